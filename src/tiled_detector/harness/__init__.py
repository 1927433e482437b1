"""The test and tool harness next to `ros/`: bags (rosbags), recording frame sources into bags, replaying bags
through the node and scoring its answers, node processes in an isolated DDS environment, an in-process ROS peer.
The core never imports it."""
