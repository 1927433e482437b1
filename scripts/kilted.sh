#!/usr/bin/env bash
# The distro-dependent tests again on ROS 2 Kilted (Fast DDS 3; the main .venv is Jazzy, Fast DDS 2.14): transport and
# profiles, launch, lifecycle and bond, message info (the tests marked `distro`). A venv of its own, .venv-kilted at the
# repository root (git-ignored), made by scripts/setup.sh with TILED_DETECTOR_ROS_WHEELS=kilted (requirements/
# ros-kilted.txt, ros-build-kilted.txt) on first use and kept while its inputs are unchanged (setup.sh's stamp), like
# .venv-numpy1; test_ros_tools builds there the kilted set of ../shared/third_party (chosen from the venv's Fast DDS).
# Called by scripts/test.sh; arguments go to pytest. Where a ROS 2 distro is sourced (the ROS route) there are no PyPI
# wheels to compare with: the pass says so and is not run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-kilted"
if [[ -n "${ROS_DISTRO:-}" ]]; then
  printf '[kilted] ROS 2 %s is sourced: the kilted pass runs on the PyPI route only (not run)\n' "$ROS_DISTRO" >&2
  exit 0
fi
TILED_DETECTOR_VENV="$venv" TILED_DETECTOR_ROS_WHEELS=kilted "$root/scripts/setup.sh"
"$venv/bin/python" - <<'PY'
import rclpy
from tiled_detector.ros_launch.fastdds import installed_major
major = installed_major()
assert major == 3, f"the kilted pass runs Fast DDS {major}"
print(f"[kilted] rclpy from {rclpy.__file__.rsplit('/', 3)[0]}, Fast DDS {major}")
PY
cd "$root"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -m distro "$@" test/test_ros_harness.py \
  test/test_node_parts.py test/test_node.py test/test_ros_tools.py
