"""ByteTrack (Zhang et al., ECCV 2022) on arrays: every track's Kalman state in one array, every step a few numpy
operations over all tracks at once, association by scipy's `linear_sum_assignment` on the pairs that can match.

The algorithm is the paper's, as ByteTrack's reference code and supervision's port run it: a constant-velocity
Kalman filter on (centre x, centre y, aspect, height); per frame, (1) high-score detections (> `activation`) are
matched to the tracked and lost tracks by IoU (fused with the score), (2) the tracked tracks left over to the
low-score detections (`LOW_SCORE` .. `activation`), (3) tracks born on the previous frame (unconfirmed) to the high
detections left over; unmatched tracked tracks become lost, unmatched unconfirmed ones are dropped, high detections
left over (> `activation` + `NEW_TRACK_MARGIN`) start tracks (confirmed at once on the first frame, else at their
second match), of a tracked and a lost track on one object the younger goes, lost tracks unseen for longer than
`buffer_s` are dropped. A track matched in a frame is reported at the box it took (as supervision reports the
detection), else at its prediction.

Where it departs from the reference, and why (each tested):
- a track matched on the previous frame takes a detection overlapping its prediction by `RECENT_IOU` before the
  lost tracks compete (DeepSORT's matching cascade, for unambiguous overlaps only): among the extra boxes tiles
  give (nearby people, parts), a lost track's stale prediction otherwise takes a live track's object;
- a last association by the distance of the centres (`_by_distance`) for small tracks (small fast objects: IoU
  cannot follow them), with detections that no other track overlaps;
- matches never cross classes;
- the camera's motion is applied to every track first (`warp`, BoT-SORT's GMC);
- the time step is the stamps' (a frame dropped upstream is a longer step, not a missed detection) and the
  lost-track buffer is in seconds;
- the cost is bounded: only boxes that overlap are compared (a sweep, not an N x M matrix) and only the rows and
  columns that compete for a match go to the assignment solver (`tiled-detector bench` measures the cost).

Under a tile budget (`update`'s `looks`: what the views run saw, `tracking.looks`) a track not seen whole was not
looked for: it keeps its state and, confirmed, is reported from its prediction (its score decayed by
`PREDICTED_DECAY` per such frame); looked for again, it is compared by buffered IoU (C-BIoU: its uncertainty grew
while it was not looked for) and then placed where it was measured, moving as its last two measurements show
(OC-SORT's observation-centric update); as in ByteTrack a look that misses it makes it lost (a tentative one
dropped), and a new track scoring `CONFIRM_AT_ONCE` is confirmed at once. Without `looks` none of this applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

from tiled_detector.geometry import polygons
from tiled_detector.settings.options import Option
from tiled_detector.tracking.geometry import (
    grown,
    overlapping,
    rotated_grown,
    rotated_overlapping,
    similarity_scale,
)
from tiled_detector.tracking.looks import Looks

LOW_SCORE = 0.1  # detections above this take part in the second association
NEW_TRACK_MARGIN = 0.1  # a new track needs a score above activation + this (ByteTrack's det_thresh)
SECOND_MATCH_IOU = 0.5  # the low-score association: IoU above this
UNCONFIRMED_MATCH = 0.7  # the unconfirmed association: fused cost below this
BUFFER_PER_FRAME, MAX_BUFFER = 0.25, 0.5  # buffered IoU after frames not looked for (`ByteTrack._overlaps`)
PREDICTED_DECAY = 0.85  # a track reported from its prediction: its last score x this per frame not looked for
DISTANCE_GATE = 1.0  # the last association: centre distance in sides per frame since the track's last match
MAX_DISTANCE_GATE = 2.0  # ... and at most this many sides
CONFIRM_AT_ONCE = 0.5  # under a tile budget a new track with this score is confirmed at once
RECENT_IOU = 0.5  # a track matched on the last frame first takes a detection overlapping it this much
DISTANCE_SMALL_PX = 48.0  # the last association: for tracks this small (longer side, frame pixels)
DUPLICATE_IOU = (
    0.85  # a tracked and a lost track overlapping this much are one object (ByteTrack's 0.15 distance)
)
_SMALLEST = np.array([1e-3, 1.0])  # the least aspect and height (pixels) a prediction keeps
_STD_POSITION, _STD_VELOCITY = 1.0 / 20, 1.0 / 160  # Kalman noise per unit of height (ByteTrack's weights)


# the measurement noise of x, y, a, h: a multiple of the height, the aspect's a constant
_MEASURED_WEIGHTS = np.array([_STD_POSITION, _STD_POSITION, 0.0, _STD_POSITION])
_MEASURED_CONSTANT = np.array([0.0, 0.0, 1e-1, 0.0])

# the columns of a tracker's table (one row per track)
# 0-7: the mean, x, y, a, h and their velocities
_VAR = slice(8, 20)  # the covariance as four 2 x 2 blocks (ByteTrack's Kalman filter, below)
# of x, y, a, h: the variance of the position, the covariance, the variance of the velocity
_PP, _PV, _VV = slice(8, 20, 3), slice(9, 20, 3), slice(10, 20, 3)
# seconds since the last match, track id, class, TRACKED or LOST, confirmed (1) or not (0), the score of the last
# match, when it was (the caller's clock, `update`'s `now`), the frames it was not looked for since, the frame
# periods since, and the measured x, y, a, h of that match
_UNSEEN, _ID, _CLASS, _STATE, _CONFIRMED, _SCORE, _SEEN, _HIDDEN, _PERIODS = range(20, 29)
_MEASURED = slice(29, 33)
_BORN = 33  # the frame (of this tracker's) the track started on
_ANGLE = 34  # a rotated track's angle (radians, continuous: each match's form aligned to it), 0 otherwise
_COLUMNS = 35


def _variances(position: float, velocity: float, aspect: tuple[float, float]) -> tuple[np.ndarray, ...]:
    """A noise's variances in the table's `_VAR` layout (module note) as height**2 x weights + constants: x, y and
    h scale with the box's height, the aspect's are constants; position and velocity are independent."""
    scaled = [position, 0.0, velocity]
    per_height = np.array([scaled, scaled, [0.0] * 3, scaled])
    constant = np.array([[0.0] * 3, [0.0] * 3, [aspect[0], 0.0, aspect[1]], [0.0] * 3])
    return per_height.reshape(-1) ** 2, constant.reshape(-1) ** 2


def _motion() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The constant-velocity step of the table's first 20 columns (mean and covariance) as M0 + dt M1 + dt**2 M2:
    `table[:, :20] @ M` moves each position by dt x its velocity and each 2 x 2 block P to F P F^T."""
    m0, m1, m2 = np.eye(20), np.zeros((20, 20)), np.zeros((20, 20))
    for c in range(4):
        m1[4 + c, c] = 1.0  # position += dt x velocity
        pp = _VAR.start + 3 * c  # this coordinate's (pp, pv, vv)
        m1[pp + 1, pp] = 2.0  # pp += 2 dt pv + dt**2 vv
        m2[pp + 2, pp] = 1.0
        m1[pp + 2, pp + 1] = 1.0  # pv += dt vv
    return m0, m1, m2


# per frame period, and of a new track
_PROCESS_WEIGHTS, _PROCESS_CONSTANT = _variances(_STD_POSITION, _STD_VELOCITY, (1e-2, 1e-5))
_INITIAL_WEIGHTS, _INITIAL_CONSTANT = _variances(2 * _STD_POSITION, 10 * _STD_VELOCITY, (1e-2, 1e-5))
_MOTION = _motion()

TRACKED, LOST = 0, 1


class TrackerKind(Option):
    """The trackers the node runs after the merge."""

    NONE = "none"
    BYTETRACK = "bytetrack"


@dataclass(frozen=True)
class TrackerSettings:
    """activation: a detection above it can start or continue a track (ByteTrack's track_thresh); buffer_s: a
    lost track is kept this long for a detection to take it up again; match: the largest cost (1 - IoU x score) of
    a match."""

    activation: float = 0.25
    buffer_s: float = 1.0
    match: float = 0.8


def _to_xyah(boxes: np.ndarray) -> np.ndarray:
    out = np.empty((len(boxes), 4))
    np.subtract(boxes[:, 2:], boxes[:, :2], out=out[:, 2:])  # w, h
    np.add(boxes[:, :2], out[:, 2:] / 2, out=out[:, :2])
    out[:, 2] /= np.maximum(out[:, 3], 1e-6)
    return out


def _to_xyxy(xyah: np.ndarray) -> np.ndarray:
    out = np.empty((len(xyah), 4))
    half_w, half_h = xyah[:, 2] * xyah[:, 3] / 2, xyah[:, 3] / 2
    out[:, 0], out[:, 2] = xyah[:, 0] - half_w, xyah[:, 0] + half_w
    out[:, 1], out[:, 3] = xyah[:, 1] - half_h, xyah[:, 1] + half_h
    return out


def _to_obb(xyah: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """(N, 4) x, y, aspect, height and (N,) angles -> (N, 5) rotated boxes cx, cy, w, h, angle."""
    return np.stack([xyah[:, 0], xyah[:, 1], xyah[:, 2] * xyah[:, 3], xyah[:, 3], angles], 1)


def _compact(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct non-negative integers of `values`, ascending, and each value's position among them (what
    `np.unique(values, return_inverse=True)` gives, without its sort)."""
    present = np.bincount(values) > 0
    distinct = np.flatnonzero(present)
    position = np.cumsum(present) - 1
    return distinct, position[values]


def assign(
    rows: np.ndarray, cols: np.ndarray, cost: np.ndarray, limit: float
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (rows[k], cols[k]) matched at the least total cost among those cheaper than `limit` (LAPJV's
    cost limit, as ByteTrack's `linear_assignment`; pairs not listed cannot match). A row and a column that can only
    match each other are matched directly; the rest go to `linear_sum_assignment` on their rows and columns only."""
    ok = cost < limit
    rows, cols, cost = rows[ok], cols[ok], cost[ok]
    if not len(rows):
        return rows, cols
    single = (np.bincount(rows)[rows] == 1) & (np.bincount(cols)[cols] == 1)
    matched_rows, matched_cols = rows[single], cols[single]
    if not single.all():
        rest_rows, rest_cols, rest_cost = rows[~single], cols[~single], cost[~single]
        r_ids, r_at = _compact(rest_rows)
        c_ids, c_at = _compact(rest_cols)
        sub = np.full((len(r_ids), len(c_ids)), limit + 1.0)
        sub[r_at, c_at] = rest_cost
        r, c = linear_sum_assignment(sub)
        good = sub[r, c] < limit
        matched_rows = np.concatenate([matched_rows, r_ids[r[good]]])
        matched_cols = np.concatenate([matched_cols, c_ids[c[good]]])
    return matched_rows, matched_cols


class Output(NamedTuple):
    """A frame's reported tracks (`ByteTrack.update`): boxes (N, 4) x1, y1, x2, y2 (a rotated tracker's: (N, 5) cx,
    cy, w, h, angle in ultralytics' regular form), scores, class ids, track ids and `seen` (N,): when each was last
    matched."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    track_ids: np.ndarray
    seen: np.ndarray


class ByteTrack:
    """ByteTrack over the detections of one camera (module docstring). `update` takes one frame's detections and
    the time since the previous frame; track ids start at `first_id` and are never reused by this tracker.

    Every track is one row of `table` (float64 columns: the mean, `_VAR`, `_UNSEEN`, `_ID`, `_CLASS`, `_STATE`,
    `_CONFIRMED`), so a frame's bookkeeping (tracks dropped, tracks started) is one array operation, not one per
    attribute.

    A `rotated` tracker takes (N, 5) rotated boxes: its filter runs on each rectangle's centre, aspect and height
    in the rectangle's own axes (as ByteTrack's on an upright box), its track keeps the angle (each match's form
    aligned to it: `polygons.aligned`, so a box turning past ultralytics' pi/2 never swaps the filter's w and h),
    and detections are associated by rotated IoU (exact intersection polygons)."""

    def __init__(self, settings: TrackerSettings, first_id: int = 1, rotated: bool = False) -> None:
        self.settings = settings
        self.rotated = rotated
        self._next_id = first_id
        self._frames = 0
        self.table = np.zeros((0, _COLUMNS))

    def __len__(self) -> int:
        return len(self.table)

    @property
    def next_id(self) -> int:
        """The id the next new track gets."""
        return self._next_id

    # --- Kalman filter (ByteTrack's, on 2 x 2 blocks) ------------------------------------------------------------
    # ByteTrack's filter moves each of x, y, a, h with its own velocity and has diagonal noises, so its 8 x 8
    # covariance is four independent 2 x 2 (position, velocity) blocks: a track's `_VAR` columns hold them as
    # (4, 3) = variance of the position, covariance of position and velocity, variance of the velocity (`_PP`,
    # `_PV`, `_VV`). Exactly the same filter, a few array operations per step.

    def _predict(self, dt: float) -> None:
        t = self.table
        if not len(t):
            return
        # the process noise scales with the height before the step
        noise = np.multiply.outer(t[:, 3] ** 2, _PROCESS_WEIGHTS) + _PROCESS_CONSTANT
        t[t[:, _STATE] == LOST, 7] = 0.0  # a lost track's height stops changing (ByteTrack)
        m0, m1, m2 = _MOTION
        t[:, :20] = t[:, :20] @ (m0 + dt * m1 + (dt * dt) * m2)
        # a shrinking box stops at a pixel, never turns inside out
        np.maximum(t[:, 2:4], _SMALLEST, out=t[:, 2:4])
        t[:, _VAR] += noise * (dt * dt)

    def _correct(self, rows: np.ndarray, measured_xyah: np.ndarray) -> None:
        """Kalman update of tracks `rows` with measured (x, y, a, h)."""
        if not len(rows):
            return
        t = self.table[rows]
        pp, pv = t[:, _PP], t[:, _PV]  # views: updated last, after every use of their old values
        projected = pp + (t[:, 3, None] * _MEASURED_WEIGHTS + _MEASURED_CONSTANT) ** 2
        gain_p, gain_v = pp / projected, pv / projected
        innovation = measured_xyah - t[:, :4]
        t[:, :4] += gain_p * innovation
        t[:, 4:8] += gain_v * innovation
        t[:, _VV] -= gain_v * pv
        t[:, _PV] -= gain_p * pv
        t[:, _PP] -= gain_p * pp
        self.table[rows] = t

    def warp(self, matrix: np.ndarray) -> None:
        """Move every track into the next frame's pixels by the camera's motion, a (2, 3) similarity (BoT-SORT's
        camera-motion compensation): centres and their velocities through it, heights and their velocities scaled,
        the variances of x and y through its squared entries (the filter keeps no x-y covariance: a small
        rotation's), those of h scaled by its square; the last measured boxes move too."""
        t = self.table
        if not len(t):
            return
        linear = np.asarray(matrix[:, :2], np.float64)
        scale = similarity_scale(matrix)
        t[:, 0:2] = t[:, 0:2] @ linear.T + matrix[:, 2]
        t[:, 4:6] = t[:, 4:6] @ linear.T
        t[:, _ANGLE] += math.atan2(linear[1, 0], linear[0, 0]) if self.rotated else 0.0
        t[:, [3, 7]] *= scale
        measured = t[:, _MEASURED]
        measured[:, 0:2] = measured[:, 0:2] @ linear.T + matrix[:, 2]
        measured[:, 3] *= scale
        t[:, _MEASURED] = measured
        blocks = t[:, _VAR].reshape(-1, 4, 3)  # x, y, a, h blocks of (pp, pv, vv)
        mixed = np.einsum("ij,njk->nik", linear**2, blocks[:, :2])
        blocks[:, :2], blocks[:, 3] = mixed, blocks[:, 3] * scale**2
        t[:, _VAR] = blocks.reshape(-1, 12)

    def matched(self) -> np.ndarray:
        """(N,) the `now` of every live track's last match (`update`)."""
        return self.table[:, _SEEN]

    def tentative(self) -> np.ndarray:
        """(N,) bool: the live tracks not confirmed yet (one match so far)."""
        return self.table[:, _CONFIRMED] == 0

    def predicted_boxes(self, step: float = 0.0) -> np.ndarray:
        """(N, 4) x1, y1, x2, y2 of every live track (tracked, lost or unconfirmed) as the filter now has it, or
        moved on by its velocity `step` frame periods ahead (a rotated tracker's: the hulls)."""
        t = self.table
        xyah = t[:, :4] + step * t[:, 4:8] if step else t[:, :4]
        return (
            polygons.hulls(polygons.corners(_to_obb(xyah, t[:, _ANGLE]))) if self.rotated else _to_xyxy(xyah)
        )

    # --- one frame --------------------------------------------------------------------------------------------

    def update(
        self,
        boxes: np.ndarray,
        scores: np.ndarray,
        class_ids: np.ndarray,
        dt_s: float,
        step: float = 1.0,
        looks: Looks | None = None,
        now: float = 0.0,
    ) -> Output:
        """Take one frame's detections, `dt_s` seconds after the previous one (`step`: that time in frame
        periods, the Kalman filter's time step; `now`: the frame's time on any clock, returned as `seen`).

        `looks`: what the frame's views looked at (None: all of it). A track whose predicted box they did not see
        whole was not looked for: unmatched, it is neither lost nor
        dropped (until `buffer_s` without a match) and, when confirmed and tracked, reported from its prediction.
        Returns the confirmed tracks matched in this frame and those reported from their prediction: their boxes
        (the filter's estimate), scores and classes (of their last match), track ids, and `seen`: the `now` of
        their last match (this frame's for a match)."""
        s = self.settings
        self._frames += 1
        self._predict(step)
        t = self.table
        t[:, _UNSEEN] += dt_s
        t[:, _PERIODS] += step
        boxes = np.asarray(boxes, np.float64).reshape(-1, 5 if self.rotated else 4)
        scores = np.asarray(scores, np.float64).reshape(-1)
        class_ids = np.asarray(class_ids, np.int64).reshape(-1)
        angles = boxes[:, 4] if self.rotated else np.zeros(len(boxes))
        if self.rotated:  # the rectangles in their own axes: the filter's boxes
            boxes = np.concatenate([boxes[:, :2] - boxes[:, 2:4] / 2, boxes[:, :2] + boxes[:, 2:4] / 2], 1)
        # every (track, detection) pair that overlaps in the same class (matches never cross classes): one sweep,
        # and each association below takes its pairs from these
        useful = np.flatnonzero(scores > LOW_SCORE)
        predicted = _to_xyxy(t[:, :4])
        i, j, iou = self._overlaps(predicted, boxes, useful, class_ids, angles)
        cost = 1.0 - iou
        fused = 1.0 - iou * scores[j]  # ByteTrack's fuse_score: IoU weighted by the detection's score
        high = scores > s.activation
        confirmed = t[:, _CONFIRMED] > 0
        free_track = np.ones(len(t), bool)
        free_det = high.copy()
        # (1) confirmed tracks and the high-score detections: first a track matched on the previous frame and a
        # detection overlapping its prediction by RECENT_IOU (its object: a lost track's older prediction must
        # not take it), then every confirmed track left (tracked or lost) as in ByteTrack
        recent = confirmed & (t[:, _PERIODS] < 1.5)
        pick = recent[i] & high[j] & (iou >= RECENT_IOU)
        t0, d0 = assign(i[pick], j[pick], fused[pick], s.match)
        free_track[t0] = False
        free_det[d0] = False
        pick = (confirmed & free_track)[i] & free_det[j]
        t1, d1 = assign(i[pick], j[pick], fused[pick], s.match)
        t1, d1 = np.concatenate([t0, t1]), np.concatenate([d0, d1])
        free_track[t1] = False
        free_det[d1] = False
        # (2) tracked tracks left over and the low-score detections
        pick = (free_track & confirmed & (t[:, _STATE] == TRACKED))[i] & ~high[j]
        t2, d2 = assign(i[pick], j[pick], cost[pick], 1.0 - SECOND_MATCH_IOU)
        free_track[t2] = False
        # (3) unconfirmed tracks and the high-score detections left over
        pick = ~confirmed[i] & free_det[j]
        t3, d3 = assign(i[pick], j[pick], fused[pick], UNCONFIRMED_MATCH)
        free_det[d3] = False
        # (4) confirmed tracks unseen for frames and the high-score detections left over, by centre distance
        t4, d4 = self._by_distance(predicted, boxes, class_ids, free_track & confirmed, free_det)
        free_det[d4] = False
        tracks, dets = np.concatenate([t1, t2, t3, t4]), np.concatenate([d1, d2, d3, d4])
        xyah = _to_xyah(boxes)
        measured = xyah[dets]
        if self.rotated:  # each match in the form nearest its track's angle
            turned = polygons.aligned(_to_obb(measured, angles[dets]), t[tracks, _ANGLE])
            measured = _to_xyah(
                np.concatenate([turned[:, :2] - turned[:, 2:4] / 2, turned[:, :2] + turned[:, 2:4] / 2], 1)
            )
            t[tracks, _ANGLE] = turned[:, 4]
        self._correct(tracks, measured)
        self._observed_motion(tracks, measured)
        t[tracks, _STATE] = TRACKED
        t[tracks, _CONFIRMED] = 1.0
        t[tracks, _UNSEEN] = 0.0
        t[tracks, _SCORE] = scores[dets]
        t[tracks, _SEEN] = now
        t[tracks, _HIDDEN] = 0.0
        t[tracks, _PERIODS] = 0.0
        t[tracks, _MEASURED] = measured
        # unmatched: tracked -> lost, unconfirmed -> gone, lost too long -> gone; unless not looked for
        unmatched = np.ones(len(t), bool)
        unmatched[tracks] = False
        hidden = np.zeros(len(t), bool)
        if looks is not None:  # a track is looked for where the views run see its box whole
            seen = (
                polygons.hulls(polygons.corners(_to_obb(t[:, :4], t[:, _ANGLE])))
                if self.rotated
                else predicted
            )
            hidden[unmatched] = ~looks.seen(seen[unmatched])  # unmatched: not corrected
        t[hidden, _HIDDEN] += 1.0
        missed = unmatched & ~hidden  # looked for and not found: lost (a tentative track: dropped)
        t[missed & confirmed, _STATE] = LOST
        keep = ~((missed & ~confirmed) | (unmatched & (t[:, _UNSEEN] > s.buffer_s)))
        # every match is confirmed now; a tracked track not looked for is shown (from its prediction)
        shown = ~unmatched | hidden & confirmed & (t[:, _STATE] == TRACKED)
        if not keep.all():
            self.table = t[keep]
            shown = shown[keep]
        # new tracks from the high-score detections nobody took, confirmed (and shown) at once on the first
        # frame, and under a tile budget (their second look may be frames away) from a score of CONFIRM_AT_ONCE
        born = np.flatnonzero(free_det & (scores > s.activation + NEW_TRACK_MARGIN))
        at_once = np.full(len(born), self._frames == 1)
        if looks is not None:
            at_once |= scores[born] >= CONFIRM_AT_ONCE
        self._start(xyah[born], class_ids[born], scores[born], now, at_once, angles[born])
        shown = np.concatenate([shown, at_once])
        keep = self._distinct()
        rows = self.table[keep & shown]
        self.table = self.table[keep]
        decayed = rows[:, _SCORE] * PREDICTED_DECAY ** rows[:, _HIDDEN]
        # a track matched in this frame is where it was measured (the detection it took); one not looked for, where
        # its filter predicts it
        xyah = np.where((rows[:, _SEEN] == now)[:, None], rows[:, _MEASURED], rows[:, :4])
        return Output(
            polygons.regularized(_to_obb(xyah, rows[:, _ANGLE])) if self.rotated else _to_xyxy(xyah),
            decayed,
            rows[:, _CLASS].astype(np.int64),
            rows[:, _ID].astype(np.int64),
            rows[:, _SEEN],
        )

    def _by_distance(
        self,
        predicted: np.ndarray,
        boxes: np.ndarray,
        class_ids: np.ndarray,
        tracks: np.ndarray,
        detections: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Matches of the `tracks` (bool: confirmed, left unmatched) with the `detections` (bool: high-score, left
        over) of their class, by the distance of the centres in units of the larger box's longer side, below
        `DISTANCE_GATE` per frame since the track's last match (at most `MAX_DISTANCE_GATE`): a small object that
        moved about its own size since shares too few pixels with its prediction for IoU, and without this would
        start a new track (an identity switch). Only for a small track (`DISTANCE_SMALL_PX`) and a detection that no
        other track's prediction overlaps: a larger object's IoU follows it (people walking), and a near detection
        is then a neighbour's or a part of one."""
        t = self.table
        rows, cols = np.flatnonzero(tracks), np.flatnonzero(detections)
        if not len(rows) or not len(cols):
            return rows[:0], cols[:0]
        same = t[rows, _CLASS][:, None] == class_ids[cols][None, :]
        i, j = np.nonzero(same)
        i, j = rows[i], cols[j]
        a, b = predicted[i], boxes[j]
        centre = np.hypot(*((a[:, :2] + a[:, 2:] - b[:, :2] - b[:, 2:]) / 2).T)
        side = np.maximum((a[:, 2:] - a[:, :2]).max(axis=1), (b[:, 2:] - b[:, :2]).max(axis=1))
        gate = np.minimum(t[i, _PERIODS] * DISTANCE_GATE, MAX_DISTANCE_GATE)
        distance = centre / np.maximum(side, 1.0)
        ok = (a[:, 2:] - a[:, :2]).max(axis=1) <= DISTANCE_SMALL_PX
        # a detection overlapping another live track's prediction is left to that track (a crowd)
        oi, oj, _ = overlapping(predicted, boxes, t[:, _CLASS], class_ids)
        overlaps = np.bincount(oj, minlength=len(boxes))[j]  # tracks whose prediction overlaps the detection
        ok &= overlaps - np.isin(i * len(boxes) + j, oi * len(boxes) + oj) == 0
        return assign(i[ok], j[ok], (distance / gate)[ok], 1.0)

    def _observed_motion(self, rows: np.ndarray, measured_xyah: np.ndarray) -> None:
        """Tracks `rows` matched again after frames they were not looked for (a tile budget): they are where they
        were measured, moving as their two last measurements show (what OC-SORT's observation-centric re-update,
        Cao et al., CVPR 2023, converges to on a constant-velocity path), not the filter's guess from before the
        gap."""
        t = self.table
        after = (t[rows, _HIDDEN] > 0) & (t[rows, _PERIODS] > 0)
        if after.any():
            gap = rows[after]
            t[gap, 4:8] = (measured_xyah[after] - t[gap, _MEASURED]) / t[gap, _PERIODS, None]
            t[gap, :4] = measured_xyah[after]

    def _overlaps(
        self,
        predicted: np.ndarray,
        boxes: np.ndarray,
        useful: np.ndarray,
        class_ids: np.ndarray,
        angles: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The (track `predicted` box, detection) pairs of the same class that overlap and their IoU, detections
        `useful` only.
        A track not looked for on frames under a tile budget is compared by buffered IoU (C-BIoU, Yang et al., WACV
        2023): both boxes grown by `BUFFER_PER_FRAME` of their size per frame not looked for (at most `MAX_BUFFER`)
        on every side, as its motion since is less certain. A rotated tracker's pairs: rotated IoU (`angles`: the
        detections')."""
        t = self.table
        buffer = np.minimum(t[:, _HIDDEN] * BUFFER_PER_FRAME, MAX_BUFFER)
        if self.rotated:
            tracks = rotated_grown(_to_obb(t[:, :4], t[:, _ANGLE]), buffer)
            found = _to_obb(_to_xyah(boxes[useful]), angles[useful])
            i, j, _ = rotated_overlapping(
                tracks,
                rotated_grown(found, np.full(len(useful), MAX_BUFFER)),
                t[:, _CLASS],
                class_ids[useful],
            )
            iou = polygons.overlap(
                polygons.corners(tracks[i]), polygons.corners(rotated_grown(found[j], buffer[i]))
            )
            hit = iou > 0
            return i[hit], useful[j[hit]], iou[hit]
        if not buffer.any():
            i, j, iou = overlapping(predicted, boxes[useful], t[:, _CLASS], class_ids[useful])
            return i, useful[j], iou
        wide = grown(predicted, buffer)
        i, j, _ = overlapping(
            wide, grown(boxes[useful], np.full(len(useful), MAX_BUFFER)), t[:, _CLASS], class_ids[useful]
        )
        j = useful[j]
        a, b = grown(predicted[i], buffer[i]), grown(boxes[j], buffer[i])
        inter = np.clip(np.minimum(a[:, 2:], b[:, 2:]) - np.maximum(a[:, :2], b[:, :2]), 0, None).prod(axis=1)
        union = np.prod(a[:, 2:] - a[:, :2], axis=1) + np.prod(b[:, 2:] - b[:, :2], axis=1) - inter
        iou = inter / np.maximum(union, 1e-12)
        hit = iou > 0
        return i[hit], j[hit], iou[hit]

    def _distinct(self) -> np.ndarray:
        """Keep mask of the tracks: of a tracked and a lost track of one class whose boxes overlap by IoU above
        `DUPLICATE_IOU`, the one tracked for the shorter time goes (ByteTrack's remove_duplicate_stracks: a lost
        track sitting on a tracked one would take its object's detections)."""
        t = self.table
        keep = np.ones(len(t), bool)
        tracked, lost = np.flatnonzero(t[:, _STATE] == TRACKED), np.flatnonzero(t[:, _STATE] == LOST)
        if not len(tracked) or not len(lost):
            return keep
        if self.rotated:
            obb = _to_obb(t[:, :4], t[:, _ANGLE])
            i, j, iou = rotated_overlapping(obb[tracked], obb[lost], t[tracked, _CLASS], t[lost, _CLASS])
        else:
            boxes = _to_xyxy(t[:, :4])
            i, j, iou = overlapping(boxes[tracked], boxes[lost], t[tracked, _CLASS], t[lost, _CLASS])
        same = iou > DUPLICATE_IOU
        a, b = tracked[i[same]], lost[j[same]]
        older = t[a, _BORN] < t[b, _BORN]
        keep[b[older]] = False
        keep[a[~older]] = False
        return keep

    def _start(
        self,
        xyah: np.ndarray,
        class_ids: np.ndarray,
        scores: np.ndarray,
        now: float,
        confirmed: np.ndarray,
        angles: np.ndarray,
    ) -> None:
        n = len(xyah)
        if not n:
            return
        new = np.zeros((n, _COLUMNS))
        new[:, :4] = xyah
        new[:, _VAR] = np.multiply.outer(xyah[:, 3] ** 2, _INITIAL_WEIGHTS) + _INITIAL_CONSTANT
        new[:, _ID] = np.arange(self._next_id, self._next_id + n)
        self._next_id += n
        new[:, _CLASS] = class_ids
        new[:, _STATE] = TRACKED
        new[:, _CONFIRMED] = confirmed
        new[:, _SCORE] = scores
        new[:, _SEEN] = now
        new[:, _MEASURED] = xyah
        new[:, _BORN] = self._frames
        new[:, _ANGLE] = angles
        self.table = np.concatenate([self.table, new])
