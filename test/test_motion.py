"""Camera-motion compensation: the estimate against the true motion of robot-like camera paths, its checks and
reset rules, the geometry that moves boxes and tiles, the tracker's warp, the schedule's new view and the
alternatives, and the stream with a moving camera."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.tools.synthetic import MotionStyle, camera_views, frame_motion, make_scene, make_sequence
from tiled_detector.tracking import motion
from tiled_detector.tracking.bytetrack import ByteTrack, TrackerSettings
from tiled_detector.tracking.schedule import ScheduleKind, alternative, schedule

W, H = 960, 540
ROBOT = MotionStyle(pan=4.0, rotate=0.1, shake=2.0)


def compose(first: np.ndarray, then: np.ndarray) -> np.ndarray:
    """The (2, 3) transform that applies `first`, then `then`."""
    return (np.vstack([then, [0, 0, 1]]) @ np.vstack([first, [0, 0, 1]]))[:2]


def similarity(scale: float, degrees: float, tx: float, ty: float) -> np.ndarray:
    a, b = scale * math.cos(math.radians(degrees)), scale * math.sin(math.radians(degrees))
    return np.array([[a, -b, tx], [b, a, ty]])


def estimates(camera: MotionStyle, frames: int = 5, size: tuple[int, int] = (W, H), seed: int = 3):
    """(measured, true) per frame after the first, through `CameraMotion` as the stream drives it."""
    tracker = motion.CameraMotion()
    out = []
    for t, scene in enumerate(make_sequence(seed, frames, *size, camera)):
        tracker.observe("cam", torch.from_numpy(scene.image), t * 33_000_000, 1.0)
        measured = tracker.measured("cam")
        if t:
            out.append((measured, scene.camera))
    return out


@pytest.mark.parametrize(
    "camera",
    [ROBOT, MotionStyle(pan=-6.0, rotate=-0.5, zoom=1.01, shake=3.0), MotionStyle(pan=25.0, rotate=1.0)],
    ids=["robot", "turning-forward", "fast-pan"],
)
def test_the_estimate_follows_robot_like_camera_motion(camera: MotionStyle) -> None:
    """Within a pixel of the true motion at the frame's corners, where the identity is off by many."""
    for measured, true in estimates(camera):
        assert measured.estimated and not measured.fallback
        assert motion.corner_error(measured.matrix, true, (H, W)) < 1.0
        assert motion.corner_error(motion.IDENTITY, true, (H, W)) > 2.0


def test_a_still_camera_is_the_identity() -> None:
    for measured, true in estimates(MotionStyle()):
        assert np.array_equal(true, motion.IDENTITY) and np.array_equal(measured.matrix, motion.IDENTITY)


def test_no_texture_and_a_cut_fall_back_to_the_identity() -> None:
    """A flat frame (a covered lens) and a cut to another scene fail the checks: the identity, counted as a
    fallback; the next good pair is estimated again."""
    tracker = motion.CameraMotion()
    scenes = [make_scene(1, W, H).image, np.full((H, W, 3), 90, np.uint8), make_scene(1, W, H).image,
              make_scene(2, W, H).image]  # fmt: skip
    results = []
    for t, image in enumerate(scenes):
        tracker.observe("cam", torch.from_numpy(image), t * 33_000_000, 1.0)
        results.append(tracker.measured("cam"))
    assert [(r.estimated, r.fallback) for r in results] == [
        (False, False),
        (True, True),
        (True, True),
        (True, True),
    ]
    assert all(np.array_equal(r.matrix, motion.IDENTITY) for r in results)


def test_a_new_size_or_a_restart_starts_the_estimate_over(caplog: pytest.LogCaptureFixture) -> None:
    tracker = motion.CameraMotion()
    frames = [s.image for s in make_sequence(3, 3, W, H, ROBOT)]
    caplog.set_level(logging.INFO, logger=motion.__name__)
    small = frames[2][: H // 2, : W // 2].copy()
    steps = [(frames[0], 0), (frames[1], 33), (small, 66), (small, 10), (frames[0], 2000), (frames[1], 2033)]
    for image, ms in steps:
        tracker.observe("cam", torch.from_numpy(image), ms * 1_000_000, 1.0)
        assert tracker.measured("cam").estimated == (ms in (33, 2033)), ms
    said = [r.getMessage() for r in caplog.records]
    assert any("changed size to 480x270" in line for line in said), said
    assert any("went back or jumped" in line for line in said), said
    tracker.reset()
    assert np.array_equal(tracker.predicted("cam"), motion.IDENTITY)


def test_synthetic_camera_motion_composes_into_the_views() -> None:
    views = camera_views(ROBOT, 6, W, H, 3)
    steps = frame_motion(views)
    for t in range(1, 6):
        assert np.allclose(compose(views[t - 1][:2], steps[t]), views[t][:2])
    with pytest.raises(ValueError, match="--zoom"):
        MotionStyle(zoom=-1.0)
    with pytest.raises(ValueError, match="--rotate"):
        MotionStyle(rotate=30.0)
    with pytest.raises(ValueError, match="--shake"):
        MotionStyle(shake=-1.0)


transforms = st.builds(
    similarity, st.floats(0.9, 1.1), st.floats(-5, 5), st.floats(-50, 50), st.floats(-50, 50)
)
boxes = st.lists(
    st.tuples(st.floats(0, 1000), st.floats(0, 1000), st.floats(1, 200), st.floats(1, 200)),
    min_size=1,
    max_size=8,
).map(lambda rows: np.array([[x, y, x + w, y + h] for x, y, w, h in rows]))


@settings(max_examples=60, deadline=None)
@given(transforms, transforms, boxes)
def test_moving_boxes_composes(first: np.ndarray, then: np.ndarray, rows: np.ndarray) -> None:
    """Moving boxes by one motion then another is moving them by the composed motion; centres move as points and
    sizes scale."""
    direct = motion.move_boxes(compose(first, then), rows)
    assert np.allclose(motion.move_boxes(then, motion.move_boxes(first, rows)), direct, atol=1e-6)
    centres = motion.move_points(first, (rows[:, :2] + rows[:, 2:]) / 2)
    moved = motion.move_boxes(first, rows)
    assert np.allclose((moved[:, :2] + moved[:, 2:]) / 2, centres, atol=1e-6)
    assert np.allclose(
        moved[:, 2:] - moved[:, :2], (rows[:, 2:] - rows[:, :2]) * motion.similarity_scale(first)
    )


def test_new_view_is_the_strip_that_entered() -> None:
    """A pan of 64 px to the right (content moves left) brings in a 64-px strip at the right edge."""
    tiles = np.array([[0, 0, 640, 640], [1280, 0, 1920, 640], [640, 400, 1280, 1080]], np.float64)
    fresh = motion.new_view(tiles, similarity(1.0, 0.0, -64.0, 0.0), (1080, 1920))
    assert fresh[0] == 0 and fresh[2] == 0 and 0.08 < fresh[1] < 0.13
    assert np.all(motion.new_view(tiles, motion.IDENTITY, (1080, 1920)) == 0)


def test_the_tracker_moves_with_the_camera() -> None:
    """A track warped by the camera's motion lands where the object is in the new frame's pixels; its velocity
    turns with it, its height and variances scale."""
    tracker = ByteTrack(TrackerSettings())
    box = np.array([[100.0, 200.0, 140.0, 260.0]])
    for step in range(3):
        tracker.update(box + np.array([5.0, 0, 5.0, 0]) * step, np.array([0.9]), np.array([0]), 1 / 30)
    before = tracker.table.copy()
    turn = similarity(1.1, 90.0, 10.0, -20.0)
    tracker.warp(turn)
    after = tracker.table
    assert np.allclose(after[0, :2], motion.move_points(turn, before[:, :2])[0])
    assert np.allclose(after[0, 4:6], before[0, 4:6] @ turn[:, :2].T)
    assert np.isclose(after[0, 3], before[0, 3] * 1.1) and np.isclose(after[0, 2], before[0, 2])
    # a quarter turn swaps the variances of x and y (and scales them)
    assert np.isclose(after[0, 11], before[0, 8] * 1.21) and np.isclose(after[0, 8], before[0, 11] * 1.21)
    still = ByteTrack(TrackerSettings())
    still.update(box, np.array([0.9]), np.array([0]), 1 / 30)
    kept = still.table.copy()
    still.warp(motion.IDENTITY)
    assert np.array_equal(still.table, kept)


def test_new_view_runs_after_the_due_tiles_and_before_the_claimed() -> None:
    ages = np.array([4, 1, 1, 1, 1, 1])
    claimed = np.array([0, 3, 0, 0, 0, 0])
    fresh = np.array([0, 0, 0.5, 0, 0.05, 0])
    assert schedule(ages, claimed, 2, 4, fresh).tolist() == [0, 2]
    assert schedule(ages, claimed, 3, 4, fresh).tolist() == [0, 1, 2]
    assert schedule(ages, claimed, 2, 4).tolist() == [0, 1]


def test_the_alternatives_run_the_same_tiles_per_frame() -> None:
    """Every tile on one frame in k, none between (k = 32 / 12 = 2.67: gaps of 2 and 3 frames); round robin visits
    every tile in turn; both at the budget's mean tiles per frame."""
    tiles, budget = 32, 8
    interval = [alternative(ScheduleKind.INTERVAL, f, tiles, budget) for f in range(8)]
    assert [len(x) for x in interval] == [0, 0, 0, 32, 0, 0, 0, 32]
    uneven = [len(alternative(ScheduleKind.INTERVAL, f, tiles, 12)) for f in range(8)]
    assert uneven == [0, 0, 32, 0, 0, 32, 0, 32] and sum(uneven) == 8 * 12
    rounds = [alternative(ScheduleKind.ROUND_ROBIN, f, tiles, budget) for f in range(4)]
    assert all(len(r) == budget for r in rounds) and sorted(np.concatenate(rounds).tolist()) == list(
        range(32)
    )
    with pytest.raises(ValueError, match="not an alternative"):
        alternative(ScheduleKind.TRACKS, 0, tiles, budget)


@pytest.mark.gpu
def test_the_estimate_on_the_gpu_equals_the_cpu() -> None:
    """The same motion on both devices, eager and replayed from its captured graph (per thumbnail shape and scale:
    1080p and 4K frames give thumbnails of one shape), for two cameras in turn."""
    for size in ((1920, 1080), (3840, 2160)):
        scenes = list(make_sequence(3, 3, *size, ROBOT))
        thumbs = {
            d: [motion.thumbnail(torch.from_numpy(s.image).to(d)) for s in scenes] for d in ("cpu", "cuda")
        }
        factor = motion.thumb_factor(size[1], size[0])
        cpu = motion.estimate(*thumbs["cpu"][:2], factor)
        gpu = motion.estimate(*thumbs["cuda"][:2], factor)
        assert torch.allclose(cpu[0], gpu[0].cpu(), atol=0.05) and bool(cpu[1]) == bool(gpu[1].cpu())
        trackers = {d: motion.CameraMotion() for d in ("cpu", "cuda")}
        for t, scene in enumerate(scenes):
            for device, tracker in trackers.items():
                for camera in ("a", "b"):
                    frame = torch.from_numpy(scene.image if camera == "a" else scene.image[::-1].copy()).to(
                        device
                    )
                    tracker.observe(camera, frame, t * 33_000_000, 1.0)
            for camera in ("a", "b"):
                on_cpu, on_gpu = (trackers[d].measured(camera) for d in ("cpu", "cuda"))
                assert (
                    np.allclose(on_cpu.matrix, on_gpu.matrix, atol=0.05)
                    and on_cpu.fallback == on_gpu.fallback
                )
        assert len(trackers["cuda"]._captured) == 1
