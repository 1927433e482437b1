"""Camera-motion estimation (`tracking.motion`): the estimate against the true motion of robot-like camera paths,
its checks, frames of any shape, a camera's state, and the estimate on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.transforms import compose
from tiled_detector.tools.worlds.synthetic import (
    MotionStyle,
    camera_views,
    frame_motion,
    make_scene,
    make_sequence,
)
from tiled_detector.tracking import motion
from tiled_detector.tracking.geometry import corner_error

W, H = 960, 540
ROBOT = MotionStyle(pan=4.0, rotate=0.1, shake=2.0)


def estimates(camera: MotionStyle, frames: int = 5, size: tuple[int, int] = (W, H), seed: int = 3):
    """(measured, true) per frame after the first, through `CameraMotion` as the stream drives it."""
    tracker, estimator = motion.CameraMotion(), motion.Estimator()
    out = []
    for t, scene in enumerate(make_sequence(seed, frames, *size, camera)):
        tracker.observe(torch.from_numpy(scene.image), estimator)
        measured = tracker.measured()
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
        assert corner_error(measured.matrix, true, (H, W)) < 1.0
        assert corner_error(motion.IDENTITY, true, (H, W)) > 2.0


def test_a_still_camera_is_the_identity() -> None:
    for measured, true in estimates(MotionStyle()):
        assert np.array_equal(true, motion.IDENTITY) and np.array_equal(measured.matrix, motion.IDENTITY)


def test_no_texture_and_a_cut_fall_back_to_the_identity() -> None:
    """A flat frame (a covered lens) and a cut to another scene fail the checks: the identity, counted as a
    fallback; the next good pair is estimated again."""
    tracker, estimator = motion.CameraMotion(), motion.Estimator()
    scenes = [
        make_scene(1, W, H).image,
        np.full((H, W, 3), 90, np.uint8),
        make_scene(1, W, H).image,
        make_scene(2, W, H).image,
    ]
    results = []
    for image in scenes:
        tracker.observe(torch.from_numpy(image), estimator)
        results.append(tracker.measured())
    assert [(r.estimated, r.fallback) for r in results] == [
        (False, False),
        (True, True),
        (True, True),
        (True, True),
    ]
    assert all(np.array_equal(r.matrix, motion.IDENTITY) for r in results)


def test_a_new_size_starts_the_estimate_over_and_a_retried_frame_replaces_the_one_observed() -> None:
    tracker, estimator = motion.CameraMotion(), motion.Estimator()
    frames = [s.image for s in make_sequence(3, 3, W, H, ROBOT)]
    small = frames[2][: H // 2, : W // 2].copy()
    for image, estimated in ((frames[0], False), (frames[1], True), (small, False), (small, True)):
        tracker.observe(torch.from_numpy(image), estimator)
        assert tracker.measured().estimated == estimated
    # a frame observed and not measured (its batch failed) is replaced by its retry: the estimate is between the
    # last frame measured and the retried one, not between the two observations
    tracker, truth = motion.CameraMotion(), list(make_sequence(3, 3, W, H, ROBOT))
    tracker.observe(torch.from_numpy(truth[0].image), estimator)
    tracker.measured()
    tracker.observe(torch.from_numpy(truth[1].image), estimator)  # failed
    tracker.observe(torch.from_numpy(truth[1].image), estimator)  # the retry
    again = tracker.measured()
    assert again.estimated and corner_error(again.matrix, truth[1].camera, (H, W)) < 1.0
    with pytest.raises(RuntimeError, match="without a frame observed"):
        tracker.measured()


@pytest.mark.parametrize(("height", "width", "fits"), [(480, 3840, True), (48, 64, False)])
def test_thin_and_tiny_frames_are_estimated_where_patches_fit_and_else_fall_back(height, width, fits) -> None:
    """A 3840 x 480 camera keeps patches by a smaller thumbnail scale and is estimated; a 64 x 48 frame holds none:
    the identity, counted as a fallback, never an error."""
    scene = make_sequence(5, 3, width, height, MotionStyle(pan=3.0))
    tracker, estimator = motion.CameraMotion(), motion.Estimator()
    results = []
    for frame in scene:
        tracker.observe(torch.from_numpy(frame.image), estimator)
        results.append(tracker.measured())
    assert [r.estimated for r in results] == [False, True, True]
    assert all(r.fallback != fits for r in results[1:])
    if not fits:
        assert all(np.array_equal(r.matrix, motion.IDENTITY) for r in results)


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
        estimators = {d: motion.Estimator() for d in ("cpu", "cuda")}
        cameras = {(d, c): motion.CameraMotion() for d in ("cpu", "cuda") for c in ("a", "b")}
        for scene in scenes:
            for (device, camera), tracker in cameras.items():
                image = scene.image if camera == "a" else scene.image[::-1].copy()
                tracker.observe(torch.from_numpy(image).to(device), estimators[device])
            for camera in ("a", "b"):
                on_cpu, on_gpu = (cameras[d, camera].measured() for d in ("cpu", "cuda"))
                assert (
                    np.allclose(on_cpu.matrix, on_gpu.matrix, atol=0.05)
                    and on_cpu.fallback == on_gpu.fallback
                )
        assert len(estimators["cuda"]._captured) == 1
