"""Convex polygons and rotated rectangles as arrays of any library: the same code runs on numpy arrays (the tracker,
the scores) and on torch tensors (the frame program, `pipeline.rotated`), with no import of either beyond numpy.

A rotated rectangle is (..., 5) cx, cy, w, h, angle: ultralytics' xywhr. Its corners are the centre plus R(angle)
(+-w/2, +-h/2), R the rotation that turns +x toward +y in pixel coordinates (x right, y down: clockwise on screen),
in ultralytics' order (`xywhr2xyxyxyxy`): (+w/2, +h/2), (+w/2, -h/2), (-w/2, -h/2), (-w/2, +h/2). A polygon is
(..., K, 2) vertices of a convex polygon in either orientation (rectangles' corners, DOTA's four label points);
every function broadcasts over the leading dimensions, with fixed shapes and no data-dependent branch (so it runs
sync-free on a GPU).

Intersection areas are exact (up to rounding) for convex polygons, by Green's theorem over the boundary of the
intersection: it is the part of each edge of A inside B and of each edge of B inside A, so its area is
1/2 sum over edges (fraction inside) x cross(start - o, edge) for any origin o. The fraction of an edge inside a
convex polygon is one interval, clipped half-plane by half-plane (Liang-Barsky): no vertex list, no sort, no loop.
Edges that lie on one line (identical or touching boxes, up to float rounding) are decided once per pair of edges
so that a shared boundary counts exactly once (`COINCIDENT`: rounding's reach, not a fraction of the edges), and
everything is computed in coordinates relative to A's vertex mean, so float32 frame coordinates keep their
precision: relative errors stay near 1e-4 of the areas.
Non-convex or self-crossing input is outside the contract (DOTA labels that are: take their convex hull first).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

# The one angle convention of a rotated rectangle (ultralytics' xywhr), as said wherever users read it (the message's
# center.theta, `detect --json`, the docs) and read back by every reader (replay, bags, the tracker)
ANGLE = (
    "radians, positive from the image's +x axis toward +y (a right-handed rotation about the camera's optical "
    "axis, REP 103's optical frame: x right, y down, z forward; clockwise on screen), in [0, pi/2)"
)
# Edges of two polygons whose lines lie within rounding of each other count as one line: within this many units
# in the last place of the coordinates' magnitude, over the lengths involved (float32 at 4K: about 1e-3 px for
# edges of a few pixels; float64: about 1e-12 px). Lines farther apart are distinct, however long the edges (a
# 1000 x 1 box 0.09 px off another is not on its lines)
COINCIDENT = 3
INF = float("inf")


def namespace(array: Any) -> Any:
    """The array library of `array`: numpy for numpy arrays and scalars, else the (already imported) module that
    defines its type (torch for tensors)."""
    if isinstance(array, (np.ndarray, np.generic, float, int)):
        return np
    return sys.modules[type(array).__module__.split(".")[0]]


def corners(obb: Any) -> Any:
    """(..., 5) cx, cy, w, h, angle -> (..., 4, 2) corners in ultralytics' order (module docstring)."""
    xp = namespace(obb)
    cos, sin = xp.cos(obb[..., 4]), xp.sin(obb[..., 4])
    half_w, half_h = obb[..., 2] / 2, obb[..., 3] / 2
    # the rotated half-axes: along w (cos, sin) and along h (-sin, cos)
    wx, wy, hx, hy = half_w * cos, half_w * sin, -half_h * sin, half_h * cos
    cx, cy = obb[..., 0], obb[..., 1]
    xs = xp.stack([cx + wx + hx, cx + wx - hx, cx - wx - hx, cx - wx + hx], -1)
    ys = xp.stack([cy + wy + hy, cy + wy - hy, cy - wy - hy, cy - wy + hy], -1)
    return xp.stack([xs, ys], -1)


def regularized(obb: Any) -> Any:
    """(..., 5) rectangles in ultralytics' regular form (`regularize_rboxes`): the angle in [0, pi/2), w and h
    swapped where the angle modulo pi was in [pi/2, pi) (the same rectangle)."""
    xp = namespace(obb)
    quarter = np.pi / 2
    turns = xp.floor(obb[..., 4] / quarter)  # quarter turns below the angle
    angle = obb[..., 4] - turns * quarter
    over, under = angle >= quarter, angle < 0  # (rounding)
    angle = xp.where(over, angle - quarter, xp.where(under, angle + quarter, angle))
    swap = (turns % 2 == 1) ^ over ^ under  # an odd number of quarter turns in all
    return xp.stack(
        [
            obb[..., 0],
            obb[..., 1],
            xp.where(swap, obb[..., 3], obb[..., 2]),
            xp.where(swap, obb[..., 2], obb[..., 3]),
            xp.clip(angle, 0, None),
        ],
        -1,
    )


def aligned(obb: Any, reference: Any) -> Any:
    """(..., 5) rectangles in the form (of the equivalent ones: the angle plus quarter turns, w and h swapped for
    an odd number) whose angle lies nearest `reference` (...): within pi/4 of it. A tracked object's angle so
    changes continuously, whatever form each detection came in."""
    xp = namespace(obb)
    quarter = np.pi / 2
    turns = xp.floor((reference - obb[..., 4]) / quarter + 0.5)
    swap = turns % 2 == 1
    return xp.stack(
        [
            obb[..., 0],
            obb[..., 1],
            xp.where(swap, obb[..., 3], obb[..., 2]),
            xp.where(swap, obb[..., 2], obb[..., 3]),
            obb[..., 4] + turns * quarter,
        ],
        -1,
    )


def degenerate(obb: Any) -> Any:
    """(..., 5) -> (...) bool: rows that are no rectangle: w or h not above 0 (or NaN), a centre or an angle that is
    not finite."""
    xp = namespace(obb)
    finite = xp.isfinite(obb[..., 0]) & xp.isfinite(obb[..., 1]) & xp.isfinite(obb[..., 4])
    return ~((obb[..., 2] > 0) & (obb[..., 3] > 0) & finite)


def inner_points(obb: Any, along_w: Any, along_h: Any) -> Any:
    """(..., 5) rectangles -> (..., P, 2) points at fractions `along_w`, `along_h` (P,) of their sides from the
    centre (-0.5 .. 0.5 spans the rectangle), turned with it."""
    xp = namespace(obb)
    cos, sin = xp.cos(obb[..., 4:5]), xp.sin(obb[..., 4:5])
    u, v = along_w * obb[..., 2:3], along_h * obb[..., 3:4]
    return xp.stack([obb[..., 0:1] + u * cos - v * sin, obb[..., 1:2] + u * sin + v * cos], -1)


def _cross(ax: Any, ay: Any, bx: Any, by: Any) -> Any:
    return ax * by - ay * bx


def signed_area(polygon: Any) -> Any:
    """(..., K, 2) -> (...) shoelace area, positive when the vertices turn from +x toward +y (ultralytics' corners
    give negative areas), computed about the vertices' mean (float32 frame coordinates keep their precision)."""
    xp = namespace(polygon)
    polygon = polygon - xp.mean(polygon, -2)[..., None, :]
    x, y = polygon[..., 0], polygon[..., 1]
    return xp.sum(_cross(x, y, xp.roll(x, -1, -1), xp.roll(y, -1, -1)), -1) / 2


def polygon_area(polygon: Any) -> Any:
    """(..., K, 2) -> (...) area of a simple polygon, either orientation."""
    return namespace(polygon).abs(signed_area(polygon))


def positive(polygon: Any) -> tuple[Any, Any]:
    """(..., K, 2) polygons with their vertices in positive orientation (`signed_area` >= 0), the same first
    vertex, and their areas."""
    xp = namespace(polygon)
    area = signed_area(polygon)
    # the same first vertex, the rest reversed (flip and roll: an index list would be copied to the device)
    reversed_order = xp.roll(xp.flip(polygon, (-2,)), 1, -2)
    return xp.where((area < 0)[..., None, None], reversed_order, polygon), xp.abs(area)


def _inside(start: Any, along: Any, blocked: Any, free: Any, axis: int) -> Any:
    """Fraction of edges inside convex polygons: along an edge the signed distance (times the clipping edge's
    length) to each clipping line is `start + t * along`, t in [0, 1], inside where >= 0; `blocked` / `free`
    pairs override (one shared line); the constraints of one edge lie along `axis`."""
    xp = namespace(start)
    flat = along == 0
    limit = -start / xp.where(flat, 1.0, along)
    lower = xp.where(along > 0, limit, -INF)
    upper = xp.where(along < 0, limit, INF)
    never = blocked | (flat & (start < 0))
    lower = xp.where(free, -INF, xp.where(never, INF, lower))
    upper = xp.where(free | never, INF, upper)
    first = xp.clip(xp.amax(lower, axis), 0, None)
    last = xp.clip(xp.amin(upper, axis), None, 1)
    return xp.clip(last - first, 0, None)


def intersection_area(a: Any, b: Any) -> Any:
    """Areas of the intersections of broadcastable convex polygons a (..., Ka, 2) and b (..., Kb, 2) (Ka, Kb >= 3,
    either orientation): exact up to rounding (module docstring); 0 where either has no area."""
    xp = namespace(a)
    (a, area_a), (b, area_b) = positive(a), positive(b)
    origin = xp.mean(a, -2)[..., None, :]
    a, b = a - origin, b - origin
    s = a[..., :, None, :]  # A's edges along axis -2: start s, direction v
    v = (xp.roll(a, -1, -2) - a)[..., :, None, :]
    u = b[..., None, :, :]  # B's edges along axis -1: start u, direction w
    w = (xp.roll(b, -1, -2) - b)[..., None, :, :]
    sx, sy, vx, vy = s[..., 0], s[..., 1], v[..., 0], v[..., 1]
    ux, uy, wx, wy = u[..., 0], u[..., 1], w[..., 0], w[..., 1]
    dx, dy = sx - ux, sy - uy
    a_start = _cross(wx, wy, dx, dy)  # A's edge start to B's edge line (x |w|), positive inside B
    a_along = _cross(wx, wy, vx, vy)
    b_start = _cross(vx, vy, -dx, -dy)  # B's edge start to A's edge line (x |v|), positive inside A
    v_len, w_len = xp.sqrt(vx * vx + vy * vy), xp.sqrt(wx * wx + wy * wy)
    # one line within rounding: a cross product (distance x length) within a few units in the last place of the
    # coordinates' magnitude (the frame's, before A's mean was taken off) times the lengths involved (an edge's
    # direction errs by that unit over its length, and the error grows with the distance it reaches)
    magnitude = xp.amax(xp.abs(origin), -1)[..., None] + xp.maximum(
        xp.maximum(xp.abs(sx), xp.abs(sy)), xp.maximum(xp.abs(ux), xp.abs(uy))
    )
    unit = xp.finfo(a.dtype).eps * xp.exp2(xp.floor(xp.log2(magnitude)))
    bound = COINCIDENT * unit * (v_len + w_len + xp.sqrt(dx * dx + dy * dy))
    coincident = (
        (v_len > 0)
        & (w_len > 0)
        & (xp.abs(a_start) <= bound)
        & (xp.abs(a_start + a_along) <= bound)
        & (xp.abs(b_start) <= bound)
        & (xp.abs(b_start - a_along) <= bound)
    )
    same = vx * wx + vy * wy > 0
    # one shared line: A's edge counts where both polygons lie on the same side of it, B's never
    a_part = _inside(a_start, a_along, coincident & ~same, coincident & same, -1)
    b_part = _inside(b_start, -a_along, coincident, xp.zeros_like(coincident), -2)
    a_terms = _cross(sx, sy, vx, vy)[..., :, 0]  # twice the triangle (origin, edge)
    b_terms = _cross(ux, uy, wx, wy)[..., 0, :]
    area = (xp.sum(a_part * a_terms, -1) + xp.sum(b_part * b_terms, -1)) / 2
    return xp.where((area_a > 0) & (area_b > 0), area, 0.0)  # (a point constrains no edge of the other)


def overlap(a: Any, b: Any, metric: str = "iou") -> Any:
    """IoU (`metric` "iou") or IoS ("ios": over the smaller area) of broadcastable convex polygons (..., K, 2);
    0 where the denominator is 0."""
    xp = namespace(a)
    inter, area_a, area_b = intersection_area(a, b), polygon_area(a), polygon_area(b)
    if metric == "iou":
        denom = area_a + area_b - inter
    elif metric == "ios":
        denom = xp.minimum(area_a, area_b)
    else:
        raise ValueError(f"overlap metric must be iou or ios, got {metric!r}")
    return xp.where(denom > 0, inter / xp.where(denom > 0, denom, 1.0), 0.0)


def hulls(polygon: Any) -> Any:
    """(..., K, 2) -> (..., 4) x1, y1, x2, y2: the axis-aligned box around each polygon."""
    xp = namespace(polygon)
    return xp.concatenate([xp.amin(polygon, -2), xp.amax(polygon, -2)], -1)


def covering(obb: Any, points: Any) -> Any:
    """(..., 5) rectangles widened to cover (..., P, 2) points too: the smallest rectangle at the same angle that
    covers the rectangle and the points (its angle is kept exactly: never an average of angles)."""
    xp = namespace(obb)
    cos, sin = xp.cos(obb[..., 4])[..., None], xp.sin(obb[..., 4])[..., None]
    dx, dy = points[..., 0] - obb[..., 0:1], points[..., 1] - obb[..., 1:2]
    along_w, along_h = cos * dx + sin * dy, cos * dy - sin * dx  # the points in the rectangle's own axes
    half_w, half_h = obb[..., 2] / 2, obb[..., 3] / 2
    w_lo, w_hi = xp.minimum(xp.amin(along_w, -1), -half_w), xp.maximum(xp.amax(along_w, -1), half_w)
    h_lo, h_hi = xp.minimum(xp.amin(along_h, -1), -half_h), xp.maximum(xp.amax(along_h, -1), half_h)
    mid_w, mid_h = (w_lo + w_hi) / 2, (h_lo + h_hi) / 2
    cos, sin = cos[..., 0], sin[..., 0]
    return xp.stack(
        [
            obb[..., 0] + cos * mid_w - sin * mid_h,
            obb[..., 1] + sin * mid_w + cos * mid_h,
            w_hi - w_lo,
            h_hi - h_lo,
            obb[..., 4],
        ],
        -1,
    )
