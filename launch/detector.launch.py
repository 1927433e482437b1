"""Launch the tiled_detector node: `ros2 launch tiled_detector detector.launch.py image:=/camera/image_raw`.

Every node parameter is also a launch argument (`conf_threshold:=0.4 transport:=compressed ...`); one given on
the command line overrides the params file, one left empty keeps the params file's value. A misspelt argument
given to this file (`conf_treshold:=0.4` on its command line, or in the `launch_arguments` of a parent that
includes it) is refused naming the nearest one; a parent's own arguments (`camera:=true`) are its business.
`--show-args` lists them all.
Several cameras, one node and one engine (their tiles batched together):
`ros2 launch tiled_detector detector.launch.py "cameras:=[/front/image_raw, /rear/image_raw]"`; each camera's
detections go to its topic's namespace (`/front/detections`, `/rear/detections`). Or one node per camera, each
with its own `namespace` and `image` topic (`namespace:=front image:=/front/image_raw`).
3D positions from an aligned depth image: `depth:=true depth_image:=/camera/camera/aligned_depth_to_color/image_raw
camera_info:=/camera/camera/color/camera_info` (the node publishes `detections_3d` beside `detections`).
`lifecycle:=true` starts the managed node instead (unconfigured; configure loads the engine, activate subscribes;
`autostart:=true` configures and activates it once at start, without a lifecycle manager).
Included from a bringup, the arguments are this file's own: only those passed to the include (its
`launch_arguments`, or the command line of `ros2 launch`) reach the node; a parent's launch configurations of the
same names (Nav2's bringup declares `autostart`, `params_file`, `use_sim_time`, `namespace`, ...; launch includes
share one scope) do not. A parent's `PushRosNamespace` (a namespaced `GroupAction`) still places the node.
The Fast DDS profile goes into the node's own environment only, never into the including launch's: both variable
names (Fast DDS 2.x reads FASTRTPS_DEFAULT_PROFILES_FILE, 3.x FASTDDS_DEFAULT_PROFILES_FILE), only the new one where
the installed Fast DDS is 3 (its rmw_fastrtps warns about the old one). A profile the environment already names (in
either variable) is kept, said in one INFO line (on Fast DDS 2.x one named only by the new name is also set under
the old one, which 2.x reads); `fastdds_profile:=FILE` given to this file beats both (empty: the environment's).
Imports no torch: the parameter table comes from `tiled_detector.ros_launch.arguments`.
"""

import os
import sys
from pathlib import Path

from launch import LaunchContext, LaunchDescription
from launch.actions import (
    DeclareLaunchArgument,
    EmitEvent,
    IncludeLaunchDescription,
    LogInfo,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch.utilities import normalize_to_list_of_substitutions, perform_substitutions
from launch_ros.actions import LifecycleNode, Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from launch_ros.substitutions import FindPackageShare
from lifecycle_msgs.msg import Transition

from tiled_detector.ros_launch.arguments import PARAMETERS, check_spelling, typed, typed_flag
from tiled_detector.ros_launch.fastdds import (
    PROFILE_VARIABLES,
    installed_major,
    profile_environment,
    profile_in_use,
)

SHARE = FindPackageShare("tiled_detector")

ARGUMENTS = (
    ("image", "image", "input sensor_msgs/Image topic (its /compressed sibling with transport:=compressed)"),
    (
        "depth_image",
        "depth_image",
        "with depth:=true: the depth image aligned to `image` (16UC1 or 32FC1), e.g. "
        "/camera/camera/aligned_depth_to_color/image_raw",
    ),
    (
        "camera_info",
        "camera_info",
        "with depth:=true: the colour camera's sensor_msgs/CameraInfo, e.g. /camera/camera/color/camera_info",
    ),
    ("params_file", PathJoinSubstitution([SHARE, "config", "detector.yaml"]), "parameters YAML file"),
    ("namespace", "", "namespace of the node and its topics (one per camera)"),
    ("use_sim_time", "false", "use /clock (true when replaying bags)"),
    (
        "lifecycle",
        "false",
        "true: the managed node (detector_lifecycle_node), unconfigured until a lifecycle manager "
        "(nav2_lifecycle_manager: the node bonds with it on activate) or `ros2 lifecycle set` configures and "
        "activates it",
    ),
    (
        "autostart",
        "false",
        "with lifecycle:=true: configure and activate the managed node once at start (leave "
        "false under a lifecycle manager, which drives the transitions itself)",
    ),
    ("log_level", "info", "logging level: debug, info, warn, error"),
    (
        "fastdds_profile",
        PathJoinSubstitution([SHARE, "config", "fastdds_large_images.xml"]),
        "Fast DDS profile with a shared-memory segment large enough for full-resolution images, set in the "
        "node's environment only (FASTRTPS_DEFAULT_PROFILES_FILE and FASTDDS_DEFAULT_PROFILES_FILE; Fast DDS 3: "
        "the latter); not given: a profile the environment names is kept, else this one; empty: the environment's",
    ),
    *((name, "", f"{description}; empty = the params file's value") for name, _, description in PARAMETERS),
)
NAMES = {name for name, _, _ in ARGUMENTS}


def _given_here(context: LaunchContext) -> list[str] | None:
    """The names of the arguments given to this file: those of the action that included it (`ros2 launch` includes
    the file it names with its command line's arguments, a parent launch file with its `launch_arguments`).

    launch hands a file no record of its include, so it is found where launch's visit keeps it while it runs this
    file's entities: in a frame of the visit (`visit_all_entities_and_collect_futures`) on the stack. None when not
    found (a launch that visits otherwise): then every launch configuration is taken as given, nothing refused."""
    here = os.path.realpath(__file__)
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            if (
                isinstance(value, IncludeLaunchDescription)
                and os.path.realpath(str(value.launch_description_source.location)) == here
            ):
                return [
                    perform_substitutions(context, normalize_to_list_of_substitutions(name))
                    for name, _ in value.launch_arguments
                ]
        frame = frame.f_back
    return None


def _own_arguments(context: LaunchContext, given: list[str] | None) -> dict[str, str]:
    """Each argument's text: the include's value for those given to this file, this file's default for the others
    (a parent's launch configuration of the same name is the parent's: launch includes share one scope)."""
    return {
        name: LaunchConfiguration(name).perform(context)
        if given is None or name in given
        else perform_substitutions(context, normalize_to_list_of_substitutions(default))
        for name, default, _ in ARGUMENTS
    }


def _profile(context: LaunchContext, given: bool, profile: str) -> tuple[dict[str, str] | None, list]:
    """The node's profile variables (None: the environment's as they are) and the INFO line that says which profile
    it keeps: `fastdds_profile:=` given to this file wins (empty: the environment's), else a profile the environment
    names in either variable (set under the name the installed Fast DDS reads where only the other names it), else
    the shipped `profile`. A file that does not exist is refused in one line naming it."""
    environment = getattr(context, "environment", os.environ)
    major = installed_major()
    exported = profile_in_use(environment, None)
    if not given and exported:
        named = [name for name in PROFILE_VARIABLES if environment.get(name)]
        reads = profile_in_use(environment, major)
        if not Path(exported).is_file():
            raise ValueError(f"{named[-1]} names a Fast DDS profile that does not exist: {exported}")
        also = (
            "" if reads else f" (also set as {', '.join(profile_environment(exported, major))} for the node)"
        )
        said = f"tiled_detector: keeping the Fast DDS profile exported as {' and '.join(named)}: {exported}{also}"
        return (None if reads else profile_environment(exported, major)), [LogInfo(msg=said)]
    if profile and not Path(profile).is_file():
        raise ValueError(f"fastdds_profile names a Fast DDS profile that does not exist: {profile}")
    return (profile_environment(profile, major) if profile else None), []


def _autostart(node: LifecycleNode) -> list:
    """Configure the managed node now and activate it once configured (once: a later configure is the user's)."""
    matcher = matches_action(node)
    activate = ChangeState(lifecycle_node_matcher=matcher, transition_id=Transition.TRANSITION_ACTIVATE)
    return [
        RegisterEventHandler(
            OnStateTransition(
                target_lifecycle_node=node,
                start_state="configuring",
                goal_state="inactive",
                entities=[EmitEvent(event=activate)],
                handle_once=True,
            )
        ),
        EmitEvent(
            event=ChangeState(lifecycle_node_matcher=matcher, transition_id=Transition.TRANSITION_CONFIGURE)
        ),
    ]


def _detector_node(context: LaunchContext) -> list:
    """The node (or the managed node), with every non-empty parameter argument given to this file overriding the
    params file."""
    given = _given_here(context)
    check_spelling(given or [], NAMES)
    arg = _own_arguments(context, given)
    overrides: dict[str, object] = {"use_sim_time": arg["use_sim_time"].lower() == "true"}
    for name, _, _ in PARAMETERS:
        if arg[name]:
            overrides[name] = typed(name, arg[name])
    image, depth, info = arg["image"], arg["depth_image"], arg["camera_info"]
    managed = typed_flag("lifecycle", arg["lifecycle"])
    autostart = typed_flag("autostart", arg["autostart"])
    environment, said = _profile(context, given is None or "fastdds_profile" in given, arg["fastdds_profile"])
    action = LifecycleNode if managed else Node
    node = action(
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
        # the node's own environment: nothing set here reaches the including launch or its other processes
        additional_env=environment,
    )
    return [*said, node, *(_autostart(node) if managed and autostart else [])]


def generate_launch_description() -> LaunchDescription:
    """Launch arguments and the node."""
    return LaunchDescription(
        [
            DeclareLaunchArgument(name, default_value=default, description=text)
            for name, default, text in ARGUMENTS
        ]
        + [OpaqueFunction(function=_detector_node)]
    )
