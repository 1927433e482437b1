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
from tiled_detector.types import Detections

LOG = logging.getLogger(__name__)
PERIODS = 30  # frame intervals kept per camera to estimate its frame period


@dataclass
class _Camera:
    tracker: ByteTrack
    last_ns: int | None = None
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=PERIODS))


@dataclass(frozen=True)
class Tracked:
    """A frame's confirmed tracks: boxes (N, 4) x1, y1, x2, y2 (the tracker's estimate), scores, class ids and
    track ids (N,) int64 (>= 1, one per object for the life of its track)."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    track_ids: np.ndarray


class CameraTracks:
    """The tracks of every camera (module docstring)."""

    def __init__(self, settings: TrackerSettings) -> None:
        self.settings = settings
        self._cameras: dict[str, _Camera] = {}
        self._next_ids: dict[str, int] = {}

    def update(
        self, camera: str, stamp_ns: int, boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray
    ) -> Tracked:
        """Feed one frame of `camera` (its header stamp) and return its confirmed tracks."""
        state = self._cameras.get(camera)
        if state is not None and state.last_ns is not None:
            gap_s = (stamp_ns - state.last_ns) / 1e9
            if gap_s < 0:
                LOG.info("stamps went back %.3f s on %s (a bag looped or the clock was reset): its tracks start over",
                         -gap_s, camera)  # fmt: skip
                state = None
            elif gap_s > self.settings.buffer_s:
                state = None  # every track would have been lost for longer than the buffer
        if state is None:
            state = self._cameras[camera] = _Camera(ByteTrack(self.settings, self._next_ids.get(camera, 1)))
        dt_s = 0.0 if state.last_ns is None else (stamp_ns - state.last_ns) / 1e9
        if dt_s > 0:
            state.intervals.append(dt_s)
        period = statistics.median(state.intervals) if state.intervals else 0.0
        step = dt_s / period if period > 0 else 1.0
        state.last_ns = stamp_ns
        found = state.tracker.update(boxes, scores, class_ids, dt_s, step)
        self._next_ids[camera] = state.tracker.next_id
        return Tracked(found[0].astype(np.float32), found[1].astype(np.float32), found[2], found[3])

    def track(self, camera: str, stamp_ns: int, detections: Detections) -> tuple[Detections, np.ndarray]:
        """`update` with a frame's `Detections`: the confirmed tracks as `Detections` (the frame's timings kept) and
        their track ids."""
        found = self.update(camera, stamp_ns, detections.boxes, detections.scores, detections.class_ids)
        return Detections(found.boxes, found.scores, found.class_ids, detections.timings), found.track_ids

    def reset(self, settings: TrackerSettings | None = None) -> None:
        """End every camera's tracks (their ids keep counting up), taking new `settings` where given."""
        self._cameras.clear()
        self.settings = settings or self.settings

    def live_tracks(self) -> int:
        """Tracks held over all cameras (tracked, lost or unconfirmed)."""
        return sum(len(c.tracker) for c in self._cameras.values())
