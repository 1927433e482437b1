"""What a model file says about itself, read from the metadata each exporter writes, so that exports load as
written (no options) with their class names:

- ultralytics (YOLOv8 / YOLO11 / YOLO26, 8.x): TorchScript's `config.txt` extra file (JSON) and ONNX's
  `metadata_props` (each value `str()` of a Python value), with the keys `imgsz` ([h, w]), `batch`, `names`
  ({id: name}), `stride`, `task` (detect, obb, segment, pose, classify), `end2end`, `channels` and `args` ({batch,
  dynamic, half or quantize, nms, ...}); a pose model's `kpt_shape` ([joints, 2 or 3]) and, where the dataset named
  them, `kpt_names` ({class id: [joint names]}); `skeleton` (pairs of joint indices) where a file states one;
  TensorRT `.engine` files start with a 4-byte little-endian length and the same metadata as JSON.
- YOLOv5 (ultralytics/yolov5): TorchScript's `config.txt` {"shape": [b, 3, h, w], "stride", "names"}; ONNX
  `stride` and `names`.
- ours: TorchScript / torch.export extra files `input_shape` ("B,C,H,W", B = -1 for a dynamic batch) and `labels`
  (one name per line, or a JSON list).
- input conventions, by anyone (ONNX `metadata_props`, or a TorchScript / torch.export extra file of that name):
  `channel_order` (rgb | bgr), `input_scale`, `input_mean`, `input_std` (3 numbers), `letterbox` (center |
  top_left), `pad_value` (0-255), spelt as the settings of the same names.

Batch rules follow ultralytics' own loader: an ONNX or TensorRT input says whether its batch is dynamic; a
TorchScript file runs any batch unless it was exported with `nms=True` (then only its export batch).
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ULTRALYTICS = "ultralytics"
# input conventions a file may state (the settings of the same names)
INPUT_KEYS = ("channel_order", "input_scale", "input_mean", "input_std", "letterbox", "pad_value")
YOLOV5 = "yolov5"


@dataclass(frozen=True)
class ModelMetadata:
    """What a model file says: input (batch, channels, height, width) where known (batch -1: any), class names,
    whether its head ends in NMS (rows x1, y1, x2, y2, score, class: end-to-end heads and `nms=True` exports),
    whether it takes fp16 input, which exporter wrote it, the framework that produced the graph (an ONNX
    file's `producer_name`: "pytorch", "PaddlePaddle", ...) and its task (ultralytics' `task`: detect, obb,
    segment, pose, classify)."""

    batch: int | None = None
    channels: int | None = None
    hw: tuple[int, int] | None = None
    labels: tuple[str, ...] | None = None
    end2end: bool = False
    half: bool = False
    source: str = ""
    inputs: tuple[tuple[str, Any], ...] = ()  # input conventions the file states (`INPUT_KEYS`), as written
    producer: str = ""
    task: str | None = (
        None  # what the model was trained for, where the file says (ultralytics: detect, obb, ...)
    )
    keypoint_shape: tuple[int, int] | None = None  # a pose model's (joints, values per joint): `kpt_shape`
    keypoint_names: tuple[str, ...] | None = (
        None  # its joints' names (`kpt_names`), where the file gives them
    )
    skeleton: tuple[tuple[int, int], ...] | None = (
        None  # joint pairs to draw (`skeleton`), where it gives them
    )

    @property
    def input_shape(self) -> tuple[int, int, int, int] | None:
        """(B, C, H, W) when the file gives the input size (B -1 when any batch runs or it does not say)."""
        if self.hw is None:
            return None
        return (-1 if self.batch is None else self.batch, self.channels or 3, *self.hw)


def _literal(text: Any) -> Any:
    """A metadata value: JSON / a Python literal as text (ONNX stores `str(value)`), or the value itself."""
    if not isinstance(text, str):
        return text
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError, TypeError):
            continue
    return text


def parse_labels(value: Any) -> tuple[str, ...] | None:
    """Class names from {id: name} (ultralytics), a list, a JSON list or one name per line; None when empty."""
    value = _literal(value) if isinstance(value, str) and value.strip()[:1] in "[{" else value
    if isinstance(value, Mapping):
        value = [value[k] for k in sorted(value, key=int)]
    elif isinstance(value, str):
        value = [line.strip() for line in value.splitlines() if line.strip()]
    names = tuple(str(v) for v in value or ())
    return names or None


def _hw(value: Any) -> tuple[int, int] | None:
    value = _literal(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


def _truthy(value: Any) -> bool:
    value = _literal(value)
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _half(args: Mapping[str, Any]) -> bool:
    """ultralytics < 8.4 writes `half`; later ones `quantize` (16 for fp16)."""
    return _truthy(args.get("half")) or str(args.get("quantize")).lower() in {"16", "fp16"}


def ultralytics_metadata(values: Mapping[str, Any], dynamic_batch: bool | None = None) -> ModelMetadata:
    """Metadata of an ultralytics export (values as written: parsed or as text). `dynamic_batch` is what the graph
    says (ONNX, TensorRT); None for TorchScript, whose batch follows ultralytics' rule."""
    args = _literal(values.get("args", {}))
    args = args if isinstance(args, Mapping) else {}
    batch = _literal(values.get("batch", args.get("batch", 1)))
    nms = _truthy(args.get("nms"))
    if dynamic_batch is None:
        dynamic_batch = _truthy(args.get("dynamic")) or not nms
    return ModelMetadata(
        batch=-1 if dynamic_batch else int(batch),
        channels=int(_literal(values.get("channels", 3))),
        hw=_hw(values.get("imgsz")),
        labels=parse_labels(values.get("names")),
        end2end=_truthy(values.get("end2end")) or nms,
        half=_half(args),
        source=f"{ULTRALYTICS} {values.get('version', '')}".strip(),
        task=_task(values),
    )


def keypoint_shape(value: Any) -> tuple[int, int] | None:
    """`kpt_shape` ([joints, values per joint], as written or its text) as a pair of ints, or None."""
    value = _literal(value)
    if isinstance(value, list | tuple) and len(value) == 2:
        try:
            return int(value[0]), int(value[1])
        except (TypeError, ValueError):
            return None
    return None


def keypoint_names(value: Any) -> tuple[str, ...] | None:
    """`kpt_names`: ultralytics' {class id: [names]} (the first class's), or a list of names; None when empty."""
    value = _literal(value)
    if isinstance(value, Mapping) and value:
        value = value[min(value, key=int)]
    if isinstance(value, list | tuple) and value:
        return tuple(str(v) for v in value)
    return None


def skeleton(value: Any) -> tuple[tuple[int, int], ...] | None:
    """`skeleton`: pairs of joint indices (0-based), or None when the value is not one."""
    value = _literal(value)
    try:
        pairs = tuple((int(a), int(b)) for a, b in value)
    except (TypeError, ValueError):
        return None
    return pairs or None


def keypoint_metadata(values: Mapping[str, Any]) -> dict[str, Any]:
    """The keypoint fields of `ModelMetadata` among `values` (`kpt_shape`, `kpt_names`, `skeleton`)."""
    return {
        "keypoint_shape": keypoint_shape(values.get("kpt_shape")),
        "keypoint_names": keypoint_names(values.get("kpt_names")),
        "skeleton": skeleton(values.get("skeleton")),
    }


def _task(values: Mapping[str, Any]) -> str | None:
    """The `task` a file states (ultralytics writes it; so does our rotated-box model), lower case, or None."""
    return str(values["task"]).strip().lower() if str(values.get("task", "")).strip() else None


def yolov5_metadata(values: Mapping[str, Any]) -> ModelMetadata:
    """Metadata of a YOLOv5 (ultralytics/yolov5) export: its `shape` (TorchScript) and `names`."""
    shape = _literal(values.get("shape"))
    hw = (int(shape[2]), int(shape[3])) if isinstance(shape, list | tuple) and len(shape) == 4 else None
    return ModelMetadata(
        batch=-1, channels=3 if hw else None, hw=hw, labels=parse_labels(values.get("names")), source=YOLOV5
    )


def input_conventions(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The input conventions (`INPUT_KEYS`) among `values`, parsed (checked where they are used)."""
    found = []
    for key in INPUT_KEYS:
        if key in values and str(values[key]).strip():
            value = _literal(values[key])
            found.append((key, tuple(value) if isinstance(value, list | tuple) else value))
    return tuple(found)


def exporter_metadata(values: Mapping[str, Any], dynamic_batch: bool | None = None) -> ModelMetadata:
    """The metadata of whichever exporter wrote `values` (ultralytics, YOLOv5; or an empty one), with the input
    conventions and the task they state."""
    if "imgsz" in values or "args" in values or str(values.get("author", "")).lower() == ULTRALYTICS:
        found = ultralytics_metadata(values, dynamic_batch)
    elif "shape" in values or "names" in values:
        found = yolov5_metadata(values)
    else:
        found = ModelMetadata()
    return dataclasses.replace(
        found, inputs=input_conventions(values), task=found.task or _task(values), **keypoint_metadata(values)
    )


def parse_input_shape(text: str | Any) -> tuple[int, int, int, int]:
    """'B,C,H,W' (or a sequence) -> a 4-tuple; B may be -1 (dynamic), C, H and W must be positive."""
    try:
        dims = tuple(int(d) for d in (text.split(",") if isinstance(text, str) else text))
    except (TypeError, ValueError):
        dims = ()
    if len(dims) != 4 or dims[0] == 0 or dims[0] < -1 or min(dims[1:]) <= 0:
        raise ValueError(f"input_shape must be 'B,C,H,W' with B = -1 or > 0 and C, H, W > 0, got {text!r}")
    return dims  # type: ignore[return-value]


def extra_files_metadata(extra: Mapping[str, str]) -> ModelMetadata:
    """Metadata of a TorchScript / torch.export file from its extra files: ours (`input_shape`, `labels`), else
    the exporter's `config.txt` (ultralytics, YOLOv5). Ours win where both say something."""
    config = _literal(extra.get("config.txt", "")) if extra.get("config.txt", "").strip() else {}
    found = exporter_metadata(config) if isinstance(config, Mapping) else ModelMetadata()
    shape = extra.get("input_shape", "").strip()
    labels = parse_labels(extra.get("labels", ""))
    if shape:
        batch, channels, height, width = parse_input_shape(shape)
        if found.hw is not None and found.hw != (height, width):
            raise ValueError(
                f"its input_shape {shape} contradicts the {found.source} metadata's imgsz {list(found.hw)}: give the "
                "size the model was trained at with the setting input_size (--input-size W H)"
            )
        found = dataclasses.replace(
            found, batch=batch, channels=channels, hw=(height, width), source=found.source or "tiled_detector"
        )
    if labels:
        found = dataclasses.replace(found, labels=labels)
    inputs = input_conventions(extra)
    return dataclasses.replace(found, inputs=tuple((dict(found.inputs) | dict(inputs)).items()))


def split_engine_file(data: bytes) -> tuple[ModelMetadata, bytes]:
    """An ultralytics TensorRT file's metadata header (4-byte little-endian length + JSON) and the engine after
    it; a plain engine file is all engine."""
    if len(data) > 4:
        length = int.from_bytes(data[:4], "little", signed=True)
        if 2 <= length <= min(len(data) - 4, 1 << 20) and data[4:5] == b"{":
            try:
                values = json.loads(data[4 : 4 + length].decode())
            except (UnicodeDecodeError, json.JSONDecodeError):
                values = None
            if isinstance(values, Mapping):
                return exporter_metadata(values), data[4 + length :]
    return ModelMetadata(), data
