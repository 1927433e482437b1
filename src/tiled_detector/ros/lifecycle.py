"""The managed (lifecycle) detector node: `detector_lifecycle_node`, for stacks that bring perception up with a
lifecycle manager (Nav2-style) or `ros2 lifecycle set`.

unconfigured -> configure: load (or build) the engine, create the publishers (a failure, e.g. a missing model,
returns FAILURE and logs the one-line reason) -> inactive -> activate: subscribe the cameras and detect ->
active -> deactivate: stop taking frames -> inactive -> cleanup: free the engine and its GPU memory ->
unconfigured; shutdown from any state ends the process cleanly. Parameters are those of the plain node.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from tiled_detector.errors import one_line
from tiled_detector.ros.node import NODE_NAME, DetectorNodeBase
from tiled_detector.ros.run import run_node


class DetectorLifecycleNode(DetectorNodeBase, LifecycleNode):
    """The detector as a managed node: starts unconfigured, each phase a lifecycle transition."""

    def __init__(self, argv: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.finished = False
        self._argv = argv  # the process's command line: its params files and -p values (None: sys.argv)
        self._declare()

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self._configure()
        except Exception as error:  # a bad parameter or model: stay unconfigured, say why in one line
            self._cleanup()
            self.get_logger().error(f"configure failed: {one_line(error)}")
            return TransitionCallbackReturn.FAILURE
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._activate()
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._deactivate()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._cleanup()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.shutdown()
        self.finished = True  # the process ends after this transition
        return TransitionCallbackReturn.SUCCESS

    def shutdown(self) -> None:
        """Stop taking frames and free the engine (whatever the state)."""
        self._deactivate()
        self._cleanup()


def main(args: Sequence[str] | None = None) -> int:
    """Run the managed node until its shutdown transition or Ctrl-C / SIGTERM (exit 0), 1 when it cannot start."""
    return run_node(DetectorLifecycleNode, NODE_NAME, args)


if __name__ == "__main__":
    sys.exit(main())
