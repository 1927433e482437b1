"""Synthetic rotated scenes: determinism, truth rectangles that the drawn objects fill, cut objects labelled by
their part inside, dense rows, seam crossings, sequences that move and turn with stable identities."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.tools.worlds import rotated_scenes
from tiled_detector.tools.worlds.rotated_scenes import (
    CLASSES,
    RotatedScene,
    make_rotated_crop,
    make_rotated_scene,
    make_rotated_sequence,
)
from tiled_detector.tools.worlds.synthetic import tile_seams


def corners(obb: np.ndarray) -> np.ndarray:
    """OpenCV's corners of rotated boxes (the test's own reference: cv2.boxPoints)."""
    return np.array([cv2.boxPoints(((cx, cy), (w, h), math.degrees(a))) for cx, cy, w, h, a in obb]).reshape(
        -1, 4, 2
    )


@pytest.fixture(scope="module")
def frame() -> RotatedScene:
    return make_rotated_scene(4, 1280, 720)


def test_same_seed_same_scene() -> None:
    a, b = make_rotated_scene(3, 640, 480), make_rotated_scene(3, 640, 480)
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.obb, b.obb)
    assert not np.array_equal(a.image, make_rotated_scene(4, 640, 480).image)


def test_scene_holds_every_class_at_many_angles(frame: RotatedScene) -> None:
    assert frame.image.shape == (720, 1280, 3) and frame.obb.dtype == np.float32
    assert len(frame.obb) >= 20 and set(frame.class_ids.tolist()) == set(range(len(CLASSES)))
    sides = np.sort(frame.obb[:, 2:4], axis=1)
    assert (sides[:, 1] / sides[:, 0]).mean() > 1.8  # elongated: the angle matters
    folded = np.mod(frame.obb[:, 4], math.pi / 2)
    assert np.histogram(folded, bins=4, range=(0, math.pi / 2))[0].min() > 0  # angles all around


@settings(max_examples=30, deadline=None)
@given(
    shape=st.integers(0, len(CLASSES) - 1),
    length=st.floats(14, 64),
    angle=st.floats(-math.pi, math.pi),
    cx=st.floats(40, 60),
    cy=st.floats(40, 60),
)
def test_drawn_object_fills_its_rectangle(
    shape: int, length: float, angle: float, cx: float, cy: float
) -> None:
    """The pixels an object paints lie in its truth rectangle grown by a pixel (OpenCV fills the pixels an edge
    touches) and reach each of its sides."""
    rng = np.random.default_rng(0)
    thing = rotated_scenes._Object(cx, cy, length, length / 3, angle, shape, (200.0, 50.0, 50.0), shape)
    image = np.zeros((100, 100, 3), np.uint8)
    owner = np.full((100, 100), -1, np.int32)
    rotated_scenes._paint(rng, image, owner, 0, thing)
    ys, xs = np.nonzero(owner == 0)
    centres = np.stack([xs + 0.5, ys + 0.5], axis=1) - (cx, cy)
    along = centres @ (math.cos(angle), math.sin(angle))
    across = centres @ (-math.sin(angle), math.cos(angle))
    # a boat's bow is a sharp tip: OpenCV may fill a pixel whose centre is up to a pixel and a half past it
    assert np.abs(along).max() <= length / 2 + 1.5 and np.abs(across).max() <= thing.width / 2 + 1.0
    # ... and reach each of its four sides (a boat's bow is one pixel wide: a pixel and a half of slack)
    assert along.max() >= length / 2 - 1.5 and along.min() <= -length / 2 + 1.5
    assert across.max() >= thing.width / 2 - 1.0 and across.min() <= -thing.width / 2 + 1.0


def test_objects_cut_by_the_border_are_labelled_by_their_part_inside() -> None:
    """Half of a 40 x 10 object inside: its label is that half; a fifth inside: no label (under 35 %)."""
    half_in = rotated_scenes._Object(0.0, 50.0, 40.0, 10.0, 0.0, 1, (0.0, 0.0, 255.0), 1)
    cx, cy, w, h, angle = rotated_scenes._truth(half_in, 100, 100)
    assert sorted((w, h)) == pytest.approx([10, 20], abs=1e-3) and (cx, cy) == pytest.approx(
        (10, 50), abs=1e-3
    )
    assert np.mod(angle, math.pi / 2) == pytest.approx(0, abs=1e-3) or np.mod(
        angle, math.pi / 2
    ) == pytest.approx(math.pi / 2, abs=1e-3)
    fifth_in = rotated_scenes._Object(-12.0, 50.0, 40.0, 10.0, 0.0, 1, (0.0, 0.0, 255.0), 1)
    assert rotated_scenes._truth(fifth_in, 100, 100) is None
    crop = make_rotated_crop(21, 160)
    points = corners(crop.obb)
    assert len(crop.obb) and points.min() >= -0.5 and points.max() <= 160.5  # every label inside the crop


def test_rows_are_dense_where_hulls_overlap_but_objects_do_not(frame: RotatedScene) -> None:
    """Neighbours in a row touch neither each other nor anything else, yet many tilted ones' axis-aligned hulls
    overlap: the case rotated merging exists for."""
    boxes = corners(frame.obb)
    hulls = np.concatenate([boxes.min(axis=1), boxes.max(axis=1)], axis=1)
    overlapping_hulls = 0
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            inter = np.minimum(hulls[i, 2:], hulls[j, 2:]) - np.maximum(hulls[i, :2], hulls[j, :2])
            if (inter > 0).all():
                overlapping_hulls += 1
                area, _ = cv2.intersectConvexConvex(boxes[i].astype(np.float32), boxes[j].astype(np.float32))
                assert area < 0.5  # the objects themselves do not overlap
    assert overlapping_hulls >= 5


def test_some_objects_cross_the_tile_seams(frame: RotatedScene) -> None:
    xs, ys = tile_seams(1280, 720, 640, 0.2)
    boxes = corners(frame.obb)
    crosses = [(boxes[:, :, 0].min(axis=1) < x) & (boxes[:, :, 0].max(axis=1) > x) for x in xs] + [
        (boxes[:, :, 1].min(axis=1) < y) & (boxes[:, :, 1].max(axis=1) > y) for y in ys
    ]
    assert np.any(crosses, axis=0).sum() >= 3


def test_sequence_objects_move_and_turn_with_stable_ids() -> None:
    frames = list(make_rotated_sequence(5, 12, 480, 320))
    assert all(len(f.ids) == len(f.obb) and len(set(f.ids.tolist())) == len(f.ids) for f in frames)
    first, last = frames[0], frames[-1]
    common = sorted(set(first.ids.tolist()) & set(last.ids.tolist()))
    assert len(common) >= 3
    a = first.obb[np.searchsorted(first.ids, common)]
    b = last.obb[np.searchsorted(last.ids, common)]
    assert np.linalg.norm(a[:, :2] - b[:, :2], axis=1).max() > 5  # they move
    turned = np.abs(np.angle(np.exp(2j * (a[:, 4] - b[:, 4].astype(np.float64)))))  # modulo pi
    assert turned.max() > math.radians(5)  # and turn
    again = list(make_rotated_sequence(5, 12, 480, 320))
    np.testing.assert_array_equal(again[-1].image, last.image)
