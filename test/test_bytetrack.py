"""ByteTrack on arrays (`tracking.bytetrack`): the assignment against a dense reference, ids through a crossing
and an occlusion, ByteTrack's rules, and each departure from it (with the defect its test would catch)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from support.strategies import box_pairs
from support.transforms import similarity
from tiled_detector.tools.scoring import box_iou
from tiled_detector.tracking.bytetrack import ByteTrack, TrackerSettings, assign
from tiled_detector.tracking.geometry import move_points, overlapping
from tiled_detector.tracking.looks import Looks

SECOND = 1_000_000_000
FRAME_NS = SECOND // 30


def _box(cx: float, cy: float, size: float = 20.0) -> list[float]:
    return [cx - size / 2, cy - size / 2, cx + size / 2, cy + size / 2]


@settings(max_examples=150, deadline=None)
@given(sets=box_pairs(), limit=st.sampled_from([0.3, 0.5, 0.8]))
def test_assignment_equals_the_dense_assignment_with_a_cost_limit(sets, limit):
    a, b = sets
    i, j, iou = overlapping(a, b)
    rows, cols = assign(i, j, 1.0 - iou, limit)
    assert len(set(rows.tolist())) == len(rows) and len(set(cols.tolist())) == len(cols)
    cost = 1.0 - box_iou(a, b)
    assert (cost[rows, cols] < limit).all()
    # the dense reference: every pair, a pair at or above the limit costs more than any other
    if len(a) and len(b):
        dense = np.where(cost < limit, cost, limit + 1.0)
        r, c = linear_sum_assignment(dense)
        ok = dense[r, c] < limit
        assert len(rows) == ok.sum()
        assert cost[rows, cols].sum() == pytest.approx(dense[r[ok], c[ok]].sum(), abs=1e-9)
    else:
        assert len(rows) == 0


def _crossing(frames: int = 40) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Two same-class objects head on (they overlap in the middle frames), a third still one."""
    out = []
    for t in range(frames):
        boxes = np.array([_box(100 + 5 * t, 100), _box(300 - 5 * t, 104), _box(50, 300)], np.float64)
        out.append((boxes, np.array([0.9, 0.85, 0.8]), np.array([1, 1, 2])))
    return out


def test_ids_hold_through_a_crossing_and_an_occlusion():
    tracker = ByteTrack(TrackerSettings())
    first = None
    for t, frame in enumerate(_crossing()):
        hidden = 25 <= t < 29  # the still object is hidden for 4 frames (133 ms < the 1 s buffer)
        boxes, scores, classes = (x[:2] for x in frame) if hidden else frame
        got_boxes, _, _, ids, _ = tracker.update(boxes, scores, classes, 1 / 30)
        by_position = dict(zip(np.round(got_boxes[:, 0]).tolist(), ids.tolist(), strict=True))
        if first is None:
            first = {round(b[0]): i for b, i in zip(boxes, ids, strict=True)}
            assert sorted(first.values()) == [1, 2, 3]
        expected = {round(100 + 5 * t - 10): first[90], round(300 - 5 * t - 10): first[290]}
        if not 25 <= t < 29:
            expected[40] = first[40]
        for x, track in expected.items():
            near = [i for bx, i in by_position.items() if abs(bx - x) <= 2]
            assert near == [track], (t, by_position, expected)


def test_a_match_is_reported_at_its_detection_and_new_tracks_wait_for_a_second_frame():
    tracker = ByteTrack(TrackerSettings())
    out = tracker.update(np.array([_box(50, 50)]), np.array([0.9]), np.array([0]), 0.0)
    assert out[3].tolist() == [1]  # the first frame confirms at once
    np.testing.assert_allclose(out[0], [_box(50, 50)], atol=1e-6)
    late = tracker.update(
        np.array([_box(52, 50), _box(200, 200)]), np.array([0.9, 0.9]), np.array([0, 0]), 1 / 30
    )
    assert late[3].tolist() == [1]  # the newcomer is unconfirmed on its first frame
    # the box it took, not the filter's estimate (which lags behind a moving object)
    np.testing.assert_allclose(late[0], [_box(52, 50)], atol=1e-6)
    assert not np.allclose(tracker.predicted_boxes(), [_box(52, 50)], atol=0.5)
    again = tracker.update(
        np.array([_box(54, 50), _box(200, 200)]), np.array([0.9, 0.9]), np.array([0, 0]), 1 / 30
    )
    assert sorted(again[3].tolist()) == [1, 2]
    low = tracker.update(np.array([_box(56, 50)]), np.array([0.15]), np.array([0]), 1 / 30)
    assert low[3].tolist() == [1]  # a low-score detection continues a track (ByteTrack's second association)
    assert tracker.update(np.array([_box(56, 90)]), np.array([0.9]), np.array([1]), 1 / 30)[3].tolist() == []


def test_a_shrinking_track_not_looked_for_never_turns_inside_out():
    tracker = ByteTrack(TrackerSettings())
    for size in (60.0, 45.0, 30.0):  # shrinking fast: its height's velocity is negative
        tracker.update(np.array([_box(100, 100, size)]), np.array([0.9]), np.array([0]), 1 / 30)
    # no tile run held it: reported as predicted
    nowhere = Looks(np.zeros((0, 4)), np.zeros((0, 4), bool), 4.0)
    for _ in range(8):
        out = tracker.update(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), 1 / 30, looks=nowhere)
        assert len(out.boxes) == 1 and (out.boxes[:, 2:] >= out.boxes[:, :2]).all()
        assert out.scores[0] < 0.9  # decayed while not looked for


def test_under_a_budget_a_look_that_misses_a_track_makes_it_lost_as_in_bytetrack():
    """Not looked for, a track is shown from its prediction; a look that misses it makes it lost: no longer shown,
    also on frames it is not looked for; found again, it keeps its id."""
    tracker = ByteTrack(TrackerSettings())
    box, nothing = np.array([_box(100, 100, 30)]), (np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))
    first = tracker.update(box, np.array([0.9]), np.array([0]), 1 / 30).track_ids.tolist()
    tracker.update(box, np.array([0.9]), np.array([0]), 1 / 30)
    nowhere = Looks(np.zeros((0, 4)), np.zeros((0, 4), bool), 4.0)
    everywhere = Looks(np.array([[0.0, 0.0, 640.0, 640.0]]), np.zeros((1, 4), bool), 4.0)
    shown = [len(tracker.update(*nothing, 1 / 30, looks=nowhere).boxes)]  # not looked for: shown
    shown.append(len(tracker.update(*nothing, 1 / 30, looks=everywhere).boxes))  # looked for, missed: lost
    shown.append(len(tracker.update(*nothing, 1 / 30, looks=nowhere).boxes))  # lost and not looked for
    again = tracker.update(box, np.array([0.9]), np.array([0]), 1 / 30, looks=everywhere)
    assert shown == [1, 0, 0] and again.track_ids.tolist() == first


def test_a_small_fast_object_keeps_its_id_where_iou_alone_loses_it():
    """An 8-px object moving 7 px a frame, missed on one frame: its prediction and its next detection barely
    overlap; the last association (centre distance within a side per frame unseen) keeps its id, while a
    detection two sides away of the same class, or one of another class, starts its own track."""
    tracker = ByteTrack(TrackerSettings())
    ids = []
    for frame in range(8):
        x = 100.0 + 7.0 * frame
        found = [] if frame == 4 else [[x, 50.0, x + 8.0, 58.0]]
        out = tracker.update(
            np.array(found).reshape(-1, 4), np.full(len(found), 0.9), np.zeros(len(found), int), 1 / 30
        )
        ids.append(out.track_ids.tolist())
    # lost on the frame it was missed (not shown), then taken up again
    assert ids == [[1]] * 4 + [[]] + [[1]] * 3, ids
    far = tracker.update(
        np.array([[400.0, 50.0, 408.0, 58.0], [156.0, 50.0, 164.0, 58.0]]),
        np.array([0.9, 0.9]),
        np.array([0, 1]),
        1 / 30,
    )
    assert 1 not in far.track_ids.tolist()


def test_the_tracker_moves_with_the_camera() -> None:
    """A track warped by the camera's motion lands where the object is in the new frame's pixels; its velocity
    turns with it, its height and variances scale."""
    tracker = ByteTrack(TrackerSettings())
    box = np.array([[100.0, 200.0, 140.0, 260.0]])
    for step in range(3):
        tracker.update(box + np.array([5.0, 0, 5.0, 0]) * step, np.array([0.9]), np.array([0]), 1 / 30)
    before = tracker.table.copy()
    turn = similarity(1.1, 90.0, 10.0, -20.0)
    tracker.warp(turn)
    after = tracker.table
    assert np.allclose(after[0, :2], move_points(turn, before[:, :2])[0])
    assert np.allclose(after[0, 4:6], before[0, 4:6] @ turn[:, :2].T)
    assert np.isclose(after[0, 3], before[0, 3] * 1.1) and np.isclose(after[0, 2], before[0, 2])
    # a quarter turn swaps the variances of x and y (and scales them)
    assert np.isclose(after[0, 11], before[0, 8] * 1.21) and np.isclose(after[0, 8], before[0, 11] * 1.21)
    still = ByteTrack(TrackerSettings())
    still.update(box, np.array([0.9]), np.array([0]), 1 / 30)
    kept = still.table.copy()
    still.warp(np.eye(3)[:2])
    assert np.array_equal(still.table, kept)


def _step(tracker: ByteTrack, boxes: list, looks: Looks | None = None) -> list[int]:
    out = tracker.update(
        np.array(boxes, float).reshape(-1, 4),
        np.full(len(boxes), 0.9),
        np.zeros(len(boxes), int),
        1 / 30,
        looks=looks,
    )
    return out.track_ids.tolist()


def test_a_track_seen_on_the_last_frame_keeps_its_object_from_a_lost_tracks_older_prediction():
    """Two people side by side, one hidden: the visible one steps towards where the hidden one stood. Its detection
    overlaps its own track's prediction by 0.6 and the lost track's by 0.9; the track seen on the last frame keeps
    it (in plain ByteTrack the lost track takes it: an identity switch)."""
    tracker = ByteTrack(TrackerSettings())
    a, b = [100.0, 100.0, 140.0, 200.0], [112.0, 100.0, 152.0, 200.0]
    first = _step(tracker, [a, b])
    for _ in range(2):
        _step(tracker, [a, b])
    assert _step(tracker, [a]) == first[:1]  # b hidden: its track is lost
    assert _step(tracker, [[110.0, 100.0, 150.0, 200.0]]) == first[:1]


def test_the_distance_association_takes_small_objects_only_and_not_a_neighbours_detection():
    """Missed for a frame, a 60 x 150 person's track does not take a detection 0.8 of its side away (IoU follows a
    person; a near box is a neighbour): a new track starts. A small object's track does not take a detection that
    another track's prediction overlaps."""
    person = ByteTrack(TrackerSettings())
    box = [100.0, 100.0, 160.0, 250.0]
    first = _step(person, [box])
    _step(person, [box])
    _step(person, [])
    assert _step(person, [[148.0, 100.0, 208.0, 250.0]]) != first
    crowd = ByteTrack(TrackerSettings())
    neighbour = [140.0, 50.0, 148.0, 58.0]
    for x in (100.0, 107.0, 114.0):
        ids = _step(crowd, [[x, 50.0, x + 8.0, 58.0], neighbour])
    _step(crowd, [neighbour])  # the small object missed
    # a detection within its distance gate that also overlaps the neighbour's prediction: not taken by distance
    assert ids[0] not in _step(crowd, [neighbour, [134.0, 50.0, 142.0, 58.0]])


def test_of_a_tracked_and_a_lost_track_on_one_object_the_younger_goes():
    """ByteTrack's remove_duplicate_stracks: a lost track whose prediction sits on a tracked one (IoU > 0.85) is
    dropped when it is younger, so that it cannot take the tracked one's object later."""
    tracker = ByteTrack(TrackerSettings())
    old, other = [100.0, 100.0, 140.0, 200.0], [300.0, 100.0, 340.0, 200.0]
    first = _step(tracker, [old])
    _step(tracker, [old, other])
    _step(tracker, [old, other])  # the second track, confirmed
    _step(tracker, [old])  # ... and lost
    assert len(tracker) == 2
    tracker.table[1, :8] = tracker.table[0, :8]  # its prediction reaches the tracked one (a person passing)
    assert _step(tracker, [old]) == first and len(tracker) == 1


def test_under_a_budget_a_track_not_looked_for_is_found_again_by_buffered_iou():
    """Not looked for 2 frames while its object sped up: its prediction and the detection no longer overlap, but
    the buffered boxes do (C-BIoU): the same id. Missed 2 frames without a budget, the track is compared by IoU as
    in ByteTrack: a new track."""
    nowhere = Looks(np.zeros((0, 4)), np.zeros((0, 4), bool), 4.0)
    everywhere = Looks(np.array([[0.0, 0.0, 640.0, 640.0]]), np.zeros((1, 4), bool), 4.0)
    for looks in (nowhere, None):
        tracker = ByteTrack(TrackerSettings())
        box = np.array([100.0, 100.0, 140.0, 200.0])
        first = _step(tracker, [box])
        _step(tracker, [box])
        for _ in range(2):  # not looked for (a budget), or missed (none)
            tracker.update(np.zeros((0, 4)), np.zeros(0), np.zeros(0, int), 1 / 30, looks=looks)
        moved = box + np.array([44.0, 0.0, 44.0, 0.0])
        again = _step(tracker, [moved], everywhere if looks is not None else None)
        assert (again == first) == (looks is not None)


# rotated boxes (N, 5) cx, cy, w, h, angle: association by rotated IoU, the angle kept


def _ships(frame: int) -> np.ndarray:
    """Two long ships side by side on a diagonal (their hulls nearly the same square), sailing along it and
    turning slowly past ultralytics' pi/2 (where their regular form swaps w and h), in the regular form a model
    gives."""
    from tiled_detector.geometry import polygons

    angle = 1.45 + 0.01 * frame
    step = np.array([math.cos(angle), math.sin(angle)]) * 3.0 * frame
    normal = np.array([-math.sin(angle), math.cos(angle)]) * 14.0
    rows = [[*(np.array([300.0, 300.0]) + step + side * normal), 160.0, 12.0, angle] for side in (-1, 1)]
    return polygons.regularized(np.array(rows))


def test_rotated_tracks_keep_their_ships_and_angles():
    """By rotated IoU each ship keeps one id over 40 frames, reported at its own rectangle (the regular form), its
    angle continuous past pi/2: no worse than an axis-aligned tracker on the same detections' hulls."""
    from tiled_detector.geometry import polygons

    rotated = ByteTrack(TrackerSettings(), rotated=True)
    aligned = ByteTrack(TrackerSettings())
    ids_rotated, ids_aligned = [], []
    for frame in range(40):
        ships = _ships(frame)
        hulls = polygons.hulls(polygons.corners(ships))
        # the detections come in either order
        order = [0, 1] if frame % 2 else [1, 0]
        out = rotated.update(ships[order], [0.9, 0.9], [0, 0], 1 / 30)
        by_hull = aligned.update(hulls[order], [0.9, 0.9], [0, 0], 1 / 30)
        assert out.boxes.shape[1:] == (5,) and by_hull.boxes.shape[1:] == (4,)
        if frame:
            assert len(out.track_ids) == 2
            # each reported rectangle is one of the ships, as detected
            near = np.abs(out.boxes[:, None, :] - ships[None]).sum(-1).min(1)
            assert (near < 1e-6).all()
            first = np.argmin(np.abs(out.boxes[:, :2] - ships[0, :2]).sum(1))
            ids_rotated.append(int(out.track_ids[first]))
            if len(by_hull.track_ids):
                pick = np.argmin(np.abs(by_hull.boxes[:, :2] - hulls[0, :2]).sum(1))
                ids_aligned.append(int(by_hull.track_ids[pick]))
    assert len(set(ids_rotated)) == 1 and len(ids_rotated) == 39
    kept = max(ids_aligned.count(i) for i in set(ids_aligned)) if ids_aligned else 0
    assert ids_rotated.count(ids_rotated[0]) >= kept
    assert rotated.table[:, 34].max() > math.pi / 2  # the kept angle went past pi/2 continuously


def test_a_rotated_tracker_turns_with_the_camera():
    """A camera rotation turns the tracks' angles and moves their centres (the similarity's)."""
    tracker = ByteTrack(TrackerSettings(), rotated=True)
    box = np.array([[200.0, 100.0, 80.0, 10.0, 0.2]])
    tracker.update(box, [0.9], [0], 1 / 30)
    turn = similarity(1.0, 10.0, 0.0, 0.0)  # 10 degrees about the origin
    tracker.warp(turn)
    moved = box.copy()
    moved[0, :2] = move_points(turn, box[:, :2])[0]
    moved[0, 4] += math.radians(10)
    out = tracker.update(moved, [0.9], [0], 1 / 30)
    assert len(out.track_ids) == 1 and out.track_ids[0] == 1
    assert out.boxes[0, 4] == pytest.approx(0.2 + math.radians(10))
