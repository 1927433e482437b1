"""Launch the tiled_detector node: `ros2 launch tiled_detector detector.launch.py image:=/camera/image_raw`.

Every node parameter is also a launch argument (`conf_threshold:=0.4 transport:=compressed ...`); one given on
the command line overrides the params file, one left empty keeps the params file's value. A misspelt argument
(`conf_treshold:=0.4`) is refused naming the nearest one; `--show-args` lists them all.
Several cameras, one node and one engine (their tiles batched together):
`ros2 launch tiled_detector detector.launch.py "cameras:=[/front/image_raw, /rear/image_raw]"`; each camera's
detections go to its topic's namespace (`/front/detections`, `/rear/detections`). Or one node per camera, each
with its own `namespace` and `image` topic (`namespace:=front image:=/front/image_raw`).
3D positions from an aligned depth image: `depth:=true depth_image:=/camera/camera/aligned_depth_to_color/image_raw
camera_info:=/camera/camera/color/camera_info` (the node publishes `detections_3d` beside `detections`).
`lifecycle:=true` starts the managed node instead (unconfigured; configure loads the engine, activate subscribes).
"""

import difflib

import yaml
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.substitutions import FindPackageShare

from tiled_detector.ros.params import PARAMS

SHARE = FindPackageShare("tiled_detector")

ARGUMENTS = (
    ("image", "image", "input sensor_msgs/Image topic (its /compressed sibling with transport:=compressed)"),
    ("depth_image", "depth_image", "with depth:=true: the depth image aligned to `image` (16UC1 or 32FC1), e.g. "
     "/camera/camera/aligned_depth_to_color/image_raw"),
    ("camera_info", "camera_info", "with depth:=true: the colour camera's sensor_msgs/CameraInfo, e.g. "
     "/camera/camera/color/camera_info"),
    ("params_file", PathJoinSubstitution([SHARE, "config", "detector.yaml"]), "parameters YAML file"),
    ("namespace", "", "namespace of the node and its topics (one per camera)"),
    ("use_sim_time", "false", "use /clock (true when replaying bags)"),
    ("lifecycle", "false", "true: the managed node (detector_lifecycle_node), unconfigured until a lifecycle "
     "manager or `ros2 lifecycle set` configures and activates it"),
    ("log_level", "info", "logging level: debug, info, warn, error"),
    ("fastdds_profile", PathJoinSubstitution([SHARE, "config", "fastdds_large_images.xml"]),
     "Fast DDS profile with a shared-memory segment large enough for full-resolution images"),
    *((p.name, "", f"{p.description}; empty = the params file's value") for p in PARAMS),
)  # fmt: skip
NAMES = {name for name, _, _ in ARGUMENTS}


def _typed_flag(name: str, text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(f"launch argument {name} must be true or false, got {text!r}")
    return text.lower() == "true"


def _typed(name: str, text: str) -> object:
    """A launch argument's text as the parameter's type (arrays as YAML, e.g. [car, person] or [0, 0.4, 1, 1])."""
    param = next(p for p in PARAMS if p.name == name)
    kind = param.value_type
    if kind is bool:
        return _typed_flag(name, text)
    if kind is list:
        value = yaml.safe_load(text)
        item = float if param.param_type.value == "double_array" else str
        try:
            return [item(v) for v in value] if isinstance(value, list) else text
        except (TypeError, ValueError):
            raise ValueError(f"launch argument {name} must be a list of numbers, got {text!r}") from None
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"launch argument {name} must be {what}, got {text!r}") from None


def _check_spelling(context: LaunchContext) -> None:
    """Refuse a launch configuration that is a near miss of one of our arguments (a typo)."""
    for given in sorted(set(context.launch_configurations) - NAMES):
        nearest = difflib.get_close_matches(given, NAMES, n=1, cutoff=0.85)
        if nearest:
            raise ValueError(
                f"unknown launch argument {given!r}: did you mean {nearest[0]!r}? "
                "(`ros2 launch tiled_detector detector.launch.py --show-args` lists them)"
            )


def _detector_node(context: LaunchContext) -> list[Node]:
    """The node (or the managed node), with every non-empty parameter argument overriding the params file."""
    _check_spelling(context)
    arg = {name: LaunchConfiguration(name) for name, _, _ in ARGUMENTS}
    overrides: dict[str, object] = {"use_sim_time": arg["use_sim_time"].perform(context).lower() == "true"}
    for param in PARAMS:
        text = arg[param.name].perform(context)
        if text:
            overrides[param.name] = _typed(param.name, text)
    image = arg["image"].perform(context)
    depth, info = arg["depth_image"].perform(context), arg["camera_info"].perform(context)
    managed = _typed_flag("lifecycle", arg["lifecycle"].perform(context))
    action = LifecycleNode if managed else Node
    return [
        action(
            package="tiled_detector",
            executable="detector_lifecycle_node" if managed else "detector_node",
            name="tiled_detector",
            namespace=arg["namespace"],
            output="screen",
            emulate_tty=True,
            parameters=[arg["params_file"], overrides],
            remappings=[
                ("image", image),
                ("image/compressed", f"{image}/compressed"),
                ("depth_image", depth),
                ("camera_info", info),
            ],
            arguments=["--ros-args", "--log-level", arg["log_level"]],
        )
    ]


def generate_launch_description() -> LaunchDescription:
    """Launch arguments, the Fast DDS profile, and the node."""
    return LaunchDescription(
        [
            DeclareLaunchArgument(name, default_value=default, description=text)
            for name, default, text in ARGUMENTS
        ]
        + [
            SetEnvironmentVariable("FASTDDS_DEFAULT_PROFILES_FILE", LaunchConfiguration("fastdds_profile")),
            OpaqueFunction(function=_detector_node),
        ]
    )
