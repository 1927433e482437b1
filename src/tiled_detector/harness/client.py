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
from rcl_interfaces.srv import SetParameters
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image
from vision_msgs.msg import Detection2DArray

from tiled_detector.harness.bags import stamp_ns
from tiled_detector.harness.process import apply_ros_environment


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

    def set_parameters(self, node: str, values: dict[str, Any], timeout: float = 10.0) -> list[Any]:
        """Set parameters of another node through its `set_parameters` service; returns the SetParametersResults."""
        client = self.node.create_client(SetParameters, f"{node}/set_parameters")
        try:
            if not client.wait_for_service(timeout_sec=timeout):
                raise TimeoutError(f"{node}/set_parameters is not available")
            request = SetParameters.Request(
                parameters=[Parameter(name, value=value).to_parameter_msg() for name, value in values.items()]
            )
            future = client.call_async(request)
            if not self.wait_until(future.done, timeout):
                raise TimeoutError(f"{node}/set_parameters did not answer within {timeout} s")
            return list(future.result().results)
        finally:
            self.node.destroy_client(client)

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
