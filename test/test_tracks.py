"""One camera's tracks over time (`tracking.tracks`): ids continuing across a start-over, stamps as time steps,
bounded state."""

from __future__ import annotations

import numpy as np

from tiled_detector.tracking.bytetrack import TrackerSettings
from tiled_detector.tracking.tracks import Tracks
from tiled_detector.types import Detections

SECOND = 1_000_000_000
FRAME_NS = SECOND // 30


def _box(cx: float, cy: float, size: float = 20.0) -> list[float]:
    return [cx - size / 2, cy - size / 2, cx + size / 2, cy + size / 2]


def _found(boxes: list, scores: list | None = None) -> Detections:
    boxes = np.array(boxes, np.float64).reshape(-1, 4)
    return Detections(
        boxes,
        np.full(len(boxes), 0.9) if scores is None else np.array(scores),
        np.zeros(len(boxes), np.int64),
    )


def test_a_cameras_tracks_continue_the_ids_they_are_given_and_stamp_what_they_saw():
    tracks = Tracks(TrackerSettings(), first_id=7)  # a camera started over: its ids continue upwards
    a = tracks.update(10 * SECOND, _found([_box(10, 10), _box(90, 90)]))
    assert a.track_ids.tolist() == [7, 8] and tracks.next_id == 9
    b = tracks.update(10 * SECOND + FRAME_NS, _found([_box(11, 10)]))
    assert b.track_ids.tolist() == [7] and b.seen_ns.tolist() == [10 * SECOND + FRAME_NS] and len(tracks) == 2


def test_a_repeated_stamp_is_one_frame_period_on_without_a_warning():
    """A frame stamped like the one before (a paused sim clock) is a new frame, one period after it: its match is
    fresh, and a lost track still runs out of its buffer while the clock stands still."""
    import warnings

    tracks = Tracks(TrackerSettings(buffer_s=0.1))  # 3 frame periods
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for stamp in (0, FRAME_NS, FRAME_NS, 2 * FRAME_NS):
            out = tracks.update(stamp, _found([_box(10 + stamp / FRAME_NS, 10)]))
            assert out.fresh.tolist() == [True] and out.seen_ns.tolist() == [stamp]
    assert out.track_ids.tolist() == [1]
    for _ in range(5):  # the clock stopped: the object is gone
        tracks.update(2 * FRAME_NS, _found([]))
    assert len(tracks) == 0


def test_a_long_stream_of_objects_coming_and_going_holds_bounded_state():
    tracks = Tracks(TrackerSettings(buffer_s=0.5))
    rng = np.random.default_rng(3)
    most = 0
    for frame in range(3_000):
        # 20 objects alive at a time, each for 90 frames, then replaced by new ones elsewhere
        generation = frame // 90
        centres = np.random.default_rng(generation).uniform(50, 1800, (20, 2)) + (frame % 90) * 1.5
        boxes = np.array([_box(x, y) for x, y in centres])
        scores = rng.uniform(0.5, 1.0, 20)
        tracks.update(frame * FRAME_NS, Detections(boxes, scores, np.zeros(20, np.int64)))
        most = max(most, len(tracks))
    assert most <= 40  # the live objects and the lost ones of the last half second, not the stream's 670
