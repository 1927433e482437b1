"""An in-process ROS 2 peer of the detector node: publishes images, collects replies, with timeouts.

Used by `tiled-detector demo`, `tiled-detector replay` and the multi-process tests. It owns its own rclpy
context (so it never disturbs a caller's) and spins it on a background thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import rclpy
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rcl_interfaces.srv import GetParameters, SetParameters
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image
from vision_msgs.msg import Detection2DArray

from tiled_detector.harness.process import apply_ros_environment
from tiled_detector.messages.images import stamp_ns


def reliable_qos(depth: int = 10) -> QoSProfile:
    """Reliable, keep-last QoS."""
    return QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)


class DetectorClient:
    """Talks to a detector node over DDS: image publisher, detections subscriber, optional extra topics."""

    def __init__(
        self,
        domain_id: int | None = None,
        image_topic: str = "image",
        detections_topic: str = "detections",
        image_reliable: bool = False,
        compressed: bool = False,
        node_name: str = "tiled_detector_client",
    ) -> None:
        apply_ros_environment(domain_id)
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(node_name, context=self.context)
        image_qos = reliable_qos(1) if image_reliable else qos_profile_sensor_data
        self.image_publisher = self.node.create_publisher(
            CompressedImage if compressed else Image, image_topic, image_qos
        )
        self._lock = threading.Condition()
        self.detections: dict[int, Detection2DArray] = {}
        self.arrivals: dict[int, float] = {}
        self._extra: dict[str, list[Any]] = {}
        self.detections_subscription = self.node.create_subscription(
            Detection2DArray, detections_topic, self._on_detections, reliable_qos(100)
        )
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, name="detector-client", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        with contextlib.suppress(ExternalShutdownException):
            self.executor.spin()

    def _on_detections(self, msg: Detection2DArray) -> None:
        with self._lock:
            key = stamp_ns(msg.header.stamp)
            self.detections[key] = msg
            self.arrivals[key] = time.monotonic()
            self._lock.notify_all()

    def subscribe(self, msg_type: type, topic: str, qos: QoSProfile | None = None) -> list[Any]:
        """Collect every message of another topic into the returned list."""
        received: list[Any] = []

        def collect(msg: Any) -> None:
            with self._lock:
                received.append(msg)
                self._lock.notify_all()

        self.node.create_subscription(msg_type, topic, collect, qos or reliable_qos(10))
        self._extra[topic] = received
        return received

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait (up to `timeout` seconds) until `predicate()` holds; it is evaluated under the client's lock."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.05))
        return True

    def wait_for_node(self, timeout: float = 20.0) -> bool:
        """Wait until the node subscribes to our images and publishes detections to us (DDS matched)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (
                self.image_publisher.get_subscription_count() > 0
                and self.detections_subscription.get_publisher_count() > 0
            ):
                return True
            time.sleep(0.05)
        return False

    def publish(self, msg: Any) -> None:
        """Publish an image message, or its serialized bytes (as read from a bag) without decoding."""
        self.image_publisher.publish(msg)

    def wait_for_stamp(self, stamp: int, timeout: float) -> Detection2DArray | None:
        """The detections whose header stamp equals `stamp` (ns), waiting up to `timeout` seconds."""
        self.wait_until(lambda: stamp in self.detections, timeout)
        with self._lock:
            return self.detections.get(stamp)

    def call(
        self,
        service_type: type,
        name: str,
        request: Any,
        timeout: float = 10.0,
        resend_s: float | None = None,
    ) -> Any:
        """Call service `name` and return its response (TimeoutError when it is absent or does not answer).
        `resend_s` sends an idempotent request again after that many seconds without an answer (a response can
        be lost while DDS is still matching the reply topic of a new client)."""
        client = self.node.create_client(service_type, name)
        deadline = time.monotonic() + timeout
        try:
            if not client.wait_for_service(timeout_sec=timeout):
                raise TimeoutError(f"{name} is not available")
            while True:
                future = client.call_async(request)
                wait = deadline - time.monotonic() if resend_s is None else resend_s
                if self.wait_until(future.done, max(0.0, min(wait, deadline - time.monotonic()))):
                    return future.result()
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{name} did not answer within {timeout} s")
        finally:
            self.node.destroy_client(client)

    def set_parameters(self, node: str, values: dict[str, Any], timeout: float = 10.0) -> list[Any]:
        """Set parameters of another node through its `set_parameters` service; returns the SetParametersResults."""
        request = SetParameters.Request(
            parameters=[Parameter(name, value=value).to_parameter_msg() for name, value in values.items()]
        )
        return list(self.call(SetParameters, f"{node}/set_parameters", request, timeout).results)

    def get_parameters(self, node: str, names: list[str], timeout: float = 10.0) -> list[Any]:
        """Values of parameters of another node through its `get_parameters` service."""
        response = self.call(
            GetParameters, f"{node}/get_parameters", GetParameters.Request(names=names), timeout
        )
        return [parameter_value_to_python(value) for value in response.values]

    def lifecycle(self, node: str, transition: str | None = None, timeout: float = 60.0) -> str | bool:
        """A managed node's state label, or whether a `transition` reached its state.

        The labels: "unconfigured", "inactive", "active", ...; the transitions: "configure", "activate",
        "deactivate", "cleanup", "shutdown" (the state checked with get_state when the change_state reply is lost)."""
        if transition is None:
            return self.call(
                GetState, f"{node}/get_state", GetState.Request(), timeout, resend_s=3.0
            ).current_state.label
        if transition == "shutdown":  # one shutdown transition per state it leaves: ask which state first
            transition_id = {
                "unconfigured": Transition.TRANSITION_UNCONFIGURED_SHUTDOWN,
                "inactive": Transition.TRANSITION_INACTIVE_SHUTDOWN,
                "active": Transition.TRANSITION_ACTIVE_SHUTDOWN,
            }[self.lifecycle(node, timeout=timeout)]
        else:
            transition_id = {
                "configure": Transition.TRANSITION_CONFIGURE,
                "activate": Transition.TRANSITION_ACTIVATE,
                "deactivate": Transition.TRANSITION_DEACTIVATE,
                "cleanup": Transition.TRANSITION_CLEANUP,
            }[transition]
        goal = {
            "configure": "inactive",
            "activate": "active",
            "deactivate": "inactive",
            "cleanup": "unconfigured",
            "shutdown": "finalized",
        }[transition]
        request = ChangeState.Request(transition=Transition(id=transition_id))
        try:
            return bool(self.call(ChangeState, f"{node}/change_state", request, timeout=10.0).success)
        except TimeoutError:  # the reply was lost (or the node ended with its shutdown transition)
            try:
                return self.lifecycle(node, timeout=10.0) == goal
            except TimeoutError:
                return transition == "shutdown"

    def close(self) -> None:
        """Stop spinning and release the context."""
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self._thread.join(timeout=5)

    def __enter__(self) -> DetectorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
