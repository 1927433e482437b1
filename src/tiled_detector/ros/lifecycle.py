"""The managed (lifecycle) detector node: `detector_lifecycle_node`, for stacks that bring perception up with a
lifecycle manager (nav2_lifecycle_manager) or `ros2 lifecycle set`.

unconfigured -> configure: load (or build) the engine, create the publishers (a failure, e.g. a missing model,
returns FAILURE and logs the one-line reason) -> inactive -> activate: subscribe the cameras, detect, enable the
lifecycle publishers and form the bond with the lifecycle manager (`ros/bond.py`) -> active -> deactivate: break
the bond, stop taking frames -> inactive -> cleanup: free the engine and its GPU memory -> unconfigured; shutdown
from any state ends the process cleanly. A transition that raises is logged (one line) and handled by `on_error`,
which frees everything (bond, worker, engine) and leaves the node unconfigured, ready to configure again.

Parameters are those of the plain node, and `bond_heartbeat_period`; the ones the plain node fixes at start
(`model`, `backend`, `device`, `precision`, ...) can be set while the node is unconfigured (cleanup, set,
configure again) and are refused while it is configured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, ParameterDescriptor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from tiled_detector.ros.bond import HEARTBEAT_PERIOD_S, PERIOD_PARAMETER, ManagerBond
from tiled_detector.ros.node import NODE_NAME, DetectorNodeBase
from tiled_detector.ros.run import run_node
from tiled_detector.runtime.errors import one_line

PERIOD_DESCRIPTOR = ParameterDescriptor(
    description="seconds between the heartbeats of the bond formed with a lifecycle manager on activate "
    "(nav2_lifecycle_manager's; Nav2's nodes use 0.1); <= 0: no bond",
    floating_point_range=[FloatingPointRange(from_value=-1.0, to_value=10.0)],
)


class DetectorLifecycleNode(DetectorNodeBase, LifecycleNode):
    """The detector as a managed node: starts unconfigured, each phase a lifecycle transition."""

    MANAGED = True

    def __init__(self, argv: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.finished = False
        self._argv = argv  # the process's command line: its params files and -p values (None: sys.argv)
        self.declare_parameter(PERIOD_PARAMETER, HEARTBEAT_PERIOD_S, PERIOD_DESCRIPTOR)
        self._declare()
        self.bond = ManagerBond(self)

    def output_publisher(self, msg_type: Any, topic: str, qos: Any, **kwargs: Any) -> Any:
        """Output publishers publish only while the node is active."""
        return self.create_lifecycle_publisher(msg_type, topic, qos, **kwargs)

    def destroy_output(self, publisher: Any) -> None:
        self.destroy_lifecycle_publisher(publisher)

    def _transition(self, name: str, step: Callable[[], None]) -> TransitionCallbackReturn:
        """Run a transition's work; an exception is logged in one line and is an ERROR (then `on_error`)."""
        try:
            step()
        except Exception as error:
            self.get_logger().error(f"{name} failed: {one_line(error)}")
            return TransitionCallbackReturn.ERROR
        return TransitionCallbackReturn.SUCCESS

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self._configure()
        except Exception as error:  # a bad parameter or model: stay unconfigured, say why in one line
            self._cleanup()
            self.get_logger().error(f"configure failed: {one_line(error)}")
            return TransitionCallbackReturn.FAILURE
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        done = self._transition("activate", self._activate)
        if done == TransitionCallbackReturn.SUCCESS:
            done = super().on_activate(state)  # the lifecycle publishers
        if done == TransitionCallbackReturn.SUCCESS:
            done = self._transition("activate", self._announce)
        return done

    def _announce(self) -> None:
        """Say what the detections mean (VisionInfo, LabelInfo) and form the bond with a lifecycle manager."""
        self._publish_info()
        self.bond.form(self.get_parameter(PERIOD_PARAMETER).value)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.bond.release()
        done = self._transition("deactivate", self._deactivate)
        return super().on_deactivate(state) if done == TransitionCallbackReturn.SUCCESS else done

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._transition("cleanup", self._cleanup)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.shutdown()
        self.finished = True  # the process ends after this transition
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """A transition failed with an error: free everything (bond, worker, engine); the node is unconfigured."""
        self.get_logger().error(
            f"a transition from {state.label} failed: the engine is freed, the node unconfigured"
        )
        self.shutdown()
        return TransitionCallbackReturn.SUCCESS

    def shutdown(self) -> None:
        """Break the bond, stop taking frames and free the engine (whatever the state)."""
        self.bond.release()
        self._deactivate()
        self._cleanup()


def main(args: Sequence[str] | None = None) -> int:
    """Run the managed node until its shutdown transition or Ctrl-C / SIGTERM (exit 0), 1 when it cannot start."""
    return run_node(DetectorLifecycleNode, NODE_NAME, args)


if __name__ == "__main__":
    sys.exit(main())
