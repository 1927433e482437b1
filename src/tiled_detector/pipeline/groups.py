"""Pairwise comparisons of detections, shared by the seam rule and the merge: which rows are compared with which
(one int64 key per row, so that one (N, N) comparison stands for "same frame and same class") and how much two
boxes overlap, in the geometry of their form (`Geometry`): axis-aligned (N, 4) x1, y1, x2, y2 boxes (their
intersection and areas, in the fewest pairwise kernels) or rotated (N, 5) cx, cy, w, h, angle ones
(`pipeline.rotated`: exact intersection polygons). `geometry_of(boxes)` picks it by the box columns; the seam rule
and the merge call it and never branch on the form themselves."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from tiled_detector.pipeline import rotated

Rows = (
    tuple[Tensor, Tensor] | None
)  # the rows of each side of a pairwise comparison that take part (None: all)


def group_key(class_ids: Tensor | None, frame_index: Tensor | None) -> Tensor | None:
    """(N,) int64 >= 0, equal for two rows exactly when they are in the same frame (None: one frame) and class
    (None: any); None when both are None. (Class ids, from an argmax or the model, lie far within +-2**31; no
    arange-based constant, which torch.compile's triton code cannot add to its 32-bit indices.)"""
    key = None if class_ids is None else class_ids + (1 << 31)
    if frame_index is not None:
        key = frame_index * (1 << 32) + (0 if key is None else key)
    return key


def intersection(a: Tensor, b: Tensor) -> Tensor:
    """Intersection areas of broadcastable (..., 4) x1, y1, x2, y2 boxes: SAHI's float operations (min of the
    ends - max of the starts, clamped at 0, width * height) on (..., 2) pairs, five kernels for a matrix."""
    wh = torch.minimum(a[..., 2:], b[..., 2:]).sub_(torch.maximum(a[..., :2], b[..., :2])).clamp_min_(0)
    return wh[..., 0] * wh[..., 1]


def pairwise_intersection(a: Tensor, b: Tensor) -> Tensor:
    """(N, M) intersection areas of every box of (N, 4) `a` with every box of (M, 4) `b`: `intersection`'s float
    operations (the same values) on each coordinate's contiguous (N, M) matrix, which vectorise (the (N, M, 2) pairs
    of `intersection` stride through memory: 3-4x slower on a CPU)."""
    at, bt = a.T.contiguous(), b.T.contiguous()  # (4, N), (4, M): one row per coordinate
    w = torch.minimum(at[2, :, None], bt[2]).sub_(torch.maximum(at[0, :, None], bt[0])).clamp_min_(0)
    h = torch.minimum(at[3, :, None], bt[3]).sub_(torch.maximum(at[1, :, None], bt[1])).clamp_min_(0)
    return w.mul_(h)


def area(boxes: Tensor) -> Tensor:
    """Areas (x2 - x1) * (y2 - y1) of (..., 4) boxes (negative for inverted ones)."""
    size = boxes[..., 2:] - boxes[..., :2]
    return size[..., 0] * size[..., 1]


def overlap(a: Tensor, b: Tensor, metric: str, inter: Tensor | None = None) -> Tensor:
    """IoU ("iou") or IoS ("ios", over the smaller area) of broadcastable (..., 4) x1, y1, x2, y2 boxes (0 where
    the denominator is 0), with SAHI's float operations (`inter`: their intersections, where already known)."""
    inter = intersection(a, b) if inter is None else inter
    area_a, area_b = area(a), area(b)
    if metric == "iou":
        denom = area_a + area_b - inter
        return torch.where(denom > 0, inter / denom, 0.0)
    # IoS: the smaller area is positive exactly when both are (the quotients elsewhere are discarded)
    smaller = torch.minimum(area_a, area_b)
    return torch.where(smaller > 0, inter / smaller, 0.0)


class Geometry:
    """Axis-aligned boxes (N, 4) x1, y1, x2, y2: what the seam rule and the merge ask of a box form."""

    columns = 4
    name = "axis-aligned"

    def overlap(self, a: Tensor, b: Tensor, metric: str) -> Tensor:
        """IoU / IoS of broadcastable boxes, row by row (the merge's re-check of a member against its group)."""
        return overlap(a, b, metric)

    def pairwise(
        self, a: Tensor, b: Tensor, metric: str, pairs: int | None = None, on: Rows = None
    ) -> Tensor:
        """(N, M) IoU / IoS of every box of a with every box of b. `pairs`, `on`: a bound on the pairs measured
        and the rows that take part (`on` (a rows, b rows) bool, None: all), for a geometry whose pairs are costly
        (rotated: the bounded pair list); axis-aligned boxes measure every pair (a few kernels)."""
        return overlap(a[:, None], b[None], metric, pairwise_intersection(a, b))

    def covers(
        self, part: Tensor, whole: Tensor, min_cover: float, pairs: int | None = None, on: Rows = None
    ) -> Tensor:
        """(N, M) bool: box j of `whole` covers at least `min_cover` of the area of box i of `part` (the seam
        rule's test; `pairs`, `on` as in `pairwise`)."""
        return pairwise_intersection(part, whole) >= min_cover * area(part).clamp_min(1e-9)[:, None]

    def pairs_needed(self, boxes: Tensor, on: Tensor) -> Tensor:
        """0-dim int64: the pairs of the rows `on` that a bounded pairwise comparison of `boxes` with themselves
        measures (the bound `pairwise` and `covers` need); 0 where every pair is measured anyway."""
        return torch.zeros((), dtype=torch.int64, device=boxes.device)

    def meeting(self, boxes: Tensor, key: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """The pairs (i, j), i < j, each (P,) int64, of rows of host `boxes` with the same `key` (None: any) whose
        intersection is positive; every other pair's is 0 (`intersection`'s float operations), or NaN. A sweep
        along x in (key, x1) order in numpy (a few dozen small operations: torch's per-op cost would double the
        merge's), for the CPU's exact path, where (N, N) matrices would compare mostly boxes far apart. None where
        it cannot tell (non-finite coordinates, boxes off the host): compare every pair."""
        xyxy = boxes.detach().numpy() if boxes.device.type == "cpu" else None
        if xyxy is None or not np.isfinite(xyxy).all():
            return None
        group = np.zeros(len(xyxy), np.int64) if key is None else key.detach().numpy()
        order = np.lexsort((xyxy[:, 0], group))  # by key, then x1 (stable)
        columns, sorted_group = np.ascontiguousarray(xyxy[order].T), group[order]  # (4, N): 1-D gathers below
        # a monotone float64 line through the (key, x) order: each key's span after the one before (rounding can
        # tie two values, never swap them: the search counts ties in, the exact test below drops them)
        x = columns[0::2].astype(np.float64)
        lowest = x.min(initial=0.0)
        span = 2.0 * (x.max(initial=0.0) - lowest) + 1.0
        segment = np.concatenate([[0], np.cumsum(sorted_group[1:] != sorted_group[:-1])])
        line = segment * span + (x - lowest)
        ends = np.searchsorted(line[0], line[1], side="right")
        counts = np.maximum(ends - np.arange(1, len(order) + 1), 0)
        first = np.repeat(
            np.arange(len(order)), counts
        )  # each sorted row once per later row starting before its end
        second = first + 1 + np.arange(len(first)) - (np.cumsum(counts) - counts)[first]
        meet = sorted_group[first] == sorted_group[second]
        for start, end in ((columns[0], columns[2]), (columns[1], columns[3])):
            meet &= np.minimum(end[first], end[second]) > np.maximum(start[first], start[second])
        i, j = order[first[meet]], order[second[meet]]
        return torch.from_numpy(np.minimum(i, j)), torch.from_numpy(np.maximum(i, j))

    def grown(self, merged: Tensor, member: Tensor) -> Tensor:
        """The boxes covering `merged` and `member` row by row (SAHI's union)."""
        return torch.cat(
            [torch.minimum(merged[:, :2], member[:, :2]), torch.maximum(merged[:, 2:], member[:, 2:])], 1
        )

    def hulls(self, boxes: Tensor) -> Tensor:
        """(N, 4) x1, y1, x2, y2 around each box: the boxes themselves."""
        return boxes

    def in_frame(self, plan: Any, boxes: Tensor, image_index: Tensor) -> Tensor:
        """Boxes in model-input pixels of batch images `image_index` of `plan` (a `BatchPlan`) -> frame pixels."""
        return plan.to_frame(boxes, image_index)

    def degenerate(self, boxes: Tensor) -> Tensor | None:
        """(N,) bool: rows that are no box, dropped and counted by the post-processing (None: all are boxes)."""
        return None

    def centres(self, boxes: Tensor) -> Tensor:
        """(N, 2) centres."""
        return (boxes[:, :2] + boxes[:, 2:]) / 2

    def sides(self, boxes: Tensor) -> Tensor:
        """(N, 2) the sides (width and height of an axis-aligned box, w and h of a rotated one)."""
        return boxes[:, 2:] - boxes[:, :2]

    def packed(self, boxes: Tensor) -> list[Tensor]:
        """The columns a packed result row carries besides the hull (none)."""
        return []


class RotatedGeometry(Geometry):
    """Rotated boxes (N, 5) cx, cy, w, h, angle (`pipeline.rotated`): overlaps of the exact intersection
    polygons; a group grows to the rectangle at its keeper's angle that covers every member's corners."""

    columns = 5
    name = "rotated"

    def overlap(self, a: Tensor, b: Tensor, metric: str) -> Tensor:
        return rotated.overlap(rotated.corners(a), rotated.corners(b), metric)

    def pairwise(
        self, a: Tensor, b: Tensor, metric: str, pairs: int | None = None, on: Rows = None
    ) -> Tensor:
        """With `pairs`: the exact polygons of at most that many pairs whose hulls meet (`rotated.pair_list`)."""
        a_on, b_on = on or (None, None)
        return rotated.pairwise_overlap(rotated.corners(a), rotated.corners(b), metric, pairs, a_on, b_on)

    def covers(
        self, part: Tensor, whole: Tensor, min_cover: float, pairs: int | None = None, on: Rows = None
    ) -> Tensor:
        corners = rotated.corners(part)
        a_on, b_on = on or (None, None)
        inside = rotated.pairwise_intersection(corners, rotated.corners(whole), pairs, a_on, b_on)
        return inside >= min_cover * rotated.polygon_area(corners).clamp_min(1e-9)[:, None]

    def pairs_needed(self, boxes: Tensor, on: Tensor) -> Tensor:
        corners = rotated.corners(boxes)
        return rotated.meeting_pairs(corners, corners, on, on)

    def meeting(self, boxes: Tensor, key: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """None: rotated boxes compare every pair (or their bounded pair list)."""
        return None

    def grown(self, merged: Tensor, member: Tensor) -> Tensor:
        return rotated.covering(merged, rotated.corners(member))

    def hulls(self, boxes: Tensor) -> Tensor:
        return rotated.obb_hulls(boxes)

    def in_frame(self, plan: Any, boxes: Tensor, image_index: Tensor) -> Tensor:
        """The view's mapping (`rotated.frame_obb`), in ultralytics' regular form (angle in [0, pi/2))."""
        mapping = plan.tensors(boxes.device).to_frame[image_index]
        return rotated.regularized(rotated.frame_obb(boxes, mapping))

    def degenerate(self, boxes: Tensor) -> Tensor | None:
        return rotated.degenerate(boxes)

    def centres(self, boxes: Tensor) -> Tensor:
        return boxes[:, :2]

    def sides(self, boxes: Tensor) -> Tensor:
        return boxes[:, 2:4]

    def packed(self, boxes: Tensor) -> list[Tensor]:
        """The rotated box itself: cx, cy, w, h, angle after the hull."""
        return [boxes]


AXIS_ALIGNED, ROTATED = Geometry(), RotatedGeometry()
GEOMETRIES = {g.columns: g for g in (AXIS_ALIGNED, ROTATED)}


def geometry_of(boxes: Tensor) -> Geometry:
    """The geometry of (N, 4) axis-aligned or (N, 5) rotated boxes (ValueError for any other form)."""
    found = GEOMETRIES.get(boxes.shape[-1]) if boxes.dim() == 2 else None
    if found is None:
        raise ValueError(
            f"boxes must be (N, 4) x1, y1, x2, y2 or (N, 5) cx, cy, w, h, angle, got {tuple(boxes.shape)}"
        )
    return found
