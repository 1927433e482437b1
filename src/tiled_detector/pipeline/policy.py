"""The detection policy: which merged detections a frame keeps besides their scores, and the ignore masks.

Rules (each a pure function of boxes in frame pixels, applied on the device inside the frame program, after the
merge and before the per-frame `max_detections` cut):
- region of interest (`roi`, fractions of the frame, in the frame's `TilePlan`): a box is kept when its centre lies
  in the rectangle (borders included);
- size limits (`min_box_size`, `max_box_size`, frame pixels, 0 = no limit): on the shorter side of the box (a
  rotated box's w or h);
- ignore mask (`ignore_mask`, in the frame's `TilePlan`): a box is dropped when more than half of its pixels are
  ignored. A box's pixels are those whose centre (x + 0.5, y + 0.5) lies in [x1, x2) x [y1, y2); a box too thin to
  hold a pixel centre along an axis takes the pixel column or row under its centre there. A rotated box is judged
  by `ROTATED_SAMPLES` x `ROTATED_SAMPLES` points spread over its rectangle (the centres of as many equal cells):
  dropped when more than half of them fall on ignored pixels.

A mask file is any image OpenCV reads, converted to one channel (`cv2.IMREAD_GRAYSCALE`; colour and alpha images
too); non-zero = ignored. It is scaled to each frame size by nearest neighbour: frame pixel (y, x) takes mask pixel
(y * Hm // H, x * Wm // W), as OpenCV's INTER_NEAREST. `IgnoreMasks` holds the masks scaled to the frame sizes seen
(bounded), each with its integral image on the host (tiles wholly ignored are not planned: `covers`) and, once
needed, on the device (a box's ignored pixels in four reads).
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tiled_detector.pipeline import rotated
from tiled_detector.pipeline.groups import geometry_of
from tiled_detector.pipeline.tiling import FULL_FRAME_ROI, BatchPlan

MAX_MASKS = 16  # masks scaled to a frame size, kept by `IgnoreMasks` (cameras x frame sizes)
ROTATED_SAMPLES = 8  # a rotated box's ignored share: this many points along each side


@functools.lru_cache(maxsize=MAX_MASKS)
def _read(path: str, stamp: tuple[int, int]) -> np.ndarray:
    import cv2

    image = cv2.imread(path, cv2.IMREAD_GRAYSCALE)
    if image is None or image.size == 0:
        raise ValueError(f"ignore_mask: {path} is not an image OpenCV can read (PNG, JPEG, BMP, TIFF, ...)")
    ignored = image != 0
    ignored.setflags(write=False)
    return ignored


def _stamp(path: str) -> tuple[int, int]:
    """When the file last changed and its size (a changed file is read again)."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise ValueError(f"ignore_mask: cannot read {path}: {error.strerror or error}") from None
    return info.st_mtime_ns, info.st_size


def read_mask(path: str | os.PathLike[str]) -> np.ndarray:
    """The ignored pixels of a mask file at its own resolution ((Hm, Wm) bool, read-only), read again when the
    file changes; ValueError naming the file when it is missing or not a readable image."""
    return _read(os.fspath(path), _stamp(os.fspath(path)))


def scaled(ignored: np.ndarray, frame_hw: tuple[int, int]) -> np.ndarray:
    """A mask scaled to a frame size by nearest neighbour (module docstring)."""
    height, width = frame_hw
    rows = np.arange(height, dtype=np.int64) * ignored.shape[0] // height
    cols = np.arange(width, dtype=np.int64) * ignored.shape[1] // width
    return ignored[rows[:, None], cols[None, :]]


@dataclass(frozen=True, eq=False)
class IgnoreMask:
    """One mask at one frame size: its ignored pixels (H, W) and their integral image (H + 1, W + 1) int32
    (`integral[y, x]` = ignored pixels above row y and left of column x). Compared by identity (a plan's part)."""

    path: str
    ignored: np.ndarray
    integral: np.ndarray
    _device: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, path: str, ignored: np.ndarray, frame_hw: tuple[int, int]) -> IgnoreMask:
        """The mask `ignored` (any resolution) scaled to `frame_hw`."""
        frame = scaled(ignored, frame_hw)
        integral = np.zeros((frame.shape[0] + 1, frame.shape[1] + 1), np.int32)
        np.cumsum(np.cumsum(frame, axis=0, dtype=np.int32), axis=1, out=integral[1:, 1:])
        frame.setflags(write=False)
        integral.setflags(write=False)
        return cls(path, frame, integral)

    def covers(self, rects: np.ndarray) -> np.ndarray:
        """(N,) bool: whether every frame pixel of each (N, 4) x1, y1, x2, y2 integer rectangle is ignored (a
        rectangle is clipped to the frame first; one with no pixel in the frame is covered)."""
        height, width = self.ignored.shape
        r = np.asarray(rects, np.int64).reshape(-1, 4)
        x1, x2 = np.clip(r[:, 0], 0, width), np.clip(r[:, 2], 0, width)
        y1, y2 = np.clip(r[:, 1], 0, height), np.clip(r[:, 3], 0, height)
        s = self.integral.astype(np.int64)
        count = s[y2, x2] - s[y1, x2] - s[y2, x1] + s[y1, x1]
        return count == np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)

    def device_integral(self, device: torch.device) -> torch.Tensor:
        """The integral image on `device` (copied there once)."""
        key = str(device)
        if key not in self._device:
            self._device[key] = torch.tensor(self.integral, device=device)
        return self._device[key]


class IgnoreMasks:
    """The masks of the current `ignore_mask` setting scaled to the frame sizes seen: at most `MAX_MASKS`, the
    least recently used dropped first; a file changed on disk is read again at its next use."""

    def __init__(self) -> None:
        self._scaled: OrderedDict[tuple[str, tuple[int, int], tuple[int, int]], IgnoreMask] = OrderedDict()

    def get(self, path: str | os.PathLike[str], frame_hw: tuple[int, int]) -> IgnoreMask:
        """The mask of file `path` at frame size `frame_hw` (the same object while the file is unchanged)."""
        name = os.fspath(path)
        key = (name, _stamp(name), (int(frame_hw[0]), int(frame_hw[1])))
        mask = self._scaled.get(key)
        if mask is None:
            mask = self._scaled[key] = IgnoreMask.of(name, _read(name, key[1]), key[2])
            while len(self._scaled) > MAX_MASKS:
                self._scaled.popitem(last=False)
        self._scaled.move_to_end(key)
        return mask


def mask_path(entries: tuple[tuple[str, Path], ...], camera: str | None) -> Path | None:
    """The mask file of a camera: its own entry ("camera=path"), else the entry for every camera ("path"), else
    None."""
    own = dict(entries)
    return own.get(camera or "", own.get(""))


def ignored_mostly(boxes: torch.Tensor, integral: torch.Tensor) -> torch.Tensor:
    """(N,) bool: more than half of each box's pixels are ignored (module docstring), for (N, 4) boxes (or (N, 5)
    rotated ones) in the pixels of the frame whose mask's integral image (H + 1, W + 1) is given. Fixed shapes, no
    host read."""
    width, height = integral.shape[1] - 1, integral.shape[0] - 1  # host numbers: no tensor made per call
    boxes = torch.nan_to_num(boxes.float())  # rows the merge left invalid may hold anything
    if boxes.shape[1] == 5:
        return _ignored_samples(boxes, integral)

    def axis(low: torch.Tensor, high: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first and one-past-last pixel whose centre lies in [low, high); none: the pixel under the middle."""
        first = torch.ceil(low - 0.5).clamp(0.0, float(size))
        end = torch.ceil(high - 0.5).clamp(0.0, float(size))
        middle = ((low + high) / 2).floor().clamp(0.0, float(size - 1))
        thin = end <= first
        return torch.where(thin, middle, first).long(), torch.where(thin, middle + 1, end).long()

    x0, x1 = axis(boxes[:, 0], boxes[:, 2], width)
    y0, y1 = axis(boxes[:, 1], boxes[:, 3], height)
    flat, stride = integral.reshape(-1), integral.shape[1]

    def at(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return flat[y * stride + x].long()

    count = at(y1, x1) - at(y0, x1) - at(y1, x0) + at(y0, x0)
    return 2 * count > (x1 - x0) * (y1 - y0)


def _ignored_samples(obb: torch.Tensor, integral: torch.Tensor) -> torch.Tensor:
    """(N,) bool: more than half of `ROTATED_SAMPLES`**2 points spread over each rotated box lie on ignored
    pixels (a pixel's value from the integral image: four reads); points outside the frame are not ignored."""
    width, height = integral.shape[1] - 1, integral.shape[0] - 1
    steps = (torch.arange(ROTATED_SAMPLES, device=obb.device, dtype=obb.dtype) + 0.5) / ROTATED_SAMPLES - 0.5
    u, v = torch.meshgrid(steps, steps, indexing="ij")
    points = rotated.inner_points(obb, u.reshape(-1), v.reshape(-1)).floor()  # (N, P, 2) pixel columns, rows
    inside = (
        (points[..., 0] >= 0) & (points[..., 0] < width) & (points[..., 1] >= 0) & (points[..., 1] < height)
    )
    x = points[..., 0].clamp(0, width - 1).long()
    y = points[..., 1].clamp(0, height - 1).long()
    flat, stride = integral.reshape(-1), integral.shape[1]
    at = lambda yy, xx: flat[yy * stride + xx].long()  # noqa: E731
    pixel = at(y + 1, x + 1) - at(y, x + 1) - at(y + 1, x) + at(y, x)
    return 2 * ((pixel > 0) & inside).sum(1) > points.shape[1]


def policy_keep(
    boxes: torch.Tensor,
    frame: torch.Tensor,
    plan: BatchPlan,
    min_box_size: float,
    max_box_size: float,
) -> torch.Tensor | None:
    """(N,) bool: which boxes ((N, 4) or rotated (N, 5), frame pixels; `frame` (N,) their frame in `plan`) pass the
    region of interest, the ignore masks of the plan's frames and the size limits; None when no rule is set (every
    box passes)."""
    keep: torch.Tensor | None = None

    def both(rule: torch.Tensor) -> torch.Tensor:
        return rule if keep is None else keep & rule

    geometry = geometry_of(boxes)
    if any(p.roi != FULL_FRAME_ROI for p in plan.plans):
        roi = plan.tensors(boxes.device).roi[frame]  # (N, 4) pixels
        centre = geometry.centres(boxes)
        keep = both(((centre >= roi[:, :2]) & (centre <= roi[:, 2:])).all(dim=1))
    if min_box_size > 0 or max_box_size > 0:
        side = geometry.sides(boxes).amin(1)
        keep = both((side >= min_box_size) & ((side <= max_box_size) if max_box_size > 0 else True))
    for k, frame_plan in enumerate(plan.plans):
        if frame_plan.ignored is not None:
            drop = ignored_mostly(boxes, frame_plan.ignored.device_integral(boxes.device)) & (frame == k)
            keep = both(~drop)
    return keep
