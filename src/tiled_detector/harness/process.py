"""Run the detector node as a real process with an isolated, large-image-ready ROS 2 environment.

Used by the tests, `tiled-detector demo` and `tiled-detector replay`. Imports no rclpy itself, so it can
prepare the environment before rclpy is loaded in this process.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tiled_detector.ros_launch.fastdds import FASTDDS_PROFILE, ros_library_folders, with_profile

# the variable Iron's and later rcl read (`rcl/src/rcl/discovery_options.c`); Humble's reads only ROS_LOCALHOST_ONLY,
# which Jazzy's rcl WARNs is deprecated (in every process that has it set) and Kilted's no longer reads
DISCOVERY_RANGE = "ROS_AUTOMATIC_DISCOVERY_RANGE"
LOCALHOST_ONLY = "ROS_LOCALHOST_ONLY"


@functools.cache
def _names_discovery_range(library: Path) -> bool:
    return DISCOVERY_RANGE.encode() in library.read_bytes()


def rcl_reads_discovery_range(env: Mapping[str, str] | None = None) -> bool | None:
    """Whether the rcl that `env` finds (`fastdds.ros_library_folders`) reads ROS_AUTOMATIC_DISCOVERY_RANGE: its
    library names the variable (Iron and later) or not (Humble); None where no librcl.so is found."""
    libraries = [
        folder / "librcl.so" for folder in ros_library_folders(env) if (folder / "librcl.so").is_file()
    ]
    return any(_names_discovery_range(library) for library in libraries) if libraries else None


def ros_environment(domain_id: int | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a ROS 2 process: Fast DDS with the large-image profile (in the variables the Fast DDS found
    reads: `fastdds.with_profile`; one already set names it for both), discovery on this host only.

    `ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST` is set, and `ROS_LOCALHOST_ONLY=1` only where the rcl found does not
    read the former (Humble; unknown: both), so that no DDS traffic leaves the host and no rcl WARNs about the
    deprecated variable (`rcl_reads_discovery_range`). An explicit `domain_id` isolates concurrent runs.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    with_profile(env, FASTDDS_PROFILE)
    env.setdefault("AMENT_PREFIX_PATH", sys.prefix)
    env[DISCOVERY_RANGE] = "LOCALHOST"
    if rcl_reads_discovery_range(env):
        env.pop(LOCALHOST_ONLY, None)
    else:
        env[LOCALHOST_ONLY] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if domain_id is not None:
        if not 0 <= domain_id <= 101:
            raise ValueError(f"ROS_DOMAIN_ID must be in [0, 101] for Fast DDS on Linux, got {domain_id}")
        env["ROS_DOMAIN_ID"] = str(domain_id)
    return env


def apply_ros_environment(domain_id: int | None = None) -> None:
    """Set `ros_environment()` in this process (call before rclpy creates its first context)."""
    env = ros_environment(domain_id)
    os.environ.update(env)
    if LOCALHOST_ONLY not in env:
        os.environ.pop(LOCALHOST_ONLY, None)


def pick_domain_id(seed: int | None = None) -> int:
    """A domain id in [1, 100] that differs between concurrently running processes."""
    value = os.getpid() if seed is None else seed
    return 1 + (value * 7919 + time.monotonic_ns() // 1_000_000) % 100


def _libc_prctl() -> Any:
    """libc's prctl, resolved here in the parent: a child must not load libraries between fork and exec."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child before exec: ask Linux to send it SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG), so a
    killed `demo` / `replay` leaves no orphaned node behind. Only a call through the pre-resolved function."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


DETECTOR_NODE = (sys.executable, "-m", "tiled_detector.ros.node")


def node_command(
    params_file: str | Path | None = None,
    parameters: Mapping[str, object] | None = None,
    remaps: Mapping[str, str] | None = None,
    log_level: str | None = None,
    program: Sequence[str] = DETECTOR_NODE,
) -> list[str]:
    """The command line that starts a node program (default: the detector node) with `--ros-args`."""
    cmd = [*program, "--ros-args"]
    if params_file is not None:
        cmd += ["--params-file", str(params_file)]
    for name, value in (parameters or {}).items():
        cmd += ["-p", f"{name}:={_param_literal(value)}"]
    for source, target in (remaps or {}).items():
        cmd += ["-r", f"{source}:={target}"]
    if log_level:
        cmd += ["--log-level", log_level]
    return cmd


def _param_literal(value: object) -> str:
    """A value as rcl's `-p name:=value` YAML parser reads it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'" if value else "''"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_param_literal(v) for v in value) + "]"
    return str(value)


class NodeProcess:
    """The detector node in its own process; a context manager that stops it with SIGINT (like Ctrl-C).

    Output goes to a temporary log file (`.log_text()`), so a chatty node can never block on a full pipe.
    """

    def __init__(
        self,
        params_file: str | Path | None = None,
        parameters: Mapping[str, object] | None = None,
        remaps: Mapping[str, str] | None = None,
        domain_id: int | None = None,
        log_level: str | None = None,
        program: Sequence[str] = DETECTOR_NODE,
    ) -> None:
        self.command = node_command(params_file, parameters, remaps, log_level, program)
        self.env = ros_environment(domain_id)
        self._log = tempfile.NamedTemporaryFile(prefix="tiled_detector_node_", suffix=".log", delete=False)  # noqa: SIM115
        self.process: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._final_log: str | None = None

    def start(self) -> NodeProcess:
        """Start the node process (on Linux it gets SIGTERM when this process dies, even by SIGKILL)."""
        self.process = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent if _PRCTL is not None else None,  # noqa: PLW1509
        )
        return self

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> int:
        """Send SIGINT, wait for a clean exit (SIGKILL after `timeout`), return the exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.returncode = self.process.returncode
        return self.returncode

    def log_text(self) -> str:
        """Everything the node printed so far (kept after the context exits)."""
        if self._final_log is not None:
            return self._final_log
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def __enter__(self) -> NodeProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._final_log = self.log_text()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)
