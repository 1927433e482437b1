"""Rotated-box geometry on the engine's device: the stage that rotated boxes (ultralytics' OBB models) add beside
the axis-aligned ones, for the seam rule, the merge, the policy and the packing.

Boxes are (..., 5) cx, cy, w, h, angle (ultralytics' xywhr; the angle in radians, turning +x toward +y in pixel
coordinates, i.e. clockwise on screen); polygons are (..., K, 2) vertices of convex polygons in either orientation
(a rectangle's `corners`, DOTA's four label points). Everything is torch, batched, with fixed shapes, no host read
and no per-box Python loop; areas are computed about local origins, so float32 frame coordinates are safe.
The math itself lives in `tiled_detector.geometry.polygons` (one implementation for torch here and numpy in the tracker);
this module's names:

- `corners(obb) -> (..., 4, 2)`: centre + R(angle)(+-w/2, +-h/2), in ultralytics' order (`xywhr2xyxyxyxy`);
- `polygon_area(p)`, `signed_area(p)`, `intersection_area(a, b)` (broadcastable convex polygons, exact);
- `overlap(a, b, metric)`: IoU / IoS of broadcastable polygons; `pairwise_overlap(a, b, metric) -> (N, M)`,
  `pairwise_intersection(a, b) -> (N, M)` (in row chunks: memory bounded by `PAIR_BUDGET`, not N x M); with a
  `capacity` (the sync-free path) only the pairs whose hulls meet, at most that many, a bounded pair list
  (`pair_list`, `meeting_pairs`): no polygon work for pairs that cannot overlap;
- `hulls(p) -> (..., 4)` x1, y1, x2, y2 and `obb_hulls(obb)`: the axis-aligned boxes around them;
- `covering(obb, points)`: the rectangle at the same angle that covers the rectangle and the points: a merged
  group keeps its keeper's angle exactly (never an average across the pi ambiguity) and covers every member;
- `regularized(obb)`: ultralytics' regular form (angle in [0, pi/2), w and h swapped to match);
- `frame_obb(obb, mapping)`: boxes in model-input pixels to frame pixels with a plan's `to_frame` rows;
- `degenerate(obb)`: rows that are no rectangle (w or h <= 0, NaN); `inner_points(obb, u, v)`: points spread over
  each rectangle (the ignore mask's and the depth's samples).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tiled_detector.geometry.polygons import (
    corners,
    covering,
    degenerate,
    hulls,
    inner_points,
    intersection_area,
    overlap,
    polygon_area,
    regularized,
    signed_area,
)

__all__ = [
    "EVERY_PAIR",
    "PAIR_BUDGET",
    "corners",
    "covering",
    "degenerate",
    "frame_obb",
    "hulls",
    "inner_points",
    "intersection_area",
    "meeting_pairs",
    "obb_hulls",
    "overlap",
    "pair_list",
    "pairwise_intersection",
    "pairwise_overlap",
    "polygon_area",
    "regularized",
    "signed_area",
]

# (pair, edge, edge) elements of one step of `pairwise_overlap` (a few float32 temporaries of this many live at
# once): rows are taken in chunks so that memory follows this bound, not N x M
PAIR_BUDGET = {"cpu": 1 << 22, "cuda": 1 << 24}
# devices where every pair is measured, with fixed shapes (a captured graph replays them); elsewhere only the pairs
# whose hulls meet (data-dependent shapes, a few thousandths of the pairs of a 4K frame's candidates: 15 s -> 0.07 s
# for 3,300 boxes on one CPU core)
EVERY_PAIR = {"cuda"}


def obb_hulls(obb: Tensor) -> Tensor:
    """(..., 5) rotated boxes -> (..., 4) x1, y1, x2, y2 of the axis-aligned boxes around them."""
    return hulls(corners(obb))


def _pairwise(function: Callable[[Tensor, Tensor], Tensor], a: Tensor, b: Tensor) -> Tensor:
    """(N, M) `function` of every polygon of a (N, K, 2) with every polygon of b (M, K, 2) (0 for polygons whose
    hulls do not meet). On `EVERY_PAIR` devices every pair is measured, in row chunks of at most `PAIR_BUDGET`
    elements (fixed shapes: a captured graph replays the same chunks); elsewhere only the pairs whose hulls meet."""
    budget = PAIR_BUDGET.get(a.device.type, PAIR_BUDGET["cuda"])
    rows = max(1, budget // max(1, len(b) * a.shape[-2] * b.shape[-2]))
    if a.device.type not in EVERY_PAIR:
        i, j = _meeting(hulls(a), hulls(b), budget)
        found = function(a[i], b[j])
        return found.new_zeros((len(a), len(b))).index_put_((i, j), found)
    if len(a) <= rows:
        return function(a[:, None], b[None])
    return torch.cat([function(part[:, None], b[None]) for part in a.split(rows)])


def _meeting(a: Tensor, b: Tensor, budget: int) -> tuple[Tensor, Tensor]:
    """The (i, j) index pairs of the boxes a (N, 4) and b (M, 4) x1, y1, x2, y2 that meet (edges touching
    included), in row chunks of at most `budget` pairs."""
    rows = max(1, budget // max(1, len(b)))
    found = []
    for start in range(0, len(a), rows):
        part = a[start : start + rows]
        meet = (part[:, None, 0] <= b[None, :, 2]) & (part[:, None, 1] <= b[None, :, 3])
        meet &= (b[None, :, 0] <= part[:, None, 2]) & (b[None, :, 1] <= part[:, None, 3])
        found.append(meet.nonzero() + torch.tensor([start, 0], device=a.device))
    pairs = torch.cat(found) if found else a.new_zeros((0, 2), dtype=torch.long)
    return pairs[:, 0], pairs[:, 1]


def _hull_meet(a: Tensor, b: Tensor, a_on: Tensor | None, b_on: Tensor | None) -> Tensor:
    """(N, M) bool: the axis-aligned boxes a (N, 4) and b (M, 4) meet (edges touching included), rows of a not
    `a_on` and of b not `b_on` never."""
    meet = (a[:, None, 0] <= b[None, :, 2]) & (a[:, None, 1] <= b[None, :, 3])
    meet &= (b[None, :, 0] <= a[:, None, 2]) & (b[None, :, 1] <= a[:, None, 3])
    if a_on is not None:
        meet &= a_on[:, None]
    if b_on is not None:
        meet &= b_on[None, :]
    return meet


def meeting_pairs(a: Tensor, b: Tensor, a_on: Tensor | None = None, b_on: Tensor | None = None) -> Tensor:
    """0-dim int64: how many pairs of polygons a (N, K, 2) and b (M, K, 2) have meeting hulls (rows `a_on` of a
    with rows `b_on` of b): the pair list's size that `pair_list` needs (no host read)."""
    return _hull_meet(hulls(a), hulls(b), a_on, b_on).sum()


def pair_list(
    a: Tensor, b: Tensor, capacity: int, a_on: Tensor | None = None, b_on: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The first `capacity` (row-major) pairs (i, j) of polygons a (N, K, 2) and b (M, K, 2) whose hulls meet (rows
    `a_on` of a with rows `b_on` of b): (i, j, present), each (capacity,), `present` False past the pairs there
    are. Fixed shapes, no host read: the cheap axis-aligned test over every pair, then a running count places each
    meeting pair; pairs past the capacity are left out (`meeting_pairs` says how many were needed)."""
    meet = _hull_meet(hulls(a), hulls(b), a_on, b_on).flatten()
    position = meet.cumsum(0, dtype=torch.int32) - 1
    slot = torch.where(meet & (position < capacity), position.long(), capacity)
    flat = torch.full((capacity + 1,), -1, dtype=torch.int64, device=a.device)
    flat.scatter_(
        0, slot, torch.arange(len(meet), device=a.device)
    )  # (every other pair: the spare last slot)
    flat = flat[:capacity]
    present = flat >= 0
    width = max(len(b), 1)
    return torch.where(present, flat // width, 0), torch.where(present, flat % width, 0), present


def _listed(
    function: Callable[[Tensor, Tensor], Tensor],
    a: Tensor,
    b: Tensor,
    capacity: int,
    a_on: Tensor | None,
    b_on: Tensor | None,
) -> Tensor:
    """(N, M) `function` of the pairs of `pair_list` (0 elsewhere: pairs whose hulls do not meet, and pairs past
    the capacity)."""
    if len(a) == 0 or len(b) == 0:
        return a.new_zeros((len(a), len(b)))
    i, j, present = pair_list(a, b, capacity, a_on, b_on)
    found = torch.where(present, function(a[i], b[j]), 0.0)
    at = torch.where(present, i * len(b) + j, len(a) * len(b))
    out = found.new_zeros(len(a) * len(b) + 1).scatter_(0, at, found)
    return out[:-1].view(len(a), len(b))


def pairwise_overlap(
    a: Tensor,
    b: Tensor,
    metric: str = "iou",
    capacity: int | None = None,
    a_on: Tensor | None = None,
    b_on: Tensor | None = None,
) -> Tensor:
    """(N, M) IoU or IoS (`metric` "iou" / "ios") of every polygon of a (N, K, 2) with every polygon of b
    (M, K, 2) (`_pairwise`'s chunks); with a `capacity`, of the pairs of `pair_list` only (rows `a_on` / `b_on`),
    0 for the others."""
    if capacity is not None:
        return _listed(lambda x, y: overlap(x, y, metric), a, b, capacity, a_on, b_on)
    return _pairwise(lambda x, y: overlap(x, y, metric), a, b)


def pairwise_intersection(
    a: Tensor, b: Tensor, capacity: int | None = None, a_on: Tensor | None = None, b_on: Tensor | None = None
) -> Tensor:
    """(N, M) intersection areas of every polygon of a (N, K, 2) with every polygon of b (M, K, 2); with a
    `capacity`, of the pairs of `pair_list` only."""
    if capacity is not None:
        return _listed(intersection_area, a, b, capacity, a_on, b_on)
    return _pairwise(intersection_area, a, b)


def frame_obb(obb: Tensor, mapping: Tensor) -> Tensor:
    """(M, 5) boxes in model-input pixels -> frame pixels with the (M, 3, 4) rows of `PlanTensors.to_frame` (scale
    and offset per coordinate; frame = input * scale + offset): the centre maps as a point; where the x and y scales
    differ (a stretched view) the w side's direction and length are mapped and h keeps the area. Not clipped to the
    frame (the hulls are)."""
    obb = obb.float()
    sx, sy = mapping[:, 0, 0], mapping[:, 0, 1]
    cos, sin = torch.cos(obb[:, 4]), torch.sin(obb[:, 4])
    wx, wy = obb[:, 2] * cos * sx, obb[:, 2] * sin * sy
    w = torch.sqrt(wx * wx + wy * wy)
    h = obb[:, 3] * obb[:, 2] * sx * sy / torch.where(w > 0, w, 1.0)
    angle = torch.where((sx == sy) | (w == 0), obb[:, 4], torch.atan2(wy, wx))
    return torch.stack(
        [
            obb[:, 0] * sx + mapping[:, 1, 0],
            obb[:, 1] * sy + mapping[:, 1, 1],
            torch.where(sx == sy, obb[:, 2] * sx, w),
            torch.where(sx == sy, obb[:, 3] * sy, h),
            angle,
        ],
        1,
    )
