"""The node's parameters, declared from one table: type, default, description, range, read-only.

Parameters that need a new engine (model, backend, device, precision, ...) are read-only; the rest change at
runtime and are applied from the next frame. `config/detector.yaml` documents the same table.
"""

from __future__ import annotations

import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType

from tiled_detector.decode import OutputLayout

_TYPES = {
    bool: ParameterType.PARAMETER_BOOL,
    int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE,
    str: ParameterType.PARAMETER_STRING,
    list: ParameterType.PARAMETER_STRING_ARRAY,
}


@dataclass(frozen=True)
class Param:
    """One declared parameter."""

    name: str
    default: Any
    description: str
    read_only: bool = False
    choices: tuple[str, ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    kind: type | None = None  # for parameters whose default is None (declared by type, "not set")

    @property
    def value_type(self) -> type:
        """Python type of the parameter's values."""
        return self.kind or type(self.default)

    def descriptor(self) -> ParameterDescriptor:
        """The rcl descriptor: type, description, choices in the constraints text, numeric range, read-only."""
        kind = self.value_type
        descriptor = ParameterDescriptor(
            name=self.name,
            type=_TYPES[kind],
            description=self.description,
            read_only=self.read_only,
            additional_constraints=f"one of: {', '.join(self.choices)}" if self.choices else "",
            # lists: `[]` from the command line is typed as an empty bool array; names or ids are both fine
            dynamic_typing=kind is list,
        )
        if self.min_value is not None and kind is int:
            descriptor.integer_range = [
                IntegerRange(from_value=int(self.min_value), to_value=int(self.max_value))
            ]
        elif self.min_value is not None and kind is float:
            descriptor.floating_point_range = [
                FloatingPointRange(from_value=float(self.min_value), to_value=float(self.max_value))
            ]
        return descriptor

    def check(self, value: Any) -> str | None:
        """Why `value` is invalid for this parameter, or None when it is valid."""
        if value is None:
            return None
        if self.value_type is list:
            valid = _is_name_list(value)
            return (
                None
                if valid
                else f"{self.name} must be a list of names or ids, e.g. ['a', 'b'], got {value!r}"
            )
        if self.choices and value not in self.choices:
            return f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}"
        if self.min_value is not None and not self.min_value <= value <= self.max_value:
            return f"{self.name} must be in [{self.min_value}, {self.max_value}], got {value!r}"
        return None


PARAMS: tuple[Param, ...] = (
    # engine: fixed for the node's lifetime
    Param("model", "", "model file (.onnx, .engine/.plan, .ts/.pt2); empty = the bundled default model", True),
    Param("backend", "auto", "inference backend; auto picks TensorRT for .onnx on CUDA when installed", True,
          ("auto", "tensorrt", "onnxruntime", "torch")),
    Param("device", "cpu", "torch device of the engine, e.g. cpu or cuda:0", True),
    Param("precision", "fp32", "engine precision: fp16 with TensorRT or torch on CUDA, int8 with TensorRT", True,
          ("fp32", "fp16", "int8")),
    Param("max_batch", 32, "largest engine batch; larger tile batches are split", True, (), 1, 1024),
    Param("labels", None, "class names by id; not set = the labels file next to the model", True, kind=list),
    Param("layout", "auto", "model output layout; auto detects it from the output shapes", True,
          tuple(layout.value for layout in OutputLayout)),
    Param("model_channel_order", "rgb", "channel order the model expects", True, ("rgb", "bgr")),
    Param("transport", "raw", "raw subscribes `image`; compressed subscribes `image/compressed`", True,
          ("raw", "compressed")),
    Param("image_reliability", "best_effort", "QoS reliability of the image subscription (depth 1)", True,
          ("best_effort", "reliable")),
    Param("diagnostics_period", 1.0, "seconds between /diagnostics messages", True, (), 0.1, 60.0),
    # pipeline: change at runtime, applied from the next frame
    Param("tile_width", 640, "tile width in pixels", False, (), 32, 8192),
    Param("tile_height", 640, "tile height in pixels", False, (), 32, 8192),
    Param("overlap", 0.2, "overlap ratio between neighbouring tiles", False, (), 0.0, 0.95),
    Param("full_frame", True, "also run the whole frame (letterboxed) in the same batch"),
    Param("conf_threshold", 0.25, "minimum detection score", False, (), 0.0, 1.0),
    Param("merge", "nms", "how detections from overlapping tiles are merged", False,
          ("nms", "nmm", "greedy_nmm")),
    Param("match_metric", "ios", "overlap measure for merging: intersection over union or over smaller", False,
          ("iou", "ios")),
    Param("merge_threshold", 0.5, "overlap above which two detections are the same object", False, (), 0.0, 1.0),
    Param("class_agnostic", False, "merge detections across classes"),
    Param("max_detections", 300, "most detections published per frame", False, (), 1, 100000),
    Param("classes", None, "publish only these classes (names or ids); not set or empty = all", kind=list),
    Param("output_format", "labels", "class_id field: label names (labels) or numeric ids (ids)", False,
          ("labels", "ids")),
)  # fmt: skip

BY_NAME: Mapping[str, Param] = {p.name: p for p in PARAMS}

# parameter name -> TiledDetector config field
PIPELINE_FIELDS: Mapping[str, str] = {
    "conf_threshold": "conf_threshold",
    "overlap": "overlap",
    "full_frame": "full_frame",
    "merge": "merge",
    "match_metric": "match_metric",
    "merge_threshold": "merge_threshold",
    "class_agnostic": "class_agnostic",
    "max_detections": "max_detections",
}


def _is_name_list(value: Any) -> bool:
    """A comma-separated string, or an array of strings or integers (any empty array)."""
    if isinstance(value, str):
        return True
    return isinstance(value, list | tuple | array.array) and all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    )


def string_list(value: Any) -> list[str]:
    """A list parameter (names, ids, or one comma-separated string) as non-empty strings."""
    items = value.split(",") if isinstance(value, str) else (value or [])
    return [str(v).strip() for v in items if str(v).strip()]


def resolve_classes(names_or_ids: list[str], labels: list[str] | None) -> tuple[int, ...] | None:
    """Class filter from names or ids; None = all classes. Raises ValueError naming the unknown entry."""
    if not names_or_ids:
        return None
    ids = []
    for item in names_or_ids:
        if item.lstrip("-").isdigit():
            ids.append(int(item))
        elif labels and item in labels:
            ids.append(labels.index(item))
        else:
            known = ", ".join(labels or []) or "no labels loaded: use numeric ids"
            raise ValueError(f"classes: unknown class {item!r} (known: {known})")
    return tuple(sorted(set(ids)))


def pipeline_changes(values: Mapping[str, Any], labels: list[str] | None) -> dict[str, Any]:
    """TiledDetector config changes for the given runtime parameter values (a subset is fine)."""
    changes = {PIPELINE_FIELDS[k]: v for k, v in values.items() if k in PIPELINE_FIELDS}
    if "tile_width" in values or "tile_height" in values:
        changes["tile_size"] = (int(values["tile_width"]), int(values["tile_height"]))
    if "classes" in values:
        changes["classes"] = resolve_classes(string_list(values["classes"]), labels)
    return changes
