"""The multi-process ROS harness: isolated environment, node subprocess with a params file, DDS round trip."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tiled_detector.harness.process import (
    FASTDDS_PROFILE,
    NodeProcess,
    node_command,
    pick_domain_id,
    rcl_reads_discovery_range,
    ros_environment,
)
from tiled_detector.ros_launch.fastdds import installed_major

ECHO_NODE = (sys.executable, str(Path(__file__).parent / "support" / "echo_node.py"))


def _fake_ros(root: Path, fastdds: str, rcl: bytes) -> dict[str, str]:
    """An install prefix with a Fast DDS library named `fastdds` and a librcl.so holding `rcl`: its environment."""
    (root / "lib").mkdir(parents=True)
    (root / "lib" / fastdds).touch()
    (root / "lib" / "librcl.so").write_bytes(b"\x7fELF..." + rcl + b"...")
    return {"AMENT_PREFIX_PATH": str(root)}


# what the distros' librcl.so name (`strings`): Humble's reads ROS_LOCALHOST_ONLY only, Jazzy's both (and WARNs
# about the old one), Kilted's the new one only
HUMBLE_RCL = b"ROS_LOCALHOST_ONLY"
JAZZY_RCL = b"ROS_AUTOMATIC_DISCOVERY_RANGE\0ROS_LOCALHOST_ONLY is deprecated but still honored"
KILTED_RCL = b"ROS_AUTOMATIC_DISCOVERY_RANGE"


@pytest.mark.distro
def test_environment_isolates_and_enables_large_images() -> None:
    """This venv's ROS (Jazzy's or Kilted's wheels): discovery on this host by ROS_AUTOMATIC_DISCOVERY_RANGE, which
    its rcl reads, and no ROS_LOCALHOST_ONLY (Jazzy's rcl WARNs that it is deprecated, in front of the node's one
    line); the profile in the variables its Fast DDS reads (2.x: FASTRTPS_DEFAULT_PROFILES_FILE, XMLParserCommon.cpp
    at eProsima/Fast-DDS v2.14.5, and the new name too; 3: FASTDDS_DEFAULT_PROFILES_FILE only, v3.2.2: its
    rmw_fastrtps 9.3.3 warns about the old one in every process)."""
    env = ros_environment(42, base={"PATH": "/bin", "ROS_LOCALHOST_ONLY": "1"})
    assert env["ROS_DOMAIN_ID"] == "42"
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    assert rcl_reads_discovery_range(env) is True
    assert "ROS_LOCALHOST_ONLY" not in env
    assert env["RMW_IMPLEMENTATION"] == "rmw_fastrtps_cpp"
    major = installed_major(env)
    assert major in (2, 3)
    assert Path(env["FASTDDS_DEFAULT_PROFILES_FILE"]) == FASTDDS_PROFILE
    assert env.get("FASTRTPS_DEFAULT_PROFILES_FILE") == (str(FASTDDS_PROFILE) if major == 2 else None)
    assert "<segment_size>67108864</segment_size>" in FASTDDS_PROFILE.read_text()
    assert "<port_queue_capacity>4096</port_queue_capacity>" in FASTDDS_PROFILE.read_text()
    with pytest.raises(ValueError, match="ROS_DOMAIN_ID"):
        ros_environment(300)


def test_localhost_discovery_by_the_variable_the_rcl_found_reads(tmp_path: Path) -> None:
    """ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST everywhere; ROS_LOCALHOST_ONLY=1 only for an rcl that does not read
    the new variable (Humble), or where no rcl is found (both: no traffic leaves the host whatever runs)."""
    for name, rcl, localhost_only in (
        ("humble", HUMBLE_RCL, "1"),
        ("jazzy", JAZZY_RCL, None),
        ("kilted", KILTED_RCL, None),
    ):
        env = ros_environment(
            base={**_fake_ros(tmp_path / name, "libfastrtps.so.2", rcl), "ROS_LOCALHOST_ONLY": "1"}
        )
        assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST", name
        assert env.get("ROS_LOCALHOST_ONLY") == localhost_only, name
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    env = ros_environment(base={"AMENT_PREFIX_PATH": str(nothing)})
    assert rcl_reads_discovery_range(env) is None
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST" and env["ROS_LOCALHOST_ONLY"] == "1"


def test_the_profile_goes_in_the_variables_the_installed_fast_dds_reads(tmp_path: Path) -> None:
    """Fast DDS 2.x (Humble, Jazzy: libfastrtps.so.2) reads FASTRTPS_DEFAULT_PROFILES_FILE (XMLParserCommon.cpp at
    eProsima/Fast-DDS v2.6.10, v2.14.5): both names there; 3 only the new one. A profile the environment names in
    either variable is the one used (a Humble user's `export FASTRTPS_DEFAULT_PROFILES_FILE=mine.xml`)."""
    on_humble = _fake_ros(tmp_path / "opt" / "ros" / "humble", "libfastrtps.so.2.6.10", HUMBLE_RCL)
    env = ros_environment(base=on_humble)
    assert (
        env["FASTRTPS_DEFAULT_PROFILES_FILE"] == env["FASTDDS_DEFAULT_PROFILES_FILE"] == str(FASTDDS_PROFILE)
    )
    for name in ("FASTRTPS_DEFAULT_PROFILES_FILE", "FASTDDS_DEFAULT_PROFILES_FILE"):
        env = ros_environment(base={**on_humble, name: "/mine.xml"})
        assert env["FASTRTPS_DEFAULT_PROFILES_FILE"] == env["FASTDDS_DEFAULT_PROFILES_FILE"] == "/mine.xml"
    both = {"FASTRTPS_DEFAULT_PROFILES_FILE": "/a.xml", "FASTDDS_DEFAULT_PROFILES_FILE": "/b.xml"}
    assert {k: ros_environment(base={**on_humble, **both})[k] for k in both} == both
    # Kilted's (Fast DDS 3): the new name only, a user's old one taken as the profile to use
    on_kilted = _fake_ros(tmp_path / "opt" / "ros" / "kilted", "libfastdds.so.3.2.2", KILTED_RCL)
    env = ros_environment(base={**on_kilted, "FASTRTPS_DEFAULT_PROFILES_FILE": "/mine.xml"})
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == "/mine.xml"


def test_domain_ids_stay_in_range() -> None:
    assert all(1 <= pick_domain_id(seed) <= 100 for seed in range(500))


def test_node_command_passes_ros_args() -> None:
    cmd = node_command(
        "p.yaml",
        {"conf_threshold": 0.5, "full_frame": False, "model": "", "classes": ["a", "b"]},
        {"image": "/cam"},
    )
    assert cmd[1:3] == ["-m", "tiled_detector.ros.node"]
    assert cmd[3:6] == ["--ros-args", "--params-file", "p.yaml"]
    assert "conf_threshold:=0.5" in cmd
    assert "full_frame:=false" in cmd
    assert "model:=''" in cmd
    assert "classes:=['a', 'b']" in cmd
    assert cmd[-2:] == ["-r", "image:=/cam"]


@pytest.mark.ros
@pytest.mark.distro
def test_1080p_image_round_trip_between_processes(tmp_path: Path) -> None:
    """One process publishes a 1920x1080 rgb8 image; another answers with a Detection2DArray built from it."""
    from tiled_detector.harness.client import DetectorClient
    from tiled_detector.messages.detections import msg_to_detections
    from tiled_detector.messages.images import array_to_imgmsg

    params = tmp_path / "echo.yaml"
    params.write_text("echo_detector:\n  ros__parameters:\n    threshold: 250\n")
    domain = pick_domain_id()
    frame = np.full((1080, 1920, 3), 40, np.uint8)
    frame[500:540, 1000:1064] = 255
    frame[100:110, 100:110] = 240  # below the params file's threshold: must be ignored
    with (
        NodeProcess(params, domain_id=domain, program=ECHO_NODE) as node,
        DetectorClient(domain_id=domain) as client,
    ):
        assert client.wait_for_node(timeout=20), node.log_text()
        msg = array_to_imgmsg(frame, "rgb8")
        msg.header.frame_id = "camera_optical"
        msg.header.stamp.sec, msg.header.stamp.nanosec = 123, 456
        reply = None
        started = time.monotonic()
        # best-effort images may be lost before discovery fully settles: resend until answered
        while reply is None and time.monotonic() - started < 20:
            client.publish(msg)
            reply = client.wait_for_stamp(123 * 1_000_000_000 + 456, timeout=1.0)
        assert reply is not None, node.log_text()
        assert reply.header.frame_id == "camera_optical"
        boxes, scores, class_ids = msg_to_detections(reply, ["bright"])
        np.testing.assert_array_equal(boxes, [[1000, 500, 1064, 540]])
        assert scores.tolist() == [1.0]
        assert class_ids.tolist() == [0]
        assert time.monotonic() - started < 10
    assert node.returncode == 0, node.log_text()


def test_node_process_dies_with_its_parent(tmp_path: Path) -> None:
    """A `demo` / `replay` killed with SIGKILL leaves no node behind (Linux parent-death signal)."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from tiled_detector.harness.process import NodeProcess\n"
            "node = NodeProcess(program=(sys.executable, '-c', 'import time; time.sleep(120)')).start()\n"
            "print(node.process.pid, flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    assert Path(f"/proc/{child}").exists()
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, os.WNOHANG)  # (not our child: only reaped by init)
        time.sleep(0.1)
    state = Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}").exists() else "gone"
    assert state in ("gone", "Z"), state
