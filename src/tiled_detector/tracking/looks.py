"""What a frame's views looked at, when not every tile ran (a tile budget, a frame in parts): where a box is seen
whole, so that a detection there is trusted and a track there that no detection matched was missed, not skipped.

A box is seen whole when
- the tiles run hold it: it lies in the union of their regions, each tile less a seam margin along its inner
  edges (a box in that margin may be the part of an object that goes on in a tile not run), and unbounded beyond
  the frame's edges (a track predicted partly out of the frame is looked for by the tile its visible part is in);
- or the full-frame view resolves it: it runs on every frame, and an object whose shorter side is at least
  `FULL_VIEW_MIN_PX` of the model's input there is found by it (people a few hundred pixels tall at 1080p: 30 to
  90 px in a 416 input), unless the box is a piece cut by the inner edge of a tile run (the full-frame view then
  missed the object, and the piece is not the object's box).
Numpy only (the tracker uses it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tiled_detector.tracking.geometry import inside_union

FULL_VIEW_MIN_PX = 32.0  # model-input pixels: an object this large in the full-frame view is found by it


@dataclass(frozen=True)
class Looks:
    """The views of a frame that ran: the tiles run (K, 4) with their inner edges (K, 4) bool (left, top, right,
    bottom: a seam inside the frame), the seam margin in frame pixels, and the full-frame view's scale (frame
    pixels -> model-input pixels; 0: no full-frame view)."""

    tiles: np.ndarray
    inner: np.ndarray
    margin: float
    full_view_scale: float = 0.0

    def regions(self) -> np.ndarray:
        """(K, 4) float64: each tile run less the seam margin along its inner edges, unbounded beyond the frame."""
        tiles = np.asarray(self.tiles, np.float64).reshape(-1, 4)
        outward = np.array([-np.inf, -np.inf, np.inf, np.inf])
        return np.where(self.inner, tiles + self.margin * np.array([1.0, 1.0, -1.0, -1.0]), outward)

    def held(self, boxes: np.ndarray) -> np.ndarray:
        """(N,) bool: the boxes the tiles run hold whole."""
        return inside_union(boxes, self.regions())

    def cut(self, boxes: np.ndarray) -> np.ndarray:
        """(N,) bool: the boxes that are pieces cut by a tile run: inside the tile, a side within the margin of one
        of its inner edges."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        tiles = np.asarray(self.tiles, np.float64).reshape(-1, 4)
        if not len(boxes) or not len(tiles):
            return np.zeros(len(boxes), bool)
        b, t = boxes[:, None, :], tiles[None, :, :]
        inside = (b[..., :2] >= t[..., :2] - 1.0).all(axis=2) & (b[..., 2:] <= t[..., 2:] + 1.0).all(axis=2)
        near = np.concatenate(
            [b[..., :2] <= t[..., :2] + self.margin, b[..., 2:] >= t[..., 2:] - self.margin], axis=2
        )
        return (inside & (near & self.inner[None]).any(axis=2)).any(axis=1)

    def resolved(self, boxes: np.ndarray) -> np.ndarray:
        """(N,) bool: the boxes large enough for the full-frame view to find (none without it)."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        side = np.sqrt(
            np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
        )
        return (self.full_view_scale > 0) & (side * self.full_view_scale >= FULL_VIEW_MIN_PX)

    def seen(self, boxes: np.ndarray) -> np.ndarray:
        """(N,) bool: the boxes seen whole (module docstring)."""
        return self.held(boxes) | (self.resolved(boxes) & ~self.cut(boxes))


def across_parts(
    boxes: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    whole: np.ndarray,
    part: np.ndarray,
    min_cover: float = 0.6,
    min_score_ratio: float = 0.5,
    class_agnostic: bool = False,
) -> np.ndarray:
    """Keep mask (N,) of the seam rule across the parts of a frame (as `pipeline.seams.suppress_truncated` within a
    batch): a box its own part did not see whole yields to a box of another part that saw it whole, of its class
    (unless `class_agnostic`), covering `min_cover` of its area and scoring at least `min_score_ratio` x its score.
    `whole` (N,) bool: seen whole by its part; `part` (N,) int: which part found it."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    keep = np.ones(len(boxes), bool)
    cut, cover = np.flatnonzero(~whole), np.flatnonzero(whole)
    if not len(cut) or not len(cover):
        return keep
    a, b = boxes[cut, None, :], boxes[None, cover, :]
    inter = np.clip(np.minimum(a[..., 2:], b[..., 2:]) - np.maximum(a[..., :2], b[..., :2]), 0, None)
    inter = inter.prod(axis=2)
    area = np.prod(boxes[cut, 2:] - boxes[cut, :2], axis=1).clip(1e-9)
    covered = inter >= min_cover * area[:, None]
    covered &= part[cut, None] != part[None, cover]
    covered &= scores[None, cover] >= min_score_ratio * scores[cut, None]
    if not class_agnostic:
        covered &= class_ids[cut, None] == class_ids[None, cover]
    keep[cut] = ~covered.any(axis=1)
    return keep
