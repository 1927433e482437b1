"""Launch the tiled_detector node: `ros2 launch tiled_detector detector.launch.py image:=/camera/image_raw`.

Several cameras: launch it once per camera with its own `namespace` and `image` topic, e.g.
`ros2 launch tiled_detector detector.launch.py namespace:=front image:=/front/image_raw` and again with
`namespace:=rear image:=/rear/image_raw`; each node publishes `<namespace>/detections`.
"""

from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare("tiled_detector")

ARGUMENTS = (
    ("image", "image", "input sensor_msgs/Image topic (its /compressed sibling with transport:=compressed)"),
    ("params_file", PathJoinSubstitution([SHARE, "config", "detector.yaml"]), "parameters YAML file"),
    ("model", "", "model file (.onnx, .engine, .ts, .pt2); empty = the params file's (default: bundled model)"),
    ("namespace", "", "namespace of the node and its topics (one per camera)"),
    ("use_sim_time", "false", "use /clock (true when replaying bags)"),
    ("log_level", "info", "logging level: debug, info, warn, error"),
    ("fastdds_profile", PathJoinSubstitution([SHARE, "config", "fastdds_large_images.xml"]),
     "Fast DDS profile with a shared-memory segment large enough for full-resolution images"),
)  # fmt: skip


def _detector_node(context: LaunchContext) -> list[Node]:
    """The node, with `model` overriding the params file only when it is given."""
    arg = {name: LaunchConfiguration(name) for name, _, _ in ARGUMENTS}
    overrides: dict[str, object] = {"use_sim_time": arg["use_sim_time"].perform(context).lower() == "true"}
    model = arg["model"].perform(context)
    if model:
        overrides["model"] = model
    image = arg["image"].perform(context)
    return [
        Node(
            package="tiled_detector",
            executable="detector_node",
            name="tiled_detector",
            namespace=arg["namespace"],
            output="screen",
            emulate_tty=True,
            parameters=[arg["params_file"], overrides],
            remappings=[("image", image), ("image/compressed", f"{image}/compressed")],
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
