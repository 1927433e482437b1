"""`DetectorConfig`: every setting of the tiled detection pipeline, validated once on construction."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tiled_detector.engines.base import Backend, Precision
from tiled_detector.options import ChannelOrder, out_of_range
from tiled_detector.pipeline.decode import OutputLayout
from tiled_detector.pipeline.merge import MatchMetric, MergeMethod


@dataclass(frozen=True)
class Setting:
    """What a user may know of a `DetectorConfig` field: its help text, range and choices, and when it applies.

    runtime: changes take effect from the next frame (the node's parameter is writable); engine: a change needs
    the engine loaded again (the rest of the non-runtime fields describe the model: labels, layout, channel
    order); parameter: the node has it as a ROS parameter (and the CLI as a flag).
    """

    help: str
    runtime: bool = True
    engine: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    parameter: bool = True
    flag: str | None = None  # CLI flag when it is not the field's name


def _setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, **meta: Any) -> Any:
    choices = meta.pop("choices", None)
    if choices is not None:
        meta["choices"] = tuple(member.value for member in choices)
    if meta.get("engine"):
        meta["runtime"] = False
    metadata = {"setting": Setting(help, **meta)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _default_model() -> Path | None:
    """The bundled model, when the package ships one."""
    try:
        from tiled_detector.models import default_model_path
    except ImportError:
        return None
    return Path(default_model_path())


def _pair(name: str, value: Sequence[int] | int, setting: Setting) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) and setting.low <= v <= setting.high for v in pair
    ):
        raise ValueError(
            f"{name} must be two positive integers (width, height) in [{setting.low}, {setting.high}], "
            f"got {value!r}"
        )
    return int(pair[0]), int(pair[1])


def _check(name: str, value: Any, setting: Setting) -> None:
    """Raise ValueError when `value` is outside the setting's range."""
    reason = out_of_range(name, value, setting.low, setting.high)
    if reason:
        raise ValueError(reason)


def _float(name: str, value: Any, setting: Setting) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    _check(name, float(value), setting)
    return float(value)


def _int(name: str, value: Any, setting: Setting) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    _check(name, value, setting)
    return value


def _bool(name: str, value: Any, setting: Setting) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


# field annotation -> checker of its values (annotations are strings here: `from __future__ import annotations`)
_SCALARS = {"float": _float, "int": _int, "bool": _bool}


@dataclass(frozen=True)
class DetectorConfig:
    """Settings of a `TiledDetector`; each field's `Setting` (`settings()`) gives its help, range and whether it
    changes at runtime: the node's parameters, config/detector.yaml and the CLI flags are derived from them.
    String options accept enum values or their names (any case). tile_size is (width, height) in frame pixels.
    """

    model: Path | None = _setting(
        help="model file (.onnx, .engine/.plan, .ts/.pt2); empty = the bundled default model",
        factory=_default_model,
        engine=True,
    )
    backend: Backend = _setting(
        Backend.AUTO,
        "inference backend; auto picks TensorRT for .onnx on CUDA when installed",
        engine=True,
        choices=Backend,
    )
    device: str = _setting("cpu", "torch device of the engine: cpu, cuda or cuda:N", engine=True)
    precision: Precision = _setting(
        Precision.FP32,
        "engine precision: fp16 with TensorRT or torch on CUDA, int8 with TensorRT",
        engine=True,
        choices=Precision,
    )
    tile_size: tuple[int, int] = _setting((640, 640), "tile width and height in pixels", low=16, high=8192)
    overlap: float = _setting(0.2, "overlap ratio between neighbouring tiles", low=0.0, high=0.95)
    full_frame: bool = _setting(True, "also run the whole frame (letterboxed) in the same batch")
    conf_threshold: float = _setting(0.25, "minimum detection score", low=0.0, high=1.0, flag="conf")
    merge: MergeMethod = _setting(
        MergeMethod.NMS, "how detections from overlapping tiles are merged", choices=MergeMethod
    )
    match_metric: MatchMetric = _setting(
        MatchMetric.IOS,
        "overlap measure for merging: intersection over union or over smaller",
        choices=MatchMetric,
    )
    merge_threshold: float = _setting(
        0.5, "overlap above which two detections are the same object", low=0.0, high=1.0
    )
    class_agnostic: bool = _setting(False, "merge detections across classes")
    max_detections: int = _setting(300, "most detections per frame (highest scores kept)", low=1, high=100000)
    classes: tuple[int, ...] | None = _setting(
        None, "only these classes (names or ids); not set or empty = all"
    )
    top_k: int = _setting(100, "most candidates per tile (highest scores) before merging", low=1, high=100000)
    layout: OutputLayout = _setting(
        OutputLayout.AUTO,
        "model output layout; auto detects it from the output shapes",
        runtime=False,
        choices=OutputLayout,
    )
    max_batch: int = _setting(
        32,
        "largest engine batch; larger tile batches are split (on a CPU at most 4 images per call, the fastest "
        "there: engine option cpu_batch)",
        engine=True,
        low=1,
        high=1024,
    )
    seam_suppression: bool = _setting(
        True, "drop a box cut by a tile seam when another view sees the whole object"
    )
    labels: tuple[str, ...] | None = _setting(
        None, "class names by id; not set = the labels stored with the model", runtime=False
    )
    channel_order: str = _setting(
        "rgb", "channel order the model expects", runtime=False, choices=ChannelOrder
    )
    sync_free: bool = _setting(
        True,
        "CUDA: post-process on fixed-size tensors, one host-to-device and one device-to-host copy per "
        "frame (false: the exact path with data-dependent shapes)",
        parameter=False,
    )
    cuda_graph: bool = _setting(
        True,
        "CUDA, torch or TensorRT engine: capture each frame's work (tiles to merged boxes) as one CUDA graph per "
        "frame size and settings and replay it (false: launch every kernel each frame)",
        runtime=False,
    )
    compile: bool = _setting(
        False,
        "CUDA with triton: fuse decoding and post-processing with torch.compile (fewer kernels per frame; the "
        "first frame of each size compiles, for minutes, then torch caches it on disk)",
        runtime=False,
    )
    profile: bool = _setting(
        False,
        "synchronise the device at every stage so that stage timings are wall times (slower)",
        parameter=False,
    )
    engine_options: Mapping[str, Any] = _setting(
        help="options of the engine's constructor (ONNX Runtime threads, torch input_shape, ...)",
        factory=dict,
        engine=True,
        parameter=False,
    )

    def __post_init__(self) -> None:
        def set_(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if self.model is None:
            raise ValueError("model is required: no bundled model is installed (tiled_detector.models)")
        set_("model", Path(self.model))
        for name, option in _OPTIONS.items():
            set_(name, option.from_value(getattr(self, name)))
        device = str(self.device).lower()
        if not (device in {"cpu", "cuda"} or (device.startswith("cuda:") and device[5:].isdigit())):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        set_("device", device)
        set_("tile_size", _pair("tile_size", self.tile_size, settings()["tile_size"]))
        for f in dataclasses.fields(self):
            if f.type in _SCALARS:
                set_(f.name, _SCALARS[f.type](f.name, getattr(self, f.name), f.metadata["setting"]))
        if self.classes is not None:
            classes = tuple(self.classes)
            if not classes or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in classes
            ):
                raise ValueError(
                    f"classes must be None or a non-empty list of class ids >= 0, got {self.classes!r}"
                )
            set_("classes", tuple(sorted(set(classes))))
        if self.labels is not None:
            if isinstance(self.labels, str) or not all(isinstance(n, str) for n in self.labels):
                raise ValueError(f"labels must be None or a list of class names, got {self.labels!r}")
            set_("labels", tuple(self.labels))
        if not isinstance(self.engine_options, Mapping):
            raise ValueError(f"engine_options must be a mapping, got {self.engine_options!r}")
        set_("engine_options", MappingProxyType(dict(self.engine_options)))

    @property
    def tile_hw(self) -> tuple[int, int]:
        """Tile height and width (tile_size is width, height)."""
        return self.tile_size[1], self.tile_size[0]

    def replace(self, **changes: Any) -> DetectorConfig:
        """A validated copy with `changes` applied (unknown names raise listing the valid ones)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ValueError(
                f"unknown detector settings {unknown}; expected some of: {', '.join(sorted(names))}"
            )
        return dataclasses.replace(self, **changes)


# string-option fields -> their enum
_OPTIONS = {
    "backend": Backend,
    "precision": Precision,
    "merge": MergeMethod,
    "match_metric": MatchMetric,
    "layout": OutputLayout,
    "channel_order": ChannelOrder,
}

# fields whose change needs the engine loaded again (everything else is applied per call)
ENGINE_FIELDS = frozenset(f.name for f in dataclasses.fields(DetectorConfig) if f.metadata["setting"].engine)


def settings() -> dict[str, Setting]:
    """Every field's `Setting`, in field order."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(DetectorConfig)}


def default(name: str) -> Any:
    """The default value of a `DetectorConfig` field."""
    f = next(f for f in dataclasses.fields(DetectorConfig) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default
