"""The label image of a frame's instance masks on the host and its rank rule (docs/MASKS.md).

Detection k's mask is its box in label pixels (x0, y0, x1, y1, end exclusive) and the bits of that box, row-major,
the detections' bits one after the other. The label image holds k + 1 where detection k's mask covers a pixel, 0
elsewhere; where masks overlap, the detection of the lower rank wins, and ranks come from scores: the higher score
the lower rank, equal scores in their order (`score_ranks`; the detector's order is by score, so there the rank is
the position). On the host each mask is written into its box by one slice assignment, the worst rank first, so the
best is written last; on a device the same rule is `pipeline.labels.compose` (one scatter-min of (rank, row) keys,
fixed shapes), tested equal to this one and to a pixel-by-pixel reference.
"""

from __future__ import annotations

import numpy as np


def score_ranks(scores: np.ndarray) -> np.ndarray:
    """(N,) int64 ranks of detections with (N,) `scores`: 0 for the highest score, equal scores in their order."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    ranks = np.empty(len(order), np.int64)
    ranks[order] = np.arange(len(order))
    return ranks


def label_image(shape: tuple[int, int], boxes: np.ndarray, bits: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The (h, w) label image of masks given as `boxes` (N, 4) int label pixels x0, y0, x1, y1 (end exclusive, inside
    `shape`), `bits` (P,) bool, each box's pixels row-major one box after the other (P >= their total area; any
    more are ignored), and `rank` (N,) int (the lower wins an overlap; `score_ranks`): uint16, k + 1 where
    detection k's mask is the best ranked of those covering a pixel, else 0 (one slice assignment per mask, the
    worst rank first: the best's pixels overwrite the others')."""
    boxes, bits, rank = np.asarray(boxes).astype(np.int64), np.asarray(bits, bool), np.asarray(rank)
    labels = np.zeros(shape, np.uint16)
    size = (boxes[:, 2:] - boxes[:, :2]).clip(0)
    areas = size[:, 0] * size[:, 1]
    starts = np.cumsum(areas) - areas
    for k in np.argsort(rank, kind="stable")[::-1]:
        if areas[k]:
            x0, y0, x1, y1 = boxes[k]
            crop = bits[starts[k] : starts[k] + areas[k]].reshape(y1 - y0, x1 - x0)
            labels[y0:y1, x0:x1][crop] = k + 1
    return labels
