"""A stream of frames through the detector, per camera: the tile budget's schedule, the tracker, the camera's
motion, the objects in tiles not run, and frames run in parts. The node (through `ros.worker`), `eval --motion` and
`bench` use it; `TiledDetector` itself stays stateless (one frame in, its detections out).

Everything a camera keeps over time is one record (`_Camera`), bounded by the camera's tiles and live objects:
- the tracks (`tracking.tracks.Tracks`, with `tracker` on);
- with `tile_budget` on: each tile's age (frames since it last ran), per tile the view the camera brought in since
  it ran, and without a tracker the boxes reported on the last frame (they claim tiles and are carried over);
- with `motion_compensation: image` (and a tracker or a budget): the camera's motion (`tracking.motion.CameraMotion`);
- the frame it is running in parts, if any.

One rule starts a camera over (a new record: every tile runs, tracks end, their ids go on counting up,
`starts_over`): its frame plan changes by value (frame size, `tile_size`, `overlap`, `full_frame`, `roi`, its ignore
mask), its stamps go back or jump by more than `lost_track_buffer`, or a setting changes what is tracked
(`tracker`, a tracker setting, `classes`, `motion_compensation`); `reset()` starts every camera over.

Camera motion: each frame's motion since the camera's previous frame is estimated on the engine's device as soon as
the frame is there (`TiledDetector.detect_many`'s `on_device`) and read after the frame's one download. The tracks
are moved by it before association (`ByteTrack.warp`), and so are the boxes carried without a tracker; the schedule,
which picks a frame's tiles before its motion is measured, uses the motion predicted from the previous frame. A
failed estimate is the identity for that frame (`StreamResult.motion.fallback`).

With `tile_budget` N (> 0) each frame with history runs at most N tiles (`tracking.schedule`) plus the full-frame
view. Only the detections the views run saw whole (`tracking.looks`) are reported or tracked; a track not seen
whole was not looked for and, confirmed, is reported from its prediction with the stamp of the frame it was last
detected in (`seen_ns`); without a tracker the last reported box not seen whole is carried as it was, unless a
detection of its class overlaps it (IoU >= `CARRIED_IOU`), for at most `max_tile_age` frames.

A frame of more views than the caller's `view_cap` runs in parts (its tiles in order, each part with the full-frame
view, no budget): the stream keeps the frame (`continuing`, known by its job's `sequence`, the camera's frame number,
never by its stamp) with the cap it started under, which every part keeps; a cap of 0 on a later part (no other
camera sending any more) runs the frame whole instead, at once. A part's tiles count as run only once its results
are back (a failed batch re-runs the same part; a batch that raises leaves no frame started), the parts' detections
meet the seam rule across parts (`tracking.looks.across_parts`) and the merge rule, and go to the tracker as one
frame's; its motion is not estimated, and the next frame's estimate starts over.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.tiling import TilePlan
from tiled_detector.streaming.frame_parts import merged
from tiled_detector.tracking.bytetrack import TrackerKind
from tiled_detector.tracking.geometry import (
    frame_hulls,
    move_boxes,
    move_rotated,
    overlapping,
    with_new_view,
)
from tiled_detector.tracking.keypoints import CarriedKeypoints
from tiled_detector.tracking.looks import Looks
from tiled_detector.tracking.motion import CameraMotion, Estimator, Measured, MotionCompensation
from tiled_detector.tracking.positions import Positions, joined, with_masks
from tiled_detector.tracking.schedule import (
    TENTATIVE_WEIGHT,
    ScheduleKind,
    alternative,
    claims,
    schedule,
    smallest_budget,
)
from tiled_detector.tracking.stamps import broken
from tiled_detector.tracking.tracks import Tracks
from tiled_detector.types import Detections

LOG = logging.getLogger(__name__)
CARRIED_IOU = 0.5  # a carried box gives way to a detection of its class overlapping it this much
SEAM_MARGIN_PX = 4.0  # as the seam rule's (`pipeline.seams.truncated_sides`)


def budget_problem(plan: TilePlan, budget: int, max_age: int) -> str | None:
    """Why `budget` (0: off) cannot keep `max_age` for frames of this plan (naming the smallest budget that can),
    or None."""
    least = smallest_budget(plan.num_tiles, max_age)
    if not budget or budget >= least:
        return None
    return (
        f"tile_budget {budget} cannot run each of the {plan.num_tiles} tiles of a {plan.frame_hw[1]}x"
        f"{plan.frame_hw[0]} frame at least once every {max_age} frames (max_tile_age): the smallest that can is "
        f"{least}"
    )


def looks(plan: TilePlan, picked: np.ndarray) -> Looks:
    """What a frame of `plan` looked at when only the tiles `picked` ran (and its full-frame view, if on)."""
    margin = SEAM_MARGIN_PX * max(float(plan.scales[0]), 1.0)
    return Looks(plan.tiles[picked], plan.inner_edges[picked], margin, plan.scale if plan.full_frame else 0.0)


@dataclass(frozen=True)
class Job:
    """One camera's frame for the stream: the camera's name, the (H, W, C) frame, its header stamp, its encoding,
    its upload slot (`TiledDetector.detect_many`), the camera name its ignore mask is given for, the caller's own
    `context` (the node's message), handed back with the result, its depth image, if any, and its `sequence`: the
    camera's frame number, given at arrival (a frame in parts is continued by the job of the same number; None: a
    new frame each time it is given, numbered by the stream)."""

    camera: str
    frame: Any
    stamp_ns: int
    encoding: str | Encoding = Encoding.RGB8
    slot: int | None = None
    mask_camera: str | None = None
    context: Any = None
    depth: Any = None  # its aligned depth image (`pipeline.depth.DepthImage`): the boxes get 3D positions
    sequence: int | None = None


@dataclass(frozen=True)
class StreamResult:
    """One frame's answer: its stamp, the reported boxes (detected in it, or carried over from an earlier frame),
    their track ids (None without a tracker), the stamp each was last detected in, which were detected in this
    frame (`fresh`; told by the frame, not the stamp: a camera may stamp two frames alike), the engine views run
    for the frame (tiles + full-frame view, over all its parts), notes for the caller (e.g. why the budget did not
    apply) and the camera's motion since its previous frame (None: not compensated)."""

    stamp_ns: int
    detections: Detections
    track_ids: np.ndarray | None
    seen_ns: np.ndarray
    fresh: np.ndarray
    views: int
    notes: tuple[str, ...] = ()
    motion: Measured | None = None

    @property
    def predicted(self) -> int:
        """Boxes reported from an earlier frame (in tiles not run in this one)."""
        return int(np.count_nonzero(~self.fresh))


@dataclass(frozen=True)
class Step:
    """What one `run` did with a job: the engine views it ran for it, its result (None: a frame in parts with
    parts left; give it again, `continuing`) and, when the camera's record started over with this frame
    (`starts_over`), why (the caller resets what it keeps of the camera with it)."""

    job: Job
    views: int
    result: StreamResult | None
    started_over: str | None = None


@dataclass
class _Parts:
    """A frame run in parts: the job, the most views of each part (the cap it started under), the tiles not run yet,
    and per part run its detections and what it saw."""

    job: Job
    cap: int
    left: np.ndarray
    found: list[Detections] = field(default_factory=list)
    whole: list[np.ndarray] = field(default_factory=list)


def _no_boxes() -> Detections:
    return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), {})


@dataclass
class _Camera:
    """Everything one camera keeps over time (module docstring), for one key (its plan's and settings' values)."""

    key: tuple[Any, ...]
    tracks: Tracks | None
    motion: CameraMotion
    last_ns: int | None = None
    frames: int = 0  # frames of this record (the history the schedule has)
    ages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    fresh: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per tile: new view since it last ran
    positions: Positions = field(default_factory=Positions)  # the 3D positions of the last reported boxes
    keypoints: CarriedKeypoints = field(
        default_factory=CarriedKeypoints
    )  # the last reported boxes' keypoints
    carried: Detections = field(default_factory=_no_boxes)  # without a tracker: the last reported boxes
    seen_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    unseen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # frames each was carried
    parts: _Parts | None = None


class Stream:
    """The detector over time (module docstring). Not thread-safe: one caller feeds it."""

    def __init__(self, detector: Any, kind: ScheduleKind = ScheduleKind.TRACKS) -> None:
        self.detector = detector  # a `TiledDetector`
        self._kind = kind  # the budget's schedule, or an alternative to compare it with (`eval --budgets`)
        self._estimator = Estimator()
        self._cameras: dict[str, _Camera] = {}
        self._next_ids: dict[str, int] = {}  # per camera, the next track id (never reused in a run)
        self._numbers = itertools.count(-1, -1)  # the sequence of a job given without one (never a caller's)
        self._said: set[tuple[Any, ...]] = set()  # one log line per cause

    def reset(self) -> None:
        """Every camera starts over (its track ids keep counting up)."""
        for name in list(self._cameras):
            self._end(name)

    def continuing(self) -> list[Job]:
        """The frames being run in parts, to give again until their last part has run."""
        return [c.parts.job for c in self._cameras.values() if c.parts is not None]

    def give_up(self, camera: str) -> None:
        """Forget the frame `camera` is running in parts (it failed)."""
        state = self._cameras.get(camera)
        if state is not None:
            state.parts = None

    def _end(self, name: str) -> None:
        state = self._cameras.pop(name)
        if state.tracks is not None:
            self._next_ids[name] = state.tracks.next_id

    def _say(self, level: int, cause: tuple[Any, ...], text: str) -> None:
        if cause not in self._said:
            self._said.add(cause)
            LOG.log(level, text)

    def budget_for(self, plan: TilePlan) -> int:
        """The tiles a frame of this plan runs under `tile_budget` (0: off): at most its tile count (with one INFO
        line), at least the smallest budget that keeps `max_tile_age` (with one WARNING line)."""
        config, tiles = self.detector.config, plan.num_tiles
        budget, age = config.tile_budget, config.max_tile_age
        if not budget:
            return 0
        size = f"{plan.frame_hw[1]}x{plan.frame_hw[0]}"
        if budget > tiles:
            self._say(
                logging.INFO,
                ("clamped", budget, tiles),
                f"tile_budget {budget} is more than the {tiles} tiles of a {size} frame: every tile runs",
            )
            return tiles
        problem = budget_problem(plan, budget, age)
        if problem:
            least = smallest_budget(tiles, age)
            self._say(logging.WARNING, ("raised", budget, tiles, age), f"{problem}; running {least}")
            return least
        return budget

    def process(
        self,
        frames: Sequence[Any],
        stamps_ns: Sequence[int],
        names: Sequence[str],
        encodings: Sequence[str | Encoding] | str | Encoding = Encoding.RGB8,
        depths: Sequence[Any] | None = None,
    ) -> list[StreamResult]:
        """`run` for whole frames (no parts): one frame of each camera `names[k]`, stamped `stamps_ns[k]` (with its
        depth image `depths[k]`, if given)."""
        if isinstance(encodings, str | Encoding):
            encodings = [encodings] * len(frames)
        depths = [None] * len(frames) if depths is None else depths
        jobs = [
            Job(name, frame, stamp, encoding, depth=depth)
            for frame, stamp, name, encoding, depth in zip(
                frames, stamps_ns, names, encodings, depths, strict=True
            )
        ]
        return [step.result for step in self.run(jobs)]  # type: ignore[misc]

    def run(
        self, jobs: Sequence[Job], view_cap: int = 0, while_running: Callable[[], None] | None = None
    ) -> list[Step]:
        """Detect the frames of `jobs` (at most one per camera) in one batch and report each.

        `view_cap` (0: none) runs a frame of more views than that in parts of at most `view_cap` views (module
        docstring): its step has no result until the run of its last part; give its job again (`continuing`)
        until then. Nothing changes when the detector raises: the same jobs can be given again. `while_running`
        is called while the device runs the batch (`TiledDetector.detect_many`: the time to stage the next
        frames)."""
        compensate = self._compensating()
        jobs = [
            job if job.sequence is not None else replace(job, sequence=next(self._numbers)) for job in jobs
        ]
        slots = [k if j.slot is None else j.slot for k, j in enumerate(jobs)]
        states, whys, plans, chosen, notes, parted, asides = [], [], [], [], [], [], []
        for job in jobs:
            plan = self.detector.plan_for(job.frame.shape[0], job.frame.shape[1], job.mask_camera)
            state, why = self._camera(job, plan)
            parts, aside = self._parts(state, job, plan, view_cap)
            picked, note = None, ()
            budget = self.budget_for(plan)
            if parts is not None:
                picked = parts.left[: max(parts.cap - int(plan.full_frame), 1)]
            elif aside is not None:
                run = len(aside.found)
                note = (
                    f"run whole: the view cap was lifted after {run} part{'s' * (run != 1)} of at most "
                    f"{aside.cap} views",
                )
            elif budget and state.frames < self._history():
                note = ("tile_budget ignored for a frame with no history: every tile ran",)
            elif budget:
                picked = self._pick(state, plan, budget, compensate)
                picked = None if len(picked) == plan.num_tiles else picked  # every tile: as without a budget
            states.append(state)
            whys.append(why)
            plans.append(plan)
            chosen.append(picked)
            notes.append(note)
            parted.append(parts)
            asides.append(aside)

        def observe(on_device: list[Any]) -> None:
            for state, frame, parts in zip(states, on_device, parted, strict=True):
                if parts is None:  # a frame in parts is not compensated
                    state.motion.observe(frame, self._estimator)

        found = self.detector.detect_many(
            [j.frame for j in jobs],
            [j.encoding for j in jobs],
            slots,
            [j.mask_camera for j in jobs],
            chosen,
            observe if compensate else None,
            **({"depths": [j.depth for j in jobs]} if any(j.depth is not None for j in jobs) else {}),
            **({"while_running": while_running} if while_running is not None else {}),
        )
        steps = []
        for job, state, why, plan, picked, detections, note, parts, aside in zip(
            jobs, states, whys, plans, chosen, found, notes, parted, asides, strict=True
        ):
            self._keep(job.camera, state, why)
            state.parts = parts
            views = plan.batch_size if picked is None else len(picked) + int(plan.full_frame)
            if parts is None:
                motion = state.motion.measured() if compensate else None
                reported = self._report(state, job.stamp_ns, plan, picked, detections, note, motion)
                if aside is not None:  # the views of the parts set aside were run for this frame too
                    reported = replace(reported, views=reported.views + self._views(plan, aside))
                steps.append(Step(job, views, self._located(state, detections, reported), why))
                continue
            parts.found.append(detections)
            parts.whole.append(looks(plan, picked).held(detections.boxes))
            parts.left = parts.left[len(picked) :]
            if len(parts.left):
                steps.append(Step(job, views, None, why))
                continue
            state.parts = None
            state.motion = CameraMotion()  # its thumbnail is a frame old: the next estimate starts over
            count = len(parts.found)  # every tile once, and the full-frame view with each part
            found_whole = self._merged(parts)
            whole = self._report(state, job.stamp_ns, plan, None, found_whole, note)
            whole = self._located(state, joined(parts.found), whole, found_whole)
            steps.append(
                Step(
                    job,
                    views,
                    replace(
                        whole,
                        views=self._views(plan, parts),
                        notes=(f"run in {count} parts of at most {parts.cap} views",),
                    ),
                    why,
                )
            )
        return steps

    @staticmethod
    def _views(plan: TilePlan, parts: _Parts) -> int:
        """The views the parts run so far took: their tiles, and the full-frame view with each."""
        return plan.num_tiles - len(parts.left) + len(parts.found) * int(plan.full_frame)

    @staticmethod
    def _located(
        state: _Camera, measured: Detections, result: StreamResult, masked: Detections | None = None
    ) -> StreamResult:
        """`result` with its boxes' 3D positions (`tracking.positions`) from the frame's `measured` detections, their
        instance masks from `masked` (default: `measured`; a frame in parts: its merged detections, whose masks are
        their groups' unions) and keypoints (`tracking.keypoints`: a carried box's moved with it)."""
        located = state.positions.attach(
            measured, result.detections, result.track_ids, result.seen_ns, result.fresh
        )
        if located is measured:  # every box as detected in this frame (positions, masks, keypoints and all)
            state.keypoints.attach(measured, located, result.track_ids, result.seen_ns, result.fresh)
            return replace(result, detections=located)
        masks = with_masks(result.stamp_ns, measured if masked is None else masked, located, result.seen_ns)
        posed = state.keypoints.attach(measured, masks, result.track_ids, result.seen_ns, result.fresh)
        return replace(result, detections=posed)

    @staticmethod
    def _parts(
        state: _Camera, job: Job, plan: TilePlan, view_cap: int
    ) -> tuple[_Parts | None, _Parts | None]:
        """The parts of this frame (changing nothing yet): continued (the same `sequence`, under the cap it started
        with), started (more views than `view_cap`: parts of that many), or None (a half-run frame of the camera
        that is not this one is given up); and, when `view_cap` is 0 for a frame in parts, its parts set aside (it
        runs whole)."""
        current = state.parts
        if current is not None and current.job.sequence == job.sequence:
            return (current, None) if view_cap else (None, current)
        if view_cap and plan.batch_size > max(view_cap, int(plan.full_frame) + 1):
            return _Parts(job, view_cap, np.arange(plan.num_tiles)), None
        return None, None

    def _merged(self, parts: _Parts) -> Detections:
        """The parts' detections as the frame's, run whole (`frame_parts.merged`)."""
        config = self.detector.config
        return merged(
            parts.found, parts.whole, self.detector.frame_settings.merge_rule, config.max_detections
        )

    def _compensating(self) -> bool:
        """Whether the camera's motion is estimated: `motion_compensation: image` and something that uses it (the
        tracker or the tile budget)."""
        config = self.detector.config
        return config.motion_compensation is MotionCompensation.IMAGE and (
            self._tracking() or config.tile_budget > 0
        )

    def _pick(self, state: _Camera, plan: TilePlan, budget: int, compensate: bool) -> np.ndarray:
        """The tiles a frame with history runs under the budget: the schedule (claims and new view moved by the
        camera's predicted motion), or the alternative this stream compares it with."""
        if self._kind is not ScheduleKind.TRACKS:
            return alternative(self._kind, state.frames, plan.num_tiles, budget)
        predicted = state.motion.motion if compensate else None
        fresh = None
        if predicted is not None and len(state.fresh) == plan.num_tiles:
            fresh = with_new_view(state.fresh, plan.tiles, predicted, plan.frame_hw)
        if state.tracks is not None:
            boxes, tentative = state.tracks.predicted()
            weights = np.where(tentative, TENTATIVE_WEIGHT, 1)
        else:
            boxes, weights = state.carried.boxes, None
        if predicted is not None:
            boxes = move_boxes(predicted, boxes)
        return schedule(
            state.ages, claims(plan.tiles, boxes, weights), budget, self.detector.config.max_tile_age, fresh
        )

    def _tracking(self) -> bool:
        return self.detector.config.tracker is not TrackerKind.NONE

    def _history(self) -> int:
        """Frames of a camera that run every tile before the budget applies: two with a tracker (its tracks then
        know their motion), else one."""
        return 2 if self._tracking() else 1

    def _key(self, plan: TilePlan) -> tuple[Any, ...]:
        """What a camera's record is for: its plan's value and the settings that change what is tracked."""
        config = self.detector.config
        tracked = (config.tracker, config.tracker_settings(), config.classes, config.motion_compensation)
        return (plan.key, tracked)

    def starts_over(self, camera: str, plan: TilePlan, stamp_ns: int) -> str | None:
        """Why `camera`'s record cannot take a frame of `plan` stamped `stamp_ns` (the one reset rule, module
        docstring), or None."""
        state = self._cameras.get(camera)
        if state is None:
            return None
        if state.key[0] != plan.key:
            return "its frame plan changed (frame size, tile settings, roi or ignore mask)"
        if state.key != self._key(plan):
            return "a setting that changes what is tracked changed"
        if broken(state.last_ns, stamp_ns, self.detector.config.lost_track_buffer):
            went = "went back" if stamp_ns < state.last_ns else "jumped"  # type: ignore[operator]
            return f"its stamps {went} (a looped bag, a restarted camera or clock)"
        return None

    def _camera(self, job: Job, plan: TilePlan) -> tuple[_Camera, str | None]:
        """The camera's record for this frame, a new one where `starts_over` says so (and why), kept only once the
        frame has run (`_keep`)."""
        why = self.starts_over(job.camera, plan, job.stamp_ns)
        state = self._cameras.get(job.camera)
        if state is not None and why is None:
            return state, None
        tracks = None
        if self._tracking():
            old = state.tracks if state is not None else None
            first = old.next_id if old is not None else self._next_ids.get(job.camera, 1)
            tracks = Tracks(self.detector.config.tracker_settings(), first, rotated=self.detector.rotated)
        return _Camera(self._key(plan), tracks, CameraMotion()), why

    def _keep(self, name: str, state: _Camera, why: str | None) -> None:
        """`state` as the camera's record (the old one ended, `why` logged, when it is a new one)."""
        if self._cameras.get(name) is state:
            return
        if why is not None:
            LOG.info("%s starts over: %s", name, why)
        if name in self._cameras:
            self._end(name)
        self._cameras[name] = state

    def _report(
        self,
        state: _Camera,
        stamp: int,
        plan: TilePlan,
        picked: np.ndarray | None,
        found: Detections,
        notes: tuple[str, ...],
        motion: Measured | None = None,
    ) -> StreamResult:
        """Update the camera's record with a frame's detections (and the camera's `motion` since its previous
        frame) and make its `StreamResult`."""
        config = self.detector.config
        seen = None if picked is None else looks(plan, picked)
        views = plan.batch_size if picked is None else len(picked) + int(plan.full_frame)
        state.ages = np.ones(plan.num_tiles, np.int64) if picked is None else state.ages + 1
        if picked is not None:
            state.ages[picked] = 1
        state.frames += 1
        state.last_ns = stamp
        moved = motion.matrix if motion is not None and motion.estimated else None
        if motion is not None and config.tile_budget:  # the new view is the schedule's
            self._fresh(state, plan, picked, motion.matrix)
        if seen is not None:
            keep = seen.seen(found.boxes)
            found = found[keep]
        if state.tracks is not None:
            tracked = state.tracks.update(stamp, found, seen, moved, plan.frame_hw)
            return StreamResult(
                stamp,
                tracked.detections(found.timings),
                tracked.track_ids,
                tracked.seen_ns,
                tracked.fresh,
                views,
                notes,
                motion,
            )
        stamps, carried = np.full(len(found), stamp, np.int64), np.zeros(len(found), np.int64)
        if seen is not None:
            if moved is not None:
                obb = state.carried.obb
                obb = None if obb is None else move_rotated(moved, obb).astype(np.float32)
                boxes = (
                    move_boxes(moved, state.carried.boxes) if obb is None else frame_hulls(obb, plan.frame_hw)
                )
                state.carried = replace(state.carried, boxes=boxes.astype(np.float32), obb=obb)
            found, stamps, carried = self._carry(state, found, stamps, seen, config.max_tile_age)
        state.carried, state.seen_ns, state.unseen = found, stamps, carried
        return StreamResult(stamp, found, None, stamps, carried == 0, views, notes, motion)

    @staticmethod
    def _fresh(state: _Camera, plan: TilePlan, picked: np.ndarray | None, motion: np.ndarray) -> None:
        """Per tile, the view the camera brought in since the tile last ran: what this frame's motion brought into
        each tile accumulates; the tiles run see it."""
        if len(state.fresh) != plan.num_tiles:
            state.fresh = np.zeros(plan.num_tiles)
        state.fresh = with_new_view(state.fresh, plan.tiles, motion, plan.frame_hw)
        state.fresh[slice(None) if picked is None else picked] = 0.0

    @staticmethod
    def _carry(
        state: _Camera, found: Detections, stamps: np.ndarray, seen: Looks, max_age: int
    ) -> tuple[Detections, np.ndarray, np.ndarray]:
        """Without a tracker: the last frame's boxes not seen whole this frame (and no detection of their class
        overlaps), carried over with their scores and stamps, for at most `max_age` frames."""
        last = state.carried
        keep = ~seen.seen(last.boxes) & (state.unseen + 1 < max_age)
        i, _, iou = overlapping(
            last.boxes.astype(np.float64), found.boxes.astype(np.float64), last.class_ids, found.class_ids
        )
        keep[i[iou >= CARRIED_IOU]] = False
        boxes = np.concatenate([found.boxes, last.boxes[keep]]).astype(np.float32)
        scores = np.concatenate([found.scores, last.scores[keep]]).astype(np.float32)
        class_ids = np.concatenate([found.class_ids, last.class_ids[keep]]).astype(np.int64)
        obb = None
        if found.obb is not None:  # (the first carried set is empty, and of no form)
            previous = last.obb if last.obb is not None else np.zeros((len(last), 5), np.float32)
            obb = np.concatenate([found.obb, previous[keep]])
        return (
            Detections(boxes, scores, class_ids, found.timings, obb=obb),
            np.concatenate([stamps, state.seen_ns[keep]]),
            np.concatenate([np.zeros(len(found), np.int64), state.unseen[keep] + 1]),
        )
