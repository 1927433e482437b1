"""What launching the node needs, without importing torch or a ROS client library: the Fast DDS profile and its variables, the node's parameters as launch arguments."""

from importlib import resources
from pathlib import Path

# the node's parameters as launch arguments (name, ROS type, description), generated from ros/params.PARAMS by
# `python -m tiled_detector.ros.params` (test_launch.py checks it is current; read by `arguments`)
LAUNCH_TABLE = Path(str(resources.files("tiled_detector") / "resources" / "launch_arguments.json"))
