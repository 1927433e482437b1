"""The ROS 2 shell: message conversion and the node. Nothing outside this package imports rclpy."""
