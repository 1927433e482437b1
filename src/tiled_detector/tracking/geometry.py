"""Box and frame geometry on numpy arrays, shared by the tracker, the schedule, the camera motion and the stream
(numpy only: the tracker and the schedule import no torch).

Boxes are (N, 4) x1, y1, x2, y2 in frame pixels (rotated ones (N, 5) cx, cy, w, h, angle: `tiled_detector.geometry.polygons`,
the same code as the frame program's rotated geometry); a camera motion is a (2, 3) similarity (scale, rotation,
translation) from the previous frame's pixels to the current one's.
"""

from __future__ import annotations

import math

import numpy as np

from tiled_detector.geometry import polygons


def overlapping(
    a: np.ndarray, b: np.ndarray, a_groups: np.ndarray | None = None, b_groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs (i, j) of boxes a[i], b[j] that intersect (and, given groups (non-negative integers), are in the
    same group), and their IoU: a sweep over b sorted by (group, x1) finds each a[i]'s candidates, so the work
    follows the pairs, not N x M."""
    empty = np.zeros(0, np.int64)
    if not len(a) or not len(b):
        return empty, empty, np.zeros(0)
    ax1, ay1, ax2, ay2 = a.T
    a_start, a_end, b_key = ax1, ax2, b[:, 0]
    if a_groups is not None and b_groups is not None:  # each group on its own stretch of the sweep's axis
        low = min(float(ax1.min()), float(b_key.min()))
        span = max(float(ax2.max()), float(b[:, 2].max())) - low + 1.0
        a_shift = a_groups * span - low
        a_start, a_end, b_key = ax1 + a_shift, ax2 + a_shift, b_key + (b_groups * span - low)
    order = np.argsort(b_key, kind="stable")
    keys = b_key[order]
    bx1, by1, bx2, by2 = b[order].T
    lo = np.searchsorted(keys, a_start - float(np.max(bx2 - bx1)), side="left")  # b.x2 may reach a.x1
    hi = np.searchsorted(keys, a_end, side="left")  # b.x1 < a.x2
    counts = np.maximum(hi - lo, 0)
    i = np.repeat(np.arange(len(a)), counts)
    k = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())  # positions in sorted b
    width = np.minimum(ax2[i], bx2[k]) - np.maximum(ax1[i], bx1[k])
    wide = width > 0
    i, k, width = i[wide], k[wide], width[wide]
    height = np.minimum(ay2[i], by2[k]) - np.maximum(ay1[i], by1[k])
    hit = height > 0
    i, k, inter = i[hit], k[hit], width[hit] * height[hit]
    union = (ax2[i] - ax1[i]) * (ay2[i] - ay1[i]) + (bx2[k] - bx1[k]) * (by2[k] - by1[k]) - inter
    return i, order[k], inter / np.maximum(union, 1e-12)


def rotated_overlapping(
    a: np.ndarray, b: np.ndarray, a_groups: np.ndarray | None = None, b_groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`overlapping` for rotated boxes (N, 5) and (M, 5): the pairs whose hulls intersect (the same sweep) and
    whose rectangles do, with their rotated IoU (exact intersection polygons)."""
    i, j, _ = overlapping(
        polygons.hulls(polygons.corners(a)), polygons.hulls(polygons.corners(b)), a_groups, b_groups
    )
    iou = polygons.overlap(polygons.corners(a[i]), polygons.corners(b[j])) if len(i) else np.zeros(0)
    hit = iou > 0
    return i[hit], j[hit], iou[hit]


def rotated_grown(obb: np.ndarray, ratio: np.ndarray) -> np.ndarray:
    """Rotated boxes grown on every side by `ratio` (per box) of their w and h (`grown`'s margins)."""
    out = obb.copy()
    out[:, 2:4] *= 1 + 2 * ratio[:, None]
    return out


def move_rotated(matrix: np.ndarray, obb: np.ndarray) -> np.ndarray:
    """Rotated boxes (N, 5) moved by a (2, 3) similarity: centres as points, w and h scaled, angles turned by its
    rotation, in the regular form again (theta in [0, pi/2): `polygons.regularized`, the same rectangles)."""
    out = np.array(obb, np.float64).reshape(-1, 5)
    out[:, :2] = move_points(matrix, out[:, :2])
    out[:, 2:4] *= similarity_scale(matrix)
    out[:, 4] += math.atan2(matrix[1, 0], matrix[0, 0])
    return polygons.regularized(out)


def frame_hulls(obb: np.ndarray, frame_hw: tuple[int, int]) -> np.ndarray:
    """(N, 4) float32 the axis-aligned boxes around rotated boxes (N, 5), clipped to a `frame_hw` frame, as the
    detector reports a rotated detection's box."""
    hull = polygons.hulls(polygons.corners(np.asarray(obb, np.float64).reshape(-1, 5)))
    return np.minimum(hull.clip(0, None), np.tile(np.asarray(frame_hw[::-1], np.float64), 2)).astype(
        np.float32
    )


def grown(boxes: np.ndarray, ratio: np.ndarray) -> np.ndarray:
    """Boxes grown on every side by `ratio` (per box) of their width and height."""
    margin = (boxes[:, 2:] - boxes[:, :2]) * ratio[:, None]
    return np.concatenate([boxes[:, :2] - margin, boxes[:, 2:] + margin], axis=1)


def inside_any(boxes: np.ndarray, rects: np.ndarray) -> np.ndarray:
    """(N,) bool: whether each box lies wholly in at least one of the (K, 4) rectangles."""
    if not len(rects) or not len(boxes):
        return np.zeros(len(boxes), bool)
    b, r = boxes[:, None, :], rects[None, :, :]
    return ((b[..., :2] >= r[..., :2]).all(axis=2) & (b[..., 2:] <= r[..., 2:]).all(axis=2)).any(axis=1)


def inside_union(boxes: np.ndarray, rects: np.ndarray) -> np.ndarray:
    """(N,) bool: whether each box lies wholly in the union of the (K, 4) rectangles (which may reach +-inf).

    Exact: the rectangles' edges cut the plane into cells, each wholly in or out of the union; a box is inside
    when no cell it overlaps is out (a summed-area table of the cells that are out answers each box at once)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    rects = np.asarray(rects, np.float64).reshape(-1, 4)
    if not len(rects) or not len(boxes):
        return np.zeros(len(boxes), bool)
    far = max(float(np.abs(rects[np.isfinite(rects)]).max(initial=0.0)), float(np.abs(boxes).max())) + 1.0
    rects = np.clip(rects, -far, far)  # beyond every box: the same cells as +-inf
    xs, ys = np.unique(rects[:, [0, 2]]), np.unique(rects[:, [1, 3]])
    # cell (r, c) spans ys[r]..ys[r + 1] x xs[c]..xs[c + 1]: in the union when a rectangle holds its centre
    cx, cy = (xs[:-1] + xs[1:]) / 2, (ys[:-1] + ys[1:]) / 2
    held = (
        (rects[:, None, None, 0] <= cx[None, None, :])
        & (rects[:, None, None, 2] >= cx[None, None, :])
        & (rects[:, None, None, 1] <= cy[None, :, None])
        & (rects[:, None, None, 3] >= cy[None, :, None])
    ).any(axis=0)  # (rows, cols)
    out = np.zeros((len(cy) + 1, len(cx) + 1), np.int64)
    out[1:, 1:] = np.cumsum(np.cumsum(~held, axis=0), axis=1)
    # the cells a box overlaps (an open overlap: a box edge on a cell edge does not reach into the next cell)
    c0 = np.searchsorted(xs, boxes[:, 0], side="right") - 1
    c1 = np.searchsorted(xs, boxes[:, 2], side="left")
    r0 = np.searchsorted(ys, boxes[:, 1], side="right") - 1
    r1 = np.searchsorted(ys, boxes[:, 3], side="left")
    within = (c0 >= 0) & (r0 >= 0) & (c1 <= len(cx)) & (r1 <= len(cy)) & (c1 > c0) & (r1 > r0)
    c0, c1 = np.clip(c0, 0, len(cx)), np.clip(c1, 0, len(cx))
    r0, r1 = np.clip(r0, 0, len(cy)), np.clip(r1, 0, len(cy))
    uncovered = out[r1, c1] - out[r0, c1] - out[r1, c0] + out[r0, c0]
    return within & (uncovered == 0)


def move_points(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(N, 2) points through a (2, 3) transform."""
    return np.asarray(points, np.float64) @ matrix[:, :2].T + matrix[:, 2]


def similarity_scale(matrix: np.ndarray) -> float:
    """The scale of a (2, 3) similarity."""
    return float(math.sqrt(abs(np.linalg.det(matrix[:, :2]))))


def move_boxes(matrix: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Boxes moved by the similarity: each box's centre moved, its width and height scaled (an upright box stays
    the object's box under a small rotation)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    centres = move_points(matrix, (boxes[:, :2] + boxes[:, 2:]) / 2)
    half = (boxes[:, 2:] - boxes[:, :2]) / 2 * similarity_scale(matrix)
    return np.concatenate([centres - half, centres + half], axis=1)


def corner_error(estimated: np.ndarray, true: np.ndarray, size_hw: tuple[int, int]) -> float:
    """Mean distance in pixels between the frame's four corners moved by the two transforms."""
    h, w = size_hw
    corners = np.array([[0.0, 0.0], [w, 0.0], [0.0, h], [w, h]])
    return float(np.linalg.norm(move_points(estimated, corners) - move_points(true, corners), axis=1).mean())


def new_view(tiles: np.ndarray, matrix: np.ndarray, size_hw: tuple[int, int]) -> np.ndarray:
    """(N,) the fraction of each tile (N, 4) that the previous frame did not show: the part of the tile that the
    inverse motion maps outside the previous frame (on a 9 x 9 grid of points per tile)."""
    inverse = np.linalg.inv(np.vstack([matrix, [0, 0, 1]]))[:2]
    steps = (np.arange(9) + 0.5) / 9
    gx = tiles[:, 0, None] + steps[None] * (tiles[:, 2] - tiles[:, 0])[:, None]  # (N, 9)
    gy = tiles[:, 1, None] + steps[None] * (tiles[:, 3] - tiles[:, 1])[:, None]
    points = np.stack(np.broadcast_arrays(gx[:, None, :], gy[:, :, None]), axis=-1).reshape(-1, 2)
    before = move_points(inverse, points).reshape(len(tiles), -1, 2)
    h, w = size_hw
    outside = (before[..., 0] < 0) | (before[..., 0] > w) | (before[..., 1] < 0) | (before[..., 1] > h)
    return outside.mean(axis=1)


def with_new_view(
    fresh: np.ndarray, tiles: np.ndarray, matrix: np.ndarray, size_hw: tuple[int, int]
) -> np.ndarray:
    """(N,) each tile's fraction of new view `fresh` after one more frame of motion `matrix` (`new_view`)."""
    return 1 - (1 - fresh) * (1 - new_view(tiles, matrix, size_hw))
