"""Tile planning: which frame regions go into the batch, and how model-input pixels map back to the frame.

Every image of the batch is a *view*: a rectangle of the frame letterboxed into the model input (resized by
`scale = min(in_h / h, in_w / w)`, then centred with `pad_x`, `pad_y` pixels of padding, or placed at the
top-left with none before it: `letterbox="top_left"`, YOLOX's way), or stretched over the whole input (each axis
by its own scale, no padding: `letterbox="stretch"`, PP-PicoDet's way). Views 0..N-1 are the tiles; view N (when
`full_frame`) is the whole frame. A point (u, v) of model-input pixels of view i maps to the frame point
(u * scales_xy[i, 0] + offsets[i, 0], v * scales_xy[i, 1] + offsets[i, 1]), with scales_xy[i] = 1 / the scale
the resize applies per axis (the region's size over the resized size: exact, whatever the rounding to whole
pixels) and offsets[i] = view origin - pad * scales_xy[i]; `scales` (B,) is the larger of the two.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

# the region of interest that is the whole frame: x_min, y_min, x_max, y_max as fractions of the frame
FULL_FRAME_ROI = (0.0, 0.0, 1.0, 1.0)


class Coverage(Protocol):
    """Pixels a frame's tiles need not cover (an ignore mask at the frame's size: `policy.IgnoreMask`)."""

    def covers(self, rects: np.ndarray) -> np.ndarray:
        """(N,) bool: whether every frame pixel of each (N, 4) x1, y1, x2, y2 rectangle is covered."""
        ...


def region_pixels(roi: Sequence[float], frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
    """The pixels x1, y1, x2, y2 a region of interest (fractions of the frame) spans: its edges rounded
    outwards, at least one pixel per side."""
    height, width = frame_hw
    x1 = min(math.floor(roi[0] * width), width - 1)
    y1 = min(math.floor(roi[1] * height), height - 1)
    return x1, y1, max(math.ceil(roi[2] * width), x1 + 1), max(math.ceil(roi[3] * height), y1 + 1)


def _check_size(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _starts(size: int, tile: int, overlap: float) -> np.ndarray:
    """Tile start offsets along one axis, as SAHI's get_slice_bboxes places them."""
    if size <= tile:
        return np.zeros(1, np.int64)
    step = tile - int(overlap * tile)  # SAHI: overlap pixels = int(ratio * tile)
    count = -(-(size - tile) // step) + 1  # fewest tiles whose last one reaches the border
    starts = np.arange(count, dtype=np.int64) * step
    starts[-1] = size - tile  # the last tile is shifted back onto the border
    return starts


def plan_tiles(height: int, width: int, tile_height: int, tile_width: int, overlap: float) -> np.ndarray:
    """Full-size overlapping tiles covering a frame: (N, 4) int64 x1, y1, x2, y2, row-major (y outer, x inner).

    Equal to SAHI's `get_slice_bboxes(height, width, tile_height, tile_width, overlap, overlap)` when the frame
    is at least one tile in each dimension. In a dimension where the frame is smaller than a tile there is one
    tile starting at 0 that extends past the border (the preprocessing pads it).
    """
    height, width = _check_size("height", height), _check_size("width", width)
    tile_height, tile_width = _check_size("tile_height", tile_height), _check_size("tile_width", tile_width)
    if not 0.0 <= float(overlap) < 1.0:
        raise ValueError(f"overlap must be a ratio in [0, 1), got {overlap!r}")
    ys = _starts(height, tile_height, float(overlap))
    xs = _starts(width, tile_width, float(overlap))
    x1 = np.tile(xs, len(ys))
    y1 = np.repeat(ys, len(xs))
    return np.stack([x1, y1, x1 + tile_width, y1 + tile_height], axis=1)


def plan_region(
    frame_hw: tuple[int, int],
    tile_hw: tuple[int, int],
    overlap: float,
    region: tuple[int, int, int, int],
    ignored: Coverage | None = None,
) -> np.ndarray:
    """Tiles over a region of the frame (`region_pixels`): `plan_tiles` over the region, shifted to it; a tile
    the region is too narrow (or short) for is moved back into the frame where the frame is large enough; tiles
    whose pixels are all covered by `ignored` are left out. (N, 4) int64, row-major."""
    x1, y1, x2, y2 = region
    tiles = plan_tiles(y2 - y1, x2 - x1, tile_hw[0], tile_hw[1], overlap) + np.array([x1, y1, x1, y1])
    shift = np.minimum(tiles[:, :2], np.maximum(0, np.array(frame_hw[::-1]) - np.array(tile_hw[::-1])))
    tiles = tiles - np.tile(tiles[:, :2] - shift, 2)
    if ignored is not None and len(tiles):
        tiles = tiles[~np.asarray(ignored.covers(tiles), bool)]
    return tiles


@dataclass(frozen=True)
class Letterbox:
    """How a (h, w) region (`source_hw`) is fitted into the model input: resized by `scale` to `resized_hw` (each
    axis to its own size when stretched), then padded."""

    scale: float
    pad_x: int
    pad_y: int
    resized_hw: tuple[int, int]
    source_hw: tuple[int, int] | None = None

    @property
    def scales(self) -> tuple[float, float]:
        """The x and y scales the resize applies (region pixels * scale = model-input pixels): the resized size
        over the region's, per axis (a size rounded to whole pixels makes them differ from `scale` slightly)."""
        if self.source_hw is None:
            return self.scale, self.scale
        return self.resized_hw[1] / self.source_hw[1], self.resized_hw[0] / self.source_hw[0]

    @classmethod
    def fit(cls, source_hw: tuple[int, int], input_hw: tuple[int, int], anchor: str = "center") -> Letterbox:
        """Largest aspect-preserving resize of `source_hw` into `input_hw` (at least 1 pixel per side), centred
        (pads rounded down), or at the top-left (`anchor` "top_left": the padding all right and below); or the
        whole input, each axis scaled on its own (`anchor` "stretch")."""
        source = (int(source_hw[0]), int(source_hw[1]))
        if anchor == "stretch":
            return cls(input_hw[1] / source[1], 0, 0, (int(input_hw[0]), int(input_hw[1])), source)
        scale = min(input_hw[0] / source[0], input_hw[1] / source[1])
        resized = (  # at least one pixel: a 1-pixel-thin frame still has a (thin) view
            max(1, min(input_hw[0], round(source[0] * scale))),
            max(1, min(input_hw[1], round(source[1] * scale))),
        )
        if anchor == "top_left":
            return cls(scale, 0, 0, resized, source)
        if anchor != "center":
            raise ValueError(f"letterbox must be center, top_left or stretch, got {anchor!r}")
        return cls(scale, (input_hw[1] - resized[1]) // 2, (input_hw[0] - resized[0]) // 2, resized, source)


@dataclass(frozen=True, eq=False)
class TilePlan:
    """Everything the pipeline needs about one (frame size, tiling, model input) combination.

    Batch image i < len(tiles) is tile i; image len(tiles) (when `full_frame`) is the letterboxed frame.
    `views` (B, 4) int64 are the frame regions of the batch images; `scales_xy` (B, 2) and `offsets` (B, 2)
    float32 map model-input pixels to frame pixels (frame = model * scale + offset, per axis; `scales` (B,) the
    larger of the two: frame pixels per input pixel); `inner_edges` (B, 4) bool marks
    which view edges (left, top, right, bottom) are seams inside the frame rather than on its border. The tiles
    cover `region` (the pixels of the region of interest `roi`) except what `ignored` covers; the policy
    (`policy.policy_keep`) keeps boxes by the same `roi` and `ignored`. Build plans with `make_plan` (cached);
    compare them by identity.
    """

    frame_hw: tuple[int, int]
    tile_hw: tuple[int, int]
    input_hw: tuple[int, int]
    overlap: float
    full_frame: bool
    tiles: np.ndarray
    tile_letterbox: Letterbox
    frame_letterbox: Letterbox
    views: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray
    inner_edges: np.ndarray
    roi: tuple[float, float, float, float] = FULL_FRAME_ROI
    ignored: Any = None  # a `Coverage` (the frame's ignore mask) or None
    letterbox: str = "center"  # where resized views sit in the model input: center, top_left or stretch
    scales_xy: np.ndarray | None = None  # (B, 2); None: `scales` on both axes

    def __post_init__(self) -> None:
        b = self.batch_size
        for name, shape in (
            ("views", (b, 4)),
            ("scales", (b,)),
            ("offsets", (b, 2)),
            ("inner_edges", (b, 4)),
        ):
            if getattr(self, name).shape != shape:
                raise ValueError(f"TilePlan.{name} must have shape {shape}, got {getattr(self, name).shape}")
        if self.scales_xy is None:
            object.__setattr__(self, "scales_xy", np.repeat(self.scales[:, None], 2, 1))
        if self.scales_xy.shape != (b, 2):
            raise ValueError(f"TilePlan.scales_xy must have shape {(b, 2)}, got {self.scales_xy.shape}")
        for array in (self.tiles, self.views, self.scales, self.offsets, self.inner_edges, self.scales_xy):
            array.setflags(write=False)

    @property
    def num_tiles(self) -> int:
        """Number of tiles N (the full-frame view, if any, is not counted)."""
        return len(self.tiles)

    @property
    def batch_size(self) -> int:
        """Images per engine call: the tiles plus one when the full-frame view is on."""
        return len(self.tiles) + int(self.full_frame)

    @property
    def scale(self) -> float:
        """Full-frame letterbox scale: frame pixels * scale = model-input pixels."""
        return self.frame_letterbox.scale

    @property
    def pad_x(self) -> int:
        """Full-frame letterbox padding on the left, in model-input pixels."""
        return self.frame_letterbox.pad_x

    @property
    def pad_y(self) -> int:
        """Full-frame letterbox padding on the top, in model-input pixels."""
        return self.frame_letterbox.pad_y

    @property
    def key(self) -> tuple[Any, ...]:
        """The plan's value: plans with equal keys have the same tiles and views (plans themselves compare by
        identity, and a cached plan may be rebuilt)."""
        mask = None if self.ignored is None else getattr(self.ignored, "path", self.ignored)
        return (
            self.frame_hw,
            self.tile_hw,
            self.input_hw,
            self.overlap,
            self.full_frame,
            self.roi,
            self.letterbox,
            mask,
            self.tiles.tobytes(),
        )

    def tensors(self, device: torch.device | str) -> PlanTensors:
        """The per-view arrays on `device` (those of this frame's `BatchPlan`, cached there)."""
        return batch_plan((self,)).tensors(device)

    def to_frame(self, boxes: torch.Tensor, image_index: torch.Tensor) -> torch.Tensor:
        """Map (M, 4) boxes in model-input pixels of batch images `image_index` to frame pixels (see
        `BatchPlan.to_frame`)."""
        return batch_plan((self,)).to_frame(boxes, image_index)


def make_plan(
    frame_hw: tuple[int, int],
    tile_hw: tuple[int, int],
    overlap: float,
    input_hw: tuple[int, int],
    full_frame: bool,
    roi: Sequence[float] = FULL_FRAME_ROI,
    ignored: Coverage | None = None,
    letterbox: str = "center",
) -> TilePlan:
    """The TilePlan for these sizes (cached per argument tuple; `ignored` by identity).

    Tiles over the region of interest `roi` (fractions of the frame) except where `ignored` covers every pixel;
    views resized to the model input placed by `letterbox` (center, top_left or stretch)."""
    return _make_plan(
        (_check_size("frame height", frame_hw[0]), _check_size("frame width", frame_hw[1])),
        (_check_size("tile height", tile_hw[0]), _check_size("tile width", tile_hw[1])),
        float(overlap),
        (_check_size("input height", input_hw[0]), _check_size("input width", input_hw[1])),
        bool(full_frame),
        tuple(float(v) for v in roi),
        ignored,
        str(letterbox),
    )


@functools.lru_cache(maxsize=64)
def _make_plan(
    frame_hw: tuple[int, int],
    tile_hw: tuple[int, int],
    overlap: float,
    input_hw: tuple[int, int],
    full_frame: bool,
    roi: tuple[float, float, float, float],
    ignored: Coverage | None,
    letterbox: str,
) -> TilePlan:
    h, w = frame_hw
    tiles = plan_region(frame_hw, tile_hw, overlap, region_pixels(roi, frame_hw), ignored)
    tile_lb = Letterbox.fit(tile_hw, input_hw, letterbox)
    frame_lb = Letterbox.fit(frame_hw, input_hw, letterbox)
    views = np.concatenate([tiles, [[0, 0, w, h]]]) if full_frame else tiles
    scales = np.tile(1.0 / np.array(tile_lb.scales), (len(views), 1))
    pads = np.tile(np.array([tile_lb.pad_x, tile_lb.pad_y], np.float64), (len(views), 1))
    if full_frame:
        scales[-1] = 1.0 / np.array(frame_lb.scales)
        pads[-1] = frame_lb.pad_x, frame_lb.pad_y
    offsets = views[:, :2] - pads * scales
    inner = np.stack([views[:, 0] > 0, views[:, 1] > 0, views[:, 2] < w, views[:, 3] < h], axis=1)
    if full_frame:
        inner[-1] = False
    return TilePlan(
        frame_hw=frame_hw,
        tile_hw=tile_hw,
        input_hw=input_hw,
        overlap=overlap,
        full_frame=full_frame,
        tiles=tiles,
        tile_letterbox=tile_lb,
        frame_letterbox=frame_lb,
        views=views,
        scales=scales.max(axis=1).astype(np.float32),
        offsets=offsets.astype(np.float32),
        inner_edges=inner,
        roi=roi,
        ignored=ignored,
        letterbox=letterbox,
        scales_xy=scales.astype(np.float32),
    )


class PlanTensors(NamedTuple):
    """A batch plan's per-view arrays as tensors on one device (see BatchPlan)."""

    # (B, 3, 4) float32, per box coordinate x1, y1, x2, y2: scale, offset (frame = model-input * scale + offset)
    # and the frame's size (width, height, width, height) that clips it: one gather maps boxes to their frames
    to_frame: torch.Tensor
    views: torch.Tensor  # (B, 4) float32 frame regions x1, y1, x2, y2
    inner_edges: torch.Tensor  # (B, 4) bool: left, top, right, bottom edge is an inner seam
    frame: torch.Tensor  # (B,) int64: the frame each view belongs to
    roi: torch.Tensor  # (F, 4) float32 per frame: its region of interest x1, y1, x2, y2 in frame pixels


@dataclass(frozen=True, eq=False)
class BatchPlan:
    """The views of several frames (each with its own `TilePlan`) in one engine batch.

    Frame k's views are batch images `starts[k]` .. `starts[k + 1] - 1`, in its plan's order. A single frame is a
    batch plan of one. Build with `batch_plan` (cached); compare by identity.
    """

    plans: tuple[TilePlan, ...]
    starts: tuple[int, ...]
    _device_cache: dict[str, PlanTensors] = field(default_factory=dict, repr=False)

    @property
    def num_frames(self) -> int:
        """Frames in the batch."""
        return len(self.plans)

    @property
    def batch_size(self) -> int:
        """Images of all frames together."""
        return self.starts[-1]

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """The parts of batch images start..stop-1 per frame: (frame, first view, end view) in frame order."""
        return pieces(self.starts, start, stop)

    def tensors(self, device: torch.device | str) -> PlanTensors:
        """The per-view arrays on `device`, copied there once and cached in the plan."""
        key = str(torch.device(device))
        cached = self._device_cache.get(key)
        if cached is None:
            plans = self.plans
            frame = np.repeat(np.arange(len(plans)), [p.batch_size for p in plans])
            bounds = np.array([p.frame_hw[::-1] for p in plans], np.float32).reshape(-1, 2)[frame]
            scales = np.concatenate([p.scales_xy for p in plans]).astype(np.float32)
            offsets = np.concatenate([p.offsets for p in plans]).astype(np.float32)
            mapping = np.stack([np.tile(scales, 2), np.tile(offsets, 2), np.tile(bounds, 2)], 1)
            roi = np.array([np.multiply(p.roi, p.frame_hw[::-1] * 2) for p in plans], np.float32)
            arrays = (
                (mapping, torch.float32),
                (np.concatenate([p.views for p in plans]).astype(np.float32), torch.float32),
                (np.concatenate([p.inner_edges for p in plans]), torch.bool),
                (frame, torch.int64),
                (roi, torch.float32),
            )
            cached = PlanTensors(*(torch.tensor(a, dtype=dt, device=device) for a, dt in arrays))
            self._device_cache[key] = cached
        return cached

    def to_frame(self, boxes: torch.Tensor, image_index: torch.Tensor) -> torch.Tensor:
        """Map (M, 4) x1, y1, x2, y2 boxes in model-input pixels of batch images `image_index` (M,) to the pixels
        of their frames (float32, clipped to each frame, on the boxes' device)."""
        mapping = self.tensors(boxes.device).to_frame[image_index]  # (M, 3, 4)
        frame = boxes.float() * mapping[:, 0] + mapping[:, 1]
        return torch.minimum(frame.clamp_min(0.0), mapping[:, 2])


def pieces(starts: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """The parts of batch images start..stop-1 per frame, frame k holding images starts[k]..starts[k + 1] - 1:
    (frame, its first image, its end image) in frame order."""
    parts = []
    for k in range(len(starts) - 1):
        lo, hi = max(start, starts[k]), min(stop, starts[k + 1])
        if lo < hi:
            parts.append((k, lo - starts[k], hi - starts[k]))
    return parts


@dataclass(frozen=True, eq=False)
class ViewSelection:
    """Some of a batch plan's views (a tile budget): frame k's batch images are `counts[k]` chosen tiles, then its
    full-frame view when its plan has one, images `starts[k]` .. `starts[k + 1] - 1`. `views` (2, V) int64 on the
    engine's device: per batch image, its view in the batch plan and in its frame's plan. The counts (not which
    tiles) shape the frame program, so a captured program is keyed by `counts` and replayed whatever tiles
    `views` names. Build with `select_views`."""

    counts: tuple[int, ...]
    starts: tuple[int, ...]
    views: torch.Tensor

    @property
    def batch_size(self) -> int:
        """Images of all frames together."""
        return self.starts[-1]


def selection_views(plan: BatchPlan, tiles: Sequence[np.ndarray]) -> tuple[tuple[int, ...], np.ndarray]:
    """The counts and the (2, V) view indices (batch plan, frame plan) of a `ViewSelection` running tiles
    `tiles[k]` (indices into frame k's tiles) of each frame, and every full-frame view."""
    chosen = [np.asarray(t, np.int64).reshape(-1) for t in tiles]
    batch_views, local_views = [], []
    for k, (frame_plan, picked) in enumerate(zip(plan.plans, chosen, strict=True)):
        if len(picked) and (picked.min() < 0 or picked.max() >= frame_plan.num_tiles):
            raise ValueError(f"frame {k} has {frame_plan.num_tiles} tiles, got tiles {picked.tolist()}")
        full = [frame_plan.num_tiles] if frame_plan.full_frame else []
        local = np.concatenate([picked, np.asarray(full, np.int64)])
        local_views.append(local)
        batch_views.append(local + plan.starts[k])
    return tuple(len(c) for c in chosen), np.stack([np.concatenate(batch_views), np.concatenate(local_views)])


def select_views(plan: BatchPlan, counts: tuple[int, ...], views: torch.Tensor) -> ViewSelection:
    """The `ViewSelection` of `selection_views`' counts and view indices (already on the device)."""
    sizes = [c + int(p.full_frame) for c, p in zip(counts, plan.plans, strict=True)]
    return ViewSelection(counts, tuple(np.cumsum([0, *sizes]).tolist()), views)


def batch_plan(plans: Sequence[TilePlan]) -> BatchPlan:
    """The BatchPlan of these frame plans, in this order (cached per tuple of plans)."""
    return _batch_plan(tuple(plans))


@functools.lru_cache(maxsize=64)
def _batch_plan(plans: tuple[TilePlan, ...]) -> BatchPlan:
    if not plans:
        raise ValueError("a batch plan needs at least one frame")
    return BatchPlan(plans, tuple(np.cumsum([0, *(p.batch_size for p in plans)]).tolist()))
