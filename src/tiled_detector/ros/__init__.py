"""The ROS 2 shell: message conversion and the node. Nothing outside this package imports rclpy."""

from tiled_detector.runtime.threads import short_spin

short_spin()  # the node's process: before its modules import torch
