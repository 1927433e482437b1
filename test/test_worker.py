"""The node's worker loop without ROS (`ros.worker.Worker`): batching, the share, frames in parts, failures."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import numpy as np
import pytest

from support.transfers import RecordedTransfers
from tiled_detector import TiledDetector
from tiled_detector.messages.images import ImageConversionError
from tiled_detector.pipeline.upload import Uploader
from tiled_detector.ros.share import EngineShare
from tiled_detector.ros.stats import FrameSlots
from tiled_detector.ros.worker import Arrival, Worker
from tiled_detector.stream import Job, Stream, StreamResult
from tiled_detector.tools.worlds.synthetic import make_scene


class Message(NamedTuple):
    frame: np.ndarray | None  # None: a message that cannot be converted
    stamp_ns: int


class Host:
    """The node's side, recorded."""

    def __init__(self) -> None:
        self.published: list[tuple[int, int, StreamResult]] = []
        self.counts: Counter[tuple[int, str]] = Counter()
        self.problems: list[tuple[int | None, str]] = []
        self.gated: list[set[int]] = []
        self.prepared = 0

    def prepare(self) -> None:
        self.prepared += 1

    def decode(self, index: int, message: Message) -> tuple[Any, str]:
        if message.frame is None:
            raise ImageConversionError("the data is shorter than height x step")
        return message.frame, "rgb8"

    def stamp(self, message: Message) -> int:
        return message.stamp_ns

    def depths(self, frames: list[tuple[int, int, tuple[int, int]]]) -> list[Any]:
        return [None] * len(frames)

    def gate(self, held: set[int]) -> None:
        self.gated.append(set(held))

    def publish(self, arrival: Arrival, job: Job, result: StreamResult) -> None:
        self.published.append((arrival.index, job.stamp_ns, result))

    def count(self, index: int, name: str) -> None:
        self.counts[index, name] += 1

    def problem(self, index: int | None, text: str, error: bool) -> None:
        self.problems.append((index, text))


@pytest.fixture(scope="module")
def detector() -> TiledDetector:
    return TiledDetector(backend="onnxruntime")


def _worker(
    detector: TiledDetector, names: list[str], clock: list[float] | None = None
) -> tuple[Worker, Host]:
    host = Host()
    now = clock or [0.0]
    share = EngineShare(len(names), clock=lambda: now[0])
    worker = Worker(host, Stream(detector), names, [None] * len(names), FrameSlots(len(names)), share, {})
    return worker, host


def _spy(worker: Worker, fail: list[bool]) -> list[list[Any]]:
    """The tiles each frame of every detect_many call asked for; a call fails while `fail` holds a True."""
    calls: list[list[Any]] = []
    detector, detect_many = worker.stream.detector, worker.stream.detector.detect_many

    def spied(frames, encodings, slots, cameras, tiles=None, on_device=None):
        if fail and fail.pop(0):
            raise RuntimeError("the engine ran out of memory")
        calls.append(list(tiles))
        return detect_many(frames, encodings, slots, cameras, tiles, on_device)

    detector.detect_many = spied
    return calls


def test_an_unexpected_error_is_counted_and_the_loop_goes_on(detector: TiledDetector) -> None:
    worker, host = _worker(detector, ["cam"])
    prepare = host.prepare
    raised = []

    def flaky() -> None:
        if not raised:
            raised.append(1)
            raise KeyError("something nobody expected")
        prepare()

    host.prepare = flaky  # type: ignore[method-assign]
    frame = make_scene(1, 96, 64).image
    for stamp in (1, 2):
        worker.slots.put(0, Arrival(0, Message(frame, stamp), 0.0))
        worker.cycle(timeout=0.0)
    assert host.counts[0, "failed"] == 1 and "KeyError" in host.problems[0][1]
    assert [p[1] for p in host.published] == [2]  # the worker kept going after the error


def test_several_cameras_go_through_one_batch_and_a_bad_frame_costs_only_its_camera(detector) -> None:
    worker, host = _worker(detector, ["a", "b", "c"])
    calls = _spy(worker, [])
    frames = [make_scene(i, 64, 48 + 16 * i).image for i in range(3)]
    worker.process(
        [
            Arrival(0, Message(frames[0], 5), 0.0),
            Arrival(1, Message(None, 5), 0.0),
            Arrival(2, Message(frames[2], 5), 0.0),
        ]
    )
    assert len(calls) == 1 and len(calls[0]) == 2  # one batch of the two good frames
    assert [p[0] for p in host.published] == [0, 2] and host.counts[1, "malformed"] == 1
    assert worker.frame_hw == {0: (48, 64), 2: (80, 64)}
    worker.process([Arrival(i, Message(f, 6), 0.0) for i, f in enumerate(frames)])
    assert len(calls[-1]) == 3 and worker.largest_batch == 3
    # a batch that fails is retried frame by frame: a frame that fails alone costs only its camera
    _spy(worker, [True, False, True, False])
    worker.process([Arrival(i, Message(f, 7), 0.0) for i, f in enumerate(frames)])
    assert [p[:2] for p in host.published[-2:]] == [(0, 7), (2, 7)] and host.counts[1, "failed"] == 1


def test_a_failed_batch_while_a_frame_runs_in_parts_skips_no_tile_and_charges_the_views_run(detector) -> None:
    """A 1080p frame (8 tiles + the full view) run in parts of 4 views beside a small camera's frames: a batch fails
    after the first part; the retry runs each frame alone and re-runs the same part, so every tile runs exactly
    once; the share is charged each part's views."""
    worker, host = _worker(detector, ["big", "small"])
    big, small = make_scene(2, 1920, 1080).image, make_scene(3, 320, 240).image
    charged: list[list[tuple[int, int]]] = []
    charge = worker.share.charge
    worker.share.charge = lambda frames, seconds: (charged.append(list(frames)), charge(frames, seconds))
    calls = _spy(worker, [False, True, False, False, False])
    worker.frame_view_cap = lambda jobs: 4  # parts of 3 tiles + the full view
    for arrival in (Arrival(0, Message(big, 9), 0.0), Arrival(1, Message(small, 9), 0.0)):
        worker.slots.put(arrival.index, arrival)
    worker.cycle(timeout=0.0)  # part 1 of the big frame and the small frame
    assert [p[0] for p in host.published] == [1] and [j.camera for j in worker.stream.continuing()] == ["big"]
    assert host.gated[-1] == set()
    worker.slots.put(1, Arrival(1, Message(small, 10), 0.0))
    worker.cycle(timeout=0.0)  # fails as a batch; each alone: the big frame's part 2 and the small frame
    assert host.gated[-1] == {0}  # no new message of a camera whose frame runs in parts
    worker.cycle(timeout=0.0)  # part 3: the frame is done
    big_tiles = [t[0] for t in calls if t and t[0] is not None and len(t[0]) < 8]
    ran = np.concatenate(big_tiles)
    assert sorted(ran.tolist()) == list(range(8)) and len(big_tiles) == 3  # each tile once, no part skipped
    assert [p[:2] for p in host.published] == [(1, 9), (1, 10), (0, 9)]
    whole = next(p[2] for p in host.published if p[0] == 0)
    assert whole.views == 8 + 3  # every tile, the full view with each part
    big_charges = [v for batch in charged for camera, v in batch if camera == 0]
    assert big_charges == [4, 4, 3]  # each part its own views, not the whole frame's


def test_the_view_cap_counts_only_the_cameras_sending(detector) -> None:
    """A 4K camera beside a small one runs in parts; once the small one stopped sending, whole frames again."""
    now = [0.0]
    worker, _ = _worker(detector, ["big", "small"], now)
    big, small = make_scene(2, 3840, 2160).image, make_scene(3, 320, 240).image
    for camera in (0, 1):
        worker.share.arrived(camera)
    jobs = [
        Job("big", big, 1, context=Arrival(0, None, 0.0)),
        Job("small", small, 1, context=Arrival(1, None, 0.0)),
    ]
    worker.frame_hw.update({0: (2160, 3840), 1: (240, 320)})
    assert worker.frame_view_cap(jobs[:1]) == 4  # the small camera's views, at least 4
    now[0] = 5.0  # the small camera sent nothing for 5 s
    worker.share.arrived(0)
    assert worker.frame_view_cap(jobs[:1]) == 0


def _views_spy(worker: Worker) -> list[list[int]]:
    """The engine views of each frame of every detect_many call."""
    calls: list[list[int]] = []
    detector, detect_many = worker.stream.detector, worker.stream.detector.detect_many

    def spied(frames, encodings, slots, cameras, tiles=None, on_device=None):
        plans = [detector.plan_for(f.shape[0], f.shape[1]) for f in frames]
        calls.append(
            [
                p.batch_size if t is None else len(t) + int(p.full_frame)
                for p, t in zip(plans, tiles, strict=True)
            ]
        )
        return detect_many(frames, encodings, slots, cameras, tiles, on_device)

    detector.detect_many = spied
    return calls


def test_a_frame_in_parts_keeps_its_cap_and_runs_whole_once_the_other_camera_stops(detector) -> None:
    """A 4K camera (32 tiles + the full view) beside a 640x480 one: the first cycle runs the 4K frame's first part
    (3 tiles + the full view: a cap of 4) with the small frame; the small camera then stops, and once it no longer
    counts as sending the 4K frame runs whole in one batch of 33 views (not 23 parts of one tile), with a note that
    says so; the next 4K frame runs whole at once."""
    now = [0.0]
    worker, host = _worker(detector, ["big", "small"], now)
    big, small = make_scene(2, 3840, 2160).image, make_scene(3, 640, 480).image
    calls = _views_spy(worker)
    for index, frame in ((0, big), (1, small)):
        worker.share.arrived(index)
        worker.slots.put(index, Arrival(index, Message(frame, 1), 0.0))
    worker.cycle(timeout=0.0)
    assert [p[0] for p in host.published] == [1] and [j.camera for j in worker.stream.continuing()] == ["big"]
    now[0] = 5.0  # the small camera sent nothing since: only the 4K camera counts
    worker.share.arrived(0)
    for _ in range(30):
        if len(host.published) == 2:
            break
        worker.cycle(timeout=0.0)
    assert calls[0][0] == 4 and calls[1:] == [[33]]  # one batch of the whole frame after the first part
    index, stamp, result = host.published[-1]
    assert (index, stamp, result.views) == (
        0,
        1,
        4 + 33,
    )  # every view run for it, the part set aside included
    assert result.notes == ("run whole: the view cap was lifted after 1 part of at most 4 views",)
    worker.slots.put(0, Arrival(0, Message(big, 2), 0.0))
    worker.cycle(timeout=0.0)
    assert calls[-1] == [33] and host.published[-1][2].notes == ()


def test_a_frame_started_in_a_batch_that_raised_leaves_its_camera_ungated(detector) -> None:
    """An error the retry does not catch (a KeyError) in the batch that would start a frame's parts: the frame is
    counted failed and nothing of it is left running in parts, so its camera is not gated on the next cycle."""
    worker, host = _worker(detector, ["big", "small"])
    worker.frame_view_cap = lambda jobs: 4
    big, small = make_scene(2, 1920, 1080).image, make_scene(3, 320, 240).image

    def raising(*args, **kwargs):
        raise KeyError("something nobody expected")

    detect_many = worker.stream.detector.detect_many
    worker.stream.detector.detect_many = raising
    try:
        for index, frame in ((0, big), (1, small)):
            worker.slots.put(index, Arrival(index, Message(frame, 1), 0.0))
        worker.cycle(timeout=0.0)
    finally:
        worker.stream.detector.detect_many = detect_many
    assert host.counts[0, "failed"] == 1 and worker.stream.continuing() == []
    worker.slots.put(1, Arrival(1, Message(small, 2), 0.0))
    worker.cycle(timeout=0.0)
    assert host.gated[-1] == set() and [p[:2] for p in host.published] == [(1, 2)]


def test_a_camera_whose_stream_starts_over_has_its_engine_time_forgotten(detector) -> None:
    """The share's decayed engine time is per camera state kept over time: a looped bag (stamps back) starts the
    camera's record over and its engine time with it; the other camera keeps its own."""
    worker, _ = _worker(detector, ["a", "b"], [0.0])  # the share's clock stands still: nothing decays
    big, small = make_scene(2, 1920, 1080).image, make_scene(3, 64, 48).image
    worker.process([Arrival(0, Message(big, 10), 0.0), Arrival(1, Message(big, 10), 0.0)])
    before = worker.share.fractions()
    worker.process([Arrival(0, Message(small, 5), 0.0)])  # stamps back: camera a starts over
    after = worker.share.fractions()
    assert after[0] < before[0] and after[1] == before[1]


def test_the_worker_feeds_the_next_frame_while_a_batch_runs(detector) -> None:
    """Where the detector copies frames ahead (CUDA; here its staging through `support.transfers`), the frame that
    arrives while a batch runs is taken, converted and staged during it, and runs in the next cycle; one replaced
    by a newer frame before it ran counts as dropped; a camera held meanwhile gets it back in its slot."""
    staging = detector.with_config()
    staging._uploader = Uploader("cpu", RecordedTransfers())
    worker, host = _worker(staging, ["cam", "other"])
    frames = [make_scene(seed, 96, 64).image for seed in range(5)]
    arrivals = [Arrival(0, Message(f, stamp), 0.0) for stamp, f in enumerate(frames)]
    during: list[Arrival] = []
    prepare = host.prepare
    host.prepare = lambda: (prepare(), [worker.slots.put(0, a) for a in during[:1]], during.clear())  # type: ignore[method-assign]
    staged = []
    stage = staging.stage
    staging.stage = lambda f, e, s: staged.extend(f) or stage(f, e, s)  # type: ignore[method-assign]

    worker.slots.put(0, arrivals[0])
    during.append(arrivals[1])  # arrives while frame 0 runs
    worker.cycle(timeout=0.0)
    assert [p[1] for p in host.published] == [0] and [id(f) for f in staged] == [id(frames[1])]
    assert worker.slots.take(timeout=0.0) == []  # taken ahead, out of the slot
    worker.cycle(timeout=0.0)  # frame 1 runs from its staged copy, with no wait for a new frame
    assert [p[1] for p in host.published] == [0, 1]
    np.testing.assert_array_equal(
        host.published[1][2].detections.boxes, staging.with_config().detect(frames[1]).boxes
    )

    during.append(arrivals[2])
    worker.slots.put(0, arrivals[3])
    worker.cycle(timeout=0.0)  # frame 3 runs; frame 2 arrives meanwhile and is staged
    worker.slots.put(0, arrivals[4])  # a newer one before frame 2 ran
    worker.cycle(timeout=0.0)
    assert [p[1] for p in host.published] == [0, 1, 3, 4] and host.counts[0, "dropped"] == 1

    during.append(arrivals[0])
    worker.slots.put(0, arrivals[1])
    worker.cycle(timeout=0.0)  # frame 0 (again) taken ahead while frame 1 runs...
    worker.share.held = lambda: {0}  # type: ignore[method-assign]
    worker.cycle(timeout=0.0)  # ...and given back to the slot when its camera is held
    assert [p[1] for p in host.published] == [0, 1, 3, 4, 1]
    assert [a for _, a in worker.slots.take(timeout=0.0)] == [arrivals[0]]
