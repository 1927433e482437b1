"""What the detector makes of a model file, and why: the decoding of its head (layout), its family, its class names
and its input conventions, each with where it came from. A file that fits more than one reading that nothing tells
apart (no names, metadata or probe) is refused in one line naming the candidates and the settings that decide:
never a guess between families.

`resolve(config, view)` reads a `ModelView`: a loaded engine (`engine_view`), or an ONNX file before any engine is
built (`file_view`: its graph's shapes, metadata and, for the YOLOX probe, one ONNX Runtime run of the file itself),
so that a file the detector would refuse is refused before anything is loaded or cached.

Rules, in order: a task the file's metadata names that the node does not serve (classify) refused;
the setting `layout` (checked against the shapes for yolox, gfl and the rotated layouts: an angle column; a pose
file's layout must be a pose layout: `pose_model`); the rotated layouts where the metadata says `task: obb`, the pose
layouts where it says `task: pose` (end-to-end rows where it says `end2end`; the keypoints read by
`pose_model.read_keypoints`); an end-to-end head
where the file's metadata says so; else the layouts the output shapes fit (`layouts.layout_candidates`), narrowed by the class
count of the names (the labels setting, the file's names, a labels file beside it). One left: it. YOLOX's raw head
among several: one run on a grey image tells raw offsets (only YOLOX's raw head holds them) from pixel boxes
(YOLOX's decoded rows, transposed YOLOv8, ...), which stay ambiguous. Families: yolox for YOLOX's head; for a GFL
head PP-PicoDet (separate outputs from a Paddle2ONNX file) or NanoDet (separate outputs from a PyTorch export,
or joined columns); an 80-class file of these families without names gets COCO's names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiled_detector.config import DetectorConfig
from tiled_detector.engines.base import Engine, ModelFormat, model_format
from tiled_detector.engines.metadata import ModelMetadata
from tiled_detector.model_files.pose_model import Keypoints, check_pose_layout, read_keypoints
from tiled_detector.models import COCO, coco_labels, load_labels
from tiled_detector.pipeline import gfl
from tiled_detector.pipeline.decode import yolox_decoded
from tiled_detector.pipeline.layouts import (
    KEYPOINT_LAYOUTS,
    OBB_END2END_COLUMNS,
    ROTATED_LAYOUTS,
    Candidate,
    OutputLayout,
    anchor_points,
    coefficient_count,
    layout_candidates,
    main_output,
    mask_output,
)
from tiled_detector.pipeline.preprocess import InputFormat

COCO_FAMILIES = frozenset({"yolox", "picodet", "nanodet"})  # released with COCO's 80 classes and no names
# what a GFL head of no known family must be told: its pre-processing differs between the families
GFL_INPUTS = ("channel_order", "input_scale", "input_mean", "input_std", "letterbox")
DECIDING = ("labels", "layout")
SERVED_TASKS = ("detect", "obb", "segment", "pose")  # ultralytics' tasks whose heads the node decodes


@dataclass(frozen=True)
class ModelView:
    """What resolution reads of a model: its output shapes (batch first; -1 dynamic), input (height, width),
    class names and metadata as stored in the file, and `probe(name)`: that output for one grey image."""

    outputs: Mapping[str, tuple[int, ...]]
    input_hw: tuple[int, int]
    labels: tuple[str, ...] | None
    metadata: ModelMetadata
    probe: Callable[[str], torch.Tensor]

    def same_head(self, other: ModelView) -> bool:
        """The same outputs (past the batch) and input: a resolution of one holds for the other."""
        mine = [(n, s[1:]) for n, s in self.outputs.items()]
        return mine == [(n, s[1:]) for n, s in other.outputs.items()] and self.input_hw == other.input_hw


class AmbiguousModelError(ValueError):
    """A model file that fits several readings: `candidates` names them, `settings` the settings that decide."""

    def __init__(
        self, message: str, candidates: tuple[str, ...], settings: tuple[str, ...] = DECIDING
    ) -> None:
        super().__init__(message)
        self.candidates = candidates
        self.settings = settings


@dataclass(frozen=True)
class Resolved:
    """A model file as the detector reads it: the layout its frame program decodes (a decoded YOLOX head: YOLOv5's
    rows), its family (None: ultralytics-like), how that was decided, the head in words, the class names and
    their source, the class count, the input format and where each convention came from, and the view read."""

    layout: OutputLayout
    family: str | None
    decided_by: str
    head: str
    labels: tuple[str, ...] | None
    labels_from: str
    num_classes: int | None
    input_format: InputFormat
    input_sources: dict[str, tuple[Any, str]]
    view: ModelView = dataclasses.field(repr=False)
    masks: int = 0  # a segmentation head's mask prototypes (the coefficients each detection carries); 0: none
    task: str = "detect"  # what the file says it does (`detect` where it says nothing), `segment` with masks
    keypoints: Keypoints | None = (
        None  # a pose head's keypoints (shape, names, skeleton, their sources); None: none
    )

    @property
    def keypoint_names(self) -> tuple[str, ...]:
        """A pose model's joint names (empty: not a pose model)."""
        return () if self.keypoints is None else self.keypoints.names

    @property
    def skeleton(self) -> tuple[tuple[int, int], ...] | None:
        """The skeleton (joint index pairs) the model file states, or None."""
        return None if self.keypoints is None else self.keypoints.skeleton

    @property
    def segments(self) -> bool:
        """A segmentation head: each detection has an instance mask."""
        return self.masks > 0

    @property
    def coco_by_family(self) -> bool:
        """COCO's names were given for want of any (an 80-class file of a COCO family)."""
        return self.labels_from.startswith("COCO's names")


def engine_view(engine: Engine) -> ModelView:
    """The view of a loaded engine (its probe: one `infer` of a 0.5-valued image)."""

    def probe(name: str) -> torch.Tensor:
        grey = torch.full((1, *engine.input.shape[1:]), 0.5, dtype=engine.input.dtype, device=engine.device)
        return engine.infer(grey.contiguous(memory_format=engine.memory_format))[name]

    shapes = {o.name: tuple(o.shape) for o in engine.outputs}
    return ModelView(shapes, engine.input_hw, engine.labels, engine.metadata, probe)


def file_view(config: DetectorConfig) -> ModelView | None:
    """The view of an ONNX model file read without building an engine (its probe: ONNX Runtime on the CPU), or
    None where only an engine can tell (not ONNX, unreadable, shapes past the batch or the input size dynamic)."""
    if model_format(config.model) is not ModelFormat.ONNX:
        return None
    try:
        import onnx

        from tiled_detector.engines.onnx_model import image_input, onnx_metadata

        model = onnx.load(str(config.model), load_external_data=False)
        node = image_input(model)
        metadata = onnx_metadata(Path(config.model))
    except Exception:  # not ours to report here: the engine that loads it says why
        return None
    shapes = {o.name: _dims(o) for o in model.graph.output}
    image = _dims(node)
    given = (config.input_size[1], config.input_size[0]) if config.input_size else None
    input_hw = image[2:] if len(image) == 4 and min(image[2:]) > 0 else given or metadata.hw
    if input_hw is None or any(d < 0 for s in shapes.values() for d in s[1:]) or len(image) != 4:
        return None

    def probe(name: str) -> torch.Tensor:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(config.model), options, providers=["CPUExecutionProvider"])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(node.type.tensor_type.elem_type)
        grey = np.full((max(image[0], 1), image[1], *input_hw), 0.5, dtype)
        return torch.from_numpy(session.run([name], {node.name: grey})[0])

    return ModelView(shapes, tuple(input_hw), metadata.labels, metadata, probe)


def _dims(value: Any) -> tuple[int, ...]:
    """An ONNX value's shape, -1 for a symbolic or unknown dimension."""
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim)


def _labels(config: DetectorConfig, view: ModelView) -> tuple[tuple[str, ...] | None, str]:
    """Class names and their source: the labels setting (`[coco]`: COCO's), else the file's, else a labels file
    beside it."""
    if config.labels == (COCO,):
        return coco_labels(), "the labels setting (coco: COCO's 80 names)"
    if config.labels:
        return config.labels, "the labels setting"
    if view.labels:
        return view.labels, f"the model file ({view.metadata.source or 'its metadata'})"
    beside = load_labels(config.model)
    if beside:
        return tuple(beside), "a labels file beside the model"
    return None, "none: classes are numbered"


def gfl_family(head: gfl.GflHead, metadata: ModelMetadata) -> str | None:
    """The family of a GFL head: NanoDet for joined columns (NanoDet 1.x's export) or separate outputs of a
    PyTorch export (NanoDet 0.x), PP-PicoDet for separate outputs of a Paddle2ONNX file; None otherwise."""
    producer = metadata.producer.lower()
    if head.joined or producer == "pytorch":
        return "nanodet"
    return "picodet" if "paddle" in producer else None


def _raw_yolox(view: ModelView, name: str) -> bool:
    """Whether a YOLOX head's rows hold its raw offsets (one probe), rather than boxes in pixels."""
    return not yolox_decoded(view.probe(name), view.input_hw)


def _check_yolox(config: DetectorConfig, view: ModelView) -> tuple[str, int]:
    """The head output of a file under `layout: yolox` and its class count (ValueError, one line, when its rows
    are not YOLOX's anchor points)."""
    name = main_output(view.outputs)
    shape = view.outputs[name]
    rows, columns = shape[1:3] if len(shape) == 3 else (-1, -1)
    expected = anchor_points(view.input_hw)
    if rows != expected or columns <= 5:
        raise ValueError(
            f"layout yolox: {config.model}'s output {name!r} {list(shape)} is not a YOLOX head, which has one row "
            f"per anchor point of strides 8, 16, 32 ({expected} for its {view.input_hw[1]}x{view.input_hw[0]} "
            "input) and 5 + classes columns; set the setting layout to the model's"
        )
    return name, columns - 5


def _check_task(config: DetectorConfig, view: ModelView) -> None:
    """A file whose metadata names a task the node does not serve is refused (ValueError, one line naming it)."""
    task = view.metadata.task
    if task is not None and task not in SERVED_TASKS:
        raise ValueError(
            f"{config.model}: its metadata says task {task}: this node serves detection models (task detect), "
            f"rotated-box models (task obb), segmentation models (task segment) and pose models (task pose), not "
            f"{task} models; export a detect, obb, segment or pose model"
        )


# the layouts that can read a task's head (a layout outside them contradicts the file's own task)
TASK_LAYOUTS = {
    "obb": ROTATED_LAYOUTS,
    "segment": frozenset({OutputLayout.YOLOV8, OutputLayout.END2END}),
}


def _check_contradiction(config: DetectorConfig, view: ModelView, layout: OutputLayout) -> None:
    """A `layout` setting the file's own task (its metadata) contradicts is refused (ValueError, one line naming
    both): a rotated-box head read as upright rows (its angle row a phantom class), a detect or segment head read
    as rotated boxes (no angle column), a segmentation head read as rows without mask coefficients."""
    task = view.metadata.task
    if task is None or layout is OutputLayout.AUTO:
        return
    fits = TASK_LAYOUTS.get(task)
    rotated = layout in ROTATED_LAYOUTS
    if (fits is not None and layout not in fits) or (fits is None and rotated):
        why = {
            "obb": "its last row is the angle, not a class",
            "segment": "only yolov8 and end2end rows carry its mask coefficients",
        }.get(task, "its output has no angle column")
        readable = f" (or {', '.join(sorted(f.value for f in fits))})" if fits else ""
        raise ValueError(
            f"layout {layout.value} contradicts {config.model}'s own task {task} (its metadata): {why}; set the "
            f"setting layout to auto{readable}"
        )


def _names_source(config: DetectorConfig, view: ModelView) -> str:
    """Where the class names came from, as a sentence's subject."""
    if config.labels:
        return "the labels setting"
    if view.labels:
        return f"its {view.metadata.source or 'file'}'s names"
    return "the labels file beside it"


def _check_obb(
    config: DetectorConfig, view: ModelView, num_classes: int | None, layout: OutputLayout
) -> int | None:
    """The class count of a file read in a rotated `layout` (ValueError, one line, where it has no angle column: its
    metadata names another task, or its shapes have no room for one)."""
    _check_contradiction(config, view, layout)
    name = main_output(view.outputs)
    shape = view.outputs[name]
    if layout is OutputLayout.OBB_END2END:
        if len(shape) != 3 or shape[2] != OBB_END2END_COLUMNS:
            raise ValueError(
                f"layout obb_end2end: {config.model}'s output {name!r} {list(shape)} has no angle column (rows "
                "of 7 columns: cx, cy, w, h, score, class, angle); set the setting layout to the model's"
            )
        return None
    rows = shape[1] if len(shape) == 3 and 0 < shape[1] < shape[2] else -1
    if rows < 6:
        raise ValueError(
            f"layout obb: {config.model}'s output {name!r} {list(shape)} has no angle column (rows cx, cy, w, h, "
            "one score per class, angle over the anchors); set the setting layout to the model's"
        )
    if num_classes is not None and rows != 5 + num_classes:
        raise ValueError(
            f"labels: {config.model} carries {rows - 5} classes (its output {name!r} {list(shape)}: 4 box rows, "
            f"{rows - 5} class scores, the angle), but {_names_source(config, view)} gives {num_classes}; give one "
            "name per class (or, if its output has no angle column, set the setting layout to the model's)"
        )
    return rows - 5


def _gfl(config: DetectorConfig, view: ModelView, num_classes: int | None) -> gfl.GflHead:
    try:
        return gfl.gfl_head(view.outputs, view.input_hw, num_classes)
    except gfl.AmbiguousHeadError as error:
        raise AmbiguousModelError(
            f"layout gfl: {config.model}: {error}", error.readings, ("labels",)
        ) from None
    except gfl.GflError as error:
        raise ValueError(f"layout gfl: {config.model}: {error}") from None


def _layout(
    config: DetectorConfig, view: ModelView, num_classes: int | None
) -> tuple[OutputLayout, str | None, str, str, int | None]:
    """(layout decoded, family, how it was decided, the head in words, the class count the head reads)."""
    if config.layout is OutputLayout.YOLOX:
        name, classes = _check_yolox(config, view)
        raw = _raw_yolox(view, name)
        how = (
            f"the setting layout; one run on a grey image found {'raw offsets' if raw else 'boxes in pixels'}"
        )
        return (OutputLayout.YOLOX if raw else OutputLayout.YOLOV5), "yolox", how, _yolox_words(raw), classes
    if config.layout is OutputLayout.GFL:
        head = _gfl(config, view, num_classes)
        return (
            OutputLayout.GFL,
            gfl_family(head, view.metadata),
            "the setting layout",
            head.describe(),
            head.classes,
        )
    check_pose_layout(str(config.model), view.metadata, config.layout)
    if config.layout in ROTATED_LAYOUTS:
        classes = _check_obb(config, view, num_classes, config.layout)
        return config.layout, None, "the setting layout", _obb_words(config.layout), classes or num_classes
    if config.layout is not OutputLayout.AUTO:
        _check_contradiction(config, view, config.layout)
        return config.layout, None, "the setting layout", f"{config.layout.value} rows", num_classes
    if view.metadata.task == "pose":
        layout = OutputLayout.POSE_END2END if view.metadata.end2end else OutputLayout.POSE
        how = "the model file's metadata (task pose" + (
            ", end-to-end head)" if view.metadata.end2end else ")"
        )
        return layout, None, how, "pose rows", num_classes
    if view.metadata.task == "obb":
        layout = OutputLayout.OBB_END2END if view.metadata.end2end else OutputLayout.OBB
        classes = _check_obb(config, view, num_classes, layout)
        how = "the model file's metadata (task obb" + (", end-to-end head)" if view.metadata.end2end else ")")
        return layout, None, how, _obb_words(layout), classes or num_classes
    if view.metadata.end2end:
        return (
            OutputLayout.END2END,
            None,
            "the model file's metadata (end-to-end head)",
            "end-to-end rows",
            None,
        )
    if any(d < 0 for s in view.outputs.values() for d in s[1:]):
        return OutputLayout.AUTO, None, "each call's output shapes (dynamic here)", "dynamic", num_classes
    try:
        found = layout_candidates(view.outputs, num_classes, view.input_hw)
    except gfl.AmbiguousHeadError as error:
        raise AmbiguousModelError(f"{config.model}: {error}", error.readings, ("labels",)) from None
    except gfl.GflError as error:
        raise ValueError(f"{config.model}: {error}; set the setting layout to the model's") from None
    except ValueError as error:
        raise ValueError(
            f"{config.model}: {error}{_angle_hint(view, num_classes)}{_fix(config, view, num_classes)}"
        ) from None
    by = "the output shapes" + (" and the class names" if num_classes is not None else "")
    yolox = next((c for c in found if c.layout is OutputLayout.YOLOX), None)
    if yolox is not None:
        raw = _raw_yolox(view, main_output(view.outputs))
        if raw or len(found) == 1:
            probed = f"{by}; one run on a grey image found {'raw offsets' if raw else 'boxes in pixels'}"
            layout = OutputLayout.YOLOX if raw else OutputLayout.YOLOV5
            return layout, "yolox", probed, _yolox_words(raw), yolox.classes
        found = [Candidate(OutputLayout.YOLOV5, yolox.classes) if c is yolox else c for c in found]
    if len(found) > 1:
        names = [
            f"yolox decoded in the graph ({c.classes} classes)"
            if c.layout is OutputLayout.YOLOV5 and yolox
            else str(c)
            for c in found
        ]
        shapes = ", ".join(f"{n} {list(s)}" for n, s in view.outputs.items())
        raise AmbiguousModelError(
            f"{config.model}: output {shapes} fits {len(found)} layouts: {', '.join(names)}, and nothing in the "
            f"file tells them apart{_fix(config, view, num_classes)}",
            tuple(names),
        )
    chosen = found[0]
    name = main_output(view.outputs)
    if chosen.layout is OutputLayout.YOLOV8 and num_classes is None and _angle_row(view, name):
        candidates = (
            f"yolov8 ({chosen.classes} classes)",
            f"obb ({(chosen.classes or 1) - 1} classes and an angle)",
        )
        raise AmbiguousModelError(
            f"{config.model}: output {name!r} {list(view.outputs[name])} fits {candidates[0]} and {candidates[1]}: its "
            "last row holds values outside [0, 1] on a grey image, as an angle does and a class score cannot, and the "
            "file names neither its task nor its classes; set the setting layout (obb for rotated boxes) or labels",
            candidates,
        )
    if chosen.layout is OutputLayout.GFL:
        head = gfl.gfl_head(view.outputs, view.input_hw, num_classes)
        return OutputLayout.GFL, gfl_family(head, view.metadata), by, head.describe(), head.classes
    return chosen.layout, None, by, f"{chosen.layout.value} rows", chosen.classes


def _angle_row(view: ModelView, name: str) -> bool:
    """Whether a YOLOv8 head (no mask coefficients) ends with what no class score can be: on a grey image (one probe)
    its last row holds values outside [0, 1] while every other class row stays inside: a rotated-box head's angle."""
    if coefficient_count(view.outputs) or view.metadata.task is not None:
        return False
    rows = view.probe(name)[0].float()
    scores, last = rows[4:-1], rows[-1]
    return bool(((scores >= 0) & (scores <= 1)).all() and ((last < 0) | (last > 1)).any())


def _angle_hint(view: ModelView, num_classes: int | None) -> str:
    """For a head of one row more than 4 + the names' classes: that row may be a rotated-box head's angle."""
    shape = view.outputs[main_output(view.outputs)]
    if (
        num_classes is None
        or len(shape) != 3
        or shape[1] != 5 + num_classes
        or view.metadata.task is not None
    ):
        return ""
    return " (one row more than 4 + classes: a rotated-box head's angle? then set the setting layout to obb)"


def _obb_words(layout: OutputLayout) -> str:
    if layout is OutputLayout.OBB_END2END:
        return "rotated boxes, end-to-end rows (cx, cy, w, h, score, class, angle)"
    return "rotated boxes (cx, cy, w, h, class scores, angle per anchor)"


def _yolox_words(raw: bool) -> str:
    return (
        "YOLOX head, raw offsets (decoded on the device)" if raw else "YOLOX head decoded in the graph (rows)"
    )


def _fix(config: DetectorConfig, view: ModelView, num_classes: int | None) -> str:
    """Where the class count came from (" (N names from ...)", or ""), and the settings that decide."""
    reason = f" ({num_classes} names from {_names_source(config, view)})" if num_classes else ""
    return f"{reason}; give one name per class with the setting labels, or the layout with the setting layout"


def _unknown_gfl(config: DetectorConfig, sources: Mapping[str, Any], view: ModelView) -> None:
    """A GFL head of no known family must be told the conventions the families differ in (ValueError)."""
    missing = [n for n in GFL_INPUTS if n not in sources]
    if missing:
        producer = view.metadata.producer or "no producer named in the file"
        raise ValueError(
            f"{config.model}: a GFL head from an unknown exporter ({producer}), so its input conventions are not "
            f"known: give {', '.join(missing)} (PP-PicoDet: rgb, 1.0, 123.675 116.28 103.53, 58.395 57.12 57.375, "
            "stretch; NanoDet: bgr, 1.0, 103.53 116.28 123.675, 57.375 57.12 58.395, center)"
        )


def resolve(config: DetectorConfig, view: ModelView) -> Resolved:
    """The file as the detector reads it (module docstring); ValueError (one line naming the file and the
    settings that fix it) where it cannot be read, `AmbiguousModelError` where it fits several readings."""
    _check_task(config, view)
    labels, labels_from = _labels(config, view)
    num_classes = len(labels) if labels else None
    masks = _masks(config, view)
    if masks:
        _check_coefficients(config, view, num_classes, masks)
    layout, family, decided_by, head, classes = _layout(config, view, num_classes)
    if masks and layout not in (OutputLayout.YOLOV8, OutputLayout.END2END, OutputLayout.AUTO):
        raise ValueError(
            f"{config.model}: a segmentation head ({masks} mask prototypes in {mask_output(view.outputs)!r}) "
            f"read as {layout.value} rows: only yolov8 and end2end rows carry mask coefficients; set the setting "
            "layout to the model's"
        )
    keypoints = None
    if layout in KEYPOINT_LAYOUTS:
        keypoints, classes = _pose(config, view, layout, num_classes)
        head = (
            f"{'end-to-end ' if layout is OutputLayout.POSE_END2END else ''}pose rows, {keypoints.describe()}"
        )
    if labels is None and family in COCO_FAMILIES and classes == len(coco_labels()):
        labels, labels_from = coco_labels(), f"COCO's names (an 80-class {family} file names none)"
    num_classes = classes if num_classes is None else num_classes
    sources = config.input_sources(family, view.metadata)
    if layout is OutputLayout.GFL and family is None:
        _unknown_gfl(config, sources, view)
    values = {n: getattr(v, "value", v) for n, (v, _) in sources.items()}
    fmt = config.input_format(family, view.metadata)
    defaults = InputFormat()
    for name, field in (
        ("channel_order", "channel_order"),
        ("input_scale", "scale"),
        ("input_mean", "mean"),
        ("input_std", "std"),
        ("letterbox", "letterbox"),
        ("pad_value", "pad_value"),
    ):
        if name not in values:
            sources[name] = (getattr(defaults, field), "ultralytics default")
    task = view.metadata.task or ("segment" if masks else "pose" if keypoints else "detect")
    if config.keypoints and keypoints is None:
        raise ValueError(
            f"keypoints: true, but {config.model} is not a pose model (no keypoint columns); set keypoints to "
            "false or auto"
        )
    if masks:
        head += f", {masks} mask coefficients (prototypes {mask_output(view.outputs)!r})"
    return Resolved(
        layout,
        family,
        decided_by,
        head,
        labels,
        labels_from,
        num_classes,
        fmt,
        sources,
        view,
        masks,
        task,
        keypoints,
    )


def _pose(
    config: DetectorConfig, view: ModelView, layout: OutputLayout, num_classes: int | None
) -> tuple[Keypoints, int | None]:
    """A pose head's keypoints and its class count (raw rows without names: what the file's kpt_shape leaves)."""
    name = main_output(view.outputs)
    shape = view.outputs[name]
    stated = view.metadata.keypoint_shape
    classes = num_classes
    if classes is None and layout is OutputLayout.POSE and stated and len(shape) == 3 and shape[1] > 0:
        classes = shape[1] - 4 - stated[0] * stated[1]
        if classes < 1:
            raise ValueError(
                f"{config.model}: its output {name!r} {list(shape)} has {shape[1]} rows: too few for 4 box rows, "
                f"a class and its kpt_shape {list(stated)}; set the setting layout to the model's"
            )
    return read_keypoints(str(config.model), view.metadata, view.outputs, name, layout, classes), classes


def _check_coefficients(
    config: DetectorConfig, view: ModelView, num_classes: int | None, prototypes: int
) -> None:
    """A segmentation head's rows must carry one mask coefficient per prototype: end-to-end rows 6 + P columns,
    YOLOv8 rows 4 + classes + P (checked where the class count is known); ValueError naming the file."""
    name = main_output(view.outputs)
    shape = view.outputs[name]
    if len(shape) != 3 or min(shape[1:]) < 0:
        return
    rows, columns = shape[1], shape[2]
    if view.metadata.end2end or config.layout is OutputLayout.END2END:
        coefficients, how = columns - 6, f"{columns} columns - 6"
    elif num_classes is not None and rows < columns:
        coefficients, how = rows - 4 - num_classes, f"{rows} rows - 4 - {num_classes} classes"
    else:
        return
    if coefficients != prototypes and config.labels and how.endswith("classes") and rows - 4 - prototypes > 0:
        raise ValueError(
            f"labels: {config.model} carries {rows - 4 - prototypes} classes (its output {name!r} {list(shape)}: "
            f"4 box rows, {rows - 4 - prototypes} class scores, {prototypes} mask coefficients for the {prototypes} "
            f"prototypes of {mask_output(view.outputs)!r}), but the labels setting gives {num_classes}; give one "
            "name per class"
        )
    if coefficients != prototypes:
        raise ValueError(
            f"{config.model}: its output {name!r} {list(shape)} carries {coefficients} mask coefficients per "
            f"detection ({how}), but {mask_output(view.outputs)!r} has {prototypes} mask prototypes: the prototype "
            "count must equal the coefficient count"
        )


def _masks(config: DetectorConfig, view: ModelView) -> int:
    """The mask prototypes of a segmentation head (0: none); ValueError (one line naming the file or setting)
    where the file says `task: segment` without prototypes, or `masks: true` is set for a file without them."""
    count = coefficient_count(view.outputs)
    if not count and view.metadata.task == "segment":
        raise ValueError(
            f"{config.model}: its metadata says task segment, but it has no (batch, prototypes, height, width) "
            f"output of mask prototypes (outputs {', '.join(f'{n} {list(s)}' for n, s in view.outputs.items())})"
        )
    if not count and config.masks:
        raise ValueError(
            f"masks: true, but {config.model} has no mask prototypes (not a segmentation model); set masks to "
            "false or auto"
        )
    return count
