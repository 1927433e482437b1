"""The upload stage (`pipeline.upload`): a staging ring per frame slot and size, frames copied ahead on a copy stream
ordered by events, a frame size change starting a new ring, pageable copies when pinned memory cannot be had. The
ring's order is checked through `support.transfers` (CPU buffers, the order CUDA would be given logged); the same
code on CUDA in the `gpu` tests."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from support.transfers import RecordedTransfers
from tiled_detector import TiledDetector
from tiled_detector.pipeline.upload import Uploader
from tiled_detector.tools.worlds.synthetic import make_scene


def _frame(seed: int, height: int = 24, width: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (height, width, 3), np.uint8)


def _recorded(pinned_fails: bool = False) -> tuple[Uploader, RecordedTransfers]:
    transfers = RecordedTransfers(pinned_fails)
    return Uploader("cpu", transfers), transfers


def test_a_staged_frame_is_copied_on_the_copy_stream_and_the_compute_stream_waits_for_it() -> None:
    uploader, transfers = _recorded()
    frames = [_frame(i) for i in range(4)]
    assert uploader.stage(frames[0], "rgb8", slot=0)
    # entry 0: copied = e0, released = e1; the host fills its pinned buffer once its last copy out is done
    assert transfers.taken() == [("host waits", "e0"), ("record", "copy", "e0")]
    device = uploader.upload(frames[0], "rgb8", slot=0)
    assert torch.equal(device, torch.from_numpy(frames[0]))
    # the compute stream waits for the staged copy, copies it into the slot's device frame, then frees the entry
    assert transfers.taken() == [("wait", "compute", "e0"), ("record", "compute", "e1")]
    for i in (1, 2):  # entries 1 (e2, e3) and 0 again
        assert uploader.stage(frames[i], "rgb8", slot=0)
        assert torch.equal(uploader.upload(frames[i], "rgb8", slot=0), torch.from_numpy(frames[i]))
    # entry 0's second use: the host refills its pinned buffer once its copy out is done, and the copy stream
    # writes its device buffer only after that buffer's copy into the device frame (e1) is done
    assert transfers.taken()[-5:] == [
        ("host waits", "e0"),
        ("wait", "copy", "e1"),
        ("record", "copy", "e0"),
        ("wait", "compute", "e0"),
        ("record", "compute", "e1"),
    ]
    # every staged frame landed in the same static device frame (what a captured program reads)
    assert uploader.upload(frames[3], "rgb8", slot=0).data_ptr() == device.data_ptr()


def test_a_frame_not_staged_is_copied_on_the_compute_stream() -> None:
    uploader, transfers = _recorded()
    frames = [_frame(i) for i in range(3)]
    for frame in frames:
        assert torch.equal(uploader.upload(frame, "rgb8", slot=1), torch.from_numpy(frame))
    # no copy stream, no cross-stream wait: entry 0, 1, then 0 again once its last copy out of it is done
    assert transfers.taken() == [
        ("host waits", "e0"),
        ("record", "compute", "e0"),
        ("host waits", "e2"),
        ("record", "compute", "e2"),
        ("host waits", "e0"),
        ("record", "compute", "e0"),
    ]


def test_a_frame_size_change_starts_a_new_ring_and_nothing_staged_is_used() -> None:
    uploader, transfers = _recorded()
    small, large = _frame(0, 24, 32), _frame(1, 48, 64)
    assert uploader.stage(small, "rgb8", slot=0)
    taken = uploader.upload(large, "rgb8", slot=0)  # the camera's size changed: the staged frame is not its
    assert torch.equal(taken, torch.from_numpy(large))
    assert transfers.pinned_shapes == [(24, 32, 3)] * 2 + [(48, 64, 3)] * 2
    # the old ring is dropped only once its copies are done
    assert ("host waits", "e0") in transfers.taken()
    # staged before the size changed: copied anew
    assert torch.equal(uploader.upload(small, "rgb8", slot=0), torch.from_numpy(small))
    assert transfers.pinned_shapes[-2:] == [(24, 32, 3)] * 2
    # another object with the same size as the staged one is never mistaken for it
    staged, other = _frame(2), _frame(3)
    uploader.stage(staged, "rgb8", slot=0)
    assert torch.equal(uploader.upload(other, "rgb8", slot=0), torch.from_numpy(other))
    assert torch.equal(uploader.upload(staged, "rgb8", slot=0), torch.from_numpy(staged))
    # slots are apart: a frame staged in one is not taken by another
    uploader.stage(staged, "rgb8", slot=2)
    assert torch.equal(uploader.upload(other, "rgb8", slot=3), torch.from_numpy(other))


def test_pinned_memory_that_cannot_be_allocated_falls_back_to_pageable_copies_with_one_warning(
    caplog,
) -> None:
    uploader, transfers = _recorded(pinned_fails=True)
    with caplog.at_level(logging.WARNING, logger="tiled_detector.pipeline.upload"):
        for seed in range(3):
            frame = _frame(seed, 24 + 8 * seed)
            assert not uploader.stage(frame, "rgb8", slot=0)  # nothing copied ahead
            assert torch.equal(uploader.upload(frame, "rgb8", slot=0), torch.from_numpy(frame))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "pageable" in warnings[0].getMessage()
    assert uploader.pageable and not uploader.stages and not transfers.log


def test_frames_for_a_cpu_engine_are_never_staged() -> None:
    frame = _frame(0)
    uploader = Uploader("cpu")
    assert not uploader.stages and not uploader.stage(frame, "rgb8")
    assert uploader.upload(frame, "rgb8").data_ptr() == frame.ctypes.data


def test_the_detector_takes_the_frame_staged_while_the_batch_before_ran() -> None:
    detector = TiledDetector(backend="onnxruntime")
    transfers = RecordedTransfers()
    detector._uploader = Uploader("cpu", transfers)
    frames = [make_scene(seed, 320, 240).image for seed in (1, 2, 3)]
    expected = [detector.with_config().detect(f) for f in frames]
    called = []

    def feed(i: int):
        return lambda: called.append(i) or detector.stage([frames[i + 1]], slots=[0])

    found = [detector.detect_many([frames[0]], while_running=feed(0))[0]]
    for i in (1, 2):
        transfers.taken()
        found += detector.detect_many([frames[i]], while_running=feed(i) if i < 2 else None)
        assert transfers.taken()[:2] == [
            ("wait", "compute", f"e{2 * (i % 2)}"),
            ("record", "compute", f"e{2 * (i % 2) + 1}"),
        ]
    assert called == [0, 1]  # once per call
    for got, want in zip(found, expected, strict=True):
        np.testing.assert_array_equal(got.boxes, want.boxes)
        np.testing.assert_array_equal(got.scores, want.scores)


@pytest.mark.gpu
def test_cuda_staged_frames_overlap_nothing_they_should_not() -> None:
    """On CUDA: frames staged while a long kernel runs on the compute stream land whole and in order in the slot's
    static device frame; a staged frame of a new size starts a new ring."""
    uploader = Uploader("cuda")
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 255, (2160, 3840, 3), np.uint8) for _ in range(4)]
    first = uploader.upload(frames[0], "rgb8", static=True)
    busy = torch.rand(4096, 4096, device="cuda")
    for i in range(1, 4):
        reader = first.float().sum()  # the compute stream reads the frame...
        for _ in range(4):
            busy = busy @ busy / 4096  # ...and stays busy while the next frame is staged
        assert uploader.stage(frames[i], "rgb8", slot=0)
        assert reader.item() == pytest.approx(float(frames[i - 1].astype(np.float64).sum()), rel=1e-4)
        tensor = uploader.upload(frames[i], "rgb8", slot=0, static=True)
        assert tensor.data_ptr() == first.data_ptr() and torch.equal(
            tensor.cpu(), torch.from_numpy(frames[i])
        )
    small = rng.integers(0, 255, (1080, 1920, 3), np.uint8)
    assert uploader.stage(small, "rgb8", slot=0)
    assert torch.equal(uploader.upload(small, "rgb8", slot=0, static=True).cpu(), torch.from_numpy(small))


@pytest.mark.gpu
def test_cuda_a_stream_of_staged_frames_gives_each_frames_detections_with_one_copy_each_way() -> None:
    """The bundled model captured on CUDA: frames staged while the one before runs give the detections each frame
    gives alone, and each frame still costs one host-to-device copy (its bytes) and one device-to-host copy."""
    from tiled_detector.tools.benchmark import profiled_copies

    detector = TiledDetector(backend="torch", device="cuda")
    frames = [make_scene(seed, 1280, 720).image for seed in range(4)]
    alone = [detector.detect(f) for f in frames]
    assert detector.stages

    def stream() -> list:
        found = []
        detector.stage([frames[0]], slots=[0])
        for i, frame in enumerate(frames):
            feed = (lambda i=i: detector.stage([frames[i + 1]], slots=[0])) if i + 1 < len(frames) else None
            found += detector.detect_many([frame], slots=[0], while_running=feed)
        return found

    stream()  # captured
    found, copies, _ = profiled_copies(stream)
    for got, want in zip(found, alone, strict=True):
        np.testing.assert_allclose(got.boxes, want.boxes, atol=1e-3)
    h2d = [b for way, b in copies if way == "HtoD"]
    assert h2d == [1280 * 720 * 3] * len(frames)
    assert len([b for way, b in copies if way == "DtoH"]) == len(frames)
