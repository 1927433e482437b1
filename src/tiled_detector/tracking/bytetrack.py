"""ByteTrack (Zhang et al., ECCV 2022) on arrays: every track's Kalman state in one array, every step a few numpy
operations over all tracks at once, association by scipy's `linear_sum_assignment` on the pairs that can match.

The algorithm is the paper's, as ByteTrack's reference code and supervision's port run it: a constant-velocity
Kalman filter on (centre x, centre y, aspect, height); per frame, (1) high-score detections (> `activation`) are
matched to the tracked and lost tracks by IoU (fused with the score), (2) the tracked tracks left over to the
low-score detections (`LOW_SCORE` .. `activation`), (3) tracks born on the previous frame (unconfirmed) to the high
detections left over; unmatched tracked tracks become lost, unmatched unconfirmed ones are dropped, high detections
left over (> `activation` + `NEW_TRACK_MARGIN`) start tracks (confirmed at once on the first frame, else at their
second match), lost tracks unseen for longer than `buffer_s` are dropped. Matches never cross classes.

Differences from the per-object reference implementations: the time step is the stamps' (a frame that was
dropped upstream is a longer step, not a missed detection), the lost-track buffer is in seconds, and the cost is
bounded: only boxes that overlap are compared (a sweep, not an N x M matrix) and only the rows and columns that
compete for a match go to the assignment solver (`tiled-detector bench` measures the cost per frame).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from tiled_detector.options import Option

LOW_SCORE = 0.1  # detections above this take part in the second association
NEW_TRACK_MARGIN = 0.1  # a new track needs a score above activation + this (ByteTrack's det_thresh)
SECOND_MATCH_IOU = 0.5  # the low-score association: IoU above this
UNCONFIRMED_MATCH = 0.7  # the unconfirmed association: fused cost below this
_STD_POSITION, _STD_VELOCITY = 1.0 / 20, 1.0 / 160  # Kalman noise per unit of height (ByteTrack's weights)
# the measurement noise of x, y, a, h: a multiple of the height, the aspect's a constant
_MEASURED_WEIGHTS = np.array([_STD_POSITION, _STD_POSITION, 0.0, _STD_POSITION])
_MEASURED_CONSTANT = np.array([0.0, 0.0, 1e-1, 0.0])

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


def overlapping(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs (i, j) of x1, y1, x2, y2 boxes a[i], b[j] that intersect, and their IoU: a sweep over b sorted by
    x1 finds each a[i]'s candidates, so the work follows the pairs, not N x M."""
    empty = np.zeros(0, np.int64)
    if not len(a) or not len(b):
        return empty, empty, np.zeros(0)
    order = np.argsort(b[:, 0], kind="stable")
    bx1, by1, bx2, by2 = b[order].T
    ax1, ay1, ax2, ay2 = a.T
    lo = np.searchsorted(bx1, ax1 - float(np.max(bx2 - bx1)), side="left")  # b.x2 may reach a.x1
    hi = np.searchsorted(bx1, ax2, side="left")  # b.x1 < a.x2
    counts = np.maximum(hi - lo, 0)
    i = np.repeat(np.arange(len(a)), counts)
    k = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())  # positions in sorted b
    width = np.minimum(ax2[i], bx2[k]) - np.maximum(ax1[i], bx1[k])
    wide = width > 0
    i, k, width = i[wide], k[wide], width[wide]
    height = np.minimum(ay2[i], by2[k]) - np.maximum(ay1[i], by1[k])
    hit = height > 0
    i, k, inter = i[hit], k[hit], width[hit] * height[hit]
    union = (ax2[i] - ax1[i]) * (ay2[i] - ay1[i]) + (bx2[k] - bx1[k]) * (by2[k] - by1[k]) - inter
    return i, order[k], inter / np.maximum(union, 1e-12)


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


class ByteTrack:
    """ByteTrack over the detections of one camera (module docstring). `update` takes one frame's detections and
    the time since the previous frame; track ids start at `first_id` and are never reused by this tracker."""

    def __init__(self, settings: TrackerSettings, first_id: int = 1) -> None:
        self.settings = settings
        self._next_id = first_id
        self._frames = 0
        self.mean = np.zeros((0, 8))
        self.var = np.zeros((0, 4, 3))
        self.ids = np.zeros(0, np.int64)
        self.classes = np.zeros(0, np.int64)
        self.state = np.zeros(0, np.int8)
        self.confirmed = np.zeros(0, bool)
        self.unseen_s = np.zeros(0)  # seconds since the track's last match

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def next_id(self) -> int:
        """The id the next new track gets."""
        return self._next_id

    # --- Kalman filter (ByteTrack's, on 2 x 2 blocks) ------------------------------------------------------------
    # ByteTrack's filter moves each of x, y, a, h with its own velocity and has diagonal noises, so its 8 x 8
    # covariance is four independent 2 x 2 (position, velocity) blocks: `var` holds them as (N, 4, 3) = variance of
    # the position, covariance of position and velocity, variance of the velocity. Exactly the same filter, a few
    # elementwise operations per step.

    @staticmethod
    def _noise(h: np.ndarray, position: float, velocity: float, aspect: tuple[float, float]) -> np.ndarray:
        """(N, 4, 2) standard deviations (position, velocity) of x, y, a, h for boxes of height `h` (the aspect's
        are constants)."""
        weights = np.array([[position, velocity], [position, velocity], [0.0, 0.0], [position, velocity]])
        return h[:, None, None] * weights + np.array([[0.0, 0.0], [0.0, 0.0], aspect, [0.0, 0.0]])

    def _predict(self, dt: float) -> None:
        if not len(self.ids):
            return
        noise = (self._noise(self.mean[:, 3], _STD_POSITION, _STD_VELOCITY, (1e-2, 1e-5)) * dt) ** 2
        self.mean[self.state == LOST, 7] = 0.0  # a lost track's height stops changing (ByteTrack)
        self.mean[:, :4] += dt * self.mean[:, 4:]
        var = self.var
        var[..., 0] += 2 * dt * var[..., 1] + dt * dt * var[..., 2] + noise[..., 0]
        var[..., 1] += dt * var[..., 2]
        var[..., 2] += noise[..., 1]

    def _correct(self, rows: np.ndarray, boxes: np.ndarray) -> None:
        """Kalman update of tracks `rows` with measured boxes (x1, y1, x2, y2)."""
        if not len(rows):
            return
        mean, var = self.mean[rows], self.var[rows]
        h = mean[:, 3]
        measured = h[:, None] * _MEASURED_WEIGHTS + _MEASURED_CONSTANT
        pp, pv = var[..., 0].copy(), var[..., 1].copy()
        projected = pp + measured**2
        gain_p, gain_v = pp / projected, pv / projected
        innovation = _to_xyah(boxes) - mean[:, :4]
        mean[:, :4] += gain_p * innovation
        mean[:, 4:] += gain_v * innovation
        var[..., 0] -= gain_p * pp
        var[..., 1] -= gain_p * pv
        var[..., 2] -= gain_v * pv
        self.mean[rows] = mean
        self.var[rows] = var

    def _boxes(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        return _to_xyxy(self.mean[rows, :4])

    # --- one frame --------------------------------------------------------------------------------------------

    def update(
        self, boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, dt_s: float, step: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Take one frame's detections, `dt_s` seconds after the previous one (`step`: that time in frame
        periods, the Kalman filter's time step). Returns the confirmed tracks matched in this frame: their boxes
        (the filter's estimate), scores and classes (of the matched detection), and track ids."""
        s = self.settings
        self._frames += 1
        self._predict(step)
        self.unseen_s += dt_s
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        scores = np.asarray(scores, np.float64).reshape(-1)
        class_ids = np.asarray(class_ids, np.int64).reshape(-1)
        high = np.flatnonzero(scores > s.activation)
        low = np.flatnonzero((scores > LOW_SCORE) & (scores <= s.activation))
        matched_tracks: list[np.ndarray] = []
        matched_dets: list[np.ndarray] = []
        predicted = self._boxes()

        def match(
            tracks: np.ndarray, dets: np.ndarray, limit: float, fuse: bool
        ) -> tuple[np.ndarray, np.ndarray]:
            i, j, overlap = overlapping(predicted[tracks], boxes[dets])
            if fuse:  # ByteTrack's fuse_score: IoU weighted by the detection's score
                overlap = overlap * scores[dets[j]]
            same = self.classes[tracks[i]] == class_ids[dets[j]]  # never across classes
            r, c = assign(i[same], j[same], 1.0 - overlap[same], limit)
            matched_tracks.append(tracks[r])
            matched_dets.append(dets[c])
            return tracks[r], dets[c]

        # (1) confirmed tracks (tracked or lost) and the high-score detections
        pool = np.flatnonzero(self.confirmed)
        t1, d1 = match(pool, high, s.match, fuse=True)
        # (2) tracked tracks left over and the low-score detections
        free_track = np.ones(len(self.ids), bool)
        free_track[t1] = False
        match(np.flatnonzero(free_track & self.confirmed & (self.state == TRACKED)), low, 1.0 - SECOND_MATCH_IOU,
              fuse=False)  # fmt: skip
        # (3) unconfirmed tracks and the high-score detections left over
        free_det = scores > s.activation
        free_det[d1] = False
        _, d3 = match(np.flatnonzero(~self.confirmed), np.flatnonzero(free_det), UNCONFIRMED_MATCH, fuse=True)
        free_det[d3] = False
        tracks = np.concatenate([np.zeros(0, np.int64), *matched_tracks])
        dets = np.concatenate([np.zeros(0, np.int64), *matched_dets])
        self._correct(tracks, boxes[dets])
        self.state[tracks] = TRACKED
        self.confirmed[tracks] = True
        self.unseen_s[tracks] = 0.0
        # unmatched: tracked -> lost, unconfirmed -> gone, lost too long -> gone
        unmatched = np.ones(len(self.ids), bool)
        unmatched[tracks] = False
        self.state[unmatched & self.confirmed] = LOST
        keep = ~(unmatched & ~self.confirmed) & ~((self.state == LOST) & (self.unseen_s > s.buffer_s))
        output = np.zeros(len(self.ids), bool)
        output[tracks] = True
        det_of = np.full(len(self.ids), -1, np.int64)
        det_of[tracks] = dets
        self._keep(keep)
        output, det_of = output[keep], det_of[keep]
        # new tracks from the high-score detections nobody took
        born = np.flatnonzero(free_det & (scores > s.activation + NEW_TRACK_MARGIN))
        first_frame = self._frames == 1
        self._start(boxes[born], class_ids[born], confirmed=first_frame)
        output = np.concatenate([output, np.full(len(born), first_frame)])
        det_of = np.concatenate([det_of, born])
        rows = np.flatnonzero(output)
        return self._boxes(rows), scores[det_of[rows]], class_ids[det_of[rows]], self.ids[rows]

    def _keep(self, keep: np.ndarray) -> None:
        for name in ("mean", "var", "ids", "classes", "state", "confirmed", "unseen_s"):
            setattr(self, name, getattr(self, name)[keep])

    def _start(self, boxes: np.ndarray, class_ids: np.ndarray, confirmed: bool) -> None:
        n = len(boxes)
        if not n:
            return
        mean = np.zeros((n, 8))
        mean[:, :4] = _to_xyah(boxes)
        initial = self._noise(mean[:, 3], 2 * _STD_POSITION, 10 * _STD_VELOCITY, (1e-2, 1e-5)) ** 2
        self.mean = np.concatenate([self.mean, mean])
        self.var = np.concatenate(
            [self.var, np.stack([initial[..., 0], np.zeros((n, 4)), initial[..., 1]], axis=2)]
        )
        self.ids = np.concatenate([self.ids, np.arange(self._next_id, self._next_id + n)])
        self._next_id += n
        self.classes = np.concatenate([self.classes, class_ids])
        self.state = np.concatenate([self.state, np.full(n, TRACKED, np.int8)])
        self.confirmed = np.concatenate([self.confirmed, np.full(n, confirmed)])
        self.unseen_s = np.concatenate([self.unseen_s, np.zeros(n)])
