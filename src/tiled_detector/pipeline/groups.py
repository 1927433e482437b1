"""Pairwise comparisons of detections, shared by the seam rule and the merge: which rows are compared with which
(one int64 key per row, so that one (N, N) comparison stands for "same frame and same class") and how much two
boxes overlap (their intersection and areas, in the fewest pairwise kernels)."""

from __future__ import annotations

import torch
from torch import Tensor


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


def area(boxes: Tensor) -> Tensor:
    """Areas (x2 - x1) * (y2 - y1) of (..., 4) boxes (negative for inverted ones)."""
    size = boxes[..., 2:] - boxes[..., :2]
    return size[..., 0] * size[..., 1]
