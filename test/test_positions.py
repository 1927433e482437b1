"""Tests for tiled_detector.tracking.positions: the stream's reported boxes find the positions measured with them,
and carried boxes keep the one they were seen with."""

from __future__ import annotations

import numpy as np

from tiled_detector.tracking.positions import Positions, joined
from tiled_detector.types import Detections

BOXES = np.array([[10, 10, 30, 30], [22, 10, 42, 30], [100, 100, 120, 130]], np.float32)
SCORES = np.array([0.9, 0.8, 0.7], np.float32)
CLASSES = np.array([0, 0, 1])
POSITIONS = np.array([[1, 1, 10], [2, 1, 11], [5, 5, 20]], np.float32)
SIZES = np.full((3, 3), 0.5, np.float32)


def _measured() -> Detections:
    return Detections(BOXES, SCORES, CLASSES, {}, POSITIONS, SIZES)


def _seen(stamps: list[int], frame: int) -> tuple[np.ndarray, np.ndarray]:
    """The stamps the reported boxes were seen at, and which were seen in this frame (stamped `frame`)."""
    return np.array(stamps), np.array(stamps) == frame


def test_boxes_detected_in_the_frame_get_their_measured_positions() -> None:
    positions = Positions()
    reported = _measured()[np.array([2, 0])]  # a subset, reordered (the stream's stages keep some)
    plain = Detections(reported.boxes, reported.scores, reported.class_ids)
    out = positions.attach(_measured(), plain, None, *_seen([5, 5], 5))
    np.testing.assert_array_equal(out.positions, POSITIONS[[2, 0]])
    np.testing.assert_array_equal(out.sizes, SIZES[[2, 0]])


def test_a_tracks_box_finds_its_detection_by_score_and_overlap_one_to_one() -> None:
    positions = Positions()
    # the tracker's estimates: shifted a little towards each other, each with its match's score
    tracks = Detections(
        BOXES[:2] + np.array([[3, 0, 3, 0], [-3, 0, -3, 0]], np.float32), SCORES[:2], CLASSES[:2]
    )
    out = positions.attach(_measured(), tracks, np.array([7, 8]), *_seen([5, 5], 5))
    np.testing.assert_array_equal(out.positions, POSITIONS[:2])
    # another class never matches
    other = Detections(BOXES[:1], SCORES[:1], [1])
    assert np.isnan(positions.attach(_measured(), other, None, *_seen([6], 6)).positions).all()


def test_carried_boxes_keep_the_position_they_were_seen_with() -> None:
    positions = Positions()
    first = _measured()
    positions.attach(
        first,
        Detections(BOXES, SCORES, CLASSES),
        np.array([4, 5, 6]),
        *_seen([1, 1, 1], 1),
    )
    later = Detections(BOXES[:1], SCORES[:1], CLASSES[:1], {}, np.array([[9, 9, 99]]), SIZES[:1])
    # frame 2: track 4 seen again (new position), tracks 6 and 5 carried from frame 1 (reported from prediction)
    reported = Detections(
        np.concatenate([BOXES[:1], BOXES[2:] + 5, BOXES[1:2]]), SCORES[[0, 2, 1]], CLASSES[[0, 2, 1]]
    )
    out = positions.attach(later, reported, np.array([4, 6, 5]), *_seen([2, 1, 1], 2))
    np.testing.assert_array_equal(out.positions, [[9, 9, 99], POSITIONS[2], POSITIONS[1]])
    # without a tracker: by class, overlap and the stamp seen at (a carried box may have been moved)
    plain = Positions()
    plain.attach(first, Detections(BOXES, SCORES, CLASSES), None, *_seen([1, 1, 1], 1))
    carried = Detections(BOXES[1:] + 2, SCORES[1:], CLASSES[1:])
    out = plain.attach(later, carried, None, *_seen([1, 1], 2))
    np.testing.assert_array_equal(out.positions, POSITIONS[1:])
    assert np.isnan(Positions().attach(later, carried, None, *_seen([1, 1], 2)).positions).all()  # apart


def test_a_frame_without_depth_has_no_positions_and_carries_none() -> None:
    positions = Positions()
    plain = Detections(BOXES, SCORES, CLASSES)
    assert positions.attach(plain, plain, np.array([4, 5, 6]), *_seen([1, 1, 1], 1)).positions is None
    out = positions.attach(_measured()[np.array([0])], plain[np.array([1])], np.array([5]), *_seen([1], 2))
    assert np.isnan(out.positions).all()  # seen in a frame without depth


def test_parts_join_with_their_positions() -> None:
    both = joined([_measured()[np.array([0])], _measured()[np.array([1, 2])]])
    np.testing.assert_array_equal(both.positions, POSITIONS)
    assert joined([_measured(), Detections(BOXES, SCORES, CLASSES)]).positions is None
