"""What launching the node needs, without importing torch or a ROS client library: the Fast DDS profile and its variables, the node's parameters as launch arguments."""
