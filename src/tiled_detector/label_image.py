"""The label image of a frame's instance masks and its rank rule (docs/MASKS.md), on numpy arrays or torch tensors.

Detection k's mask is its box in label pixels (x0, y0, x1, y1, end exclusive) and the bits of that box, row-major,
the detections' bits one after the other. The label image holds k + 1 where detection k's mask covers a pixel, 0
elsewhere; where masks overlap, the detection of the lower rank wins, and ranks come from scores: the higher score
the lower rank, equal scores in their order (`score_ranks`; the detector's order is by score, so there the rank is
the position). One rule, one function (`label_image`) wherever the image is made: on the host from downloaded bits
(numpy: each mask written into its box by one slice assignment, the worst rank first, so the best is written last),
or on a device (torch: every mask pixel at once, each pixel the lowest rank among the masks covering it by one
scatter-min; fixed shapes, no host read: it can run in a captured graph). Both give the same image.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def _torch(array: Any) -> Any | None:
    """The torch module when `array` is a tensor (torch already imported), else None (numpy)."""
    if isinstance(array, np.ndarray):
        return None
    return sys.modules[type(array).__module__.split(".")[0]]


def score_ranks(scores: Any) -> Any:
    """(N,) int64 ranks of detections with (N,) `scores`: 0 for the highest score, equal scores in their order."""
    torch = _torch(scores)
    if torch is None:
        order = np.argsort(-np.asarray(scores), kind="stable")
        ranks = np.empty(len(order), np.int64)
        ranks[order] = np.arange(len(order))
        return ranks
    order = torch.argsort(-scores, stable=True)
    return torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))


def label_image(shape: tuple[int, int], boxes: Any, bits: Any, rank: Any) -> Any:
    """The (h, w) label image of masks given as `boxes` (N, 4) int label pixels x0, y0, x1, y1 (end exclusive, inside
    `shape`), `bits` (P,) bool, each box's pixels row-major one box after the other (P >= their total area; any
    more are ignored), and `rank` (N,) int (the lower wins an overlap; `score_ranks`): k + 1 where detection k's mask
    is the best ranked of those covering a pixel, else 0. numpy: uint16; torch: int32 on the tensors' device."""
    torch = _torch(bits)
    if torch is None:
        return _composed(shape, np.asarray(boxes), np.asarray(bits, bool), np.asarray(rank))
    return _scattered(torch, shape, boxes, bits, rank)


def _areas(boxes: Any) -> Any:
    size = (boxes[:, 2:] - boxes[:, :2]).clip(0)
    return size[:, 0] * size[:, 1]


def _composed(shape: tuple[int, int], boxes: np.ndarray, bits: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """numpy: the masks written into their boxes worst rank first (one slice assignment each, none per pixel)."""
    labels = np.zeros(shape, np.uint16)
    areas = _areas(boxes.astype(np.int64))
    starts = np.cumsum(areas) - areas
    for k in np.argsort(rank, kind="stable")[::-1]:  # the best last: its pixels overwrite the others'
        if areas[k]:
            x0, y0, x1, y1 = boxes[k]
            crop = bits[starts[k] : starts[k] + areas[k]].reshape(y1 - y0, x1 - x0)
            labels[y0:y1, x0:x1][crop] = k + 1
    return labels


def _scattered(torch: Any, shape: tuple[int, int], boxes: Any, bits: Any, rank: Any) -> Any:
    """torch: per pixel the lowest (rank, detection) key among the mask bits on it (one scatter-min over every bit;
    fixed shapes)."""
    height, width = shape
    count, device = len(boxes), bits.device
    if count == 0 or len(bits) == 0:
        return torch.zeros(shape, dtype=torch.int32, device=device)
    boxes = boxes.long()
    areas = _areas(boxes)
    ends = areas.cumsum(0)
    item = torch.arange(len(bits), device=device)
    row = torch.searchsorted(ends, item, right=True).clamp_max(count - 1)
    local = item - (ends - areas)[row]
    wide = (boxes[row, 2] - boxes[row, 0]).clamp_min(1)
    x, y = boxes[row, 0] + local % wide, boxes[row, 1] + local // wide
    on = bits.bool() & (item < ends[-1])
    # one key per detection: its rank first, then its index (ranks may repeat); past the image: nothing
    key = rank.long()[row] * count + row
    nothing = torch.iinfo(torch.int64).max
    flat = torch.where(on, y * width + x, height * width)
    best = torch.full((height * width + 1,), nothing, dtype=torch.int64, device=device)
    best.scatter_reduce_(0, flat, torch.where(on, key, nothing), "amin")
    best = best[:-1].reshape(height, width)
    return torch.where(best == nothing, 0, best % count + 1).int()
