"""The real ROS 2 tools, driven as a user would: `colcon build`, `ros2 launch`, `ros2 run`, `ros2 param`,
`ros2 node`, `ros2 topic`, `ros2 lifecycle` and `ros2 pkg` against this package installed in a colcon workspace,
and the real bondpy playing nav2_lifecycle_manager's side of the bond.

No registry serves launch, launch_ros, ros2cli or bond_core here, so the workspace is built from the unmodified
upstream sources of the venv's distro (see their READMEs: launch, launch_ros, ros2cli, bond_core's bond, bondpy and
smclib): `../shared/third_party/jazzy/*.tar.gz` (jazzy branches) over Jazzy's wheels (`.venv`, Fast DDS 2.14),
`../shared/third_party/*.tar.gz` (kilted) over Kilted's (`.venv-kilted`, Fast DDS 3), chosen from the Fast DDS the
venv's ROS has (`third_party_sources`), plus this package as committed (its tracked and not-ignored files): the tools
once per venv (kept in it), this package again in every session. `TILED_DETECTOR_THIRD_PARTY` names another
`third_party` folder. Without those archives the module is skipped, except under CI=true, where their absence fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import psutil
import pytest
from filelock import FileLock

pytestmark = [pytest.mark.ros, pytest.mark.slow]
DISTRO = pytest.mark.distro  # run again on Kilted (scripts/kilted.sh): launch, lifecycle and bond

rclpy = pytest.importorskip("rclpy")

from tiled_detector.detector import TiledDetector  # noqa: E402
from tiled_detector.harness.bags import stamp_ns  # noqa: E402
from tiled_detector.harness.client import DetectorClient  # noqa: E402
from tiled_detector.harness.process import pick_domain_id, ros_environment  # noqa: E402
from tiled_detector.messages.detections import msg_to_detections  # noqa: E402
from tiled_detector.messages.images import array_to_imgmsg  # noqa: E402
from tiled_detector.ros_launch.fastdds import (  # noqa: E402
    PROFILE_VARIABLES,
    installed_major,
    profile_environment,
    with_profile,
    without_profile,
)
from tiled_detector.tools.worlds.synthetic import CLASSES, make_scene  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
THIRD_PARTY = Path(os.environ.get("TILED_DETECTOR_THIRD_PARTY", ROOT.parent / "shared" / "third_party"))
VENV = Path(sys.prefix)
# the ROS 2 tools' sources for each Fast DDS major of the venv's ROS: Jazzy's wheels ship 2.14, Kilted's 3
SOURCES_BY_FASTDDS = {2: "jazzy", 3: "."}
TOOLS_CACHE = "tiled-detector-ros-tools"  # in the venv: the workspace of the tools built from those sources


def third_party_sources(root: Path = THIRD_PARTY, prefix: Path = VENV) -> Path:
    """The folder of upstream tool archives for the ROS 2 of the venv at `prefix`, decided from the Fast DDS major
    installed there (`fastdds.installed_major`): the jazzy branches over Fast DDS 2.x, the kilted set over 3."""
    major = installed_major({"AMENT_PREFIX_PATH": str(prefix)})
    if major not in SOURCES_BY_FASTDDS:
        raise AssertionError(f"no ROS 2 tool sources for Fast DDS {major} (the venv {prefix})")
    return (root / SOURCES_BY_FASTDDS[major]).resolve()


# `ros2 param` and `ros2 node/topic list` run where a `ros2 daemon` of the domain runs (`two_cameras`,
# `daemon_domain`; stopped after, none left behind): the tool asks it for the graph instead of discovering it anew
# in every call (a fresh participant needs seconds on a busy machine); the service wait is still the tool's own
PARAM_OPTIONS = ("--timeout", "20")
# `ros2 lifecycle` waits the spin time on every call: short, and called again while the node is not found yet
# (without a daemon a 1 s spin found the node one call in two or three on this loaded machine)
LIFECYCLE_OPTIONS = ("--no-daemon", "--spin-time", "1")
DAEMON_LIFECYCLE_OPTIONS = ("--spin-time", "1")
# the bundled network's class names in the copy `ros2 param set model` gives the managed node
OTHER_LABELS = ("disc", "square", "triangle", "cross")


def _package_files() -> list[str]:
    """This package as committed: the files git tracks or would track (not ignored)."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        ).stdout.decode()
        return [f for f in listed.split("\0") if f and (ROOT / f).is_file()]
    skip = {".venv", ".git", "build", "install", "log", "__pycache__"}
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts)]


def _sourced_environment(setup: Path, base: dict[str, str]) -> dict[str, str]:
    """The environment after `source install/setup.bash`, as a user's shell has it."""
    dump = subprocess.run(
        ["bash", "-c", f"source '{setup}' >/dev/null && env -0"], env=base, check=True, capture_output=True
    ).stdout.decode()
    return dict(line.split("=", 1) for line in dump.split("\0") if "=" in line)


def _colcon_build(ws: Path, base: dict[str, str], *packages: str) -> subprocess.CompletedProcess:
    """`colcon build` in `ws` over the venv (only `packages` where given)."""
    return subprocess.run(
        [
            str(VENV / "bin" / "colcon"),
            "build",
            *(("--packages-select", *packages) if packages else ()),
            "--cmake-args",
            "-DBUILD_TESTING=OFF",
            f"-DPython3_EXECUTABLE={VENV / 'bin' / 'python'}",
        ],
        cwd=ws,
        env=base,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="session")
def workspace() -> SimpleNamespace:
    """A colcon workspace with launch, launch_ros, ros2cli, bond_core and this package built and installed.

    The upstream tools are built once per venv and set of sources and kept in the venv (`TOOLS_CACHE`, git-ignored
    with it; a few minutes on 2 cores); every session copies this package in again and rebuilds it alone, from a
    clean build and install folder (nothing of an earlier copy left), under a lock.

    Slow: the first session in a venv builds the upstream tools (about 150 s on 2 cores; then kept in the venv, and
    a later session's setup rebuilds this package alone in about 5 s)."""
    sources = third_party_sources()
    archives = sorted(sources.glob("*.tar.gz"))
    if not archives:
        why = f"no ROS 2 tool sources in {sources} (set TILED_DETECTOR_THIRD_PARTY)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI needs them to run the real ros2 tools")
        pytest.skip(why)
    if not shutil.which("colcon", path=str(VENV / "bin")):
        pytest.fail("colcon is missing from the venv: run ./scripts/setup.sh (requirements/ros-tools.txt)")
    digest = hashlib.sha256(b"".join(a.name.encode() + a.read_bytes() for a in archives)).hexdigest()[:16]
    ws = VENV / TOOLS_CACHE / digest
    ws.mkdir(parents=True, exist_ok=True)
    base = {
        **os.environ,
        "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}",
        "AMENT_PREFIX_PATH": str(VENV),
        "CMAKE_PREFIX_PATH": str(VENV),
    }
    with FileLock(f"{ws}.lock"):
        built = ws / ".tools-built"
        for folder in ("src/tiled_detector", "build/tiled_detector", "install/tiled_detector"):
            shutil.rmtree(ws / folder, ignore_errors=True)
        if not built.exists():
            shutil.rmtree(ws / "src", ignore_errors=True)
            (ws / "src").mkdir()
            for archive in archives:
                subprocess.run(["tar", "xzf", str(archive), "-C", str(ws / "src")], check=True)
        for name in _package_files():
            target = ws / "src" / "tiled_detector" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
        build = _colcon_build(ws, base, *(("tiled_detector",) if built.exists() else ()))
        assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
        built.touch()
    env = _sourced_environment(ws / "install" / "setup.bash", base)
    share = ws / "install" / "tiled_detector" / "share" / "tiled_detector"
    return SimpleNamespace(path=ws, env=env, share=share, log=build.stdout, sources=sources)


def _env(ws: SimpleNamespace, domain: int, profile: bool = True) -> dict[str, str]:
    """The sourced workspace's environment on `domain`, with the installed large-image profile (both variable
    names) or, `profile` False, with none."""
    env = ros_environment(domain, base=ws.env)
    without_profile(env)
    if profile:
        with_profile(env, ws.share / "config" / "fastdds_large_images.xml")
    return env


def ros2(ws: SimpleNamespace, domain: int, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run a `ros2` command to completion (in the workspace's sourced environment)."""
    return subprocess.run(
        ["ros2", *args], env=_env(ws, domain), capture_output=True, text=True, timeout=timeout, check=False
    )


def ros2_daemon(ws: SimpleNamespace, domain: int, verb: str) -> None:
    """`ros2 daemon start` or `stop` on `domain` (as a user's shell has it running: the tools ask it for the graph
    instead of discovering it anew in every call)."""
    done = ros2(ws, domain, "daemon", verb)
    assert done.returncode == 0, done


@pytest.fixture
def daemon_domain(workspace: SimpleNamespace) -> Iterator[int]:
    """A ROS domain of its own with a `ros2 daemon` running on it during the test, stopped after (none left)."""
    domain = pick_domain_id()
    ros2_daemon(workspace, domain, "start")
    yield domain
    ros2_daemon(workspace, domain, "stop")


def ros2_lifecycle(
    ws: SimpleNamespace, domain: int, node: str, *args: str, daemon: bool = False
) -> subprocess.CompletedProcess:
    """`ros2 lifecycle VERB NODE ARGS...` (through the domain's daemon where `daemon`: `daemon_domain`), again while
    the node is not found (a fresh ros2 process, or the daemon, may not have discovered it yet)."""
    deadline = time.monotonic() + 60
    options = DAEMON_LIFECYCLE_OPTIONS if daemon else LIFECYCLE_OPTIONS
    while True:
        done = ros2(ws, domain, "lifecycle", *args[:1], *options, node, *args[1:])
        if "Node not found" not in done.stdout + done.stderr or time.monotonic() > deadline:
            return done


class Background:
    """A long-running `ros2 launch` / `ros2 run` process; stopped with SIGINT like Ctrl-C."""

    def __init__(self, ws: SimpleNamespace, domain: int, *args: str, log: Path, profile: bool = True) -> None:
        self.log = log
        self._file = log.open("wb")
        self.process = subprocess.Popen(
            ["ros2", *args],
            env=_env(ws, domain, profile),
            stdout=self._file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 90.0) -> bool:
        """Whether `text` shows in the output within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while text not in self.text() and time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.2)
        return text in self.text()

    def node_environment(self, executable: str) -> dict[str, str]:
        """The environment of the node process `executable` this launch started."""
        (node,) = [
            p
            for p in psutil.Process(self.process.pid).children(recursive=True)
            if any(Path(part).name == executable for part in p.cmdline()[:2])
        ]
        return node.environ()

    def interrupt(self, timeout: float = 20.0) -> tuple[int, float]:
        """Ctrl-C (SIGINT to the process group, as a terminal sends it); exit code and seconds taken."""
        started = time.monotonic()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait()
        self._file.close()
        return code, time.monotonic() - started


def _frame(index: int, frame_id: str) -> tuple[Any, Any]:
    scene = make_scene(900 + index, 1280, 720)
    msg = array_to_imgmsg(scene.image, "rgb8")
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = 2000 + index, 125
    return scene, msg


def _answer(client: DetectorClient, msg: Any, timeout: float = 60.0) -> Any:
    """Publish `msg` until its detections come back (best-effort images can be lost right after discovery)."""
    stamp = stamp_ns(msg.header.stamp)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client.publish(msg)
        reply = client.wait_for_stamp(stamp, timeout=min(3.0, max(deadline - time.monotonic(), 0.1)))
        if reply is not None:
            return reply
    raise AssertionError(f"no detections for stamp {stamp} on {client.detections_subscription.topic_name}")


def _same(reply: Any, expected: Any) -> None:
    boxes, scores, class_ids = msg_to_detections(reply, list(CLASSES))
    assert len(scores) == len(expected.scores) > 0
    order, ref = np.lexsort((boxes[:, 0], -scores)), np.lexsort((expected.boxes[:, 0], -expected.scores))
    np.testing.assert_allclose(boxes[order], expected.boxes[ref], atol=1e-3)
    np.testing.assert_array_equal(class_ids[order], expected.class_ids[ref])


def test_the_tools_are_built_from_the_sources_of_the_venvs_distro(tmp_path: Path) -> None:
    """Fast DDS 2.x where the venv's ROS is (Jazzy's wheels: libfastrtps.so.2.14): the jazzy branches; Fast DDS 3
    (Kilted's: libfastdds.so.3): the kilted set; the venv running this test: the set of its own Fast DDS."""
    for name, library, expected in (
        ("jazzy", "libfastrtps.so.2.14.5", tmp_path / "third_party" / "jazzy"),
        ("kilted", "libfastdds.so.3.2.2", tmp_path / "third_party"),
    ):
        (tmp_path / name / "lib").mkdir(parents=True)
        (tmp_path / name / "lib" / library).touch()
        (tmp_path / "third_party" / "jazzy").mkdir(parents=True, exist_ok=True)
        assert third_party_sources(tmp_path / "third_party", tmp_path / name) == expected.resolve(), name
    running = installed_major({"AMENT_PREFIX_PATH": str(VENV)})
    assert third_party_sources(tmp_path) == (tmp_path / SOURCES_BY_FASTDDS[running]).resolve()


@DISTRO
def test_colcon_install_layout(workspace: SimpleNamespace) -> None:
    domain = pick_domain_id()
    prefix = ros2(workspace, domain, "pkg", "prefix", "tiled_detector")
    assert prefix.returncode == 0, prefix.stderr
    assert Path(prefix.stdout.strip()) == workspace.path / "install" / "tiled_detector"
    executables = ros2(workspace, domain, "pkg", "executables", "tiled_detector")
    assert "tiled_detector detector_node" in executables.stdout, executables
    assert "tiled_detector detector_lifecycle_node" in executables.stdout, executables
    assert os.access(workspace.path / "install/tiled_detector/lib/tiled_detector/detector_node", os.X_OK)
    for name in (
        "launch/detector.launch.py",
        "config/detector.yaml",
        "config/fastdds_large_images.xml",
        "package.xml",
    ):
        assert (workspace.share / name).is_file(), name
    bondpy = subprocess.run(
        [
            sys.executable,
            "-c",
            "from bondpy.bondpy import Bond; from bond.msg import Status; print(Bond.__module__)",
        ],
        env=workspace.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bondpy.stdout.strip() == "bondpy.bondpy", bondpy.stderr  # bond_core built beside this package
    found = subprocess.run(
        [sys.executable, "-c", "import tiled_detector as t; print(t.default_model_path())"],
        env=workspace.env,
        capture_output=True,
        text=True,
        check=True,
    )
    model = Path(found.stdout.strip())
    assert model.is_file() and workspace.path / "install" in model.parents, model
    helped = ros2(workspace, domain, "run", "tiled_detector", "detector_node", "--help")
    assert helped.returncode == 0 and "usage: detector_node" in helped.stdout, helped
    assert "conf_threshold" in helped.stdout
    # launch as built here is the one of the venv's distro's set (jazzy 3.4.x, kilted 3.7.x)
    built = (workspace.path / "install" / "launch" / "share" / "launch" / "package.xml").read_text()
    version = re.search(r"<version>([^<]+)</version>", built).group(1)
    assert (workspace.sources / f"ros2-launch-{version}.tar.gz").is_file(), (version, workspace.sources)


@pytest.fixture(scope="module")
def two_cameras(
    workspace: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimpleNamespace]:
    """Two launches side by side: `front` (params file, model, reliable images, debug log) and `rear`, and a
    `ros2 daemon` of their domain that the module's ros2 CLI calls ask for the graph (stopped at the end)."""
    tmp = tmp_path_factory.mktemp("launch")
    params = tmp / "front.yaml"
    params.write_text("/**:\n  ros__parameters:\n    conf_threshold: 0.3\n    max_detections: 40\n")
    model = workspace.path / "install/tiled_detector/lib/python3.11/site-packages/tiled_detector/models"
    model = next(model.glob("default.onnx"), None) or next(workspace.path.glob("install/**/default.onnx"))
    domain = pick_domain_id()
    ros2_daemon(workspace, domain, "start")
    front = Background(
        workspace,
        domain,
        "launch",
        "tiled_detector",
        "detector.launch.py",
        "namespace:=front",
        "image:=/front/image_raw",
        f"params_file:={params}",
        f"model:={model}",
        "log_level:=debug",
        "image_reliability:=reliable",
        "transport:=raw",
        log=tmp / "front.log",
    )
    rear = Background(
        workspace,
        domain,
        "launch",
        "tiled_detector",
        "detector.launch.py",
        "namespace:=rear",
        "image:=/rear/image_raw",
        log=tmp / "rear.log",
    )
    clients = {
        name: DetectorClient(
            domain_id=domain,
            image_topic=f"/{name}/image_raw",
            detections_topic=f"/{name}/detections",
            image_reliable=True,
            node_name=f"client_{name}",
        )
        for name in ("front", "rear")
    }
    try:
        for client in clients.values():
            assert client.wait_for_node(timeout=90), (front.text(), rear.text())
        yield SimpleNamespace(
            ws=workspace, domain=domain, front=front, rear=rear, clients=clients, model=model, params=params
        )
    finally:
        for client in clients.values():
            client.close()
        front.interrupt()
        rear.interrupt()
        ros2_daemon(workspace, domain, "stop")


def test_two_launches_answer_on_their_namespaces(two_cameras: SimpleNamespace) -> None:
    for index, name in enumerate(("front", "rear")):
        scene, msg = _frame(index, f"{name}_optical")
        reply = _answer(two_cameras.clients[name], msg)
        assert reply.header.frame_id == f"{name}_optical"
        assert (reply.header.stamp.sec, reply.header.stamp.nanosec) == (2000 + index, 125)
        settings = {"conf_threshold": 0.3, "max_detections": 40} if name == "front" else {}
        _same(reply, TiledDetector(**settings).detect(scene.image, "rgb8"))
        assert [d.id for d in reply.detections] == [""] * len(reply.detections)  # untracked: no identity
    assert "parameters: {" in two_cameras.front.text()  # log_level:=debug reached the node
    assert "parameters: {" not in two_cameras.rear.text()


def test_launch_arguments_reach_the_node(two_cameras: SimpleNamespace) -> None:
    ws, domain = two_cameras.ws, two_cameras.domain
    expected = {
        "conf_threshold": "0.3",  # from params_file:=
        "image_reliability": "reliable",  # from image_reliability:=
        "transport": "raw",
        "model": str(two_cameras.model),  # from model:=
    }
    for name, value in expected.items():
        got = ros2(ws, domain, "param", "get", *PARAM_OPTIONS, "/front/tiled_detector", name)
        assert got.returncode == 0 and got.stdout.strip().endswith(value), (name, got)
    bundled = ros2(ws, domain, "param", "get", *PARAM_OPTIONS, "/rear/tiled_detector", "model")
    assert bundled.stdout.strip().endswith("default.onnx"), bundled  # the loaded path, not ""


def test_ros2_param_set_get_describe_dump(two_cameras: SimpleNamespace) -> None:
    ws, domain, node = two_cameras.ws, two_cameras.domain, "/rear/tiled_detector"

    def param(*args: str) -> subprocess.CompletedProcess:
        return ros2(ws, domain, "param", args[0], *PARAM_OPTIONS, node, *args[1:])

    ok = param("set", "conf_threshold", "0.6")
    assert ok.returncode == 0 and "Set parameter successful" in ok.stdout, ok
    scene, msg = _frame(5, "rear_optical")
    _same(
        _answer(two_cameras.clients["rear"], msg),
        TiledDetector(conf_threshold=0.6).detect(scene.image, "rgb8"),
    )
    # (`get` of the value set: the dump below shows it)

    refusals = {
        ("overlap", "1.7"): "out of range",
        ("model", "/other.onnx"): "read-only",
        ("merge", "average"): "merge must be one of nms, nmm, greedy_nmm",
    }
    for (name, value), reason in refusals.items():
        refused = param("set", name, value)
        assert "Setting parameter failed" in refused.stdout + refused.stderr, refused
        assert reason in refused.stdout + refused.stderr, (reason, refused)
    # an empty list from the command line (typed as a bool array): all classes
    reset = param("set", "classes", "[]")
    assert "Set parameter successful" in reset.stdout, reset

    described = param("describe", "overlap")
    assert "Min value: 0.0" in described.stdout and "Max value: 0.95" in described.stdout, described
    assert "overlap ratio" in described.stdout
    dumped = param("dump")
    assert dumped.returncode == 0, dumped
    for name in ("conf_threshold: 0.6", "model:", "labels:", "classes:", "tile_width: 0", "overlap: 0.2"):
        assert name in dumped.stdout, (name, dumped.stdout)


def _listed(
    ws: SimpleNamespace, domain: int, what: str, wanted: set[str], timeout: float = 60.0
) -> list[str]:
    """`ros2 <what> list`, again until it shows `wanted` (discovery on a loaded machine can take a while)."""
    deadline = time.monotonic() + timeout
    while True:
        listed = ros2(ws, domain, what, "list").stdout.split()
        if wanted <= set(listed) or time.monotonic() > deadline:
            return listed


def test_ros2_node_and_topic_tools(two_cameras: SimpleNamespace) -> None:
    ws, domain = two_cameras.ws, two_cameras.domain
    nodes = {"/front/tiled_detector", "/rear/tiled_detector"}
    assert nodes <= set(_listed(ws, domain, "node", nodes))
    topics = {
        "/front/detections",
        "/rear/detections",
        "/front/image_raw",
        "/front/debug_image",
        "/diagnostics",
    }
    assert topics <= set(_listed(ws, domain, "topic", topics))
    try:  # hz runs until stopped: give it a few diagnostics periods
        hz = ros2(ws, domain, "topic", "hz", "/diagnostics", timeout=12)
        output = hz.stdout
    except subprocess.TimeoutExpired as stopped:
        output = (
            (stopped.stdout or b"").decode() if isinstance(stopped.stdout, bytes) else stopped.stdout or ""
        )
    rates = [float(r) for r in re.findall(r"average rate: ([0-9.]+)", output)]
    assert rates and 0.5 <= rates[-1] <= 3.0, output  # two nodes at 1 Hz each (a loaded CI machine may lag)


def test_sigint_ends_each_launch_cleanly(two_cameras: SimpleNamespace) -> None:
    for launch in (two_cameras.front, two_cameras.rear):
        code, seconds = launch.interrupt()
        text = launch.text()
        assert code == 0, text
        assert seconds < 10, (seconds, text)
        assert "process has finished cleanly" in text, text
        assert "Traceback" not in text and "SIGKILL" not in text and "SIGTERM" not in text, text


def test_ros2_run_with_the_installed_params_file(workspace: SimpleNamespace, tmp_path: Path) -> None:
    domain = pick_domain_id()
    node = Background(
        workspace,
        domain,
        "run",
        "tiled_detector",
        "detector_node",
        "--ros-args",
        "--params-file",
        str(workspace.share / "config" / "detector.yaml"),
        "-r",
        "image:=/camera/image_raw",
        log=tmp_path / "run.log",
    )
    client = DetectorClient(domain_id=domain, image_topic="/camera/image_raw", node_name="client_run")
    try:
        assert client.wait_for_node(timeout=90), node.text()
        scene, msg = _frame(7, "camera_optical")
        reply = _answer(client, msg)
        assert reply.header.frame_id == "camera_optical"
        _same(reply, TiledDetector().detect(scene.image, "rgb8"))
    finally:
        client.close()
        code, _ = node.interrupt()
    assert code == 0 and "Traceback" not in node.text(), node.text()


def test_sim_time_launch_stops_on_ctrl_c(workspace: SimpleNamespace, tmp_path: Path) -> None:
    domain = pick_domain_id()
    launch = Background(
        workspace,
        domain,
        "launch",
        "tiled_detector",
        "detector.launch.py",
        "use_sim_time:=true",
        log=tmp_path / "sim.log",
    )
    deadline = time.monotonic() + 90
    while "ready:" not in launch.text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "ready:" in launch.text(), launch.text()
    time.sleep(2.0)  # no /clock: sim time stands still
    code, seconds = launch.interrupt()
    assert code == 0 and seconds < 5, (code, seconds, launch.text())
    assert "process has finished cleanly" in launch.text()


@DISTRO
def test_misspelt_launch_argument_is_refused(workspace: SimpleNamespace) -> None:
    refused = ros2(
        workspace, pick_domain_id(), "launch", "tiled_detector", "detector.launch.py", "conf_treshold:=0.4"
    )
    assert refused.returncode != 0
    assert "did you mean 'conf_threshold'" in refused.stdout + refused.stderr, refused


def test_ros2_lifecycle_drives_the_managed_node(
    workspace: SimpleNamespace, daemon_domain: int, tmp_path: Path
) -> None:
    """`lifecycle:=true` launches detector_lifecycle_node; the real `ros2 lifecycle` (through a `ros2 daemon`, as a
    user's shell runs it) configures, activates, deactivates, cleans up and shuts it down, and it detects only
    while active; cleanup -> `ros2 param set model` -> configure -> activate answers frames with the new model
    (refused while configured).

    Slow: about 60 s on this loaded 2-core machine (a launch, two model loads and 19 ros2 CLI processes, each a
    Python start-up, a 1 s spin and a service call)."""
    domain, node = daemon_domain, "/managed/tiled_detector"
    other = tmp_path / "other.onnx"  # the bundled network under other class names (a labels file beside it)
    shutil.copy(next(workspace.path.glob("install/**/models/default.onnx")), other)
    (tmp_path / "other.labels.txt").write_text("".join(f"{name}\n" for name in OTHER_LABELS))
    launch = Background(
        workspace,
        domain,
        "launch",
        "tiled_detector",
        "detector.launch.py",
        "lifecycle:=true",
        "namespace:=managed",
        "image:=/managed/image_raw",
        log=tmp_path / "managed.log",
    )
    client = DetectorClient(
        domain_id=domain,
        image_topic="/managed/image_raw",
        detections_topic="/managed/detections",
        node_name="client_managed",
    )

    def lifecycle(*args: str) -> subprocess.CompletedProcess:
        return ros2_lifecycle(workspace, domain, node, *args, daemon=True)

    try:
        assert lifecycle("get").stdout.strip() == "unconfigured [1]", (lifecycle("get"), launch.text())
        for transition in ("configure", "activate"):
            done = lifecycle("set", transition)
            assert "Transitioning successful" in done.stdout, (done, launch.text())
        assert lifecycle("get").stdout.strip() == "active [3]"
        scene, msg = _frame(7, "managed_optical")
        _same(_answer(client, msg), TiledDetector().detect(scene.image, "rgb8"))
        refused = ros2(workspace, domain, "param", "set", *PARAM_OPTIONS, node, "model", str(other))
        assert "set while it is unconfigured" in refused.stdout + refused.stderr, refused  # configured
        for transition in ("deactivate", "cleanup"):
            assert "Transitioning successful" in lifecycle("set", transition).stdout
        assert lifecycle("get").stdout.strip() == "unconfigured [1]"
        # another model while unconfigured: configure loads it, with its own class names
        shown = ros2(workspace, domain, "param", "get", *PARAM_OPTIONS, node, "labels")
        assert "red_disc" not in shown.stdout, shown  # the first model's names are not kept for the next
        done = ros2(workspace, domain, "param", "set", *PARAM_OPTIONS, node, "model", str(other))
        assert "Set parameter successful" in done.stdout, done
        for transition in ("configure", "activate"):
            assert "Transitioning successful" in lifecycle("set", transition).stdout, launch.text()
        scene, msg = _frame(8, "managed_optical")
        reply = _answer(client, msg)
        expected = TiledDetector(model=other).detect(scene.image, "rgb8")
        names = sorted(d.results[0].hypothesis.class_id for d in reply.detections)
        assert names == sorted(OTHER_LABELS[i] for i in expected.class_ids.tolist()) and names, reply
        for transition in ("deactivate", "cleanup"):
            assert "Transitioning successful" in lifecycle("set", transition).stdout
        assert "Transitioning successful" in lifecycle("set", "shutdown").stdout
        code, _ = launch.interrupt()  # (already ended by the shutdown transition, or ends now)
        assert code == 0, launch.text()
        assert "Traceback" not in launch.text()
    finally:
        client.close()
        launch.interrupt()


PARENT_LAUNCH = """
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    detector = PathJoinSubstitution([FindPackageShare("tiled_detector"), "launch", "detector.launch.py"])
    arguments = {"namespace": "robot", "image": "/robot/image_raw", "lifecycle": "true", "autostart": "true"}
    return LaunchDescription([
        DeclareLaunchArgument("camera", default_value="false"),
        DeclareLaunchArgument("models", default_value=""),
        IncludeLaunchDescription(PythonLaunchDescriptionSource(detector), launch_arguments=arguments.items()),
        ExecuteProcess(
            cmd=["bash", "-c", "echo sibling: camera=$0 ${FASTRTPS_DEFAULT_PROFILES_FILE-unset} "
                 "${FASTDDS_DEFAULT_PROFILES_FILE-unset}", LaunchConfiguration("camera")],
            output="screen",
        ),
    ])
"""


@DISTRO
def test_a_parent_launch_with_arguments_near_ours_brings_the_managed_node_up(
    workspace: SimpleNamespace, tmp_path: Path
) -> None:
    """The real `ros2 launch` of a bringup that includes detector.launch.py and has its own `camera` and `models`
    arguments (one letter from `cameras` and `model`): the node comes up; `lifecycle:=true autostart:=true`
    configures and activates it; the Fast DDS profile is in the node's environment under both names and nowhere
    else (a process the parent starts after the include has neither)."""
    parent = tmp_path / "robot.launch.py"
    parent.write_text(PARENT_LAUNCH)
    domain = pick_domain_id()
    launch = Background(
        workspace,
        domain,
        "launch",
        str(parent),
        "camera:=true",
        "models:=x",
        log=tmp_path / "robot.log",
        profile=False,
    )
    client = DetectorClient(
        domain_id=domain,
        image_topic="/robot/image_raw",
        detections_topic="/robot/detections",
        node_name="client_robot",
    )
    try:
        assert launch.wait_for("sibling:"), launch.text()
        assert "sibling: camera=true unset unset" in launch.text(), launch.text()
        scene, msg = _frame(3, "robot_optical")
        _same(_answer(client, msg), TiledDetector().detect(scene.image, "rgb8"))  # active without a manager
        profile = str(workspace.share / "config" / "fastdds_large_images.xml")
        node_env = launch.node_environment("detector_lifecycle_node")
        # Fast DDS 2.x (Jazzy): both names; 3 (Kilted): the name it reads, not the old one its rmw_fastrtps warns about
        expected = profile_environment(profile, installed_major(workspace.env))
        assert {name: node_env.get(name) for name in PROFILE_VARIABLES} == {
            name: expected.get(name) for name in PROFILE_VARIABLES
        }
    finally:
        client.close()
        code, _ = launch.interrupt()
    assert code == 0 and "Traceback" not in launch.text(), launch.text()


NAV2_BRINGUP = """
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, GroupAction, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import PathJoinSubstitution
from launch_ros.actions import PushRosNamespace
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    detector = PathJoinSubstitution([FindPackageShare("tiled_detector"), "launch", "detector.launch.py"])
    # what nav2_bringup's bringup_launch.py declares (autostart, params_file, use_sim_time), and a model of its own
    return LaunchDescription([
        DeclareLaunchArgument("autostart", default_value="true"),
        DeclareLaunchArgument("params_file", default_value=PARAMS),
        DeclareLaunchArgument("model", default_value="/nonexistent/nav2_model.onnx"),
        DeclareLaunchArgument("use_sim_time", default_value="true"),
        GroupAction([
            PushRosNamespace("robot"),
            IncludeLaunchDescription(
                PythonLaunchDescriptionSource(detector),
                launch_arguments={"lifecycle": "true", "image": "/robot/image_raw"}.items(),
            ),
        ]),
    ])
"""
NAV2_PARAMS = """/**:
  ros__parameters:
    conf_threshold: 0.9
controller_server:
  ros__parameters:
    controller_frequency: 20.0
"""


def _diagnostics_counts(diagnostics: list[Any]) -> dict[str, int]:
    """The frame counters of the node's last /diagnostics pipeline status."""
    values = {kv.key: kv.value for kv in diagnostics[-1].status[0].values} if diagnostics else {}
    return {k: int(v) for k, v in values.items() if k.startswith("frames_")}


def _settled_counts(diagnostics: list[Any], timeout: float = 15.0) -> dict[str, int]:
    """The frame counters once two /diagnostics messages newer than this call show the same ones."""
    seen, deadline = len(diagnostics), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if len(diagnostics) >= seen + 2:
            last, previous = (_diagnostics_counts([message]) for message in diagnostics[-1:-3:-1])
            if last == previous:
                return last
    raise AssertionError(f"the node's counters did not settle in {timeout} s")


def _four_k_burst(
    ws: SimpleNamespace, domain: int, diagnostics: list[Any], reliability: str
) -> dict[str, int]:
    """10 frames of 3840x2160 rgb8 at 2 Hz (test/support/publisher.py, the shipped profile in its environment):
    what the node's counters grew by, from counters that two fresh /diagnostics messages agree on (a frame answered
    just before must not count in the burst)."""
    before = _settled_counts(diagnostics)
    publisher = subprocess.run(
        [
            *(sys.executable, str(ROOT / "test" / "support" / "publisher.py"), "--topic", "/robot/image_raw"),
            *("--size", "3840x2160", "--rate", "2", "--count", "10", "--reliability", reliability),
        ],
        env=_env(ws, domain),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(publisher.stdout.splitlines()[-1]) == {"sent": 10}, publisher.stderr[-2000:]
    deadline = time.monotonic() + 30
    counts = before
    while time.monotonic() < deadline:
        time.sleep(1.0)
        counts = _diagnostics_counts(diagnostics)
        grown = {k: counts[k] - before.get(k, 0) for k in counts}
        if (
            grown.get("frames_received", 0) + grown.get("frames_lost", 0) + grown.get("frames_skipped", 0)
            >= 10
        ):
            break
    return {k: counts[k] - before.get(k, 0) for k in counts}


@DISTRO
def test_a_nav2_style_bringup_includes_the_managed_node_with_its_own_arguments(
    workspace: SimpleNamespace, daemon_domain: int, tmp_path: Path
) -> None:
    """The real `ros2 launch` of a bringup that declares what Nav2's does (`autostart:=true`, `params_file` of its
    own, `use_sim_time:=true`) and a `model` of its own, and includes ours in a `PushRosNamespace` group with
    `lifecycle:=true`: the node comes up in the bringup's namespace, unconfigured, with none of the bringup's values
    (its model, params file, sim time); `ros2 lifecycle` configures and activates it; a bondpy peer (as
    nav2_lifecycle_manager) forms the bond on /robot/bond; it answers frames with its own model; 4K frames over the
    shipped profile arrive 10 of 10 reliable and best-effort at 2 Hz, frames_skipped counted (rclpy's message info).
    Slow: about 60 s on this loaded 2-core machine (a launch, five ros2 CLI calls, a bond and two 4K streams; its
    `ros2 lifecycle` calls go through the domain's daemon)."""
    from diagnostic_msgs.msg import DiagnosticArray

    params = tmp_path / "nav2_params.yaml"
    params.write_text(NAV2_PARAMS)
    parent = tmp_path / "bringup_launch.py"
    parent.write_text(NAV2_BRINGUP.replace("PARAMS", repr(str(params))))
    domain, node = daemon_domain, "/robot/tiled_detector"
    launch = Background(workspace, domain, "launch", str(parent), log=tmp_path / "bringup.log")
    client = DetectorClient(
        domain_id=domain,
        image_topic="/robot/image_raw",
        detections_topic="/robot/detections",
        node_name="client_bringup",
    )
    diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
    manager = None
    try:
        state = ros2_lifecycle(workspace, domain, node, "get", daemon=True)
        assert state.stdout.strip() == "unconfigured [1]", (
            state,
            launch.text(),
        )  # no autostart from the parent
        for name, value in (("use_sim_time", "False"), ("conf_threshold", "0.25")):
            got = ros2(workspace, domain, "param", "get", *PARAM_OPTIONS, node, name)
            assert got.stdout.strip().endswith(value), (name, got, launch.text())
        # the bondpy peer waits for the node's side, which activate starts
        manager = subprocess.Popen(
            [sys.executable, str(ROOT / "test" / "support" / "lifecycle_manager.py"), node, "bond", "vanish"],
            env=_env(workspace, domain),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for transition in ("configure", "activate"):
            done = ros2_lifecycle(workspace, domain, node, "set", transition, daemon=True)
            assert "Transitioning successful" in done.stdout, (done, launch.text())
        out, err = manager.communicate(timeout=90)
        assert [json.loads(line)["ok"] for line in out.splitlines()] == [True, True], (out, err[-3000:])
        assert launch.wait_for("bond formed with the lifecycle manager (topic bond", timeout=10), (
            launch.text()
        )
        got = ros2(workspace, domain, "param", "get", *PARAM_OPTIONS, node, "model")
        assert got.stdout.strip().endswith("default.onnx"), got  # its own model, not the bringup's
        scene, msg = _frame(21, "robot_optical")
        _same(_answer(client, msg), TiledDetector().detect(scene.image, "rgb8"))
        assert client.wait_until(lambda: "frames_skipped" in _diagnostics_counts(diagnostics), timeout=30)
        bursts = {
            reliability: _four_k_burst(workspace, domain, diagnostics, reliability)
            for reliability in ("reliable", "best_effort")
        }
        print(f"4K at 2 Hz over the shipped profile: {bursts}")
        for reliability, grown in bursts.items():
            assert grown["frames_received"] == 10, (reliability, bursts, launch.text()[-3000:])
            assert grown["frames_lost"] == grown["frames_skipped"] == 0, (reliability, bursts)
        assert launch.text().count("keeping the Fast DDS profile exported as") == 1, launch.text()
    finally:
        if manager is not None and manager.poll() is None:
            manager.kill()
        client.close()
        code, _ = launch.interrupt()
    assert code == 0 and "Traceback" not in launch.text(), launch.text()


def test_the_launch_file_costs_under_100_ms_and_imports_no_torch(workspace: SimpleNamespace) -> None:
    """`python -X importtime`: what loading detector.launch.py imports beyond launch and launch_ros themselves."""
    program = f"""
import sys
import launch, launch.actions, launch.events, launch.substitutions, launch.utilities, lifecycle_msgs.msg
import launch_ros.actions, launch_ros.event_handlers, launch_ros.events.lifecycle, launch_ros.substitutions
from launch.launch_description_sources import get_launch_description_from_python_launch_file
print("-- launch file --", file=sys.stderr, flush=True)
get_launch_description_from_python_launch_file({str(workspace.share / "launch" / "detector.launch.py")!r})
print(sorted(name for name in ("torch", "tiled_detector.config", "tiled_detector.ros") if name in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", program],
        env=workspace.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout  # no torch, no config table, not the node's package
    ours = done.stderr.split("-- launch file --", 1)[1].splitlines()
    rows = [line.split("|") for line in ours if line.startswith("import time:") and "cumulative" not in line]
    top = [(int(row[1]), row[2].strip()) for row in rows if len(row[2]) - len(row[2].lstrip()) == 1]
    total_ms = sum(us for us, _ in top) / 1e3
    assert total_ms < 100, (total_ms, sorted(top, reverse=True)[:8])


@DISTRO
def test_a_lifecycle_manager_bonds_on_activate_and_the_node_outlives_it(
    workspace: SimpleNamespace, tmp_path: Path
) -> None:
    """The real bondpy playing nav2_lifecycle_manager (test/support/lifecycle_manager.py): the bond forms within
    half of bond_timeout after activate and breaks on deactivate; formed again on the next activate, the manager
    breaks it (as one that ends or resets does): the node says so once (WARN) and stays active; formed a third time,
    the manager then vanishes without a word: the node's side never times out on the manager's heartbeat (Nav2's
    nodes: "server side never times out from lifecycle manager"), no WARN, still active, answering frames."""
    domain, node = pick_domain_id(), "/nav/tiled_detector"
    launch = Background(
        workspace,
        domain,
        "launch",
        "tiled_detector",
        "detector.launch.py",
        "lifecycle:=true",
        "namespace:=nav",
        "image:=/nav/image_raw",
        log=tmp_path / "nav.log",
    )
    client = DetectorClient(
        domain_id=domain,
        image_topic="/nav/image_raw",
        detections_topic="/nav/detections",
        node_name="client_nav",
    )
    steps = ("configure", "activate", "deactivate", "activate", "break", "deactivate", "activate", "vanish")
    try:
        manager = subprocess.run(
            [sys.executable, str(ROOT / "test" / "support" / "lifecycle_manager.py"), node, *steps],
            env=_env(workspace, domain),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        done = [json.loads(line) for line in manager.stdout.splitlines()]
        # activate: and the bond formed within bond_timeout / 2; deactivate, break: and the bond broke
        assert [(s["step"], s["ok"]) for s in done] == [(step, True) for step in steps], (
            done,
            manager.stderr[-3000:],
            launch.text(),
        )
        time.sleep(6.0)  # longer than the 4 s heartbeat timeout since the manager's last heartbeat
        done = ros2_lifecycle(workspace, domain, node, "get")
        assert done.stdout.strip() == "active [3]", (done.stdout, done.stderr, launch.text())
        scene, msg = _frame(11, "nav_optical")
        _same(_answer(client, msg), TiledDetector().detect(scene.image, "rgb8"))
        text = launch.text()
        assert text.count("bond with the lifecycle manager broke") == 1, text  # the manager's break only
        assert text.count("bond formed with the lifecycle manager") == 3, text
        assert "Heartbeat timeout is disabled" not in text and "Traceback" not in text, text
    finally:
        client.close()
        code, _ = launch.interrupt()
    assert code == 0 and "Traceback" not in launch.text(), launch.text()


@DISTRO
def test_a_stalled_executor_keeps_the_bond(workspace: SimpleNamespace) -> None:
    """The node's executor held for 6 s (longer than the 4 s heartbeat timeout; test/support/bond_stall.py, the
    real bondpy on both sides): its side keeps the bond and keeps sending heartbeats, so the manager's side never
    sees it break (nav2_lifecycle_manager would reset every node it manages)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "test" / "support" / "bond_stall.py")],
        env=_env(workspace, pick_domain_id()),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "formed": True,
        "manager_broken": False,
        "node_formed": True,
    }, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
