"""`tiled-detector env`: versions without heavy imports, text and JSON, works from a bare source tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiled_detector.commands import env

SRC = Path(__file__).parents[1] / "src"


def run_env(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys; from tiled_detector.cli import main; rc = main(sys.argv[1:]); "
        "heavy = [m for m in ('torch', 'tensorrt', 'tensorrt_lean_bindings', 'rclpy', 'onnxruntime') "
        "if m in sys.modules]; print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)"
    )
    environ = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-c", code, "env", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )


def test_json_report_without_importing_heavy_modules() -> None:
    proc = run_env("--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert report["packages"]["numpy"]["version"] == __import__("numpy").__version__
    assert report["packages"]["tiled_detector"]["version"]
    assert report["tensorrt"]["module"] in env.TENSORRT_MODULES
    # the profile to export for the camera driver / ros2 bag play: the one the node's launch file sets
    from tiled_detector.ros_launch.fastdds import FASTDDS_PROFILE

    assert report["fastdds_profile"] == str(FASTDDS_PROFILE) and Path(report["fastdds_profile"]).is_file()
    assert "HEAVY []" in proc.stderr


def test_text_table_lists_every_component() -> None:
    proc = run_env()
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    for component in [*env.PACKAGES, "python", "tensorrt"]:
        assert component in names


def test_version_read_from_source(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\n__version__ = '10.3.0.30'\ncuda: Optional[str] = '12.6'\n")
    assert env._version_in_source(tmp_path / "m.py") == "10.3.0.30"
    assert env._version_in_source(tmp_path / "m.py", "cuda") == "12.6"
    assert env._version_in_source(tmp_path / "missing.py") is None


def test_ros_package_version_from_the_ament_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    share = tmp_path / "share" / "vision_msgs"
    share.mkdir(parents=True)
    (share / "package.xml").write_text("<package><name>vision_msgs</name><version>4.1.1</version></package>")
    monkeypatch.setenv("AMENT_PREFIX_PATH", f"/nonexistent{os.pathsep}{tmp_path}")
    assert env._ament_version("vision_msgs") == "4.1.1"
    assert env._ament_version("rclpy") is None


def test_gpu_info_parses_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    class Done:
        stdout = "NVIDIA H200, 570.86, 9.0, 143771 MiB\n"

    monkeypatch.setattr(env.subprocess, "run", lambda *a, **k: Done())
    assert env.gpu_info() == [
        {
            "name": "NVIDIA H200",
            "driver_version": "570.86",
            "compute_cap": "9.0",
            "memory.total": "143771 MiB",
        }
    ]
    table = env.format_table({**env.collect(), "gpus": env.gpu_info()})
    assert "gpu 0" in table and "compute_cap=9.0" in table


def test_the_processor_is_named_with_the_cores_this_process_may_use(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    (tmp_path / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
    )
    assert env.cpu_name(tmp_path / "cpuinfo") == f"AMD EPYC 7B13, {cores} cores"
    assert env.cpu_name(tmp_path / "missing").endswith(f", {cores} cores")  # platform's name instead
    assert env.collect()["platform"]["cpu"] == env.cpu_name()
