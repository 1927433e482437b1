"""The tile schedule under a budget: which of a frame's tiles run, as a pure function of the tiles, each tile's age
and the boxes that claim tiles (the live tracks' predicted boxes; without a tracker, the previous frame's
detections).

A tile's *age* is the number of frames since it last ran (1: it ran on the previous frame). With `max_age` A every
tile runs at least once in any A consecutive frames, so a tile of age a must run within the next A - a + 1 frames
(this one included). The order of choice:

1. *due*: the fewest, most urgent tiles (oldest first) without which some later frame would have more tiles that
   must run than the budget holds (earliest deadline first: for every horizon d = 1..A, the tiles due within d
   frames, less what the d - 1 frames after this one can run, run now). Any budget of at least
   `smallest_budget(N, A)` = ceil(N / A) tiles keeps the bound for ever from a frame where every tile ran.
2. *new view* (with camera-motion compensation): tiles of which at least `NEW_VIEW` is view the camera has turned
   or moved to since they last ran (`tracking.motion.new_view`);
3. *by need*: the rest by claims x age squared (then by age: tiles without claims, oldest first), claims from
   the boxes that claim the tile (grown by `CLAIM_MARGIN` of their size on every side, at least `MIN_MARGIN_PX`:
   how far an object may move or its box grow between frames; a box on a seam claims every tile it touches; a
   tentative track, seen once, weighs `TENTATIVE_WEIGHT`: its second look confirms it and gives its motion): a
   tile's objects drift from their predictions the longer it waits; a tile without tracks is looked at for
   objects not found yet when the budget has room, and at the latest when the age bound makes it due.

Ties go to the lower tile index, so the same inputs give the same set.

What a user could do instead, for comparison (`eval --motion --budgets`): every tile on one frame in k (on
average) and none between (`ScheduleKind.INTERVAL`, DeepStream's `interval`), or the tiles in turn
(`ScheduleKind.ROUND_ROBIN`), at the same mean tiles per frame (`alternative`).
"""

from __future__ import annotations

import numpy as np

from tiled_detector.settings.options import Option

CLAIM_MARGIN = 0.5  # a claiming box grows by this fraction of its width / height on every side
MIN_MARGIN_PX = 8.0
TENTATIVE_WEIGHT = 16  # a tentative track's claim counts as this many confirmed ones
NEW_VIEW = 0.1  # a tile this much of which the camera has brought into view since it last ran comes first


class ScheduleKind(Option):
    """How a stream picks the tiles a budget runs: the schedule above, or one of the alternatives."""

    TRACKS = "tracks"
    INTERVAL = "interval"
    ROUND_ROBIN = "round_robin"


def smallest_budget(tiles: int, max_age: int) -> int:
    """The smallest budget that runs each of `tiles` tiles at least once in every `max_age` frames."""
    return -(-tiles // max_age)


def claims(tiles: np.ndarray, boxes: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(N,) int: how many of the (M, 4) boxes (or the sum of their integer `weights`), grown by the claim margin,
    overlap each of the (N, 4) tiles."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    if not len(boxes) or not len(tiles):
        return np.zeros(len(tiles), np.int64)
    size = boxes[:, 2:] - boxes[:, :2]
    margin = np.maximum(size * CLAIM_MARGIN, MIN_MARGIN_PX)
    grown = np.concatenate([boxes[:, :2] - margin, boxes[:, 2:] + margin], axis=1)
    t = tiles[:, None, :]
    overlap = (
        (grown[None, :, 0] < t[..., 2])
        & (grown[None, :, 2] > t[..., 0])
        & (grown[None, :, 1] < t[..., 3])
        & (grown[None, :, 3] > t[..., 1])
    )
    return overlap.sum(axis=1) if weights is None else overlap @ np.asarray(weights, np.int64)


def due(ages: np.ndarray, budget: int, max_age: int) -> np.ndarray:
    """The tiles that must run now (module docstring, step 1), most urgent first."""
    # frames left to run in, this one included
    slack = np.clip(max_age - np.asarray(ages, np.int64) + 1, 1, max_age)
    order = np.lexsort((np.arange(len(slack)), slack))  # most urgent first, ties by index
    within = np.cumsum(np.bincount(slack, minlength=max_age + 1)[1:])  # tiles due within d = 1..A frames
    later = (np.arange(1, max_age + 1) - 1) * budget  # what the frames after this one can run
    return order[: int(max(0, (within - later).max(initial=0)))]


def schedule(
    ages: np.ndarray, claimed: np.ndarray, budget: int, max_age: int, fresh: np.ndarray | None = None
) -> np.ndarray:
    """The sorted indices of the tiles to run this frame: at most `budget` of the N tiles (ages (N,) int,
    claimed (N,) int: `claims`, fresh (N,): the fraction of each that is new view), in the order of the module
    docstring. Raises ValueError when the tiles due now exceed the budget (a budget below `smallest_budget`)."""
    ages, claimed = np.asarray(ages, np.int64), np.asarray(claimed, np.int64)
    if budget < 1 or max_age < 1:
        raise ValueError(f"the tile budget and the tile age must be at least 1, got {budget} and {max_age}")
    if budget >= len(ages):
        return np.arange(len(ages))
    must = due(ages, budget, max_age)
    if len(must) > budget:
        raise ValueError(
            f"a budget of {budget} tiles cannot run each of {len(ages)} tiles every {max_age} frames: "
            f"the smallest that can is {smallest_budget(len(ages), max_age)}"
        )
    index = np.arange(len(ages))
    rank = np.full(len(ages), 2)  # 0: due, 1: new view, 2: the rest
    if fresh is not None:
        rank[np.asarray(fresh) >= NEW_VIEW] = 1
    rank[must] = 0
    # the rest by claims x age squared: the objects of a tile not run drift from their predictions, more the longer
    # it waits (their position's uncertainty grows with the square of the frames unseen); then by age
    order = np.lexsort((index, -ages, -claimed * np.square(ages), rank))
    return np.sort(order[:budget])


def alternative(kind: ScheduleKind, frame: int, tiles: int, budget: int) -> np.ndarray:
    """The tiles the alternative `kind` runs on a camera's `frame`-th frame: every tile on one frame in k =
    tiles / budget and none between (interval; where k is not a whole number the gaps are floor(k) and ceil(k)
    frames, so that the mean is `budget` tiles a frame), or `budget` tiles in turn (round robin)."""
    if kind is ScheduleKind.INTERVAL:
        runs = (frame + 1) * budget // tiles > frame * budget // tiles
        return np.arange(tiles) if runs else np.zeros(0, np.int64)
    if kind is ScheduleKind.ROUND_ROBIN:
        return np.sort((frame * budget + np.arange(min(budget, tiles))) % tiles)
    raise ValueError(f"{kind.value} is the track-driven schedule, not an alternative")
