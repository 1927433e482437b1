"""`DetectorConfig`: every setting of the tiled detection pipeline, validated once on construction, and the
table (`Setting`, one per field) from which everything else about a setting is derived.

A field's `Setting` says what a user may know of it (help), the kind of its values (`tiled_detector.settings.kinds`: type,
range or choices, its ROS parameter(s), its CLI flag) and when a change applies (`Applies`). From the table come
the node's parameters and their descriptors, config/detector.yaml's documented defaults (a test compares), the CLI
flags of every subcommand, the runtime/read-only split, and the `FrameSettings` the frame program reads (which is
also its capture key). Adding a setting of an existing kind means one field here and its line in
config/detector.yaml.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiled_detector.engines.base import Backend, Precision
from tiled_detector.engines.metadata import ModelMetadata
from tiled_detector.pipeline.frame_settings import FrameSettings, KeypointFusion
from tiled_detector.pipeline.layouts import OutputLayout
from tiled_detector.pipeline.merge import DEFAULT_RULE, MatchMetric, MergeMethod
from tiled_detector.pipeline.policy import read_mask
from tiled_detector.pipeline.preprocess import InputFormat
from tiled_detector.pipeline.tiling import FULL_FRAME_ROI
from tiled_detector.settings.class_kinds import Classes, ClassValues
from tiled_detector.settings.kinds import (
    CameraFiles,
    Channels,
    Choice,
    File,
    Flag,
    Kind,
    Names,
    Number,
    Options,
    Rectangle,
    Size,
    Switch,
    Text,
)
from tiled_detector.settings.options import ChannelOrder, LetterboxAnchor, Option
from tiled_detector.tracking.bytetrack import TrackerKind, TrackerSettings
from tiled_detector.tracking.motion import MotionCompensation


class Applies(Option):
    """When a change of a setting takes effect."""

    ENGINE = (
        "engine"  # with a new engine (the node's parameter is read-only; `TiledDetector.update` refuses it)
    )
    DETECTOR = (
        "detector"  # the detector is rebuilt around its engine (read-only parameter; `update` takes it)
    )
    PLAN = "plan"  # from the next frame: the tiles are planned again
    FRAME = "frame"  # from the next frame: read by the frame program (a `FrameSettings` field, in the capture key)
    HOST = "host"  # from the next frame: read on the host only, never inside the frame program


@dataclass(frozen=True)
class Setting:
    """What a user may know of a `DetectorConfig` field (help), the kind of its values, and when it applies.

    parameter: the node has it as a ROS parameter and the CLI as a flag; ros_name: the parameter's name (a size's
    prefix) when it is not the field's; flag: the CLI flag's name when it is not the field's.
    """

    help: str
    kind: Kind
    applies: Applies = Applies.FRAME
    parameter: bool = True
    ros_name: str | None = None
    flag: str | None = None

    @property
    def runtime(self) -> bool:
        """A change applies from the next frame (the node's parameter is writable)."""
        return self.applies in (Applies.PLAN, Applies.FRAME, Applies.HOST)


def _setting(default: Any = dataclasses.MISSING, help: str = "", **meta: Any) -> Any:
    """A dataclass field with its `Setting` as metadata (a dict default is copied per instance)."""
    metadata = {"setting": Setting(help, **meta)}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _device(name: str, text: str) -> str:
    device = text.strip().lower()
    if not (device in {"cpu", "cuda"} or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"{name} must be 'cpu', 'cuda' or 'cuda:N', got {text!r}")
    return device


def _bundled_model(backend: Backend) -> Any:
    """The bundled model for a backend, when the package ships one (else None)."""
    try:
        from tiled_detector.models import default_model_path
    except ImportError:
        return None
    return default_model_path(backend)


@dataclass(frozen=True)
class DetectorConfig:
    """Settings of a `TiledDetector`; each field's `Setting` (`settings()`) gives its help, kind and when it
    applies: the node's parameters, config/detector.yaml and the CLI flags are derived from them.
    String options accept enum values or their names (any case). tile_size is (width, height) in frame pixels, or
    None (auto): the model's input size (`tile_hw_for`).
    """

    model: Any = _setting(
        None,
        "model file (.onnx, .engine/.plan, .ts/.pt2); empty = the bundled default model (its TorchScript file "
        "for the torch backend, else its ONNX file)",
        kind=File(),
        applies=Applies.ENGINE,
    )
    backend: Backend = _setting(
        Backend.AUTO,
        "inference backend; auto: on CUDA one that runs there (.onnx: TensorRT, else ONNX Runtime with CUDA, else the TorchScript beside it)",
        kind=Choice(option=Backend),
        applies=Applies.ENGINE,
    )
    device: str = _setting(
        "cpu",
        "torch device of the engine: cpu, cuda or cuda:N",
        kind=Text(rule=_device),
        applies=Applies.ENGINE,
    )
    precision: Precision = _setting(
        Precision.FP32,
        "engine precision: fp16 with TensorRT or torch on CUDA; int8 with ONNX Runtime or TensorRT, from an ONNX "
        "with Q/DQ nodes (given, or made from calibration)",
        kind=Choice(option=Precision),
        applies=Applies.ENGINE,
    )
    calibration: Path | None = _setting(
        None,
        "int8 calibration frames: a folder of images or a rosbag2 bag from the cameras; an ONNX model without Q/DQ "
        "nodes is quantized from them once, tiled as at run time (cached); empty = int8 needs a Q/DQ model",
        kind=File(),
        applies=Applies.ENGINE,
    )
    input_size: tuple[int, int] | None = _setting(
        None,
        "the model's input width and height, for a model file that does not say it (not set, 0 0 = from the file)",
        kind=Size(low=16, high=8192, optional=True),
        applies=Applies.ENGINE,
        ros_name="input",
    )
    tile_size: tuple[int, int] | None = _setting(
        None,
        "tile width and height in pixels; auto (not set, 0 0) = the model's input size",
        kind=Size(low=16, high=8192, optional=True, unset="auto: the model's input size"),
        applies=Applies.PLAN,
        ros_name="tile",
    )
    overlap: float = _setting(
        0.2, "overlap ratio between neighbouring tiles", kind=Number(0.0, 0.95), applies=Applies.PLAN
    )
    full_frame: bool = _setting(
        True, "also run the whole frame (letterboxed) in the same batch", kind=Flag(), applies=Applies.PLAN
    )
    conf_threshold: float = _setting(0.25, "minimum detection score", kind=Number(0.0, 1.0), flag="conf")
    class_thresholds: tuple[tuple[int | str, float], ...] = _setting(
        (),
        "minimum score per class, 'class:threshold' entries (names or ids, e.g. person:0.35 3:0.6); classes not "
        "listed keep conf_threshold",
        kind=ClassValues(0.0, 1.0),
    )
    roi: tuple[float, float, float, float] = _setting(
        FULL_FRAME_ROI,
        "region of interest [x_min, y_min, x_max, y_max], fractions of the frame: tiles cover it only, and a box "
        "is kept when its centre lies in it (the full-frame view still sees the whole frame)",
        kind=Rectangle(),
        applies=Applies.PLAN,
    )
    ignore_mask: tuple[tuple[str, Path], ...] = _setting(
        (),
        "mask images (any size, scaled to the frame; non-zero = ignored): 'path' for every camera, "
        "'camera=path' for one; a box more than half on ignored pixels is dropped, a tile wholly on them is not run",
        kind=CameraFiles(rule=read_mask),
        applies=Applies.PLAN,
    )
    min_box_size: float = _setting(
        0.0, "smallest box kept: its shorter side in frame pixels (0 = no limit)", kind=Number(0.0, 100000.0)
    )
    max_box_size: float = _setting(
        0.0, "largest box kept: its shorter side in frame pixels (0 = no limit)", kind=Number(0.0, 100000.0)
    )
    merge: MergeMethod = _setting(
        DEFAULT_RULE.method,
        "how detections from overlapping tiles are merged",
        kind=Choice(option=MergeMethod),
    )
    match_metric: MatchMetric = _setting(
        DEFAULT_RULE.metric,
        "overlap measure for merging: intersection over union or over smaller",
        kind=Choice(option=MatchMetric),
    )
    merge_threshold: float = _setting(
        DEFAULT_RULE.threshold,
        "overlap above which two detections are the same object",
        kind=Number(0.0, 1.0),
    )
    class_agnostic: bool = _setting(
        DEFAULT_RULE.class_agnostic, "merge detections across classes", kind=Flag()
    )
    nms_rounds: int = _setting(
        DEFAULT_RULE.rounds,
        "0 = SAHI's result: the suppression of nms and greedy_nmm settled to its fixed point (its cost grows with "
        "the longest chain of boxes suppressing one another, as in a flood of candidates); N > 0 = at most N matrix "
        "rounds over all candidates, a bounded cost that CHANGES RESULTS where chains are longer than N (1: a box "
        "is dropped when any higher-ranked box matches it; measured effect on real-photo AP in docs/PERFORMANCE.md)",
        kind=Number(0, 256, integer=True),
    )
    max_detections: int = _setting(
        300, "most detections per frame (highest scores kept)", kind=Number(1, 100000, integer=True)
    )
    classes: tuple[int | str, ...] | None = _setting(
        None, "only these classes (names or ids); not set or empty = all", kind=Classes()
    )
    top_k: int = _setting(
        100, "most candidates per tile (highest scores) before merging", kind=Number(1, 100000, integer=True)
    )
    tracker: TrackerKind = _setting(
        TrackerKind.NONE,
        "tracker after the merge, one per camera: none, or bytetrack (Detection2D.id = the track id)",
        kind=Choice(option=TrackerKind),
        applies=Applies.HOST,
    )
    track_activation_threshold: float = _setting(
        0.25,
        "tracker: a detection above this score continues a track (above it + 0.1: starts one); below it, down to "
        "0.1, it can only continue a track",
        kind=Number(0.0, 1.0),
        applies=Applies.HOST,
    )
    lost_track_buffer: float = _setting(
        1.0,
        "tracker: seconds a track without detections is kept for one to take it up again",
        kind=Number(0.001, 3600.0),
        applies=Applies.HOST,
    )
    track_matching_threshold: float = _setting(
        0.8,
        "tracker: the largest cost (1 - IoU x score) of a detection-to-track match",
        kind=Number(0.0, 1.0),
        applies=Applies.HOST,
    )
    tile_budget: int = _setting(
        0,
        "tiles run per frame of a stream, chosen from the tracks (or the last detections) and each tile's age, "
        "plus the full-frame view; objects in tiles not run are reported from what was seen before; 0 = every "
        "tile every frame",
        kind=Number(0, 100000, integer=True),
        applies=Applies.HOST,
    )
    max_tile_age: int = _setting(
        4,
        "with tile_budget: every tile runs at least once in this many frames (the latest a new object is found)",
        kind=Number(1, 1000, integer=True),
        applies=Applies.HOST,
    )
    motion_compensation: MotionCompensation = _setting(
        MotionCompensation.IMAGE,
        "with tracker or tile_budget: the camera's own motion between frames, estimated from each frame on the "
        "engine's device, moves the tracks, the budget's claims, carried boxes and marks the view that entered the "
        "frame (image); none: the camera is assumed still",
        kind=Choice(option=MotionCompensation),
        applies=Applies.HOST,
    )
    depth: bool = _setting(
        False,
        "3D positions from an aligned depth image: the node subscribes depth_image (16UC1 or 32FC1, registered to "
        "the colour camera) and camera_info beside each camera's image and publishes detections_3d",
        kind=Flag(),
        applies=Applies.DETECTOR,
    )
    depth_scale: float = _setting(
        0.001,
        "metres per unit of a 16UC1 depth image (millimetres: 0.001); 32FC1 is in metres",
        kind=Number(1e-6, 1.0),
    )
    depth_sync_tolerance: float = _setting(
        0.02,
        "seconds between a colour frame's stamp and its depth image's stamp (matched by stamp, the nearest)",
        kind=Number(0.0, 10.0),
        applies=Applies.HOST,
    )
    depth_min: float = _setting(
        0.1,
        "nearest valid depth in metres (below: a hole or an invalid code)",
        kind=Number(0.0, 1000.0),
    )
    depth_max: float = _setting(
        65.0,
        "farthest valid depth in metres (beyond: invalid; the default is below 16UC1's largest value at 0.001, "
        "which drivers use for saturated pixels)",
        kind=Number(0.0, 1000.0),
    )
    masks: bool | None = _setting(
        None,
        "instance masks of a segmentation model's detections (the masks topic, a label image; detect --json's mask): "
        "true, false, or auto (not set: true for a segmentation model)",
        kind=Switch(auto="true for a segmentation model"),
    )
    mask_scale: float = _setting(
        1.0,
        "resolution of the masks as a fraction of the frame's (the label image is the frame's size times it)",
        kind=Number(0.0, 1.0, open_low=True),
    )
    keypoints: bool | None = _setting(
        None,
        "keypoints of a pose model's detections (the keypoints topic; detect --json's keypoints): true, false, or "
        "auto (not set: true for a pose model)",
        kind=Switch(auto="true for a pose model"),
    )
    keypoint_fusion: KeypointFusion = _setting(
        KeypointFusion.JOINTS,
        "where a detection's keypoints come from: joints (each joint from the views of the object that saw it "
        "whole, weighted by its score) or keeper (the kept candidate's own)",
        kind=Choice(option=KeypointFusion),
    )
    layout: OutputLayout = _setting(
        OutputLayout.AUTO,
        "model output layout; auto detects it from the output shapes",
        kind=Choice(option=OutputLayout),
        applies=Applies.DETECTOR,
    )
    max_batch: int = _setting(
        32,
        "largest engine batch; larger tile batches are split (on a CPU at most 4 images per call, the fastest "
        "there: engine option cpu_batch)",
        kind=Number(1, 1024, integer=True),
        applies=Applies.ENGINE,
    )
    seam_suppression: bool = _setting(
        True, "drop a box cut by a tile seam when another view sees the whole object", kind=Flag()
    )
    labels: tuple[str, ...] | None = _setting(
        None,
        "class names by id; not set = the labels stored with the model",
        kind=Names(),
        applies=Applies.DETECTOR,
    )
    channel_order: ChannelOrder = _setting(
        ChannelOrder.AUTO,
        "channel order the model expects; auto = the model file's, else its family's (yolox, nanodet: bgr), else "
        "rgb",
        kind=Choice(option=ChannelOrder),
        applies=Applies.DETECTOR,
        ros_name="model_channel_order",
    )
    input_scale: float | None = _setting(
        None,
        "multiplier applied to 0-255 pixel values (not set = the model file's, else its family's: 1/255; yolox, "
        "picodet, nanodet 1.0)",
        kind=Number(1e-6, 1000.0, unset=0.0),
        applies=Applies.DETECTOR,
    )
    input_mean: tuple[float, float, float] | None = _setting(
        None,
        "per channel, subtracted after input_scale, in the model's channel order (not set = the model file's, "
        "else its family's, else 0 0 0)",
        kind=Channels(),
        applies=Applies.DETECTOR,
    )
    input_std: tuple[float, float, float] | None = _setting(
        None,
        "per channel, divides after input_mean, in the model's channel order (not set = the model file's, else "
        "its family's, else 1 1 1)",
        kind=Channels(nonzero=True),
        applies=Applies.DETECTOR,
    )
    letterbox: LetterboxAnchor = _setting(
        LetterboxAnchor.AUTO,
        "where a resized view sits in the model input: center, top_left (padding right and below), or stretch "
        "(the whole input, aspect not kept); auto = the model file's, else its family's (yolox: top_left, "
        "picodet: stretch), else center",
        kind=Choice(option=LetterboxAnchor),
        applies=Applies.DETECTOR,
    )
    pad_value: float | None = _setting(
        None,
        "grey level (0-255) of the letterbox padding and of tile pixels past the frame (not set = the model "
        "file's, else its family's (nanodet 0), else 114)",
        kind=Number(0.0, 255.0, unset=-1.0),
        applies=Applies.DETECTOR,
    )
    sync_free: bool = _setting(
        True,
        "CUDA: post-process on fixed-size tensors, one host-to-device and one device-to-host copy per "
        "frame (false: the exact path with data-dependent shapes)",
        kind=Flag(),
        applies=Applies.DETECTOR,
        parameter=False,
    )
    cuda_graph: bool = _setting(
        True,
        "CUDA, torch or TensorRT engine: capture each frame's work (tiles to merged boxes) as one CUDA graph per "
        "frame size and settings and replay it (false: launch every kernel each frame)",
        kind=Flag(),
        applies=Applies.DETECTOR,
    )
    compile: bool = _setting(
        False,
        "CUDA with triton: fuse decoding and post-processing with torch.compile (fewer kernels per frame; the "
        "first frame of each size compiles, for minutes, then torch caches it on disk)",
        kind=Flag(),
        applies=Applies.DETECTOR,
    )
    profile: bool = _setting(
        False,
        "synchronise the device at every stage so that stage timings are wall times (slower)",
        kind=Flag(),
        applies=Applies.HOST,
        parameter=False,
    )
    engine_options: Any = _setting(
        {},
        "options of the engine's constructor (ONNX Runtime threads, torch input_shape, ...)",
        kind=Options(),
        applies=Applies.ENGINE,
        parameter=False,
    )

    def __post_init__(self) -> None:
        for name, setting in settings().items():
            object.__setattr__(self, name, setting.kind.check(name, getattr(self, name)))
        if 0 < self.max_box_size < self.min_box_size:
            raise ValueError(
                f"min_box_size ({self.min_box_size:g}) must not exceed max_box_size ({self.max_box_size:g}); "
                "0 = no limit"
            )
        if not self.depth_min < self.depth_max:
            raise ValueError(
                f"depth_min ({self.depth_min:g}) must be less than depth_max ({self.depth_max:g}), metres"
            )
        if self.model is None:
            model = _bundled_model(self.backend)
            if model is None:
                raise ValueError("model is required: no bundled model is installed (tiled_detector.models)")
            object.__setattr__(self, "model", model)

    def input_format(self, family: str | OutputLayout | None, model: ModelMetadata) -> InputFormat:
        """How pixels become the model's input: each convention given here, else what the model file says,
        else its family's (`FAMILY_INPUTS`: yolox, picodet, nanodet), else ultralytics' (`InputFormat()`)."""
        chosen = {n: v for n, (v, _) in self.input_sources(family, model).items()}
        return InputFormat(**{INPUT_SETTINGS[n]: getattr(v, "value", v) for n, v in chosen.items()})

    def input_sources(
        self, family: str | OutputLayout | None, model: ModelMetadata
    ) -> dict[str, tuple[Any, str]]:
        """The input conventions (setting name -> (value, where it came from: "setting", "model file",
        "<family> default")) that are not ultralytics' defaults."""
        name = getattr(family, "value", family)
        given = {n: getattr(self, n) for n in INPUT_SETTINGS}
        given = {
            n: v
            for n, v in given.items()
            if v is not None and v not in (ChannelOrder.AUTO, LetterboxAnchor.AUTO)
        }
        return {
            **{n: (v, f"{name} default") for n, v in FAMILY_INPUTS.get(name, {}).items()},
            **{n: (v, "model file") for n, v in model.inputs},
            **{n: (v, "setting") for n, v in given.items()},
        }

    def tile_hw_for(self, input_hw: tuple[int, int]) -> tuple[int, int]:
        """Tile height and width (tile_size is width, height): the setting's, or with auto the model's input
        (`input_hw`, height and width)."""
        return (
            (int(input_hw[0]), int(input_hw[1]))
            if self.tile_size is None
            else (self.tile_size[1], self.tile_size[0])
        )

    def tracker_settings(self) -> TrackerSettings:
        """The tracker's settings."""
        return TrackerSettings(
            self.track_activation_threshold, self.lost_track_buffer, self.track_matching_threshold
        )

    def engine_arguments(self) -> dict[str, Any]:
        """The engine's constructor options: `engine_options`, and the input (height, width) where
        `input_size` gives it."""
        options = dict(self.engine_options)
        if self.input_size is not None:
            options["input_hw"] = (self.input_size[1], self.input_size[0])
        return options

    def replace(self, **changes: Any) -> DetectorConfig:
        """A validated copy with `changes` applied (unknown names raise listing the valid ones)."""
        unknown = sorted(set(changes) - set(settings()))
        if unknown:
            raise ValueError(
                f"unknown detector settings {unknown}; expected some of: {', '.join(sorted(settings()))}"
            )
        return dataclasses.replace(self, **changes)

    def changed(self, other: DetectorConfig) -> set[Applies]:
        """When the fields that differ between this config and `other` apply."""
        return {s.applies for n, s in settings().items() if getattr(self, n) != getattr(other, n)}

    def frame_settings(self, labels: Sequence[str] | None) -> FrameSettings:
        """The settings the frame program reads (every `Applies.FRAME` field), class names resolved to ids
        against `labels` (ValueError naming an unknown class)."""
        return FrameSettings(
            **{
                n: s.kind.resolve(n, getattr(self, n), labels)
                for n, s in settings().items()
                if s.applies is Applies.FRAME
            }
        )


# the input conventions: setting -> `InputFormat` field
INPUT_SETTINGS = {
    "channel_order": "channel_order",
    "input_scale": "scale",
    "input_mean": "mean",
    "input_std": "std",
    "letterbox": "letterbox",
    "pad_value": "pad_value",
}
# a model family's input conventions, where they are not ultralytics' (`InputFormat()`): YOLOX's own
# pre-processing (yolox/data/data_augment.py `preproc`: BGR, 0-255, no mean / std, padded right and below with 114);
# PP-PicoDet's (PaddleDetection 2.3 configs/picodet/_base_/picodet_416_reader.yml: images decoded to RGB, resized
# to the input without keeping the aspect ratio, /255 then ImageNet's mean / std, here on 0-255 values); NanoDet's
# (its configs' normalize on BGR 0-255 values; its ONNX and ncnn demos' `resize_uniform`: the aspect kept, centred
# on black)
FAMILY_INPUTS: dict[str, dict[str, Any]] = {
    "yolox": {"channel_order": "bgr", "input_scale": 1.0, "letterbox": "top_left", "pad_value": 114.0},
    "picodet": {
        "channel_order": "rgb",
        "input_scale": 1.0,
        "input_mean": (123.675, 116.28, 103.53),
        "input_std": (58.395, 57.12, 57.375),
        "letterbox": "stretch",
    },
    "nanodet": {
        "channel_order": "bgr",
        "input_scale": 1.0,
        "input_mean": (103.53, 116.28, 123.675),
        "input_std": (57.375, 57.12, 58.395),
        "letterbox": "center",
        "pad_value": 0.0,
    },
}


def settings() -> dict[str, Setting]:
    """Every field's `Setting`, in field order."""
    return _SETTINGS


_SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in dataclasses.fields(DetectorConfig)}

# fields whose change needs the engine loaded again (everything else is applied per call or by a rebuild)
ENGINE_FIELDS = frozenset(n for n, s in _SETTINGS.items() if s.applies is Applies.ENGINE)


def default(name: str) -> Any:
    """The default value of a `DetectorConfig` field (the bundled model is the default model's None)."""
    f = next(f for f in dataclasses.fields(DetectorConfig) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default
