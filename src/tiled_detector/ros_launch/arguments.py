"""The node's parameters as the launch file needs them, without heavy imports (no torch, no rclpy): a bringup that
includes `detector.launch.py` pays a few milliseconds for it, and works where torch is not importable by the
`ros2 launch` Python (a Jetson's venv).

`PARAMETERS` is the node's parameter table (`ros/params.PARAMS`: name, ROS type, description) as generated into
`resources/launch_arguments.json` (`LAUNCH_TABLE`) by `python -m tiled_detector.ros.params`: no written copy;
`test_launch.py` checks that the generated file is current.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable

import yaml

from tiled_detector.ros_launch import LAUNCH_TABLE

# (name, ROS parameter type, description) of every node parameter, in the node's order
PARAMETERS: tuple[tuple[str, str, str], ...] = tuple(
    (name, kind, description)
    for name, kind, description in json.loads(LAUNCH_TABLE.read_text(encoding="utf-8"))["parameters"]
)
TYPES = {name: kind for name, kind, _ in PARAMETERS}
SPELLING_CUTOFF = 0.85  # difflib ratio above which an unknown name is taken for a misspelt argument


def typed_flag(name: str, text: str) -> bool:
    """A true / false launch argument (any case)."""
    if text.lower() not in ("true", "false"):
        raise ValueError(f"launch argument {name} must be true or false, got {text!r}")
    return text.lower() == "true"


def typed(name: str, text: str) -> object:
    """A parameter's launch argument text as the parameter's type (arrays as YAML, e.g. [car, person] or
    [0, 0.4, 1, 1])."""
    kind = TYPES[name]
    if kind == "bool":
        return typed_flag(name, text)
    if kind.endswith("_array"):
        value = yaml.safe_load(text)
        item = float if kind == "double_array" else str
        try:
            return [item(v) for v in value] if isinstance(value, list) else text
        except (TypeError, ValueError):
            raise ValueError(f"launch argument {name} must be a list of numbers, got {text!r}") from None
    try:
        return {"integer": int, "double": float, "string": str}[kind](text)
    except ValueError:
        what = "an integer" if kind == "integer" else "a number"
        raise ValueError(f"launch argument {name} must be {what}, got {text!r}") from None


def check_spelling(given: Iterable[str], declared: Iterable[str]) -> None:
    """Refuse a given argument name that is not declared but near one that is (a typo), naming the nearest."""
    names = set(declared)
    for name in sorted(set(given) - names):
        nearest = difflib.get_close_matches(name, names, n=1, cutoff=SPELLING_CUTOFF)
        if nearest:
            raise ValueError(
                f"unknown launch argument {name!r}: did you mean {nearest[0]!r}? "
                "(`ros2 launch tiled_detector detector.launch.py --show-args` lists them)"
            )
