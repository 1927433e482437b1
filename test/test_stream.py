"""The stream over the detector (`stream.Stream`): the tile budget's schedule per camera, its reset rules, and the
boxes reported from an earlier frame."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tiled_detector import TiledDetector
from tiled_detector.pipeline.depth import DepthImage, Intrinsics
from tiled_detector.stream import Job, Stream, budget_problem, looks
from tiled_detector.tools.worlds.synthetic import make_scene, make_sequence
from tiled_detector.tracking.geometry import inside_any
from tiled_detector.types import Detections

FRAME_NS = 33_333_333


@pytest.fixture(scope="module")
def detector():
    return TiledDetector(backend="onnxruntime")


@pytest.fixture(scope="module")
def sequence():
    return list(make_sequence(3, 8, 1280, 720))


def _spy(stream: Stream, monkeypatch: pytest.MonkeyPatch) -> list:
    """The tiles each frame asked the detector for (None: every tile)."""
    asked, detect_many = [], stream.detector.detect_many

    def spied(frames, encodings, slots, cameras, tiles, on_device=None):
        asked.append(tiles[0])
        return detect_many(frames, encodings, slots, cameras, tiles, on_device)

    monkeypatch.setattr(stream.detector, "detect_many", spied)
    return asked


@pytest.mark.parametrize("tracker", ["none", "bytetrack"])
def test_a_budget_covering_every_tile_equals_full_tiling(detector, sequence, tracker):
    tiles = detector.plan_for(720, 1280).num_tiles
    full = Stream(detector.with_config(tracker=tracker))
    budget = Stream(detector.with_config(tracker=tracker, tile_budget=tiles))
    for index, scene in enumerate(sequence):
        a = full.process([scene.image], [index * FRAME_NS], ["cam"])[0]
        b = budget.process([scene.image], [index * FRAME_NS], ["cam"])[0]
        np.testing.assert_array_equal(a.detections.boxes, b.detections.boxes)
        np.testing.assert_array_equal(a.detections.scores, b.detections.scores)
        assert (a.track_ids is None) == (b.track_ids is None)
        if a.track_ids is not None:
            np.testing.assert_array_equal(a.track_ids, b.track_ids)
        assert a.views == b.views == tiles + 1 and b.predicted == 0


@pytest.mark.parametrize("tracker", ["none", "bytetrack"])
def test_a_budget_runs_its_tiles_after_the_history_and_keeps_the_age_bound(
    detector, sequence, tracker, monkeypatch
):
    stream = Stream(detector.with_config(tracker=tracker, tile_budget=2, max_tile_age=3))
    asked = _spy(stream, monkeypatch)
    tiles = detector.plan_for(720, 1280).num_tiles  # 6 tiles: 2 a frame keeps an age of 3
    history = 2 if tracker == "bytetrack" else 1
    last_ran = np.zeros(tiles, int)
    for index, scene in enumerate(sequence):
        result = stream.process([scene.image], [index * FRAME_NS], ["cam"])[0]
        if index < history:
            assert asked[-1] is None and result.views == tiles + 1 and result.notes
            last_ran[:] = index
            continue
        assert len(asked[-1]) == 2 and result.views == 3 and not result.notes
        last_ran[asked[-1]] = index
        assert (index - last_ran).max() < 3  # every tile ran within the last 3 frames
        # boxes from tiles not run carry the stamp they were seen at; the rest this frame's
        assert set(np.unique(result.seen_ns)) <= {i * FRAME_NS for i in range(index + 1)}
    assert result.predicted > 0


def test_a_box_at_an_inner_edge_of_a_tile_run_is_not_seen_whole(detector):
    """Under a budget a box is seen whole inside a tile run less the seam margin along its inner edges (there it may
    be the part of an object that goes on in a tile not run); along the frame's edges there is no margin, and a box
    (a track's prediction) reaching out of the frame is seen by the tile its visible part is in."""
    plan = detector.plan_for(720, 1280)
    x1, y1, x2, y2 = plan.tiles[0].tolist()
    assert (x1, y1) == (0, 0) and x2 < 1280 and y2 < 720
    boxes = np.array(
        [
            [x2 - 30, 100, x2 - 1, 130],
            [100, y2 - 30, 130, y2 - 2],
            [x2 - 40, 100, x2 - 10, 130],
            [0, 0, 30, 30],
            [-12, 100, 18, 130],
        ],
        float,
    )
    assert looks(plan, np.array([0])).held(boxes).tolist() == [False, False, True, True, True]
    assert inside_any(boxes, plan.tiles[:1].astype(float)).tolist() == [True] * 4 + [False]


def test_a_box_cut_by_the_edge_of_a_tile_run_does_not_reach_the_tracker(detector, sequence, monkeypatch):
    """A box touching the inner edge of the one tile run (the part of an object whose rest is in a tile not run) is
    left out of the frame's answer; the same box clear of that edge is reported (a new track, confirmed at once)."""
    stream = Stream(detector.with_config(tracker="bytetrack", tile_budget=1, max_tile_age=6))
    plan, detect_many, added = detector.plan_for(720, 1280), stream.detector.detect_many, []

    def with_box(frames, encodings, slots, cameras, tiles, on_device=None):
        found = detect_many(frames, encodings, slots, cameras, tiles, on_device)
        if tiles[0] is None:
            return found
        x1, y1, x2, _ = plan.tiles[tiles[0][0]].tolist()
        clear = 20 * len(added)  # the first box touches a seam of the tile, the second stands clear of it
        # its right edge: at the tile's right seam or left
        seam = x2 - 1 - clear if x2 < 1280 else x1 + 24 + clear
        added.append(np.array([seam - 23, y1 + 200, seam, y1 + 230], np.float32))
        return [
            Detections(
                np.concatenate([f.boxes, added[-1][None]]),
                np.append(f.scores, np.float32(0.95)),
                np.append(f.class_ids, 0),
                f.timings,
            )
            for f in found
        ]

    monkeypatch.setattr(stream.detector, "detect_many", with_box)
    for index, scene in enumerate(sequence[:4]):
        result = stream.process([scene.image], [index * FRAME_NS], ["cam"])[0]
        if index < 2:
            continue
        reported = np.abs(result.detections.boxes - added[-1]).max(axis=1) < 1.0
        assert reported.any() == (index == 3), index


def test_without_a_tracker_a_box_in_a_tile_not_run_is_carried_with_its_stamp(detector):
    stream = Stream(detector.with_config(tile_budget=2, max_tile_age=4))
    frame = make_scene(3, 1920, 1080).image  # 8 tiles, 2 run
    first = stream.process([frame], [0], ["cam"])[0]
    second = stream.process([frame], [FRAME_NS], ["cam"])[0]  # the same frame: nothing moved
    carried = second.seen_ns == 0
    assert carried.any() and second.predicted == carried.sum()
    kept = {tuple(b) for b in first.detections.boxes.round(2).tolist()}
    assert {tuple(b) for b in second.detections.boxes[carried].round(2).tolist()} <= kept


def test_reset_rules_run_every_tile_again(detector, sequence, monkeypatch):
    stream = Stream(detector.with_config(tile_budget=2, max_tile_age=3))
    asked = _spy(stream, monkeypatch)
    frame = sequence[0].image
    for stamp in (0, 1, 2):
        stream.process([frame], [stamp * FRAME_NS], ["cam"])
    assert asked == [None, asked[1], asked[2]] and asked[1] is not None
    stream.process([frame], [FRAME_NS], ["cam"])  # stamps went back
    assert asked[-1] is None
    stream.process([frame], [60 * FRAME_NS], ["cam"])  # a gap longer than lost_track_buffer (1 s)
    assert asked[-1] is None
    stream.process([frame], [61 * FRAME_NS], ["cam"])
    assert asked[-1] is not None
    stream.process([frame[:640]], [62 * FRAME_NS], ["cam"])  # another frame size: another plan
    assert asked[-1] is None
    stream.process([frame[:640]], [63 * FRAME_NS], ["other"])  # another camera has its own history
    assert asked[-1] is None
    stream.detector.update(overlap=0.3)  # a tile setting: every camera starts over
    stream.process([frame[:640]], [64 * FRAME_NS], ["cam"])
    assert asked[-1] is None
    stream.detector.update(overlap=0.2)


def test_budgets_that_cannot_keep_the_age_or_exceed_the_tiles_are_said_once(detector, caplog):
    plan = detector.plan_for(2160, 3840)  # 32 tiles
    assert budget_problem(plan, 4, 4) == (
        "tile_budget 4 cannot run each of the 32 tiles of a 3840x2160 frame at least once every 4 frames "
        "(max_tile_age): the smallest that can is 8"
    )
    assert budget_problem(plan, 8, 4) is None and budget_problem(plan, 0, 4) is None
    with caplog.at_level(logging.INFO, logger="tiled_detector.stream"):
        low = Stream(detector.with_config(tile_budget=4))
        assert low.budget_for(plan) == 8 and low.budget_for(plan) == 8
        high = Stream(detector.with_config(tile_budget=50))
        assert high.budget_for(plan) == 32
    warned = [r for r in caplog.records if "the smallest that can is 8; running 8" in r.getMessage()]
    clamped = [r for r in caplog.records if "every tile runs" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert len(clamped) == 1 and clamped[0].levelno == logging.INFO


def _run(stream: Stream, scenes: list) -> list:
    return [stream.process([s.image], [i * FRAME_NS], ["cam"])[0] for i, s in enumerate(scenes)]


def test_a_moving_camera_keeps_its_identities_with_motion_compensation(detector):
    """The camera turns fast (a robot turning on the spot): moved by the estimated motion, the tracks keep their
    objects (IDF1 above, identity switches at most, those without compensation; switches within 2x of the still
    camera's); every frame's motion is estimated."""
    from tiled_detector.tools.scoring import mot_metrics
    from tiled_detector.tools.worlds.synthetic import MotionStyle

    moving = list(make_sequence(4, 16, 1280, 720, MotionStyle(pan=30.0, rotate=1.0, shake=4.0)))
    still = list(make_sequence(4, 16, 1280, 720))

    def scores(scenes: list, compensation: str) -> tuple[dict, list]:
        results = _run(
            Stream(detector.with_config(tracker="bytetrack", motion_compensation=compensation)), scenes
        )
        truth = [(s.boxes, s.ids) for s in scenes]
        return mot_metrics(truth, [(r.detections.boxes, r.track_ids) for r in results]), results

    compensated, results = scores(moving, "image")
    uncompensated, plain = scores(moving, "none")
    assert compensated["IDF1"] > uncompensated["IDF1"] + 0.05, (compensated, uncompensated)
    assert compensated["id_switches"] <= uncompensated["id_switches"]
    assert compensated["id_switches"] <= 2 * max(scores(still, "image")[0]["id_switches"], 1)
    assert (
        all(r.motion.estimated and not r.motion.fallback for r in results[1:])
        and not results[0].motion.estimated
    )
    assert all(r.motion is None for r in plain)


def test_a_still_camera_gives_the_same_output_with_and_without_compensation(detector, sequence):
    for tracker, budget in (("bytetrack", 0), ("none", 2)):
        changes = {"tracker": tracker, "tile_budget": budget, "max_tile_age": 3}
        image = _run(Stream(detector.with_config(motion_compensation="image", **changes)), sequence)
        none = _run(Stream(detector.with_config(motion_compensation="none", **changes)), sequence)
        for a, b in zip(image, none, strict=True):
            np.testing.assert_array_equal(a.detections.boxes, b.detections.boxes)
            assert a.views == b.views


def test_a_frame_the_motion_cannot_be_estimated_in_is_counted_and_the_stream_goes_on(detector, sequence):
    """A flat frame (a covered lens) between moving ones: its motion falls back to the identity (counted by the
    node), the stream answers every frame, and the next frames are estimated again."""
    frames = (
        [s.image for s in sequence[:3]]
        + [np.full_like(sequence[0].image, 80)]
        + [s.image for s in sequence[3:6]]
    )
    stream = Stream(detector.with_config(tracker="bytetrack", tile_budget=3, max_tile_age=4))
    results = [stream.process([f], [i * FRAME_NS], ["cam"])[0] for i, f in enumerate(frames)]
    assert [r.motion.fallback for r in results] == [False, False, False, True, True, False, False]
    assert all(len(r.detections.boxes) for i, r in enumerate(results) if i != 3)


def test_without_a_tracker_or_a_budget_no_motion_is_estimated(detector, sequence, monkeypatch):
    asked = []
    detect_many = detector.detect_many

    def spied(*args):
        asked.append(args[5])
        return detect_many(*args)

    monkeypatch.setattr(detector, "detect_many", spied)
    results = _run(Stream(detector), sequence[:2])
    assert asked == [None, None] and all(r.motion is None for r in results)


def test_a_frame_of_many_views_runs_in_parts_and_finds_what_the_whole_frame_does(detector):
    """view_cap 4 on a 1080p frame (8 tiles + the full view): three parts (3 + 3 + 2 tiles, each with the full
    view), no result until the last; the merged parts find what one run finds; a small camera in the same calls is
    answered every time; a new frame of the camera gives up the half-run one."""
    from tiled_detector.tools.scoring import box_iou

    big, small = make_scene(21, 1920, 1080).image, make_scene(22, 640, 480).image
    whole = detector.detect(big)
    stream = Stream(detector)
    jobs = [Job("big", big, 5, sequence=1), Job("small", small, 5, sequence=1)]
    steps = [stream.run(jobs, view_cap=4) for _ in range(3)]
    assert [s[0].result is None for s in steps] == [True, True, False]
    assert all(s[1].result is not None for s in steps)
    assert [s[0].views for s in steps] == [4, 4, 3] and not stream.continuing()
    parts = steps[-1][0].result
    assert parts.views == 3 + 1 + 3 + 1 + 2 + 1 and parts.notes == ("run in 3 parts of at most 4 views",)
    iou = box_iou(whole.boxes.astype(np.float64), parts.detections.boxes.astype(np.float64))
    same_class = whole.class_ids[:, None] == parts.detections.class_ids[None, :]
    found = (np.where(same_class, iou, 0).max(axis=1) >= 0.7).mean()
    assert (
        found >= 0.95 and abs(len(parts.detections.boxes) - len(whole.boxes)) <= 0.05 * len(whole.boxes) + 2
    )
    assert stream.run([jobs[0]], view_cap=4)[0].result is None and stream.continuing() == [jobs[0]]
    newer = Job("big", big, 6, sequence=2)
    assert stream.run([newer], view_cap=4)[0].result is None  # a newer frame starts over
    assert stream.continuing() == [newer]
    stream.give_up("big")
    assert not stream.continuing() and stream.process([big], [7], ["big"])[0].views == 9


def test_one_rule_starts_a_camera_over_by_value(detector, sequence, caplog):
    """The record follows the plan's value: a plan rebuilt alike (a cache evicted) continues; a roi, a frame size,
    a setting of what is tracked, stamps back start it over, tracks with it (their ids go on counting up)."""
    from tiled_detector.pipeline import tiling

    stream = Stream(detector.with_config(tracker="bytetrack"))
    frame = sequence[0].image
    plan = stream.detector.plan_for(720, 1280)
    assert stream.starts_over("cam", plan, 0) is None  # no record yet: nothing to start over
    first = stream.process([frame], [0], ["cam"])[0].track_ids
    tiling._make_plan.cache_clear()  # the same plan, rebuilt: not a change
    assert stream.detector.plan_for(720, 1280) is not plan
    assert stream.starts_over("cam", stream.detector.plan_for(720, 1280), FRAME_NS) is None
    again = stream.process([frame], [FRAME_NS], ["cam"])[0].track_ids
    assert set(again) == set(first)
    assert "stamps went back" in stream.starts_over("cam", plan, 0)
    assert "jumped" in stream.starts_over("cam", plan, 5 * 10**9)
    roi = stream.detector.with_config(roi=(0.0, 0.0, 0.5, 1.0)).plan_for(720, 1280)
    assert "plan changed" in stream.starts_over("cam", roi, 2 * FRAME_NS)
    assert "plan changed" in stream.starts_over("cam", stream.detector.plan_for(640, 1280), 2 * FRAME_NS)
    stream.detector.update(classes=("red_disc",))
    assert "what is tracked" in stream.starts_over("cam", plan, 2 * FRAME_NS)
    with caplog.at_level(logging.INFO, logger="tiled_detector.stream"):
        after = stream.process([frame], [2 * FRAME_NS], ["cam"])[0].track_ids
    assert "cam starts over: a setting that changes what is tracked changed" in caplog.text
    assert min(after) > max(first)  # new tracks, ids never given twice
    small = stream.process([frame[:360, :640]], [3 * FRAME_NS], ["cam"])[0]  # another size: no old boxes
    assert (small.detections.boxes[:, 2:] <= [640, 360]).all() and min(small.track_ids) > max(after)
    stream.detector.update(classes=None)


def test_a_plan_change_mid_frame_starts_the_frame_over(detector):
    """A roi set while a frame runs in parts: the frame starts over under the new plan, and no part of the old plan
    is merged into it."""
    big = make_scene(21, 1920, 1080).image
    stream = Stream(detector.with_config())
    job = Job("big", big, 5, sequence=1)
    assert stream.run([job], view_cap=4)[0].result is None
    stream.detector.update(roi=(0.0, 0.0, 0.5, 1.0))  # 4 tiles now
    steps = [stream.run([job], view_cap=4)[0] for _ in range(2)]
    assert [s.result is None for s in steps] == [True, False]
    assert steps[-1].result.views == stream.detector.plan_for(1080, 1920).num_tiles + 2
    assert (
        steps[-1].result.detections.boxes[:, 0] + steps[-1].result.detections.boxes[:, 2] <= 2 * 960
    ).all()
    stream.detector.update(roi=(0.0, 0.0, 1.0, 1.0))


def _with(found: list[Detections], box: list[float], score: float = 0.95) -> list[Detections]:
    return [
        Detections(
            np.concatenate([f.boxes, np.array([box], np.float32)]),
            np.append(f.scores, np.float32(score)),
            np.append(f.class_ids, 0),
            f.timings,
        )
        for f in found
    ]


def test_the_seam_rule_applies_across_the_parts_of_a_frame(detector, monkeypatch):
    """A box cut by the right edge of a tile of the first part (its rest in a tile of the second) yields to the whole
    box the second part holds, though it scores higher: without the rule the merge (NMS) would keep the piece."""
    big = make_scene(21, 1920, 1080).image
    stream = Stream(detector)
    plan = detector.plan_for(1080, 1920)
    x2 = float(plan.tiles[0][2])  # the first tile's right edge; the second tile holds the object whole
    whole, cut = [x2 - 40, 300, x2 + 20, 340], [x2 - 40, 300, x2 - 1, 340]
    detect_many = stream.detector.detect_many

    def crafted(frames, encodings, slots, cameras, tiles, on_device=None):
        found = detect_many(frames, encodings, slots, cameras, tiles, on_device)
        return _with(found, cut, 0.95) if 0 in tiles[0] else _with(found, whole, 0.7)

    monkeypatch.setattr(stream.detector, "detect_many", crafted)
    job = Job("big", big, 1, sequence=1)
    result = None
    while result is None:
        result = stream.run([job], view_cap=2)[0].result
    boxes = result.detections.boxes
    assert np.abs(boxes - np.array(whole, np.float32)).max(axis=1).min() < 1.0
    assert np.abs(boxes - np.array(cut, np.float32)).max(axis=1).min() > 1.0


def test_under_a_budget_an_object_larger_than_a_tile_is_kept_and_tracked(detector, sequence, monkeypatch):
    """A person-sized box (300 x 500 px: no 640 tile of a 1920 x 1080 frame holds it) found by the full-frame view
    is reported and keeps its track on every frame of a budget of one tile; a small box in a tile not run is not."""
    stream = Stream(detector.with_config(tracker="bytetrack", tile_budget=2, max_tile_age=4))
    big = [500.0, 200.0, 800.0, 700.0]
    frame = make_scene(3, 1920, 1080).image
    detect_many = stream.detector.detect_many

    def crafted(frames, encodings, slots, cameras, tiles, on_device=None):
        return _with(detect_many(frames, encodings, slots, cameras, tiles, on_device), big, 0.9)

    monkeypatch.setattr(stream.detector, "detect_many", crafted)
    ids = []
    for index in range(6):
        result = stream.process([frame], [index * FRAME_NS], ["cam"])[0]
        at = np.abs(result.detections.boxes - np.array(big, np.float32)).max(axis=1) < 2.0
        assert at.sum() == 1 and result.seen_ns[at][0] == index * FRAME_NS, index
        ids.append(int(result.track_ids[at][0]))
    assert len(set(ids)) == 1


@pytest.mark.parametrize("tracker", ["none", "bytetrack"])
def test_boxes_carry_the_position_of_the_frame_they_were_seen_in(detector, sequence, tracker):
    """Each frame's depth is one distance (10 m + the frame's index): a box detected in a frame is at that frame's
    distance, a box carried under the tile budget at the distance of the frame it was seen in (its seen_ns)."""
    stream = Stream(detector.with_config(tracker=tracker, tile_budget=2, max_tile_age=3))
    camera = Intrinsics(1000.0, 1000.0, 639.5, 359.5)
    carried = 0
    for index, scene in enumerate(sequence):
        depth = DepthImage(np.full((360, 640), 10.0 + index, np.float32), camera)
        result = stream.process([scene.image], [index * FRAME_NS], ["cam"], depths=[depth])[0]
        found = result.detections
        assert found.positions is not None and len(found.positions) == len(found)
        seen_at = 10.0 + result.seen_ns / FRAME_NS
        located = np.isfinite(found.positions[:, 2])
        np.testing.assert_allclose(found.positions[located, 2], seen_at[located], rtol=1e-5)
        assert located[result.seen_ns == result.stamp_ns].all()  # every box detected in the frame has one
        carried += int(np.count_nonzero(located & (result.seen_ns != result.stamp_ns)))
    assert carried > 0
    plain = Stream(detector.with_config(tracker=tracker)).process([sequence[0].image], [0], ["cam"])[0]
    assert plain.detections.positions is None  # no depth: no positions


def test_a_frame_in_parts_keeps_the_cap_it_started_under_and_runs_whole_when_it_is_lifted(detector):
    """A 1080p frame (8 tiles + the full view) started under a cap of 4 keeps parts of 4 views when the cap grows
    (not 6, and never parts of 2 views when it shrinks); a cap of 0 on a later part runs it whole at once."""
    big = make_scene(21, 1920, 1080).image
    stream = Stream(detector)
    job = Job("big", big, 5, sequence=1)
    steps = [stream.run([job], view_cap=cap)[0] for cap in (4, 6, 2)]
    assert [s.views for s in steps] == [4, 4, 3] and steps[-1].result.notes == (
        "run in 3 parts of at most 4 views",
    )
    again = Job("big", big, 6, sequence=2)
    first, whole = stream.run([again], view_cap=4)[0], stream.run([again], view_cap=0)[0]
    assert (first.views, first.result, whole.views) == (4, None, 9) and not stream.continuing()
    assert whole.result.views == 4 + 9
    assert whole.result.notes == ("run whole: the view cap was lifted after 1 part of at most 4 views",)


def test_frames_in_parts_are_told_apart_by_sequence_not_stamp(detector):
    """A camera stamping every frame alike (0): a new frame (the next sequence) starts its parts over rather than
    joining the old frame's; the same sequence continues them."""
    big, other = make_scene(21, 1920, 1080).image, make_scene(23, 1920, 1080).image
    stream = Stream(detector)
    assert stream.run([Job("big", big, 0, sequence=1)], view_cap=4)[0].result is None
    newer = Job("big", other, 0, sequence=2)
    steps = [stream.run([newer], view_cap=4)[0] for _ in range(3)]
    assert [s.views for s in steps] == [4, 4, 3]  # all of the new frame's tiles, from its first
    assert steps[-1].result.views == 8 + 3 and not stream.continuing()
    plain = stream.process([other], [0], ["big"])[0]  # a whole frame at the same stamp again: a new frame
    np.testing.assert_allclose(plain.detections.boxes, detector.detect(other).boxes, atol=1e-3)


def test_a_frame_whose_batch_raised_is_not_left_started(detector, monkeypatch):
    """Nothing changes when the detector raises: a frame whose first part was in a batch that raised (any error) is
    not left in `continuing`, and no record starts over until a frame has run."""
    big = make_scene(21, 1920, 1080).image
    stream = Stream(detector.with_config(tracker="bytetrack"))
    stream.process([big[:540, :960]], [0], ["big"])
    broken = stream.detector.detect_many

    def raising(*args, **kwargs):
        raise KeyError("something nobody expected")

    monkeypatch.setattr(stream.detector, "detect_many", raising)
    job = Job("big", big, FRAME_NS, sequence=2)
    with pytest.raises(KeyError):
        stream.run([job], view_cap=4)
    assert stream.continuing() == []
    assert "plan changed" in stream.starts_over("big", stream.detector.plan_for(1080, 1920), FRAME_NS)
    monkeypatch.setattr(stream.detector, "detect_many", broken)
    step = stream.run([job], view_cap=4)[0]
    assert step.result is None and step.started_over is not None and stream.continuing() == [job]


@pytest.mark.parametrize("tracker", ["none", "bytetrack"])
def test_a_camera_stamping_every_frame_alike_tells_carried_boxes_from_fresh_ones(detector, sequence, tracker):
    """Every frame stamped 0 (a driver without a clock): under the tile budget, boxes in tiles not run are still
    reported as carried (`fresh` False, counted in `predicted`) at the position of the frame they were seen in,
    and the boxes detected in the frame at its own (each frame's depth: 10 m + its index)."""
    stream = Stream(detector.with_config(tracker=tracker, tile_budget=2, max_tile_age=3))
    camera = Intrinsics(1000.0, 1000.0, 639.5, 359.5)
    carried = 0
    for index, scene in enumerate(sequence):
        depth = DepthImage(np.full((360, 640), 10.0 + index, np.float32), camera)
        result = stream.process([scene.image], [0], ["cam"], depths=[depth])[0]
        carried += result.predicted
        z = result.detections.positions[:, 2]
        np.testing.assert_allclose(z[result.fresh], 10.0 + index, rtol=1e-5)
        assert (z[~result.fresh & np.isfinite(z)] < 10.0 + index).all()
    assert carried > 0


def test_tracked_rotated_boxes_report_hulls_clipped_to_the_frame(monkeypatch):
    """A rotated box reaching past the frame's left edge: tracked, its reported box is its hull clipped to the frame,
    as the detector's own (was: the hull unclipped, x1 -14.3 beside the detector's 0)."""
    from tiled_detector.geometry import polygons
    from tiled_detector.models import obb_model_path

    detector = TiledDetector(
        obb_model_path(), backend="onnxruntime", tracker="bytetrack", motion_compensation="none"
    )
    obb = np.array([[5.0, 50, 40, 10, 0.6]], np.float32)
    hull = polygons.hulls(polygons.corners(obb.astype(np.float64))).clip(0, None)  # inside a 640 x 480 frame
    found = Detections(hull, np.array([0.9]), np.array([0]), {}, obb=obb)
    assert found.boxes[0, 0] == 0.0
    monkeypatch.setattr(detector, "detect_many", lambda *args, **kwargs: [found])
    stream = Stream(detector)
    frame = np.zeros((480, 640, 3), np.uint8)
    results = [stream.process([frame], [k * FRAME_NS], ["cam"])[0] for k in range(3)]
    tracked = results[-1]
    assert tracked.track_ids is not None and len(tracked.detections) == 1
    np.testing.assert_allclose(tracked.detections.boxes, found.boxes, atol=0.05)
    assert tracked.detections.boxes.min() >= 0.0
