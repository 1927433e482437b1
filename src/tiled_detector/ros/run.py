"""Running a detector node as a process: `ros2 run` / `python -m` entry points share this."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from tiled_detector.ros.params import USAGE
from tiled_detector.runtime.errors import one_line
from tiled_detector.runtime.threads import follow_load

SPIN_WAKE_S = 0.25  # the executor wakes at least this often (wall clock), so Ctrl-C never waits on sim time


def run_node(node_type: Callable[..., Any], name: str, args: Sequence[str] | None = None) -> int:
    """Run the node until Ctrl-C / SIGTERM (or a managed node's shutdown transition): exit 0 after a clean
    shutdown, 1 when the node cannot start."""
    follow_load()  # the node's process: torch's CPU threads follow the host's load
    argv = list(sys.argv if args is None else args)
    ros_args_at = argv.index("--ros-args") if "--ros-args" in argv else len(argv)
    if {"-h", "--help"} & set(argv[1:ros_args_at]):
        print(USAGE)
        return 0
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except RuntimeError as error:  # rclpy's RCLError: unreadable params file or --ros-args
        print(f"[{name}] cannot start: {error}", file=sys.stderr)
        return 1
    # Ctrl-C / SIGTERM end the node, also when started from a background job (which inherits SIGINT ignored),
    # as rclpy's own handlers do; launch stops nodes with SIGINT
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    node: Any = None
    try:
        try:
            node = node_type(argv=argv)
        except Exception as error:  # the process boundary: one line (bad parameter, model, backend, device)
            if os.environ.get("TILED_DETECTOR_DEBUG"):
                traceback.print_exc()
            print(f"[{name}] cannot start: {one_line(error)}", file=sys.stderr)
            return 1
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        # a wall-clock wake-up: Ctrl-C is handled even while sim time stands still
        while rclpy.ok() and not node.finished:
            executor.spin_once(timeout_sec=SPIN_WAKE_S)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        # a second signal (launch forwards SIGINT to a process that got the group's) must not cut the cleanup
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        if node is not None:
            node.shutdown()
            node.destroy_node()
        rclpy.try_shutdown()
    return 0
