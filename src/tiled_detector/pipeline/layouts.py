"""The output layouts of the detectors we decode, and which layout a set of output shapes fits.

`layout_candidates` lists every layout a set of output shapes fits; `detect_layout` takes the one, and refuses
(`AmbiguousLayoutError`, naming the candidates) where several fit: no guess between families. Read from shapes
only (an engine's outputs or an ONNX file's, before any engine is built: `resolve`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import torch

from tiled_detector.pipeline import gfl
from tiled_detector.settings.options import Option

# An end-to-end head (YOLOv10 / YOLO26) emits at most this many detections per image; a (B, K, 6) output with
# more rows is taken for a raw head with 1 (v5) or 2 (v8) classes.
MAX_END2END_DETECTIONS = 1000

_EFFICIENT_NMS_KEYS = ("num", "box", "score", "class")


class OutputLayout(Option):
    """Output tensor layouts of the detectors we can decode."""

    AUTO = "auto"
    YOLOV5 = "yolov5"  # (B, A, 5 + C): cx, cy, w, h, objectness, class scores
    YOLOV8 = "yolov8"  # (B, 4 + C, A): cx, cy, w, h, class scores (also YOLO11)
    YOLOV8_TRANSPOSED = "yolov8_transposed"  # (B, A, 4 + C)
    END2END = "end2end"  # (B, K, 6): x1, y1, x2, y2, score, class (YOLOv10, YOLO26)
    EFFICIENT_NMS = "efficient_nms"  # num_detections, detection_boxes, detection_scores, detection_classes
    # (B, A, 5 + C), one row per anchor point of strides 8, 16, 32: x, y offsets to the grid cell and log width,
    # height (stride units), objectness, class scores (YOLOX's raw head; its decoded head is YOLOV5's rows)
    YOLOX = "yolox"
    # class scores and box distributions per anchor point of each stride (PP-PicoDet, NanoDet: `pipeline.gfl`)
    GFL = "gfl"
    # ultralytics' rotated boxes (`task: obb`): (B, 4 + C + 1, A) cx, cy, w, h, class scores, angle (v8, 11, 26)
    OBB = "obb"
    # their end-to-end rows (YOLO26 exported NMS-free): (B, K, 7) cx, cy, w, h, score, class, angle
    OBB_END2END = "obb_end2end"
    # ultralytics' pose heads (`task: pose`): (B, 4 + C + K x D, A) cx, cy, w, h, class scores, then each joint's
    # x, y (input pixels) and, where D is 3, its visibility score; and their end-to-end rows (B, N, 6 + K x D)
    POSE = "pose"
    POSE_END2END = "pose_end2end"


# layouts whose boxes are rotated: decoded to (M, 5) cx, cy, w, h, angle (`pipeline.rotated`)
ROTATED_LAYOUTS = frozenset({OutputLayout.OBB, OutputLayout.OBB_END2END})
OBB_END2END_COLUMNS = 7
# layouts whose rows end in keypoints: each candidate's K x D joint columns are its payload (`extra`)
KEYPOINT_LAYOUTS = frozenset({OutputLayout.POSE, OutputLayout.POSE_END2END})


YOLOX_STRIDES = (8, 16, 32)


def anchor_points(input_hw: tuple[int, int], strides: Sequence[int] = YOLOX_STRIDES) -> int:
    """How many anchor points an anchor-free head has over an input of `input_hw` (one per cell per stride)."""
    return sum((input_hw[0] // s) * (input_hw[1] // s) for s in strides)


Shape = Sequence[int]


def shape_of(value: torch.Tensor | Shape) -> tuple[int, ...]:
    return tuple(int(d) for d in (value.shape if isinstance(value, torch.Tensor) else value))


def efficient_nms_names(names: Iterable[str]) -> dict[str, str] | None:
    """Map num/box/score/class to the EfficientNMS output names (num_detections, detection_boxes, ...)."""
    found: dict[str, str] = {}
    for name in names:
        lower = name.lower()
        for key in _EFFICIENT_NMS_KEYS:
            if key in lower and key not in found:
                found[key] = name
                break
    return found if len(found) == len(_EFFICIENT_NMS_KEYS) else None


def main_output(outputs: Mapping[str, torch.Tensor | Shape]) -> str:
    """Name of the detection head output: the only output, else the first rank-3 one (e.g. not seg protos)."""
    if len(outputs) == 1:
        return next(iter(outputs))
    for name, value in outputs.items():
        if len(shape_of(value)) == 3:
            return name
    raise ValueError(f"no (batch, rows, columns) detection output among {list(outputs)}")


def mask_output(outputs: Mapping[str, torch.Tensor | Shape]) -> str | None:
    """Name of a segmentation head's prototype output (B, P, h, w): its only rank-4 output, else None."""
    found = [name for name, value in outputs.items() if len(shape_of(value)) == 4]
    return found[0] if len(found) == 1 else None


def coefficient_count(outputs: Mapping[str, torch.Tensor | Shape]) -> int:
    """How many mask coefficients each row of the head carries: the prototype count P of a segmentation head's
    prototype output (`mask_output`), else 0."""
    name = mask_output(outputs)
    return 0 if name is None else shape_of(outputs[name])[1]


class Candidate(NamedTuple):
    """A layout some outputs fit, and the class count it reads from them (None: not from the shapes)."""

    layout: OutputLayout
    classes: int | None

    def __str__(self) -> str:
        return self.layout.value + ("" if self.classes is None else f" ({self.classes} classes)")


class AmbiguousLayoutError(ValueError):
    """Outputs that fit more than one layout: `candidates` lists them."""

    def __init__(self, message: str, candidates: Sequence[Candidate]) -> None:
        super().__init__(message)
        self.candidates = tuple(candidates)


LAYOUT_HINT = (
    "pass the output layout explicitly (yolov5, yolov8, yolov8_transposed, yolox, gfl, end2end, efficient_nms, "
    "obb, obb_end2end, pose, pose_end2end)"
)


def _rank3(outputs: Mapping[str, torch.Tensor | Shape]) -> dict[str, tuple[int, ...]]:
    return {n: s for n, s in ((n, shape_of(v)) for n, v in outputs.items()) if len(s) == 3}


def layout_candidates(
    outputs: Mapping[str, torch.Tensor | Shape],
    num_classes: int | None = None,
    input_hw: tuple[int, int] | None = None,
) -> list[Candidate]:
    """Every layout `outputs` (name -> tensor or shape) fit, with the class count each reads; with `num_classes`
    only those reading that many. ValueError when nothing fits (naming why).

    Four outputs named like num_detections / detection_boxes / detection_scores / detection_classes: EFFICIENT_NMS.
    Several (batch, rows, columns) outputs: a GFL head (`pipeline.gfl`; GflError naming what was expected when
    they are not one). One head output (B, D1, D2): D2 == 6 and D1 <= MAX_END2END_DETECTIONS: END2END. D1 < D2:
    YOLOV8 (anchors are the larger dimension of raw heads). D1 > D2: YOLOX (D1 the anchor points of strides 8,
    16, 32 over `input_hw`: its raw or decoded rows), else YOLOV5 (5 + C columns); YOLOV8_TRANSPOSED (4 + C); with
    `num_classes`, a GFL head joined into one tensor (C + 4 x bins columns over every stride's anchor points).
    A segmentation head (a (B, P, h, w) prototype output beside: `mask_output`) ends each row with P mask
    coefficients: END2END rows have 6 + P columns, YOLOV8 4 + C + P rows (only these two carry them).
    """
    if len(outputs) == 4 and efficient_nms_names(outputs) is not None:
        return [Candidate(OutputLayout.EFFICIENT_NMS, None)]
    heads = _rank3(outputs)
    if len(heads) > 1 and input_hw is not None:
        return [Candidate(OutputLayout.GFL, gfl.gfl_head(heads, input_hw, num_classes).classes)]
    name = main_output(outputs)
    shape = shape_of(outputs[name])
    if len(shape) != 3 or min(shape[1:]) < 0:
        raise ValueError(f"cannot tell the layout of output {name!r} with shape {shape}; {LAYOUT_HINT}")
    rows, cols = shape[1], shape[2]
    coefficients = coefficient_count(outputs)
    if cols == 6 + coefficients and rows <= MAX_END2END_DETECTIONS:
        return [Candidate(OutputLayout.END2END, None)]
    if rows < cols:
        classes = rows - 4 - coefficients
        if num_classes is not None and classes != num_classes:
            masks = (
                f" (beside {coefficients} mask coefficients: its prototypes {mask_output(outputs)!r})"
                if coefficients
                else ""
            )
            raise ValueError(
                f"output {name!r} {shape} looks like YOLOv8 but has {classes} classes, not {num_classes}{masks}"
            )
        if classes < 1:
            raise ValueError(
                f"output {name!r} {shape} has {rows} rows: too few for 4 box rows, classes and the "
                f"{coefficients} mask coefficients of its prototype output {mask_output(outputs)!r}"
            )
        return [Candidate(OutputLayout.YOLOV8, classes)]
    if coefficients:
        raise ValueError(
            f"output {name!r} {shape} beside prototypes {mask_output(outputs)!r} is neither a YOLOv8 "
            f"segmentation head (4 + classes + {coefficients} rows) nor end-to-end rows (6 + {coefficients} "
            "columns)"
        )
    found = []
    if cols > 5:
        anchor_free = input_hw is not None and rows == anchor_points(input_hw)
        found.append(Candidate(OutputLayout.YOLOX if anchor_free else OutputLayout.YOLOV5, cols - 5))
    if cols > 4:
        found.append(Candidate(OutputLayout.YOLOV8_TRANSPOSED, cols - 4))
    if num_classes is not None and input_hw is not None:
        with contextlib.suppress(gfl.GflError):  # a joined GFL head over every stride's anchor points
            found.append(
                Candidate(OutputLayout.GFL, gfl.gfl_head({name: shape}, input_hw, num_classes).classes)
            )
    fitting = [c for c in found if num_classes is None or c.classes == num_classes]
    if not fitting:
        raise ValueError(
            f"output {name!r} {shape} has neither 4 + {num_classes} nor 5 + {num_classes} columns"
        )
    return fitting


def detect_layout(
    outputs: Mapping[str, torch.Tensor | Shape],
    num_classes: int | None = None,
    layout: str | OutputLayout = OutputLayout.AUTO,
    input_hw: tuple[int, int] | None = None,
) -> OutputLayout:
    """The layout of `outputs` (name -> tensor or shape); an explicit `layout` other than auto always wins.
    Otherwise the one `layout_candidates` gives; where several fit, `AmbiguousLayoutError` naming them (without
    `num_classes`, YOLOv5's and transposed YOLOv8's rows, or YOLOX's raw head and transposed YOLOv8's, are told
    apart only by the class count)."""
    chosen = OutputLayout.from_value(layout)
    if chosen is not OutputLayout.AUTO:
        return chosen
    found = layout_candidates(outputs, num_classes, input_hw)
    if len(found) == 1:
        return found[0].layout
    name = main_output(outputs)
    raise AmbiguousLayoutError(
        f"ambiguous output {name!r} with shape {shape_of(outputs[name])}: it fits "
        f"{', '.join(map(str, found))} (give num_classes or the layout); {LAYOUT_HINT}",
        found,
    )
