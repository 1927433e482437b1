"""Result type shared by the pipeline, the CLI and the ROS node."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from tiled_detector.geometry.label_image import label_image


@dataclass(frozen=True)
class InstanceMasks:
    """The instance masks of one frame's N detections, at `scale` of the frame's pixels.

    shape: the label image's (h, w); boxes: (N, 4) int32 each detection's box in label pixels x0, y0, x1, y1 (end
    exclusive; empty: no mask, e.g. an object carried from an earlier frame); bits: every detection's pixels in its
    box, row-major, one detection after the other; frame_hw: the frame's size; rank: (N,) where masks overlap, the
    detection of the lower rank wins (None: the order, the first wins; the detector's order is by score).
    `labels`, the label image: `image` where it was composed on the device (`pipeline.labels`), else composed from
    the boxes and bits on first use.
    """

    shape: tuple[int, int]
    boxes: np.ndarray
    bits: np.ndarray
    scale: float
    frame_hw: tuple[int, int]
    rank: np.ndarray | None = None
    image: np.ndarray | None = None  # (h, w) uint16: the label image composed on the device, in this order

    def __post_init__(self) -> None:
        boxes = np.asarray(self.boxes, np.int32).reshape(-1, 4)
        object.__setattr__(self, "shape", (int(self.shape[0]), int(self.shape[1])))
        object.__setattr__(self, "boxes", boxes)
        object.__setattr__(self, "bits", np.asarray(self.bits, bool).reshape(-1))
        rank = np.arange(len(boxes)) if self.rank is None else np.asarray(self.rank, np.int64).reshape(-1)
        object.__setattr__(self, "rank", rank)
        if self.bits.size != int(self.areas.sum()):
            raise ValueError(
                f"InstanceMasks: {self.bits.size} bits for boxes of {int(self.areas.sum())} pixels"
            )
        if len(rank) != len(boxes):
            raise ValueError(f"InstanceMasks: {len(rank)} ranks for {len(boxes)} boxes")

    @functools.cached_property
    def labels(self) -> np.ndarray:
        """The (h, w) uint16 label image: k + 1 where detection k's mask covers a pixel, 0 elsewhere; where masks
        overlap, the detection of the lower rank wins. The device's (`image`) where it composed it; else composed
        once, on first use, by `label_image.label_image` (the one rank rule on the host)."""
        if self.image is not None:
            return self.image
        assert self.rank is not None
        return label_image(self.shape, self.boxes, self.bits, self.rank)

    @property
    def areas(self) -> np.ndarray:
        """(N,) each box's pixel count."""
        size = (self.boxes[:, 2:] - self.boxes[:, :2]).clip(0).astype(np.int64)
        return size[:, 0] * size[:, 1]

    def __len__(self) -> int:
        return len(self.boxes)

    def crop(self, k: int) -> np.ndarray:
        """Detection k's mask within its box (bh, bw) bool."""
        areas = self.areas
        start = int(areas[:k].sum())
        x0, y0, x1, y1 = self.boxes[k]
        return self.bits[start : start + int(areas[k])].reshape(max(y1 - y0, 0), max(x1 - x0, 0))

    def mask(self, k: int) -> np.ndarray:
        """Detection k's mask as a (h, w) bool image of the label image's size."""
        full = np.zeros(self.shape, bool)
        x0, y0, x1, y1 = self.boxes[k]
        full[y0:y1, x0:x1] = self.crop(k)
        return full

    @classmethod
    def joined(cls, parts: list[InstanceMasks]) -> InstanceMasks:
        """The masks of several detections of one frame (its parts) as one (the parts' detections in order; where
        masks overlap, the first in that order wins)."""
        first = parts[0]
        boxes = np.concatenate([p.boxes for p in parts])
        bits = np.concatenate([p.bits for p in parts])
        return cls(first.shape, boxes, bits, first.scale, first.frame_hw)

    def label_boxes(self, boxes: np.ndarray) -> np.ndarray:
        """(N, 4) int32 the label pixels whose left / top edge lies in each of `boxes` (N, 4) frame pixels x1, y1, x2,
        y2 (float32, as the device computes them), clipped to the label image."""
        pixels = np.ceil(np.asarray(boxes, np.float32).reshape(-1, 4) * np.float32(self.scale)).clip(0, None)
        return np.minimum(pixels, np.tile(self.shape[::-1], 2)).astype(np.int32)

    def merged(self, groups: np.ndarray, boxes: np.ndarray) -> InstanceMasks:
        """The masks of merged detections, in order: row i the union of the masks of detections `groups[i]` (indices
        here; -1: none) within the label pixels of its frame box `boxes[i]` (`label_boxes`), as the frame program
        makes a merge group's mask."""
        groups = np.asarray(groups, np.int64).reshape(len(boxes), -1)
        boxes = self.label_boxes(boxes)
        areas = self.areas
        starts = np.cumsum(areas) - areas
        bits = []
        for (x0, y0, x1, y1), members in zip(boxes.tolist(), groups, strict=True):
            union = np.zeros((max(y1 - y0, 0), max(x1 - x0, 0)), bool)
            for k in members[members >= 0]:
                mx0, my0, mx1, my1 = self.boxes[k].tolist()
                crop = self.bits[starts[k] : starts[k] + areas[k]].reshape(
                    max(my1 - my0, 0), max(mx1 - mx0, 0)
                )
                ax0, ay0, ax1, ay1 = max(mx0, x0), max(my0, y0), min(mx1, x1), min(my1, y1)
                if ax1 > ax0 and ay1 > ay0:
                    union[ay0 - y0 : ay1 - y0, ax0 - x0 : ax1 - x0] |= crop[
                        ay0 - my0 : ay1 - my0, ax0 - mx0 : ax1 - mx0
                    ]
            bits.append(union.reshape(-1))
        flat = np.concatenate(bits) if bits else np.zeros(0, bool)
        return InstanceMasks(self.shape, boxes, flat, self.scale, self.frame_hw)

    def select(self, index: np.ndarray) -> InstanceMasks:
        """The masks of detections `index` (their new order; -1: a detection without a mask), keeping their ranks
        (where masks overlap, the one better ranked here wins)."""
        index = np.asarray(index, np.int64).reshape(-1)
        assert self.rank is not None
        areas = self.areas
        starts = np.cumsum(areas) - areas
        parts = [self.bits[starts[k] : starts[k] + areas[k]] for k in index if k >= 0]
        at = np.where(index >= 0, index, len(self.boxes))  # -1: an empty box after the others
        boxes = np.concatenate([self.boxes, np.zeros((1, 4), np.int32)])[at]
        bits = np.concatenate(parts) if parts else np.zeros(0, bool)
        rank = np.append(self.rank, len(self.rank))[at]
        return InstanceMasks(self.shape, boxes, bits, self.scale, self.frame_hw, rank)


@dataclass(frozen=True)
class Detections:
    """Detections of one frame as a struct of arrays, in frame pixel coordinates.

    boxes: (N, 4) float32 x1, y1, x2, y2; scores: (N,) float32 in [0, 1]; class_ids: (N,) int64;
    timings: stage name -> milliseconds for the call that produced them. With a depth image: positions (N, 3)
    and sizes (N, 3) float32, each object's centre and extent in metres in the colour camera's optical frame (x
    right, y down, z forward), NaN rows where it has no valid depth; None without one. From a rotated-box model:
    obb (N, 5) float32 cx, cy, w, h, angle (radians in [0, pi/2), turning +x toward +y: clockwise on screen;
    ultralytics' xywhr), whose axis-aligned hulls are `boxes`; None from an axis-aligned model. masks: a
    segmentation model's instance masks (`InstanceMasks`, one per detection, in this order), None without them.
    keypoints: a pose model's (N, K, 3) float32 joints x, y (frame pixels), score (a file of 2 values per joint:
    score 1), None from a model without keypoints; keypoint_positions: with a depth image, each joint's (N, K, 3)
    position in metres (the camera's optical frame, as `positions`), NaN where it has no valid depth.
    """

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    positions: np.ndarray | None = field(default=None, compare=False)
    sizes: np.ndarray | None = field(default=None, compare=False)
    obb: np.ndarray | None = None
    masks: InstanceMasks | None = field(default=None, compare=False)
    keypoints: np.ndarray | None = field(default=None, compare=False)
    keypoint_positions: np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        scores = np.asarray(self.scores, dtype=np.float32).reshape(-1)
        class_ids = np.asarray(self.class_ids, dtype=np.int64).reshape(-1)
        if not len(boxes) == len(scores) == len(class_ids):
            raise ValueError(
                f"Detections need as many boxes as scores and class ids, got "
                f"{len(boxes)}, {len(scores)} and {len(class_ids)}"
            )
        object.__setattr__(self, "boxes", boxes)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "class_ids", class_ids)
        for name, width in (("positions", 3), ("sizes", 3), ("obb", 5)):
            value = getattr(self, name)
            if value is not None:
                value = np.asarray(value, dtype=np.float32).reshape(-1, width)
                if len(value) != len(scores):
                    raise ValueError(
                        f"Detections need one row of {name} per box, got {len(value)} for {len(scores)}"
                    )
                object.__setattr__(self, name, value)
        if self.keypoints is not None:
            keypoints = np.asarray(self.keypoints, dtype=np.float32)
            keypoints = keypoints.reshape(len(scores), -1, 3) if keypoints.size or len(scores) else keypoints
            if keypoints.ndim != 3 or keypoints.shape[0] != len(scores) or keypoints.shape[2] != 3:
                raise ValueError(
                    f"Detections need (N, K, 3) keypoints for {len(scores)} boxes, got {keypoints.shape}"
                )
            object.__setattr__(self, "keypoints", keypoints)
        if self.keypoint_positions is not None:
            where = np.asarray(self.keypoint_positions, dtype=np.float32)
            if self.keypoints is None or where.shape != self.keypoints.shape:
                raise ValueError(f"Detections need one keypoint position per joint, got {where.shape}")
            object.__setattr__(self, "keypoint_positions", where)
        if self.masks is not None and len(self.masks) != len(scores):
            raise ValueError(f"Detections need one mask per box, got {len(self.masks)} for {len(scores)}")

    @classmethod
    def empty(cls) -> Detections:
        """No detections."""
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.scores)

    def __getitem__(self, index: np.ndarray | slice) -> Detections:
        """Select detections by boolean mask, index array or slice (timings, positions, sizes, rotated boxes,
        masks and keypoints are kept)."""
        rows = np.arange(len(self.scores))[index]
        return Detections(
            self.boxes[index],
            self.scores[index],
            self.class_ids[index],
            dict(self.timings),
            None if self.positions is None else self.positions[index],
            None if self.sizes is None else self.sizes[index],
            None if self.obb is None else self.obb[index],
            None if self.masks is None else self.masks.select(rows),
            None if self.keypoints is None else self.keypoints[index],
            None if self.keypoint_positions is None else self.keypoint_positions[index],
        )
