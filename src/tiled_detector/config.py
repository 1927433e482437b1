"""`DetectorConfig`: every setting of the tiled detection pipeline, validated once on construction."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tiled_detector.decode import OutputLayout
from tiled_detector.engines.base import Backend, Precision
from tiled_detector.merge import MatchMetric, MergeMethod
from tiled_detector.options import check_channel_order

# Fields whose change needs the engine loaded again (everything else is applied per call).
ENGINE_FIELDS = frozenset({"model", "backend", "device", "precision", "max_batch", "engine_options"})


def _default_model() -> Path | None:
    """The bundled model, when the package ships one."""
    try:
        from tiled_detector.models import default_model_path
    except ImportError:
        return None
    return Path(default_model_path())


def _pair(name: str, value: Sequence[int] | int) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair):
        raise ValueError(f"{name} must be two positive integers (width, height), got {value!r}")
    return int(pair[0]), int(pair[1])


def _in_range(name: str, value: float, low: float, high: float, high_open: bool = False) -> float:
    value = float(value)
    if not (low <= value < high if high_open else low <= value <= high) or math.isnan(value):
        raise ValueError(f"{name} must be in [{low}, {high}{')' if high_open else ']'}, got {value!r}")
    return value


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class DetectorConfig:
    """Settings of a `TiledDetector`. String options accept enum values or their names (any case).

    tile_size is (width, height) in frame pixels; overlap a ratio in [0, 1); full_frame adds a letterboxed view
    of the whole frame to the batch; classes keeps only those class ids (None: all); top_k caps candidates per
    batch image before merging; seam_suppression drops boxes cut by a tile seam when another view sees the whole
    object; labels overrides the class names found in the model; profile synchronises the device at every
    stage so that per-stage timings are host wall times (slower). engine_options go to the engine's
    constructor (e.g. ONNX Runtime `threads`, torch `input_shape`). channel_order is the model's input order
    (rgb or bgr). sync_free (CUDA only) post-processes on fixed-size tensors so that a frame costs exactly one
    host-to-device and one device-to-host copy and the host never waits mid-frame; False takes the exact path
    with data-dependent shapes, which synchronises about a dozen times but launches fewer kernels.
    """

    model: Path | None = field(default_factory=_default_model)
    backend: Backend = Backend.AUTO
    device: str = "cpu"
    precision: Precision = Precision.FP32
    tile_size: tuple[int, int] = (640, 640)
    overlap: float = 0.2
    full_frame: bool = True
    conf_threshold: float = 0.25
    merge: MergeMethod = MergeMethod.NMS
    match_metric: MatchMetric = MatchMetric.IOS
    merge_threshold: float = 0.5
    class_agnostic: bool = False
    max_detections: int = 300
    classes: tuple[int, ...] | None = None
    top_k: int = 100
    layout: OutputLayout = OutputLayout.AUTO
    max_batch: int = 32
    seam_suppression: bool = True
    labels: tuple[str, ...] | None = None
    channel_order: str = "rgb"
    sync_free: bool = True
    profile: bool = False
    engine_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def set_(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if self.model is None:
            raise ValueError("model is required: no bundled model is installed (tiled_detector.models)")
        set_("model", Path(self.model))
        set_("backend", Backend.from_value(self.backend))
        set_("precision", Precision.from_value(self.precision))
        set_("merge", MergeMethod.from_value(self.merge))
        set_("match_metric", MatchMetric.from_value(self.match_metric))
        set_("layout", OutputLayout.from_value(self.layout))
        device = str(self.device).lower()
        if not (device in {"cpu", "cuda"} or (device.startswith("cuda:") and device[5:].isdigit())):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        set_("device", device)
        set_("tile_size", _pair("tile_size", self.tile_size))
        set_("overlap", _in_range("overlap", self.overlap, 0.0, 1.0, high_open=True))
        set_("conf_threshold", _in_range("conf_threshold", self.conf_threshold, 0.0, 1.0))
        set_("merge_threshold", _in_range("merge_threshold", self.merge_threshold, 0.0, 1.0))
        for name in ("max_detections", "top_k", "max_batch"):
            _positive(name, getattr(self, name))
        for name in ("full_frame", "class_agnostic", "seam_suppression", "profile", "sync_free"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
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
        check_channel_order(self.channel_order)
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
