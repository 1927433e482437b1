"""Per-camera tracks: one `ByteTrack` per camera, fed each camera's merged detections with their stamps, and the
rules that bound and reset that state.

State and its bounds: per camera a tracker (its live tracks: a lost track is dropped `lost_track_buffer` seconds
after its last match, so the state follows the objects in view, not the stream's length), the last stamp and the
last `PERIODS` frame intervals (the frame period that scales the Kalman step).

Reset rules (the camera's tracks end; its next track ids continue upwards, so an id is never given to two objects
in one run): a stamp earlier than the last one (a bag looped, sim time reset: one INFO line); a gap between stamps
longer than `lost_track_buffer`; `reset()` (the node calls it when `tracker`, a tracker setting or a tile setting
changes, and drops the whole object at a lifecycle cleanup).
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from tiled_detector.tracking.bytetrack import ByteTrack, TrackerSettings
from tiled_detector.tracking.stamps import broken
from tiled_detector.types import Detections

LOG = logging.getLogger(__name__)
PERIODS = 30  # frame intervals kept per camera to estimate its frame period


@dataclass
class _Camera:
    tracker: ByteTrack
    origin_ns: int  # the tracker's clock: nanoseconds since this stamp (exact in float64 for 104 days)
    last_ns: int | None = None
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=PERIODS))


@dataclass(frozen=True)
class Tracked:
    """A frame's confirmed tracks: boxes (N, 4) x1, y1, x2, y2 (the tracker's estimate), scores, class ids,
    track ids (N,) int64 (>= 1, one per object for the life of its track) and `seen_ns` (N,) int64: the stamp of
    the frame each was last detected in (the frame's own, except for a track reported from its prediction in a
    region not looked at: `update`'s `observed`)."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    track_ids: np.ndarray
    seen_ns: np.ndarray


class CameraTracks:
    """The tracks of every camera (module docstring)."""

    def __init__(self, settings: TrackerSettings) -> None:
        self.settings = settings
        self._cameras: dict[str, _Camera] = {}
        self._next_ids: dict[str, int] = {}

    def update(
        self,
        camera: str,
        stamp_ns: int,
        boxes: np.ndarray,
        scores: np.ndarray,
        class_ids: np.ndarray,
        observed: np.ndarray | None = None,
        motion: np.ndarray | None = None,
    ) -> Tracked:
        """Feed one frame of `camera` (its header stamp; `observed`: the regions it was looked at in, None: all of
        it, see `ByteTrack.update`; `motion`: the camera's motion since its previous frame, a (2, 3) similarity
        the tracks are moved by first) and return its confirmed tracks."""
        state = self._cameras.get(camera)
        if state is not None and broken(state.last_ns, stamp_ns, self.settings.buffer_s):
            if stamp_ns < state.last_ns:  # type: ignore[operator]
                LOG.info("stamps went back %.3f s on %s (a bag looped or the clock was reset): its tracks start over",
                         (state.last_ns - stamp_ns) / 1e9, camera)  # type: ignore[operator]  # fmt: skip
            state = None  # else every track would have been lost for longer than the buffer
        if state is None:
            tracker = ByteTrack(self.settings, self._next_ids.get(camera, 1))
            state = self._cameras[camera] = _Camera(tracker, stamp_ns)
        dt_s = 0.0 if state.last_ns is None else (stamp_ns - state.last_ns) / 1e9
        if dt_s > 0:
            state.intervals.append(dt_s)
        period = statistics.median(state.intervals) if state.intervals else 0.0
        step = dt_s / period if period > 0 else 1.0
        state.last_ns = stamp_ns
        if motion is not None:
            state.tracker.warp(motion)
        found = state.tracker.update(
            boxes, scores, class_ids, dt_s, step, observed, float(stamp_ns - state.origin_ns)
        )
        self._next_ids[camera] = state.tracker.next_id
        return Tracked(
            found.boxes.astype(np.float32), found.scores.astype(np.float32), found.class_ids, found.track_ids,
            found.seen.astype(np.int64) + state.origin_ns,
        )  # fmt: skip

    def track(
        self, camera: str, stamp_ns: int, detections: Detections, observed: np.ndarray | None = None,
        motion: np.ndarray | None = None,
    ) -> tuple[Detections, Tracked]:  # fmt: skip
        """`update` with a frame's `Detections`: the reported tracks as `Detections` (the frame's timings kept), and
        all of `Tracked` (ids, when each was last seen)."""
        found = self.update(
            camera, stamp_ns, detections.boxes, detections.scores, detections.class_ids, observed, motion
        )
        return Detections(found.boxes, found.scores, found.class_ids, detections.timings), found

    def predicted(self, camera: str) -> tuple[np.ndarray, np.ndarray]:
        """(N, 4) boxes of `camera`'s live tracks (tracked, lost or unconfirmed) one frame period ahead, where to
        look next, and (N,) bool: which are tentative (none before its first frame)."""
        state = self._cameras.get(camera)
        if state is None:
            return np.zeros((0, 4)), np.zeros(0, bool)
        return state.tracker.predicted_boxes(step=1.0), state.tracker.tentative()

    def reset(self, settings: TrackerSettings | None = None) -> None:
        """End every camera's tracks (their ids keep counting up), taking new `settings` where given."""
        self._cameras.clear()
        self.settings = settings or self.settings

    def live_tracks(self) -> int:
        """Tracks held over all cameras (tracked, lost or unconfirmed)."""
        return sum(len(c.tracker) for c in self._cameras.values())
