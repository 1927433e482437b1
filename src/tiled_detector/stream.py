"""A stream of frames through the detector, per camera: the tile budget's schedule, the tracker, and the objects
in tiles not run this frame, reported from what was seen before. The node, `eval --motion` and `bench` use it;
`TiledDetector` itself stays stateless (one frame in, its detections out).

Per camera, state and its bounds (all of it follows the camera's tiles and live objects, not the stream's length):
- the tracks (`tracking.tracks.CameraTracks`, with `tracker` on);
- with `tile_budget` on: each tile's age (frames since it last ran) for the frame plan in use, and the boxes reported
  on the last frame (they claim tiles when there is no tracker, and are carried over, see below);
- with `motion_compensation: image` (and a tracker or a budget): the camera's motion (`tracking.motion.CameraMotion`:
  the last thumbnail and estimate) and, per tile, the fraction of it that is view the camera brought in since it last
  ran.

Reset rules (the camera starts over: every tile runs on its next frame): the frame plan changes (frame size,
`tile_size`, `overlap`, `full_frame`, `roi`, its ignore mask); the stamps go back or jump by more than
`lost_track_buffer`; `tracker`, a tracker setting, a tile setting or `motion_compensation` changes (every camera);
`reset()`.

Camera motion (`motion_compensation: image`): each frame's motion since the camera's previous frame is estimated on
the engine's device as soon as the frame is there (`TiledDetector.detect_many`'s `on_device`) and read after the
frame's one download. Before association the tracks are moved by it (`ByteTrack.warp`), and so are the boxes carried
without a tracker; the schedule, which picks a frame's tiles before its motion is measured, moves the claiming boxes
by the motion predicted from the previous frame and runs first the tiles the camera brought into view
(`tracking.schedule`). A failed estimate is the identity for that frame (`StreamResult.motion.fallback`).

With `tile_budget` N (> 0) each frame with history runs at most N tiles (`tracking.schedule`: those due under
`max_tile_age`, those the camera brought new view into, then by the claims of the tracks' predicted boxes and age)
plus the full-frame view. An object in a tile not run is reported from what was seen before, with the stamp of the
frame it was last detected in (`seen_ns`; the node puts it in that Detection2D's header). A tile run holds a box
whole when the box lies in it clear of its inner edges by the seam margin (`looked_at_regions`); only the
detections tiles run hold whole are reported or tracked. With the tracker, a confirmed track whose predicted box
no tile run holds whole keeps its state and is reported at its predicted box with its last score (until it is
looked for again: at most `max_tile_age` frames, every tile runs that often); without it, the last reported box
that no tile run holds whole is kept as it was (with its score), unless a detection of its class overlaps it
(IoU >= 0.5), for at most `max_tile_age` frames.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.merge import merge_detections
from tiled_detector.pipeline.tiling import TilePlan
from tiled_detector.tracking.bytetrack import TrackerKind, inside_any, overlapping
from tiled_detector.tracking.motion import (
    CameraMotion,
    Measured,
    MotionCompensation,
    move_boxes,
    with_new_view,
)
from tiled_detector.tracking.positions import CameraPositions, joined
from tiled_detector.tracking.schedule import (
    TENTATIVE_WEIGHT,
    ScheduleKind,
    alternative,
    claims,
    schedule,
    smallest_budget,
)
from tiled_detector.tracking.stamps import broken
from tiled_detector.tracking.tracks import CameraTracks
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


def looked_at_regions(plan: TilePlan, picked: np.ndarray) -> np.ndarray:
    """(K, 4) float64: the regions of the tiles `picked` in which a box is seen whole: each tile less a seam margin
    (`SEAM_MARGIN_PX` model-input pixels, in frame pixels) along its inner edges, and unbounded beyond the frame's
    edges. A box in that margin may be the part of an object that goes on in a tile not run (the seam rule drops it
    only when the neighbour ran); a track predicted partly out of the frame is looked for by the tile its visible
    part is in (else it would never be, and would be reported from its prediction after it left)."""
    tiles = plan.tiles[picked].astype(np.float64)
    margin = SEAM_MARGIN_PX * max(float(plan.scales[0]), 1.0)
    inner = plan.inner_edges[picked]
    outward = np.array([-np.inf, -np.inf, np.inf, np.inf])
    return np.where(inner, tiles + margin * np.array([1.0, 1.0, -1.0, -1.0]), outward)


@dataclass(frozen=True)
class StreamResult:
    """One frame's answer: its stamp, the reported boxes (detected in it, or carried over from an earlier frame: `seen_ns`
    below the frame's stamp), their track ids (None without a tracker), the stamp each was last detected in, the
    engine views run for the frame (tiles + full-frame view), notes for the caller (e.g. why the budget did not
    apply) and the camera's motion since its previous frame (None: not compensated)."""

    stamp_ns: int
    detections: Detections
    track_ids: np.ndarray | None
    seen_ns: np.ndarray
    views: int
    notes: tuple[str, ...] = ()
    motion: Measured | None = None

    @property
    def predicted(self) -> int:
        """Boxes reported from an earlier frame (in tiles not run in this one)."""
        return int(np.count_nonzero(self.seen_ns != self.stamp_ns))


@dataclass
class _Parts:
    """A frame run in parts (`Stream.process`'s `view_cap`): its stamp, the tiles still to run and what the parts
    run so far found."""

    stamp_ns: int
    left: np.ndarray
    found: list[Detections] = field(default_factory=list)

    def next_tiles(self, tiles: int) -> np.ndarray:
        """The next `tiles` tiles to run (taken off those left)."""
        chosen, self.left = self.left[:tiles], self.left[tiles:]
        return chosen


@dataclass
class _Camera:
    """One camera's schedule state (module docstring)."""

    plan: TilePlan | None = None
    frames: int = 0  # frames of this plan in a row (the history the schedule has)
    ages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last_ns: int | None = None
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))  # the last reported frame
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    class_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    seen_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    unseen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # frames each was carried
    fresh: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per tile: new view since it last ran


class Stream:
    """The detector over time (module docstring). Not thread-safe: one caller feeds it."""

    def __init__(self, detector: Any, kind: ScheduleKind = ScheduleKind.TRACKS) -> None:
        self.detector = detector  # a `TiledDetector`
        self._kind = kind  # the budget's schedule, or an alternative to compare it with (`eval --budgets`)
        self._motion = CameraMotion()
        self._cameras: dict[str, _Camera] = {}
        self._parts: dict[str, _Parts] = {}  # per camera, the frame it is running in parts
        self._tracks: CameraTracks | None = None
        self._key: Any = None
        self._said: set[tuple[Any, ...]] = set()  # one log line per cause
        self._positions = CameraPositions()  # 3D positions: each camera's last reported ones

    def reset(self) -> None:
        """Every camera starts over (its track ids keep counting up)."""
        self._cameras.clear()
        self._parts.clear()
        self._motion.reset()
        self._positions.reset()
        if self._tracks is not None:
            self._tracks.reset()

    def _follow_settings(self) -> None:
        """A change of the tracker, its settings or the tiles ends every camera's tracks and schedule."""
        config = self.detector.config
        key = (config.tracker, config.tracker_settings(), config.tile_size, config.overlap, config.full_frame,
               config.motion_compensation)  # fmt: skip
        if key == self._key:
            return
        if self._key is not None:
            LOG.info("tracker or tile settings changed: every camera's tracks and tile ages start over")
        self._key = key
        if self._tracks is None:
            self._tracks = CameraTracks(config.tracker_settings())
        else:
            self._tracks.reset(config.tracker_settings())
        self._cameras.clear()
        self._parts.clear()
        self._motion.reset()

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
            self._say(logging.INFO, ("clamped", budget, tiles),
                      f"tile_budget {budget} is more than the {tiles} tiles of a {size} frame: every tile runs")  # fmt: skip
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
        slots: Sequence[int] | None = None,
        mask_cameras: Sequence[str | None] | None = None,
        view_cap: int = 0,
        depths: Sequence[Any] | None = None,
    ) -> list[StreamResult | None]:
        """Detect one frame of each camera `names[k]` (its header stamp `stamps_ns[k]`; `mask_cameras`: the name
        its ignore mask is given for, see `TiledDetector.detect_many`) and report each as a `StreamResult`.

        `view_cap` (0: none) runs a frame of more views than that in parts of at most `view_cap` views (its tiles
        in order, each part with the full-frame view; the tile budget does not apply): its entry is None until the
        call that runs its last part, and the caller gives the same frame with the same stamp again until then.
        The parts' detections are merged by the merge rule and go to the tracker as one frame's.

        `depths` (per frame a `pipeline.depth.DepthImage` or None; see `TiledDetector.detect_many`) gives the
        reported boxes their 3D positions (`tracking.positions`: a carried box keeps the one it was seen with)."""
        self._follow_settings()
        config = self.detector.config
        masks = [None] * len(frames) if mask_cameras is None else list(mask_cameras)
        compensate = self._compensating()
        states, plans, chosen, notes, parted = [], [], [], [], []
        for frame, stamp, name, mask in zip(frames, stamps_ns, names, masks, strict=True):
            plan = self.detector.plan_for(frame.shape[0], frame.shape[1], mask)
            state = self._camera(name, plan, stamp)
            budget = self.budget_for(plan)
            picked, note = None, ()
            parts = self._parts_for(name, stamp, plan, view_cap)
            if parts is not None:
                picked = parts.next_tiles(view_cap - int(plan.full_frame))
            elif budget and state.frames < self._history():
                note = ("tile_budget ignored for a frame with no history: every tile ran",)
            elif budget:
                picked = self._pick(name, state, plan, budget, compensate)
                picked = None if len(picked) == plan.num_tiles else picked  # every tile: as without a budget
            states.append(state)
            plans.append(plan)
            chosen.append(picked)
            notes.append(note)
            parted.append(parts)

        def observe(on_device: list[Any]) -> None:
            for name, stamp, frame, parts in zip(names, stamps_ns, on_device, parted, strict=True):
                if parts is None:  # a frame in parts is not compensated (its estimate starts over after it)
                    self._motion.observe(name, frame, stamp, config.lost_track_buffer)

        located = {} if depths is None else {"depths": depths}
        found = self.detector.detect_many(
            frames, encodings, slots, mask_cameras, chosen, observe if compensate else None, **located
        )
        results: list[StreamResult | None] = []
        for name, stamp, state, plan, picked, detections, note, parts in zip(
            names, stamps_ns, states, plans, chosen, found, notes, parted, strict=True
        ):
            if parts is None:
                motion = self._motion.measured(name) if compensate else None
                reported = self._report(name, stamp, state, plan, picked, detections, note, motion)
                results.append(self._located(name, detections, reported))
                continue
            parts.found.append(detections)
            if len(parts.left):
                results.append(None)
                continue
            del self._parts[name]
            whole = self._report(name, stamp, state, plan, None, self._merged(parts.found), note)
            count = len(parts.found)  # every tile once, and the full-frame view with each part
            whole = self._located(name, joined(parts.found), whole)
            results.append(dataclasses.replace(whole, views=plan.num_tiles + count * int(plan.full_frame), notes=(
                f"run in {count} parts of at most {view_cap} views",)))  # fmt: skip
        return results

    def _located(self, name: str, measured: Detections, result: StreamResult) -> StreamResult:
        """`result` with its boxes' 3D positions (`tracking.positions`) from the frame's `measured` detections."""
        located = self._positions.attach(
            name, result.stamp_ns, measured, result.detections, result.track_ids, result.seen_ns
        )
        return dataclasses.replace(result, detections=located)

    def in_parts(self, name: str) -> bool:
        """Whether camera `name` has a frame left half run (`process`'s `view_cap`)."""
        return name in self._parts

    def give_up(self, name: str) -> None:
        """Forget camera `name`'s frame in parts (it failed)."""
        self._parts.pop(name, None)

    def _parts_for(self, name: str, stamp: int, plan: TilePlan, view_cap: int) -> _Parts | None:
        """The parts of this frame: continued (the same stamp), started (more views than `view_cap`), or None."""
        parts = self._parts.get(name)
        if parts is not None and parts.stamp_ns == stamp:
            return parts
        self._parts.pop(name, None)  # a new frame instead: the half-run one is given up
        if not view_cap or plan.batch_size <= view_cap or view_cap <= int(plan.full_frame):
            return None
        parts = self._parts[name] = _Parts(stamp, np.arange(plan.num_tiles))
        return parts

    def _merged(self, found: list[Detections]) -> Detections:
        """The parts' detections merged as the frame program merges views, the best `max_detections` kept."""
        config = self.detector.config
        boxes, scores, class_ids = merge_detections(
            np.concatenate([f.boxes for f in found]), np.concatenate([f.scores for f in found]),
            np.concatenate([f.class_ids for f in found]), config.merge, config.match_metric,
            config.merge_threshold, config.class_agnostic,
        )  # fmt: skip
        best = np.argsort(-scores, kind="stable")[: config.max_detections]
        timings = {k: sum(f.timings.get(k, 0.0) for f in found) for k in found[-1].timings}
        return Detections(boxes[best], scores[best], class_ids[best], timings)

    def _compensating(self) -> bool:
        """Whether the camera's motion is estimated: `motion_compensation: image` and something that uses it (the
        tracker or the tile budget)."""
        config = self.detector.config
        return config.motion_compensation is MotionCompensation.IMAGE and (
            self._tracking() or config.tile_budget > 0
        )

    def _pick(self, name: str, state: _Camera, plan: TilePlan, budget: int, compensate: bool) -> np.ndarray:
        """The tiles a frame with history runs under the budget: the schedule (claims and new view moved by the
        camera's predicted motion), or the alternative this stream compares it with."""
        if self._kind is not ScheduleKind.TRACKS:
            return alternative(self._kind, state.frames, plan.num_tiles, budget)
        predicted = self._motion.predicted(name) if compensate else None
        fresh = None
        if predicted is not None and len(state.fresh) == plan.num_tiles:
            fresh = with_new_view(state.fresh, plan.tiles, predicted, plan.frame_hw)
        claimed = self._claims(name, state, plan, predicted)
        return schedule(state.ages, claimed, budget, self.detector.config.max_tile_age, fresh)

    def _tracking(self) -> bool:
        return self.detector.config.tracker is not TrackerKind.NONE

    def _history(self) -> int:
        """Frames of a camera that run every tile before the budget applies: two with a tracker (its tracks then
        know their motion), else one."""
        return 2 if self._tracking() else 1

    def _claims(
        self, name: str, state: _Camera, plan: TilePlan, motion: np.ndarray | None = None
    ) -> np.ndarray:
        """How much each tile is claimed: by the tracks' predicted boxes (tentative ones weigh more), or without a
        tracker by the last reported boxes; moved by the camera's predicted `motion` where given."""
        if not self._tracking():
            return claims(plan.tiles, state.boxes if motion is None else move_boxes(motion, state.boxes))
        boxes, tentative = self._tracks.predicted(name)  # type: ignore[union-attr]
        boxes = boxes if motion is None else move_boxes(motion, boxes)
        return claims(plan.tiles, boxes, np.where(tentative, TENTATIVE_WEIGHT, 1))

    def _camera(self, name: str, plan: TilePlan, stamp: int) -> _Camera:
        """The camera's state, started over where a reset rule says so (module docstring)."""
        state = self._cameras.get(name)
        if state is not None and (
            state.plan is not plan or broken(state.last_ns, stamp, self.detector.config.lost_track_buffer)
        ):
            state = None
        if state is None:
            state = self._cameras[name] = _Camera()
        return state

    def _report(
        self,
        name: str,
        stamp: int,
        state: _Camera,
        plan: TilePlan,
        picked: np.ndarray | None,
        found: Detections,
        notes: tuple[str, ...],
        motion: Measured | None = None,
    ) -> StreamResult:
        """Update the camera's state with a frame's detections (and the camera's `motion` since its previous frame)
        and make its `StreamResult`."""
        config = self.detector.config
        observed = None if picked is None else looked_at_regions(plan, picked)
        views = plan.batch_size if picked is None else len(picked) + int(plan.full_frame)
        state.ages = np.ones(plan.num_tiles, np.int64) if picked is None else state.ages + 1
        if picked is not None:
            state.ages[picked] = 1
        state.plan = plan
        state.frames += 1
        state.last_ns = stamp
        track_ids = None
        moved = motion.matrix if motion is not None and motion.estimated else None
        if motion is not None and config.tile_budget:  # the new view is the schedule's
            self._fresh(state, plan, picked, motion.matrix)
        if observed is not None:
            found = self._looked_at(found, observed)
        if self._tracking():
            found, tracked = self._tracks.track(name, stamp, found, observed, moved)  # type: ignore[union-attr]
            track_ids, seen = tracked.track_ids, tracked.seen_ns
            carried = np.zeros(len(found), np.int64)
        else:
            seen, carried = np.full(len(found), stamp, np.int64), np.zeros(len(found), np.int64)
            if observed is not None:
                if moved is not None:
                    state.boxes = move_boxes(moved, state.boxes).astype(np.float32)
                found, seen, carried = self._carry(state, found, seen, observed, config.max_tile_age)
        state.boxes, state.scores, state.class_ids = found.boxes, found.scores, found.class_ids
        state.seen_ns, state.unseen = seen, carried
        return StreamResult(stamp, found, track_ids, seen, views, notes, motion)

    @staticmethod
    def _looked_at(found: Detections, observed: np.ndarray) -> Detections:
        """Under a budget, the detections a tile run holds whole: one that no tile run holds is cut by the edge of a
        tile not run (its other part unseen) or seen only by the coarse full-frame view; either would move a track
        from where it is, so the track of that object waits for its tile instead."""
        keep = inside_any(found.boxes.astype(np.float64), observed)
        return Detections(found.boxes[keep], found.scores[keep], found.class_ids[keep], found.timings)

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
        state: _Camera, found: Detections, seen: np.ndarray, observed: np.ndarray, max_age: int
    ) -> tuple[Detections, np.ndarray, np.ndarray]:
        """Without a tracker: the last frame's boxes that no tile run this frame holds whole (and no detection of
        their class overlaps), carried over with their scores and stamps, for at most `max_age` frames."""
        looked = inside_any(state.boxes, observed)
        keep = ~looked & (state.unseen + 1 < max_age)
        i, _, iou = overlapping(state.boxes, found.boxes, state.class_ids, found.class_ids)
        keep[i[iou >= CARRIED_IOU]] = False
        boxes = np.concatenate([found.boxes, state.boxes[keep]]).astype(np.float32)
        scores = np.concatenate([found.scores, state.scores[keep]]).astype(np.float32)
        class_ids = np.concatenate([found.class_ids, state.class_ids[keep]]).astype(np.int64)
        return (
            Detections(boxes, scores, class_ids, found.timings),
            np.concatenate([seen, state.seen_ns[keep]]),
            np.concatenate([np.zeros(len(found), np.int64), state.unseen[keep] + 1]),
        )
