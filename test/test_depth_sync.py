"""Tests for tiled_detector.streaming.depth_sync: colour frames paired with depth images by stamp (nearest within the
tolerance), the latest camera info, waiting for a depth image that may still come, and why a frame has none."""

from __future__ import annotations

import threading
import time

import pytest

from tiled_detector.streaming.depth_sync import QUEUE, DepthSync, Unpaired

MS = 1_000_000  # nanoseconds


def _sync(cameras: int = 1) -> DepthSync:
    sync = DepthSync(cameras)
    for camera in range(cameras):
        sync.add_info(camera, f"info {camera}")
    return sync


def test_the_nearest_depth_within_the_tolerance_is_paired() -> None:
    sync = _sync()
    for stamp in (0, 33, 66, 100):
        sync.add_depth(0, stamp * MS, f"depth {stamp}")
    pairing = sync.pair(0, 70 * MS, 0.02)
    assert (pairing.depth, pairing.info, pairing.cause) == ("depth 66", "info 0", None)
    assert pairing.offset_s == pytest.approx(-0.004)
    assert sync.pair(0, 86 * MS, 0.014).depth == "depth 100"  # 14 ms: on the tolerance
    assert sync.pair(0, 83 * MS, 0.016).cause is Unpaired.NOT_WITHIN_TOLERANCE  # 17 ms from both


def test_stamps_never_within_the_tolerance_say_how_far_the_nearest_is() -> None:
    sync = _sync()
    sync.add_depth(0, 1000 * MS, "late clock")
    pairing = sync.pair(0, 1500 * MS, 0.02)
    assert pairing.depth is None and pairing.cause is Unpaired.NOT_WITHIN_TOLERANCE
    assert pairing.text == (
        "the nearest depth image is -0.500 s from the colour frame's stamp (depth_sync_tolerance 0.02 s)"
    )


def test_no_camera_info_or_no_depth_yet_is_said() -> None:
    sync = DepthSync(1)
    sync.add_depth(0, 0, "depth")
    assert sync.pair(0, 0, 0.02).cause is Unpaired.NO_CAMERA_INFO
    assert _sync().pair(0, 0, 0.02).cause is Unpaired.NO_DEPTH
    sync.add_info(0, "first")
    sync.add_info(0, "second")
    assert sync.pair(0, 0, 0.02).info == "second"  # the latest


def test_a_depth_image_after_its_colour_frame_is_waited_for() -> None:
    sync = _sync()
    sync.add_depth(0, 0, "previous")
    timer = threading.Timer(0.05, sync.add_depth, (0, 33 * MS, "this frame's"))
    timer.start()
    start = time.monotonic()
    pairing = sync.pair(0, 33 * MS, 0.02, wait_s=2.0)
    assert pairing.depth == "this frame's" and time.monotonic() - start < 1.0
    timer.join()


def test_no_wait_once_a_newer_depth_image_is_there_or_after_a_wait_ran_out() -> None:
    sync = _sync()
    sync.add_depth(0, 500 * MS, "newer than the window")
    start = time.monotonic()
    assert sync.pair(0, 0, 0.02, wait_s=2.0).cause is Unpaired.NOT_WITHIN_TOLERANCE
    assert time.monotonic() - start < 0.5  # none can come any more: no wait
    other = _sync()
    other.add_depth(0, 0, "a second behind")
    start = time.monotonic()
    assert other.pair(0, 1000 * MS, 0.02, wait_s=0.2).cause is Unpaired.NOT_WITHIN_TOLERANCE
    assert time.monotonic() - start >= 0.2  # waited once
    start = time.monotonic()
    assert other.pair(0, 1033 * MS, 0.02, wait_s=0.2).cause is Unpaired.NOT_WITHIN_TOLERANCE
    assert time.monotonic() - start < 0.1  # and not again until the camera pairs
    other.add_depth(0, 1066 * MS, "in step again")
    assert other.pair(0, 1066 * MS, 0.02, wait_s=0.2).depth == "in step again"


def test_the_queue_is_bounded_and_cameras_are_apart() -> None:
    sync = _sync(2)
    for index in range(QUEUE + 1):
        sync.add_depth(0, index * 33 * MS, index)
    assert sync.pair(0, 0, 0.02).cause is Unpaired.NOT_WITHIN_TOLERANCE  # the first one left the queue
    assert sync.pair(0, 33 * MS, 0.02).depth == 1
    assert sync.pair(1, 33 * MS, 0.02).cause is Unpaired.NO_DEPTH


def test_of_two_depth_images_as_near_the_newer_is_paired() -> None:
    """A camera stamping every frame alike (0, or a paused sim clock): each frame gets the latest depth image."""
    sync = _sync()
    sync.add_depth(0, 0, "first")
    assert sync.pair(0, 0, 0.02).depth == "first"
    sync.add_depth(0, 0, "latest")
    assert sync.pair(0, 0, 0.02).depth == "latest"
    sync.add_depth(0, 10 * MS, "10 ms after")
    sync.add_depth(0, 30 * MS, "10 ms before")  # equally near a colour stamp of 20 ms: the newer
    assert sync.pair(0, 20 * MS, 0.02).depth == "10 ms before"


def test_after_the_stamps_go_back_a_depth_image_after_its_colour_frame_is_waited_for() -> None:
    """A looped bag: the colour frame of the new loop comes before its depth image, while the queue holds the end
    of the last loop (stamps far ahead): it waits for its depth image and pairs, as the next frames do."""
    sync = _sync()
    for stamp in range(9_000, 10_000, 100):
        sync.add_depth(0, stamp * MS, f"loop 1 at {stamp}")
        assert sync.pair(0, stamp * MS, 0.02, wait_s=0.2).depth == f"loop 1 at {stamp}"
    timer = threading.Timer(0.05, sync.add_depth, (0, 0, "loop 2 at 0"))
    timer.start()
    assert sync.pair(0, 0, 0.02, wait_s=2.0).depth == "loop 2 at 0"
    timer.join()
    sync.add_depth(0, 100 * MS, "loop 2 at 100")
    assert sync.pair(0, 100 * MS, 0.02, wait_s=0.2).depth == "loop 2 at 100"
    # the depth images went back first: nothing to wait for, they pair at once
    other = _sync()
    other.add_depth(0, 9_900 * MS, "loop 1")
    assert other.pair(0, 9_900 * MS, 0.02).depth == "loop 1"
    other.add_depth(0, 0, "loop 2 at 0")
    start = time.monotonic()
    assert other.pair(0, 0, 0.02, wait_s=2.0).depth == "loop 2 at 0" and time.monotonic() - start < 0.5
