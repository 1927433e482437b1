"""ROS 2 message formats <-> numpy arrays (sensor_msgs images, vision_msgs detections), without rclpy: used by the
node, the harness and the tools alike."""
