"""One camera's tracks over time: its `ByteTrack` fed the camera's merged detections with their stamps, and the
frame period that scales the tracker's time step.

State and its bounds: the tracker's live tracks (a lost track is dropped `lost_track_buffer` seconds after its last
match, so the state follows the objects in view, not the stream's length), the last stamp, the last `PERIODS`
frame intervals and the stamps of the frames the live tracks were last matched in.

Each `update` is one frame: the tracker's clock is the frame's number, not its stamp, so a track matched in this
frame is told from one carried from an earlier frame even when a camera stamps two frames alike (a driver that
stamps 0, a paused sim clock); such a frame is one frame period after the previous one. Stamps are what a track's
`seen_ns` reports. When the camera's stream breaks (stamps back, a gap longer than the buffer, a new frame plan, a
tracker setting changed) its owner (`stream.Stream`) starts a new `Tracks` whose ids continue upwards
(`first_id`), so an id is never given to two objects in one run.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np

from tiled_detector.geometry import polygons
from tiled_detector.tracking.bytetrack import ByteTrack, TrackerSettings
from tiled_detector.tracking.geometry import frame_hulls
from tiled_detector.tracking.looks import Looks
from tiled_detector.types import Detections

PERIODS = 30  # frame intervals kept to estimate the camera's frame period


@dataclass(frozen=True)
class Tracked:
    """A frame's confirmed tracks: boxes (N, 4) x1, y1, x2, y2 (the tracker's estimate), scores, class ids,
    track ids (N,) int64 (>= 1, one per object for the life of its track), `seen_ns` (N,) int64: the stamp of
    the frame each was last detected in, and `fresh` (N,) bool: detected in this frame (all but a track reported
    from its prediction in a region not looked at: `update`'s `looks`); rotated tracks: `obb` (N, 5), their hulls
    `boxes`."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    track_ids: np.ndarray
    seen_ns: np.ndarray
    fresh: np.ndarray
    obb: np.ndarray | None = None

    def detections(self, timings: dict[str, float]) -> Detections:
        """The tracks as `Detections` (with a frame's `timings`)."""
        return Detections(self.boxes, self.scores, self.class_ids, timings, obb=self.obb)


class Tracks:
    """The tracks of one camera (module docstring)."""

    def __init__(self, settings: TrackerSettings, first_id: int = 1, rotated: bool = False) -> None:
        self.tracker = ByteTrack(settings, first_id, rotated)
        self._frame = 0  # the tracker's clock: this frame's number
        # frame number -> stamp, of the frames live tracks were last matched in
        self._stamps: dict[int, int] = {}
        self._last_ns: int | None = None
        self._intervals: deque[float] = deque(maxlen=PERIODS)

    @property
    def next_id(self) -> int:
        """The id the next new track gets."""
        return self.tracker.next_id

    def update(
        self,
        stamp_ns: int,
        detections: Detections,
        looks: Looks | None = None,
        motion: np.ndarray | None = None,
        frame_hw: tuple[int, int] | None = None,
    ) -> Tracked:
        """Feed one frame (its header stamp; `looks`: what its views looked at, None: all of it, see `ByteTrack.update`; `motion`: the camera's motion since its previous frame, a (2, 3) similarity the tracks
        are moved by first) and return its confirmed tracks (rotated ones' hulls clipped to a `frame_hw` frame, as
        the detector's are)."""
        dt_s = 0.0 if self._last_ns is None else max(stamp_ns - self._last_ns, 0) / 1e9
        if dt_s > 0:
            self._intervals.append(dt_s)
        period = statistics.median(self._intervals) if self._intervals else 0.0
        step = dt_s / period if period > 0 else 1.0
        if self._last_ns is not None and stamp_ns == self._last_ns:  # a new frame stamped alike: a period on
            dt_s, step = period, 1.0
        self._last_ns = stamp_ns
        self._frame += 1
        self._stamps[self._frame] = stamp_ns
        if motion is not None:
            self.tracker.warp(motion)
        found = self.tracker.update(
            detections.obb if self.tracker.rotated else detections.boxes,
            detections.scores,
            detections.class_ids,
            dt_s,
            step,
            looks,
            float(self._frame),
        )
        live = set(self.tracker.matched().astype(np.int64).tolist())
        self._stamps = {frame: stamp for frame, stamp in self._stamps.items() if frame in live}
        seen = found.seen.astype(np.int64)
        obb = found.boxes.astype(np.float32) if self.tracker.rotated else None
        hulls = None if obb is None else polygons.hulls(polygons.corners(obb))
        if obb is not None and frame_hw is not None:
            hulls = frame_hulls(obb, frame_hw)
        return Tracked(
            found.boxes.astype(np.float32) if hulls is None else hulls,
            found.scores.astype(np.float32),
            found.class_ids,
            found.track_ids,
            np.array([self._stamps[frame] for frame in seen.tolist()], np.int64),
            seen == self._frame,
            obb,
        )

    def predicted(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, 4) boxes of the live tracks (tracked, lost or unconfirmed) one frame period ahead, where to look next,
        and (N,) bool: which are tentative."""
        return self.tracker.predicted_boxes(step=1.0), self.tracker.tentative()

    def __len__(self) -> int:
        """Tracks held (tracked, lost or unconfirmed)."""
        return len(self.tracker)
