"""The node's parameters: the detector's (`tiled_detector.parameters`, derived from `DetectorConfig`) and the
node's own (transport, QoS, diagnostics, output format), as rcl descriptors.

Read-only parameters are fixed when the node starts (a new engine is needed); the rest change at runtime and
apply from the next frame. `config/detector.yaml` documents the same table (a test compares them).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType

from tiled_detector.parameters import DETECTOR_PARAMETERS
from tiled_detector.ros_launch import LAUNCH_TABLE
from tiled_detector.settings.kinds import Choice, Names, Number, Parameter, ParamType
from tiled_detector.settings.options import Option

_TYPES = {
    ParamType.BOOL: ParameterType.PARAMETER_BOOL,
    ParamType.INTEGER: ParameterType.PARAMETER_INTEGER,
    ParamType.DOUBLE: ParameterType.PARAMETER_DOUBLE,
    ParamType.STRING: ParameterType.PARAMETER_STRING,
    ParamType.STRING_ARRAY: ParameterType.PARAMETER_STRING_ARRAY,
    ParamType.DOUBLE_ARRAY: ParameterType.PARAMETER_DOUBLE_ARRAY,
}


class Transport(Option):
    """Which image topic the node subscribes."""

    RAW = "raw"
    COMPRESSED = "compressed"


class Reliability(Option):
    """QoS reliability of the image subscription."""

    BEST_EFFORT = "best_effort"
    RELIABLE = "reliable"


class OutputFormat(Option):
    """What the published class_id holds."""

    LABELS = "labels"
    IDS = "ids"


NODE_PARAMETERS: tuple[Parameter, ...] = (
    Parameter(
        "transport",
        Choice(option=Transport),
        "raw",
        "raw subscribes `image`; compressed subscribes `image/compressed`",
        True,
    ),
    Parameter(
        "image_reliability",
        Choice(option=Reliability),
        "best_effort",
        "QoS reliability of the image subscription (depth 1)",
        True,
    ),
    Parameter("diagnostics_period", Number(0.1, 60.0), 1.0, "seconds between /diagnostics messages", True),
    Parameter(
        "cameras",
        Names(),
        None,
        "image topics of several cameras, detected together in one engine batch; "
        "each publishes <its namespace>/detections; empty = the one `image` input",
        True,
    ),
    Parameter(
        "output_format",
        Choice(option=OutputFormat),
        "labels",
        "class_id field: label names (labels) or numeric ids (ids)",
        False,
    ),
)

PARAMS: tuple[Parameter, ...] = DETECTOR_PARAMETERS + NODE_PARAMETERS
BY_NAME: Mapping[str, Parameter] = {p.name: p for p in PARAMS}


def launch_table() -> dict[str, Any]:
    """What `ros_launch.arguments` reads (`resources/launch_arguments.json`, generated from `PARAMS` by
    `python -m tiled_detector.ros.params`): every parameter's name, ROS type and description, in order."""
    return {
        "generated_by": "python -m tiled_detector.ros.params (from ros/params.PARAMS; do not edit)",
        "parameters": [[p.name, p.param_type.value, p.description] for p in PARAMS],
    }


def write_launch_table(path: Path = LAUNCH_TABLE) -> Path:
    """Write `launch_table()` to `path` (a temporary file renamed over it: never half-written)."""
    table = launch_table()
    rows = ",\n".join(f"  {json.dumps(row, ensure_ascii=False)}" for row in table["parameters"])
    text = f'{{\n "generated_by": {json.dumps(table["generated_by"])},\n "parameters": [\n{rows}\n ]\n}}\n'
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8"
    ) as out:
        out.write(text)
    os.replace(out.name, path)
    return path


def descriptor(param: Parameter) -> ParameterDescriptor:
    """The rcl descriptor: type, description, choices in the constraints text, numeric range, read-only."""
    kind = param.value_type
    result = ParameterDescriptor(
        name=param.name,
        type=_TYPES[param.param_type],
        description=param.description,
        read_only=param.read_only,
        additional_constraints=f"one of: {', '.join(param.choices)}" if param.choices else "",
        # lists: `[]` from the command line is typed as an empty bool array; names or ids are both fine
        dynamic_typing=param.dynamic,
    )
    if param.min_value is not None and kind is int:
        result.integer_range = [IntegerRange(from_value=int(param.min_value), to_value=int(param.max_value))]
    elif param.min_value is not None and kind is float:
        result.floating_point_range = [
            FloatingPointRange(from_value=float(param.min_value), to_value=float(param.max_value))
        ]
    return result


def declared_value(param: Parameter) -> Any:
    """The value to declare: the default; lists that are 'not set' by default are declared empty (a parameter
    left unset would empty rclpy's batched get, and so `ros2 param dump`)."""
    if param.default is None:
        return [] if param.value_type is list else ""
    return param.default


USAGE = """usage: detector_node [--ros-args --params-file FILE -p NAME:=VALUE -r image:=TOPIC ...]

The tiled_detector node: subscribes `image` (sensor_msgs/Image; `image/compressed` with transport:=compressed),
publishes `detections` (vision_msgs/Detection2DArray), `debug_image` and /diagnostics.
Usually started with `ros2 launch tiled_detector detector.launch.py image:=/camera/image_raw`.

parameters (ro = read-only, fixed at start; the others change at runtime with `ros2 param set`):
""" + "\n".join(
    f"  {p.name:<20} {'' if p.default is None else repr(p.default):<14} {'(ro) ' if p.read_only else ''}"
    f"{p.description}"
    for p in PARAMS
)


if __name__ == "__main__":
    print(f"wrote {write_launch_table()}")
