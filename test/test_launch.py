"""Structural tests of the launch file, the params file and the ament_python install layout.

`launch` and `launch_ros` cannot be installed here, so the launch file is loaded against small recording fakes
of the classes it uses; the assertions are on what it declares and on the Node action it builds. The real
`ros2 launch` runs it in test_ros_tools.py (a parent launch file, the import cost, autostart).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import setuptools
import yaml

ROOT = Path(__file__).resolve().parents[1]


class _Recorder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


class _LaunchConfiguration(_Recorder):
    def perform(self, context: Any) -> str:
        return context.launch_configurations[self.args[0]]


def _perform(context: Any, parts: list[Any]) -> str:
    """launch's perform_substitutions over the fakes: text as it is, substitutions performed."""
    return "".join(part if isinstance(part, str) else part.perform(context) for part in parts)


class _PathJoinSubstitution(_Recorder):
    def perform(self, context: Any) -> str:
        return "/".join(_perform(context, [part]) for part in self.args[0])


class _FindPackageShare(_Recorder):
    def perform(self, context: Any) -> str:
        return context.share


class _Include:
    """launch's IncludeLaunchDescription as the launch file reads it: its source's location and its arguments."""

    def __init__(self, location: Path, launch_arguments: list[tuple[str, str]]) -> None:
        self.launch_description_source = types.SimpleNamespace(location=str(location))
        self.launch_arguments = launch_arguments


LAUNCH_FILE = ROOT / "launch" / "detector.launch.py"


def _fake_launch_modules() -> dict[str, types.ModuleType]:
    launch = types.ModuleType("launch")
    launch.LaunchDescription = type("LaunchDescription", (_Recorder,), {})
    launch.LaunchContext = type("LaunchContext", (), {})
    actions = types.ModuleType("launch.actions")
    for name in (
        "DeclareLaunchArgument",
        "OpaqueFunction",
        "EmitEvent",
        "RegisterEventHandler",
        "SetEnvironmentVariable",
        "LogInfo",
    ):
        setattr(actions, name, type(name, (_Recorder,), {}))
    actions.IncludeLaunchDescription = _Include
    events = types.ModuleType("launch.events")
    events.matches_action = lambda action: ("matches", action)
    utilities = types.ModuleType("launch.utilities")
    utilities.normalize_to_list_of_substitutions = lambda text: [text]
    utilities.perform_substitutions = _perform
    substitutions = types.ModuleType("launch.substitutions")
    substitutions.LaunchConfiguration = _LaunchConfiguration
    substitutions.PathJoinSubstitution = _PathJoinSubstitution
    launch_ros = types.ModuleType("launch_ros")
    ros_actions = types.ModuleType("launch_ros.actions")
    ros_actions.Node = type("Node", (_Recorder,), {})
    ros_actions.LifecycleNode = type("LifecycleNode", (_Recorder,), {})
    ros_handlers = types.ModuleType("launch_ros.event_handlers")
    ros_handlers.OnStateTransition = type("OnStateTransition", (_Recorder,), {})
    ros_lifecycle = types.ModuleType("launch_ros.events.lifecycle")
    ros_lifecycle.ChangeState = type("ChangeState", (_Recorder,), {})
    ros_substitutions = types.ModuleType("launch_ros.substitutions")
    ros_substitutions.FindPackageShare = _FindPackageShare
    return {
        "launch": launch,
        "launch.actions": actions,
        "launch.events": events,
        "launch.utilities": utilities,
        "launch.substitutions": substitutions,
        "launch_ros": launch_ros,
        "launch_ros.actions": ros_actions,
        "launch_ros.event_handlers": ros_handlers,
        "launch_ros.events": types.ModuleType("launch_ros.events"),
        "launch_ros.events.lifecycle": ros_lifecycle,
        "launch_ros.substitutions": ros_substitutions,
    }


@pytest.fixture
def launch_description(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The launch file's description, loaded against the fakes; its `share` the package's installed share folder
    (a temporary one holding the params file and the Fast DDS profile)."""
    from tiled_detector.ros_launch.fastdds import FASTDDS_PROFILE

    for name, module in _fake_launch_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("detector_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    description.share = tmp_path / "share" / "tiled_detector"
    (description.share / "config").mkdir(parents=True)
    shutil.copy(ROOT / "config" / "detector.yaml", description.share / "config")
    shutil.copy(FASTDDS_PROFILE, description.share / "config")
    return description


def _actions_for(
    description: Any,
    given: tuple[str, ...] | None = None,
    environment: dict[str, str] | None = None,
    **configurations: str,
) -> list[Any]:
    """What the launch file's opaque function returns for these launch configurations (set by a parent, or by the
    include), included (as launch does) with the arguments named `given` (default: every configuration given
    here), the launch's environment `environment` (default: empty)."""
    from tiled_detector.ros.params import PARAMS

    defaults = {
        "image": "image",
        "depth_image": "depth_image",
        "camera_info": "camera_info",
        "params_file": f"{description.share}/config/detector.yaml",
        "namespace": "",
        "use_sim_time": "false",
        "lifecycle": "false",
        "autostart": "false",
        "log_level": "info",
        "fastdds_profile": f"{description.share}/config/fastdds_large_images.xml",
        **{p.name: "" for p in PARAMS},
    }
    context = types.SimpleNamespace(
        launch_configurations={**defaults, **configurations},
        environment=environment or {},
        share=str(description.share),
    )
    (opaque,) = [e for e in description.args[0] if type(e).__name__ == "OpaqueFunction"]
    names = tuple(configurations) if given is None else given
    # launch's visit holds the action that included the file while the file's entities run
    including = _Include(LAUNCH_FILE, [(name, configurations.get(name, "")) for name in names])
    assert including.launch_arguments is not None
    return opaque.kwargs["function"](context)


def _node_for(description: Any, given: tuple[str, ...] | None = None, **configurations: str) -> Any:
    (node,) = [
        a for a in _actions_for(description, given, **configurations) if type(a).__name__.endswith("Node")
    ]
    return node


def test_launch_arguments(launch_description: Any) -> None:
    declared = {
        e.args[0]: e.kwargs for e in launch_description.args[0] if type(e).__name__ == "DeclareLaunchArgument"
    }
    from tiled_detector.ros.params import PARAMS

    # every node parameter is a launch argument too (empty default: the params file's value)
    assert set(declared) == {
        "image",
        "depth_image",
        "camera_info",
        "params_file",
        "namespace",
        "use_sim_time",
        "lifecycle",
        "log_level",
        "fastdds_profile",
        "autostart",
    } | {p.name for p in PARAMS}
    assert all(declared[p.name]["default_value"] == "" for p in PARAMS)
    assert all(kw["description"] for kw in declared.values())
    assert declared["use_sim_time"]["default_value"] == "false"
    params_default = declared["params_file"]["default_value"]
    assert params_default.args[0][1:] == ["config", "detector.yaml"]
    assert params_default.args[0][0].args == ("tiled_detector",)


def _installed(monkeypatch: pytest.MonkeyPatch, root: Path, library: str) -> None:
    """Make `root` (with the Fast DDS library `library` in its lib folder) the ROS the launch file finds."""
    (root / "lib").mkdir(parents=True, exist_ok=True)
    (root / "lib" / library).touch()
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(root))
    monkeypatch.setattr(sys, "prefix", str(root))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)


FASTDDS_2 = ("humble", "libfastrtps.so.2.6.10")
FASTDDS_3 = ("kilted", "libfastdds.so.3.2.2")


def test_launch_sets_the_large_image_dds_profile_for_the_node_only(
    launch_description: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Fast DDS 2.x reads FASTRTPS_DEFAULT_PROFILES_FILE (XMLParserCommon.cpp at eProsima/Fast-DDS v2.6.10 and
    v2.14.5), 3.x FASTDDS_DEFAULT_PROFILES_FILE (v3.2.2): both names, in the node action's own environment (no action
    of the description sets the including launch's); where the installed Fast DDS is 3, the new name only (its
    rmw_fastrtps warns about the old one in every process); empty leaves the environment's."""
    assert {type(e).__name__ for e in launch_description.args[0]} == {
        "DeclareLaunchArgument",
        "OpaqueFunction",
    }
    large = tmp_path / "large.xml"
    large.write_text("<profiles/>")
    envs = {}
    for distro, library in (FASTDDS_2, FASTDDS_3):
        _installed(monkeypatch, tmp_path / distro, library)
        envs[distro] = _node_for(launch_description, fastdds_profile=str(large)).kwargs["additional_env"]
    assert envs["humble"] == {
        "FASTRTPS_DEFAULT_PROFILES_FILE": str(large),
        "FASTDDS_DEFAULT_PROFILES_FILE": str(large),
    }
    assert envs["kilted"] == {"FASTDDS_DEFAULT_PROFILES_FILE": str(large)}
    assert _node_for(launch_description, fastdds_profile="").kwargs["additional_env"] is None
    # not given: the shipped profile of the package's share folder
    shipped = str(launch_description.share / "config" / "fastdds_large_images.xml")
    assert _node_for(launch_description, given=()).kwargs["additional_env"] == {
        "FASTDDS_DEFAULT_PROFILES_FILE": shipped
    }


@pytest.mark.parametrize(("distro", "library"), [FASTDDS_2, FASTDDS_3])
def test_a_profile_the_user_exported_is_kept_and_said_once(
    launch_description: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, distro: str, library: str
) -> None:
    """As the CLI keeps it (`fastdds.with_profile`): a profile the environment names under either variable is the
    node's, said in one INFO line; where only the name the installed Fast DDS does not read names it, the node gets
    it under the one it reads (Fast DDS 2.x reads only FASTRTPS_DEFAULT_PROFILES_FILE); `fastdds_profile:=` given to
    this file beats it."""
    _installed(monkeypatch, tmp_path / distro, library)
    mine = tmp_path / "mine.xml"
    mine.write_text("<profiles/>")
    reads = "FASTRTPS_DEFAULT_PROFILES_FILE" if distro == "humble" else "FASTDDS_DEFAULT_PROFILES_FILE"
    other = "FASTDDS_DEFAULT_PROFILES_FILE" if distro == "humble" else "FASTRTPS_DEFAULT_PROFILES_FILE"
    for exported, expected in (
        ({reads: str(mine)}, None),  # the node inherits it as it is
        (
            {other: str(mine)},
            {reads: str(mine)} if distro == "kilted" else {reads: str(mine), other: str(mine)},
        ),
    ):
        actions = _actions_for(launch_description, given=("image",), environment=exported, image="/cam")
        said = [a for a in actions if type(a).__name__ == "LogInfo"]
        (node,) = [a for a in actions if type(a).__name__ == "Node"]
        assert node.kwargs["additional_env"] == expected, exported
        assert len(said) == 1 and str(mine) in said[0].kwargs["msg"], said
        assert "keeping the Fast DDS profile exported as" in said[0].kwargs["msg"]
    large = tmp_path / "large.xml"
    large.write_text("<profiles/>")
    actions = _actions_for(launch_description, environment={other: str(mine)}, fastdds_profile=str(large))
    assert [type(a).__name__ for a in actions] == ["Node"]
    assert set(actions[0].kwargs["additional_env"].values()) == {str(large)}


def test_a_profile_file_that_does_not_exist_is_refused_in_one_line(
    launch_description: Any, tmp_path: Path
) -> None:
    with pytest.raises(
        ValueError, match=r"fastdds_profile names a Fast DDS profile that does not exist: /no/such\.xml"
    ):
        _node_for(launch_description, fastdds_profile="/no/such.xml")
    with pytest.raises(
        ValueError,
        match=r"FASTRTPS_DEFAULT_PROFILES_FILE names a Fast DDS profile that does not exist: /gone\.xml",
    ):
        _actions_for(
            launch_description, given=(), environment={"FASTRTPS_DEFAULT_PROFILES_FILE": "/gone.xml"}
        )


def test_a_bringups_own_arguments_never_reach_the_node(launch_description: Any) -> None:
    """Nav2's bringup_launch.py declares `autostart:=true`, `params_file`, `use_sim_time`, `namespace` (and a
    bringup may declare `model`): launch includes share one scope, so they are launch configurations this file sees;
    only what the bringup passes to the include is ours. The node keeps its own defaults for the rest."""
    parents = {
        "autostart": "true",
        "params_file": "/robot/nav2_params.yaml",
        "model": "/nonexistent/nav2_model.onnx",
        "use_sim_time": "true",
        "namespace": "robot",
        "log_level": "debug",
        "fastdds_profile": "",
    }
    actions = _actions_for(
        launch_description, given=("lifecycle", "image"), lifecycle="true", image="/cam", **parents
    )
    assert [type(a).__name__ for a in actions] == ["LifecycleNode"]  # no autostart: unconfigured
    (node,) = actions
    params_file, overrides = node.kwargs["parameters"]
    assert params_file == f"{launch_description.share}/config/detector.yaml"
    assert overrides == {"use_sim_time": False}  # no model, no sim time
    assert node.kwargs["namespace"] == ""  # a parent's PushRosNamespace still places it (launch_ros)
    assert node.kwargs["arguments"][-1] == "info"
    assert node.kwargs["additional_env"] is not None  # the shipped profile, not the parent's ""
    assert node.kwargs["remappings"][0] == ("image", "/cam")
    # passed to the include, they are ours
    actions = _actions_for(launch_description, given=("lifecycle", *parents), lifecycle="true", **parents)
    node, _, _ = actions  # autostart: configure, then activate
    assert node.kwargs["parameters"][0] == "/robot/nav2_params.yaml"
    assert node.kwargs["parameters"][1] == {"use_sim_time": True, "model": "/nonexistent/nav2_model.onnx"}
    assert node.kwargs["namespace"] == "robot" and node.kwargs["additional_env"] is None


def test_launch_node_action(launch_description: Any) -> None:
    node = _node_for(
        launch_description,
        image="/front/image_raw",
        use_sim_time="true",
        camera_info="/front/color/camera_info",
    )
    assert node.kwargs["package"] == "tiled_detector"
    assert node.kwargs["executable"] == "detector_node"
    assert node.kwargs["name"] == "tiled_detector"
    assert node.kwargs["namespace"] == ""
    assert node.kwargs["remappings"] == [
        ("image", "/front/image_raw"),
        ("image/compressed", "/front/image_raw/compressed"),
        ("depth_image", "depth_image"),
        ("camera_info", "/front/color/camera_info"),
    ]
    params_file, overrides = node.kwargs["parameters"]
    assert params_file == f"{launch_description.share}/config/detector.yaml"
    assert overrides == {"use_sim_time": True}  # no model: the params file's model stays in force
    assert node.kwargs["arguments"][:2] == ["--ros-args", "--log-level"]


def test_launch_model_argument_overrides_params_file(launch_description: Any) -> None:
    node = _node_for(launch_description, model="/models/yolo.onnx")
    assert node.kwargs["parameters"][1] == {"use_sim_time": False, "model": "/models/yolo.onnx"}


def test_launch_parameter_arguments_are_typed(launch_description: Any) -> None:
    node = _node_for(
        launch_description,
        image_reliability="reliable",
        transport="compressed",
        conf_threshold="0.4",
        tile_width="512",
        full_frame="False",
        classes="[red_disc, 2]",
        cameras="[/front/image_raw, /rear/image_raw]",
    )
    assert node.kwargs["parameters"][1] == {
        "use_sim_time": False,
        "image_reliability": "reliable",
        "transport": "compressed",
        "conf_threshold": 0.4,
        "tile_width": 512,
        "full_frame": False,
        "classes": ["red_disc", "2"],
        "cameras": ["/front/image_raw", "/rear/image_raw"],
    }
    with pytest.raises(ValueError, match="tile_width must be an integer, got 'wide'"):
        _node_for(launch_description, tile_width="wide")


def test_launch_refuses_a_misspelt_argument_given_to_it(launch_description: Any) -> None:
    with pytest.raises(ValueError, match="'conf_treshold': did you mean 'conf_threshold'"):
        _node_for(launch_description, conf_treshold="0.4")
    with pytest.raises(ValueError, match="'merges': did you mean 'merge'"):
        _node_for(launch_description, given=("image", "merges"), image="/cam", merges="nms")
    _node_for(launch_description, robot_name="r2")  # far from every argument: not ours to judge


def test_a_parents_own_arguments_near_ours_pass(launch_description: Any) -> None:
    """A parent's `camera:=true`, `models:=...`, `merges:=...` are launch configurations the included file sees,
    but were not given to it: only the arguments of the action that included it are checked."""
    node = _node_for(
        launch_description,
        given=("image",),
        image="/cam/image_raw",
        camera="true",
        models="a.onnx",
        merges="x",
    )
    assert node.kwargs["remappings"][0] == ("image", "/cam/image_raw")


def test_params_yaml_documents_every_parameter_with_its_default() -> None:
    from tiled_detector.ros.params import PARAMS

    text = (ROOT / "config" / "detector.yaml").read_text()
    values = yaml.safe_load(text)["/**"]["ros__parameters"]
    for param in PARAMS:
        if param.default is None:
            assert f"# {param.name}:" in text, f"{param.name} is not documented"
        else:
            assert values[param.name] == param.default, param.name
        # the line's comment states what the parameter table says: read-only, choices, range
        line = next(x for x in text.splitlines() if x.strip().lstrip("# ").startswith(f"{param.name}:"))
        comment = line.split("  # ")[-1]
        assert ("(ro)" in comment) == param.read_only, line
        if param.choices:
            assert " | ".join(param.choices) in comment, line
        if param.min_value is not None:
            opening = "(" if getattr(param.kind, "open_low", False) else "["
            assert f"{opening}{param.min_value:g}, {param.max_value:g}]" in comment, line
    assert set(values) <= {p.name for p in PARAMS}


def test_ament_python_install_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: dict[str, Any] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(ROOT)
    exec(compile((ROOT / "setup.py").read_text(), "setup.py", "exec"), {"__name__": "__main__"})
    data = dict(captured["data_files"])
    assert data["share/ament_index/resource_index/packages"] == ["resource/tiled_detector"]
    assert data["share/tiled_detector"] == ["package.xml"]
    assert data["share/tiled_detector/launch"] == ["launch/detector.launch.py"]
    assert "config/detector.yaml" in data["share/tiled_detector/config"]
    assert all((ROOT / f).is_file() for files in data.values() for f in files)
    scripts = captured["entry_points"]["console_scripts"]
    assert "detector_node = tiled_detector.ros.node:main" in scripts
    assert "install_scripts=$base/lib/tiled_detector" in (ROOT / "setup.cfg").read_text()
    package_xml = (ROOT / "package.xml").read_text()
    assert '<package format="3">' in package_xml
    assert "<build_type>ament_python</build_type>" in package_xml
    for dep in ("rclpy", "sensor_msgs", "std_msgs", "vision_msgs", "diagnostic_msgs"):
        assert f"<exec_depend>{dep}</exec_depend>" in package_xml


def test_lifecycle_launches_the_managed_node(launch_description: Any) -> None:
    plain = _node_for(launch_description)
    managed = _node_for(launch_description, lifecycle="true", namespace="front")
    assert type(plain).__name__ == "Node" and plain.kwargs["executable"] == "detector_node"
    assert type(managed).__name__ == "LifecycleNode"
    assert (
        managed.kwargs["executable"] == "detector_lifecycle_node"
        and managed.kwargs["name"] == "tiled_detector"
    )
    assert managed.kwargs["parameters"][1] == plain.kwargs["parameters"][1]  # the same overrides
    with pytest.raises(ValueError, match="lifecycle must be true or false, got 'yes'"):
        _node_for(launch_description, lifecycle="yes")


def test_autostart_configures_then_activates_the_managed_node_once(launch_description: Any) -> None:
    from lifecycle_msgs.msg import Transition

    assert len(_actions_for(launch_description, lifecycle="true")) == 1  # a lifecycle manager's to drive
    assert len(_actions_for(launch_description, autostart="true")) == 1  # the plain node is active anyway
    node, handler, configure = _actions_for(launch_description, lifecycle="true", autostart="true")
    assert type(node).__name__ == "LifecycleNode"
    assert configure.kwargs["event"].kwargs == {
        "lifecycle_node_matcher": ("matches", node),
        "transition_id": Transition.TRANSITION_CONFIGURE,
    }
    on_configured = handler.args[0].kwargs
    assert on_configured["target_lifecycle_node"] is node and on_configured["handle_once"] is True
    assert (on_configured["start_state"], on_configured["goal_state"]) == ("configuring", "inactive")
    (activate,) = on_configured["entities"]
    assert activate.kwargs["event"].kwargs["transition_id"] == Transition.TRANSITION_ACTIVATE
    with pytest.raises(ValueError, match="autostart must be true or false"):
        _actions_for(launch_description, lifecycle="true", autostart="on")


def test_the_launch_table_is_generated_from_the_node_parameter_table(tmp_path: Path) -> None:
    """The launch file's table (`resources/launch_arguments.json`, read by `ros_launch.arguments` without torch) is
    what `python -m tiled_detector.ros.params` generates from ros/params.PARAMS: no written copy to keep in step."""
    import json

    from tiled_detector.ros.params import PARAMS, launch_table, write_launch_table
    from tiled_detector.ros_launch import LAUNCH_TABLE
    from tiled_detector.ros_launch.arguments import PARAMETERS

    assert json.loads(LAUNCH_TABLE.read_text()) == launch_table(), (
        "resources/launch_arguments.json is stale: run `.venv/bin/python -m tiled_detector.ros.params`"
    )
    assert tuple((p.name, p.param_type.value, p.description) for p in PARAMS) == PARAMETERS
    written = write_launch_table(tmp_path / "table.json")
    assert written.read_text() == LAUNCH_TABLE.read_text()  # the command writes exactly the shipped file
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]  # no temporary file left


def test_the_launch_file_imports_no_torch() -> None:
    """Loaded (against the fakes) in a fresh interpreter: neither torch nor rclpy is imported for it."""
    program = f"""
import importlib.util, sys
sys.path.insert(0, {str(ROOT / "test")!r})
from test_launch import _fake_launch_modules
sys.modules.update(_fake_launch_modules())
spec = importlib.util.spec_from_file_location("detector_launch", {str(LAUNCH_FILE)!r})
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(sorted(m for m in ("torch", "rclpy", "numpy", "tiled_detector.config") if m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_package_xml_names_no_rosdep_key_that_installs_a_wrong_torch() -> None:
    """rosdep's `python3-torch` (ros/rosdistro rosdep/python.yaml: Ubuntu's `python3-torch`) is the distribution's
    CPU build, on x86_64 and on a Jetson alike: package.xml names no torch key, and the docs say how to install it
    per platform."""
    import xml.etree.ElementTree as ET

    root = ET.parse(ROOT / "package.xml").getroot()
    keys = {element.text for element in root if element.tag.endswith("depend")}
    assert "rclpy" in keys and not [key for key in keys if "torch" in key], keys
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    assert "PyTorch has no rosdep key" in docs and "JetPack wheel" in docs
