"""Box and frame geometry (`tracking.geometry`): moving boxes by a camera motion, the view a motion brings in, boxes
inside a union of rectangles, the overlapping pairs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from support.strategies import box_pairs
from support.transforms import compose, similarity
from tiled_detector.tools.scoring import box_iou
from tiled_detector.tracking.geometry import (
    frame_hulls,
    inside_any,
    inside_union,
    move_boxes,
    move_points,
    move_rotated,
    new_view,
    overlapping,
    similarity_scale,
)

IDENTITY = np.eye(3)[:2]


transforms = st.builds(
    similarity, st.floats(0.9, 1.1), st.floats(-5, 5), st.floats(-50, 50), st.floats(-50, 50)
)
boxes = st.lists(
    st.tuples(st.floats(0, 1000), st.floats(0, 1000), st.floats(1, 200), st.floats(1, 200)),
    min_size=1,
    max_size=8,
).map(lambda rows: np.array([[x, y, x + w, y + h] for x, y, w, h in rows]))


@settings(max_examples=60, deadline=None)
@given(transforms, transforms, boxes)
def test_moving_boxes_composes(first: np.ndarray, then: np.ndarray, rows: np.ndarray) -> None:
    """Moving boxes by one motion then another is moving them by the composed motion; centres move as points and
    sizes scale."""
    direct = move_boxes(compose(first, then), rows)
    assert np.allclose(move_boxes(then, move_boxes(first, rows)), direct, atol=1e-6)
    centres = move_points(first, (rows[:, :2] + rows[:, 2:]) / 2)
    moved = move_boxes(first, rows)
    assert np.allclose((moved[:, :2] + moved[:, 2:]) / 2, centres, atol=1e-6)
    assert np.allclose(moved[:, 2:] - moved[:, :2], (rows[:, 2:] - rows[:, :2]) * similarity_scale(first))


def test_new_view_is_the_strip_that_entered() -> None:
    """A pan of 64 px to the right (content moves left) brings in a 64-px strip at the right edge."""
    tiles = np.array([[0, 0, 640, 640], [1280, 0, 1920, 640], [640, 400, 1280, 1080]], np.float64)
    fresh = new_view(tiles, similarity(1.0, 0.0, -64.0, 0.0), (1080, 1920))
    assert fresh[0] == 0 and fresh[2] == 0 and 0.08 < fresh[1] < 0.13
    assert np.all(new_view(tiles, IDENTITY, (1080, 1920)) == 0)


rect_sets = st.lists(
    st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(1, 8), st.integers(1, 8)),
    min_size=0,
    max_size=6,
).map(lambda rows: np.array([[x, y, x + w, y + h] for x, y, w, h in rows], float).reshape(-1, 4) * 10)
box_sets = st.lists(
    st.tuples(st.integers(0, 190), st.integers(0, 190), st.integers(1, 60), st.integers(1, 60)),
    min_size=1,
    max_size=6,
).map(lambda rows: np.array([[x, y, x + w, y + h] for x, y, w, h in rows], float))


@settings(max_examples=200, deadline=None)
@given(rect_sets, box_sets)
def test_a_box_is_inside_a_union_when_every_pixel_of_it_is_covered(
    rects: np.ndarray, boxes: np.ndarray
) -> None:
    """Against a raster of the union (integer boxes and rectangles: every unit pixel decides); a box held by one
    rectangle is inside the union."""
    raster = np.zeros((320, 320), bool)
    for x1, y1, x2, y2 in rects.astype(int):
        raster[y1:y2, x1:x2] = True
    expected = [bool(raster[int(y1) : int(y2), int(x1) : int(x2)].all()) for x1, y1, x2, y2 in boxes]
    assert inside_union(boxes, rects).tolist() == expected
    assert not (inside_any(boxes, rects) & ~inside_union(boxes, rects)).any()


def test_rectangles_unbounded_beyond_the_frame_hold_what_reaches_out_of_it() -> None:
    rects = np.array([[-np.inf, -np.inf, 100.0, 100.0], [90.0, -np.inf, 200.0, 100.0]])
    boxes = np.array([[-30.0, -5.0, 150.0, 50.0], [50.0, 50.0, 150.0, 120.0], [190.0, 0.0, 210.0, 10.0]])
    assert inside_union(boxes, rects).tolist() == [True, False, False]


@settings(max_examples=150, deadline=None)
@given(sets=box_pairs(), groups=st.sampled_from([0, 1, 3]))
def test_overlapping_pairs_equal_the_dense_iou(sets, groups):
    """Every intersecting pair (of the same group, where groups are given: matches never cross classes)."""
    a, b = sets
    dense = box_iou(a, b)
    if groups:
        a_groups, b_groups = np.arange(len(a)) % groups, np.arange(len(b)) % (groups + 1)
        i, j, iou = overlapping(a, b, a_groups, b_groups)
        dense[a_groups[:, None] != b_groups[None, :]] = 0.0
    else:
        i, j, iou = overlapping(a, b)
    want = np.argwhere(dense > 0)
    got = np.stack([i, j], axis=1) if len(i) else np.zeros((0, 2), np.int64)
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist()))
    np.testing.assert_allclose(iou, dense[i, j], rtol=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1000), st.floats(0, 1000), st.floats(1, 200), st.floats(1, 200), st.floats(0, 1.5707)
        ),
        min_size=1,
        max_size=6,
    ),
    st.floats(0.8, 1.25),
    st.floats(-180, 180),
)
def test_rotated_boxes_moved_by_the_camera_stay_in_the_regular_form(rows, scale, degrees):
    """A camera's turn moves a rotated box's angle on: the moved box comes back in the regular form (theta in
    [0, pi/2), w and h swapped where a quarter turn passed), the same rectangle as the one moved (its corners)."""
    from tiled_detector.geometry import polygons

    obb = np.array(rows, np.float64)
    matrix = similarity(scale, degrees, 12.0, -7.0)
    moved = move_rotated(matrix, obb)
    assert ((moved[:, 4] >= 0) & (moved[:, 4] < np.pi / 2)).all()
    turned = polygons.corners(obb) @ matrix[:, :2].T + matrix[:, 2]  # the rectangles' corners moved as points
    np.testing.assert_allclose(polygons.hulls(polygons.corners(moved)), polygons.hulls(turned), atol=1e-6)
    np.testing.assert_allclose(
        polygons.polygon_area(polygons.corners(moved)), obb[:, 2] * obb[:, 3] * scale**2
    )


def test_frame_hulls_are_clipped_to_the_frame():
    obb = np.array([[5.0, 50, 40, 10, 0.6], [90, 40, 20, 20, 0.0]])
    # the first: x 5 +- 19.33, y 50 +- 15.42 (20 cos 0.6 + 5 sin 0.6, 20 sin 0.6 + 5 cos 0.6), cut at 0 and at 60
    np.testing.assert_allclose(
        frame_hulls(obb, (60, 100)), [[0, 34.58, 24.33, 60], [80, 30, 100, 50]], atol=0.01
    )
