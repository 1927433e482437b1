"""Rotated-box geometry (`pipeline.rotated`, over `tiled_detector.geometry.polygons`): corners as ultralytics places them,
exact intersection areas of convex quadrilaterals against an independent clipping, float32 frame coordinates, the
covering rectangle, hulls, pairwise matrices in chunks, no host read."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from support.sync import SyncCounter
from tiled_detector.geometry import polygons
from tiled_detector.pipeline import rotated
from tiled_detector.pipeline.merge import MatchMetric
from tiled_detector.pipeline.merge import overlap as aligned_overlap
from tiled_detector.pipeline.rotated import (
    corners,
    covering,
    frame_obb,
    hulls,
    intersection_area,
    obb_hulls,
    overlap,
    pairwise_overlap,
    polygon_area,
    regularized,
)


def clipped(subject: list[tuple[float, float]], clip: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sutherland-Hodgman in plain Python floats (the reference): `subject` clipped by the convex `clip`, both
    turning positively."""
    out = subject
    for (ax, ay), (bx, by) in zip(clip, clip[1:] + clip[:1], strict=True):
        points, out = out, []
        for p, q in zip(points, points[1:] + points[:1], strict=True):
            sp = (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax)
            sq = (bx - ax) * (q[1] - ay) - (by - ay) * (q[0] - ax)
            if sp >= 0:
                out.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        if not out:
            return []
    return out


def shoelace(points: list[tuple[float, float]]) -> float:
    return 0.5 * sum(
        x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(points, points[1:] + points[:1], strict=True)
    )


def reference_intersection(a: np.ndarray, b: np.ndarray) -> float:
    if min(abs(shoelace([tuple(p) for p in q])) for q in (a, b)) == 0:
        return 0.0  # (a polygon with no area clips nothing away in Sutherland-Hodgman)
    oriented = [
        [tuple(map(float, p)) for p in (q if shoelace([tuple(p) for p in q]) >= 0 else q[::-1])]
        for q in (a, b)
    ]
    return abs(shoelace(clipped(*oriented)))


def tolerance(*quads: np.ndarray) -> float:
    """What the contract allows in float64: rounding (lines within `COINCIDENT` epsilons of the coordinates'
    magnitude count as one), over the longest edge."""
    longest = max(float(np.linalg.norm(np.roll(q, -1, 0) - q, axis=1).max()) for q in quads)
    reach = max(float(np.abs(q).max()) for q in quads) + longest
    return 4 * polygons.COINCIDENT * np.finfo(np.float64).eps * reach * longest + 1e-9


finite = dict(allow_nan=False, allow_infinity=False)
rectangles = st.tuples(
    st.floats(-50, 150, **finite),
    st.floats(-50, 150, **finite),
    st.floats(0.5, 80, **finite),
    st.floats(0.5, 80, **finite),
    st.floats(-7, 7, **finite),
).map(lambda r: np.array(r, np.float64))


@st.composite
def convex_quads(draw) -> np.ndarray:
    """Four points on an ellipse, in angle order (a convex quadrilateral of either orientation), like DOTA's
    labels."""
    angles = sorted(draw(st.lists(st.floats(0, 2 * math.pi - 0.2, **finite), min_size=4, max_size=4)))
    assert angles[-1] - angles[0] < 2 * math.pi
    sx, sy = draw(st.floats(2, 60, **finite)), draw(st.floats(2, 60, **finite))
    cx, cy, tilt = (
        draw(st.floats(0, 100, **finite)),
        draw(st.floats(0, 100, **finite)),
        draw(st.floats(-3, 3)),
    )
    x, y = sx * np.cos(angles), sy * np.sin(angles)
    quad = np.stack([cx + x * np.cos(tilt) - y * np.sin(tilt), cy + x * np.sin(tilt) + y * np.cos(tilt)], 1)
    return quad[::-1].copy() if draw(st.booleans()) else quad


def test_corners_are_ultralytics_xywhr_corners() -> None:
    """Centre + R(angle)(+-w/2, +-h/2) in xywhr2xyxyxyxy's order; R turns +x toward +y: at pi/2 the w side runs
    along +y (down on screen)."""
    box = torch.tensor([[10.0, 20.0, 8.0, 4.0, 0.0], [10.0, 20.0, 8.0, 4.0, math.pi / 2]])
    expected = torch.tensor(
        [[[14, 22], [14, 18], [6, 18], [6, 22]], [[8, 24], [12, 24], [12, 16], [8, 16]]], dtype=torch.float32
    )
    torch.testing.assert_close(corners(box), expected, atol=1e-5, rtol=0)
    direction = corners(torch.tensor([0.0, 0.0, 2.0, 0.0, 0.3]))[0]  # the (+w/2, 0) end: (cos, sin)
    torch.testing.assert_close(direction, torch.tensor([math.cos(0.3), math.sin(0.3)]))


@settings(max_examples=150, deadline=None)
@given(rectangles, rectangles)
@example(np.array([0, 0, 10, 10, 0.0]), np.array([10, 0, 10, 10, 0.0]))  # touching: 0
@example(np.array([5, 5, 10, 10, 0.3]), np.array([5, 5, 10, 10, 0.3]))  # identical
@example(np.array([5, 5, 10, 4, 0.3]), np.array([5, 5, 4, 10, 0.3 + math.pi / 2]))  # the same, other form
@example(np.array([5, 5, 10, 10, 0.0]), np.array([5, 5, 4, 4, 0.5]))  # inside
@example(np.array([0, 0, 10, 10, 0.0]), np.array([5, 0, 10, 10, 0.0]))  # shared edge lines
@example(np.array([0, 32, 1, 6, 1.0]), np.array([0, 32, 1, 0.5, 1.0]))  # the same lines, rounded apart
@example(np.array([39, 0, 1, 56.25, 2.0]), np.array([39, 0, 1, 0.5, 2.0]))  # (double counted at 64 eps)
@example(
    np.array([104.3655876750, 0, 75, 0.5, 4.0204540067]), np.array([82, 2, 53, 39, 1.0])
)  # thin, float32
def test_intersection_of_rectangles_equals_the_clipped_polygon(a: np.ndarray, b: np.ndarray) -> None:
    """Against Sutherland-Hodgman clipping in float64, both ways round, in float64 and float32 (to what rounding the
    coordinates to float32 moves along both outlines)."""
    ca, cb = polygons.corners(a), polygons.corners(b)
    expected = reference_intersection(ca, cb)
    tol = tolerance(ca, cb)
    assert abs(polygons.intersection_area(ca, cb) - expected) <= tol
    assert abs(polygons.intersection_area(cb, ca) - expected) <= tol
    ta, tb = torch.tensor(ca, dtype=torch.float32), torch.tensor(cb, dtype=torch.float32)
    outlines = 2 * (a[2] + a[3] + b[2] + b[3])
    rounding = 4 * float(np.spacing(np.float32(max(np.abs(ca).max(), np.abs(cb).max())))) * outlines
    assert abs(float(intersection_area(ta, tb)) - expected) <= tol + max(
        1e-5 * max(a[2] * a[3], 1.0), rounding
    )
    assert intersection_area(ta, tb) <= min(polygon_area(ta), polygon_area(tb)) * (1 + 1e-5) + 1e-5


def _shapely_overlap(a: np.ndarray, b: np.ndarray) -> float:
    import shapely

    pa, pb = shapely.Polygon(a), shapely.Polygon(b)
    return pa.intersection(pb).area / pa.union(pb).area


@pytest.mark.parametrize("angle", [0.0, 0.7, 1.5])
@pytest.mark.parametrize("offset", [0.09, 0.01, 0.5])
def test_near_lines_are_not_taken_for_one_line(angle: float, offset: float) -> None:
    """A 1000 x 1 box and the same box `offset` px across its long sides: their IoU is shapely's, in float64 and in
    float32 frame coordinates (was 0.914 for 0.835 at 0.09 px: lines within 1e-4 of the edge's length were one)."""
    a = np.array([2000.0, 1000.0, 1000.0, 1.0, angle])
    b = a + np.array([-offset * math.sin(angle), offset * math.cos(angle), 0, 0, 0])  # across the long sides
    ca, cb = polygons.corners(a), polygons.corners(b)
    expected = _shapely_overlap(ca, cb)
    assert expected == pytest.approx((1 - offset) / (1 + offset), abs=1e-9)
    assert float(polygons.overlap(ca, cb)) == pytest.approx(expected, abs=1e-9)
    ta, tb = (torch.tensor(c, dtype=torch.float32) for c in (ca, cb))
    assert float(polygons.overlap(ta, tb)) == pytest.approx(expected, abs=2e-4)


@settings(max_examples=300, deadline=None)
@given(rectangles, rectangles, st.sampled_from([0.0, 1e-9, 1e-3, 0.05, 0.3]))
def test_intersection_over_union_equals_shapelys(a: np.ndarray, b: np.ndarray, shift: float) -> None:
    """Rectangles, and rectangles a hair across one another's lines (b is a turned copy of a moved by `shift`
    px): the IoU is shapely's (GEOS) in float64."""
    if shift:
        b = a + np.array([shift, -shift, 0, 0, 0])
    ca, cb = polygons.corners(a), polygons.corners(b)
    assert float(polygons.overlap(ca, cb)) == pytest.approx(_shapely_overlap(ca, cb), abs=1e-7)


@settings(max_examples=150, deadline=None)
@given(convex_quads(), convex_quads())
def test_intersection_of_convex_quadrilaterals(a: np.ndarray, b: np.ndarray) -> None:
    """DOTA-like quadrilaterals of either orientation: the same areas as the clipped polygon."""
    expected = reference_intersection(a, b)
    tol = tolerance(a, b)
    assert abs(polygons.intersection_area(a, b) - expected) <= tol
    assert abs(float(intersection_area(torch.tensor(a), torch.tensor(b))) - expected) <= tol
    # orientation does not matter
    assert abs(polygons.intersection_area(a[::-1].copy(), b) - expected) <= tol


@settings(max_examples=100, deadline=None)
@given(
    rectangles,
    st.floats(1000, 4000, **finite),
    st.floats(1000, 4000, **finite),
    st.floats(-1e-3, 1e-3, **finite),
    st.floats(-1e-4, 1e-4, **finite),
)
def test_float32_frame_coordinates_keep_their_precision(
    box: np.ndarray, dx: float, dy: float, shift: float, turn: float
) -> None:
    """A box far into a 4K frame in float32 and a nearly identical one (the same object seen by two views): IoU as
    computed in float64 at the origin, to 1e-4 beyond what rounding the corners to float32 moves, lines within
    `COINCIDENT` units in the last place (over the lengths involved: about 3.4 x that for a unit box) taken as one
    (areas about local origins; shared edges counted once)."""
    other = box + np.array([shift, -shift, shift, 0.0, turn])
    expected = polygons.overlap(polygons.corners(box), polygons.corners(other))
    moved = torch.tensor(np.stack([box, other]) + np.array([dx, dy, 0, 0, 0]), dtype=torch.float32)
    got = overlap(corners(moved[0]), corners(moved[1]))
    rounding = float(np.spacing(np.float32(max(dx, dy) + 300)))  # of a corner's coordinates
    band = 4 + 4 * polygons.COINCIDENT  # rounding, and lines within the coincidence band taken as one
    assert abs(float(got) - expected) <= 1e-4 + band * rounding * (box[2] + box[3]) / (box[2] * box[3])
    assert abs(float(overlap(corners(moved[0]), corners(moved[0]))) - 1.0) <= 1e-5


@pytest.mark.parametrize("metric", list(MatchMetric))
def test_unrotated_boxes_overlap_as_axis_aligned_ones(metric: MatchMetric) -> None:
    """At angle 0 (and pi) the rotated IoU / IoS is the merge's axis-aligned one."""
    rng = np.random.default_rng(1)
    xy, wh = rng.uniform(0, 100, (60, 2)), rng.uniform(1, 40, (60, 2))
    obb = torch.tensor(
        np.concatenate([xy, wh, rng.integers(0, 2, (60, 1)) * math.pi], 1), dtype=torch.float32
    )
    aligned = torch.cat([obb[:, :2] - obb[:, 2:4] / 2, obb[:, :2] + obb[:, 2:4] / 2], 1)
    c = corners(obb)
    torch.testing.assert_close(
        pairwise_overlap(c, c, metric.value),
        aligned_overlap(aligned[:, None], aligned[None], metric),
        atol=2e-5,
        rtol=0,
    )


@pytest.mark.parametrize("every_pair", [True, False], ids=["every pair", "meeting hulls"])
def test_pairwise_overlap_in_chunks_equals_one_matrix(
    monkeypatch: pytest.MonkeyPatch, every_pair: bool
) -> None:
    """Rows in chunks (a small `PAIR_BUDGET`) give the same matrix as one broadcast, element by element, whether
    every pair is measured (a GPU's fixed shapes) or only those whose hulls meet (the CPU's)."""
    rng = np.random.default_rng(2)
    obb = torch.tensor(
        np.concatenate(
            [rng.uniform(0, 60, (37, 2)), rng.uniform(2, 30, (37, 2)), rng.uniform(-3, 3, (37, 1))], 1
        ),
        dtype=torch.float32,
    )
    c = corners(obb)
    whole = overlap(c[:, None], c[None], "ios")
    monkeypatch.setitem(rotated.PAIR_BUDGET, "cpu", 16 * 37 * 5)
    monkeypatch.setattr(rotated, "EVERY_PAIR", {"cpu", "cuda"} if every_pair else {"cuda"})
    torch.testing.assert_close(pairwise_overlap(c, c, "ios"), whole, atol=0, rtol=0)
    assert (whole.diagonal() > 1 - 1e-5).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(rectangles, min_size=0, max_size=12), st.lists(rectangles, min_size=0, max_size=12))
def test_only_pairs_whose_hulls_meet_are_measured_on_the_cpu(a: list, b: list) -> None:
    """The CPU's matrices (only the pairs whose hulls meet measured, the rest 0) equal every pair measured, bit for
    bit; rectangles side by side (hulls touching, sharing an edge) included."""
    a_obb = torch.tensor(np.array(a, np.float32).reshape(-1, 5))
    b_obb = torch.tensor(np.array(b + [r + np.array([r[2], 0, 0, 0, 0]) for r in a if r[4] == 0], np.float32))
    ca, cb = corners(a_obb), corners(b_obb.reshape(-1, 5))
    for metric in ("iou", "ios"):
        torch.testing.assert_close(
            pairwise_overlap(ca, cb, metric), overlap(ca[:, None], cb[None], metric), atol=0, rtol=0
        )
    torch.testing.assert_close(
        rotated.pairwise_intersection(ca, cb),
        rotated.intersection_area(ca[:, None], cb[None]),
        atol=0,
        rtol=0,
    )


def test_geometry_reads_nothing_on_the_host() -> None:
    """Every op of the stage keeps fixed shapes: no data-dependent op (which would make an accelerator wait)."""
    obb = torch.tensor([[5.0, 5, 10, 4, 0.3], [6, 5, 10, 4, 0.4], [50, 50, 3, 3, 0]])
    counter = SyncCounter()
    with counter:
        c = corners(obb)
        pairwise_overlap(c, c, "iou")
        covering(obb, c.flip(0))
        obb_hulls(obb)
        regularized(obb)
        frame_obb(obb, torch.tensor([[[1.0, 1, 1, 1], [4, 8, 4, 8], [99, 99, 99, 99]]]).expand(3, 3, 4))
    assert counter.found == []


@settings(max_examples=200, deadline=None)
@given(rectangles, st.lists(st.tuples(st.floats(-100, 200), st.floats(-100, 200)), min_size=1, max_size=12))
def test_covering_rectangle_keeps_the_angle_and_covers_tightly(box: np.ndarray, points: list) -> None:
    """The rectangle at the box's angle covering the box and the points: the same angle, every point and corner
    inside (to rounding), and each side touched by one of them (the smallest such rectangle)."""
    pts = np.array(points, np.float64)
    cover = polygons.covering(box, pts)
    assert cover[4] == box[4]
    inside = np.concatenate([pts, polygons.corners(box)])
    cos, sin = math.cos(box[4]), math.sin(box[4])
    along_w = (inside[:, 0] - cover[0]) * cos + (inside[:, 1] - cover[1]) * sin
    along_h = (inside[:, 1] - cover[1]) * cos - (inside[:, 0] - cover[0]) * sin
    tol = 1e-7 * (1 + np.abs(inside).max())
    assert np.all(np.abs(along_w) <= cover[2] / 2 + tol) and np.all(np.abs(along_h) <= cover[3] / 2 + tol)
    assert abs(along_w.max() - cover[2] / 2) <= tol and abs(along_w.min() + cover[2] / 2) <= tol
    assert abs(along_h.max() - cover[3] / 2) <= tol and abs(along_h.min() + cover[3] / 2) <= tol
    # points already inside change nothing
    np.testing.assert_allclose(polygons.covering(box, polygons.corners(box)), box, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(rectangles)
def test_regular_form_is_the_same_rectangle(box: np.ndarray) -> None:
    """ultralytics' regular form: angle in [0, pi/2), the same corners (as a set)."""
    regular = polygons.regularized(box)
    assert 0 <= regular[4] < math.pi / 2
    same = np.abs(polygons.corners(regular)[:, None] - polygons.corners(box)[None]).sum(-1).min(1)
    assert np.all(same <= 1e-9 * (1 + np.abs(box[:4]).max()))


def test_hulls_hold_the_corners_tightly() -> None:
    obb = torch.tensor([[10.0, 10, 4, 2, math.pi / 4], [0, 0, 2, 2, 0]])
    torch.testing.assert_close(
        obb_hulls(obb),
        torch.tensor(
            [[10 - 1.5 * 2**0.5, 10 - 1.5 * 2**0.5, 10 + 1.5 * 2**0.5, 10 + 1.5 * 2**0.5], [-1, -1, 1, 1]]
        ),
    )
    torch.testing.assert_close(hulls(corners(obb)), obb_hulls(obb))


def test_views_map_rotated_boxes_to_the_frame() -> None:
    """A tile shifts the centre; a scaled view scales w and h and keeps the angle; a stretched one maps the w side's
    direction and keeps the area (x scale 2, y scale 1: a 45 degree square side turns to atan2(1, 2))."""
    obb = torch.tensor(
        [[10.0, 20.0, 8.0, 4.0, 0.3], [10.0, 20.0, 8.0, 4.0, 0.3], [0.0, 0.0, 2.0, 2.0, math.pi / 4]]
    )
    mapping = torch.tensor(
        [
            [[1.0, 1, 1, 1], [100, 50, 100, 50], [1e4] * 4],
            [[2.0, 2, 2, 2], [0, 0, 0, 0], [1e4] * 4],
            [[2.0, 1, 2, 1], [0, 0, 0, 0], [1e4] * 4],
        ]
    )
    out = frame_obb(obb, mapping)
    torch.testing.assert_close(out[0], torch.tensor([110.0, 70.0, 8.0, 4.0, 0.3]))
    torch.testing.assert_close(out[1], torch.tensor([20.0, 40.0, 16.0, 8.0, 0.3]))
    assert math.isclose(float(out[2, 4]), math.atan2(1, 2), rel_tol=1e-6)
    assert math.isclose(float(out[2, 2] * out[2, 3]), 8.0, rel_tol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(rectangles, min_size=0, max_size=14),
    st.lists(st.booleans(), min_size=14, max_size=14),
    st.integers(1, 120),
)
def test_the_bounded_pair_list_measures_exactly_the_pairs_whose_hulls_meet(
    boxes: list, on: list, capacity: int
):
    """Property: with a capacity (the sync-free path) only pairs whose hulls meet are measured as polygons, rows
    that take part only: where the meeting pairs fit, the matrices equal every pair measured (bit for bit) on those
    rows and are 0 elsewhere; where they do not, only the first `capacity` of them (row-major) are, and
    `meeting_pairs` says how many there were."""
    obb = torch.tensor(np.array(boxes, np.float32).reshape(-1, 5))
    c = corners(obb)
    rows = torch.tensor(on[: len(boxes)], dtype=torch.bool)
    meet = (obb_hulls(obb)[:, None, :2] <= obb_hulls(obb)[None, :, 2:]).all(-1)
    meet &= (obb_hulls(obb)[None, :, :2] <= obb_hulls(obb)[:, None, 2:]).all(-1)
    meet &= rows[:, None] & rows[None, :]
    assert int(rotated.meeting_pairs(c, c, rows, rows)) == int(meet.sum())
    every = overlap(c[:, None], c[None], "iou")
    listed = pairwise_overlap(c, c, "iou", capacity, rows, rows)
    taken = meet.flatten() & (meet.flatten().cumsum(0) <= capacity)
    want = torch.where(taken.view(meet.shape), every, 0.0)
    torch.testing.assert_close(listed, want, atol=0, rtol=0)
    inside = rotated.pairwise_intersection(c, c, capacity, rows, rows)
    torch.testing.assert_close(
        inside, torch.where(taken.view(meet.shape), intersection_area(c[:, None], c[None]), 0.0)
    )


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**31 - 1), st.sampled_from(["nms", "nmm", "greedy_nmm"]), st.sampled_from(["iou", "ios"])
)
def test_the_rotated_merge_by_the_pair_list_equals_every_pair(seed: int, method: str, metric: str) -> None:
    """Property: the sync-free rotated merge and seam rule measuring a bounded pair list give today's result (every
    pair measured) wherever the pairs fit: the same rows, the same `exact`; a list too short says so in the
    status (`exact` 0, the pairs needed), never a silent cut, and the limits grow the pairs, not the rounds."""
    from tiled_detector.config import DetectorConfig
    from tiled_detector.pipeline.decode import PaddedDecoded
    from tiled_detector.pipeline.merge import MergeRule, merge_padded
    from tiled_detector.pipeline.postprocess import Limits, postprocess_rows
    from tiled_detector.pipeline.tiling import batch_plan, make_plan

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    centres = rng.uniform(20, 200, (max(1, n // 3), 2))[rng.integers(0, max(1, n // 3), n)]
    obb = np.concatenate(
        [centres + rng.normal(0, 4, (n, 2)), rng.uniform(4, 60, (n, 2)), rng.uniform(0, 1.5, (n, 1))], 1
    ).astype(np.float32)
    boxes, scores = torch.from_numpy(obb), torch.from_numpy(rng.uniform(0, 1, n).astype(np.float32))
    classes, valid = torch.from_numpy(rng.integers(0, 2, n)), torch.from_numpy(rng.random(n) < 0.8)
    rule = MergeRule(method, metric, 0.3)
    every = merge_padded(boxes, scores, classes, valid, rule, nms_rounds=64, slots=64)
    listed = merge_padded(boxes, scores, classes, valid, rule, nms_rounds=64, slots=64, pairs=n * n)
    for a, b in zip(every, listed, strict=True):
        assert torch.equal(a, b)
    plan = batch_plan([make_plan((256, 256), (128, 128), 0.2, (128, 128), True)])
    found = PaddedDecoded(
        boxes, scores, classes, torch.from_numpy(rng.integers(0, plan.batch_size, n)), valid
    )
    settings_ = DetectorConfig(merge=method, match_metric=metric, merge_threshold=0.3).frame_settings(
        ("a", "b")
    )
    roomy = postprocess_rows(found, plan, settings_, Limits(capacity=64, slots=64, rounds=64, pairs=4096))
    exact = postprocess_rows(found, plan, settings_, None)
    kept = roomy.packed[:-1, 6] > 0
    assert torch.equal(roomy.packed[:-1][kept], exact.packed[:-1][exact.packed[:-1, 6] > 0])
    needed = int(roomy.packed[-1, 4])
    assert roomy.packed[-1, 1] == 1.0 and needed >= int(valid.sum())  # (every valid row meets itself)
    if needed == 0:
        return
    short = postprocess_rows(
        found, plan, settings_, Limits(capacity=64, slots=64, rounds=64, pairs=needed - 1)
    )
    assert short.packed[-1, 1] == 0.0 and int(short.packed[-1, 4]) == needed
    limits, maxed = Limits(pairs=needed - 1).grown(n, False, 1, 0, needed)
    assert limits.pairs >= needed and limits.rounds == Limits().rounds and not maxed
