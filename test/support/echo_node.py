"""A minimal ROS 2 node for the harness test: finds the bright square in each image and publishes it.

It exercises the same message conversion and transport as the detector node without loading a model:
`image` (sensor_msgs/Image, best effort) in, `detections` (vision_msgs/Detection2DArray) out.
"""

from __future__ import annotations

import sys

import numpy as np
import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from vision_msgs.msg import Detection2DArray

from tiled_detector.messages.detections import detections_to_msg
from tiled_detector.messages.images import imgmsg_to_array


class EchoNode(Node):
    """Publishes the bounding box of the pixels brighter than the `threshold` parameter as class 'bright' (with the
    `rotated` parameter: their minimum-area rectangle, center.theta its angle)."""

    def __init__(self) -> None:
        super().__init__("echo_detector")
        self.threshold = self.declare_parameter("threshold", 200).value
        self.rotated = self.declare_parameter("rotated", False).value
        self.publisher = self.create_publisher(Detection2DArray, "detections", 10)
        self.create_subscription(Image, "image", self.on_image, qos_profile_sensor_data)

    def on_image(self, msg: Image) -> None:
        frame, _ = imgmsg_to_array(msg)
        ys, xs = np.nonzero(frame.min(axis=2) > self.threshold)
        boxes = (
            np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)
            if len(xs)
            else np.zeros((0, 4))
        )
        obb = None
        if self.rotated and len(xs):
            import cv2

            # pixel centres: a pixel (x, y) spans [x, x + 1], so its rectangle is half a pixel larger on each side
            (cx, cy), (w, h), degrees = cv2.minAreaRect(np.stack([xs, ys], 1).astype(np.float32))
            obb = np.array([[cx + 0.5, cy + 0.5, w + 1, h + 1, np.radians(degrees)]])
        self.publisher.publish(
            detections_to_msg(
                boxes, np.ones(len(boxes)), np.zeros(len(boxes)), msg.header, ["bright"], obb=obb
            )
        )


def main() -> int:
    rclpy.init()
    node = EchoNode()
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
