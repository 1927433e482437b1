"""The node's worker loop, without ROS: each cycle takes the newest frame of every camera the engine share lets
through, with the next part of each frame running in parts, detects them in one batch through the stream, charges
the share with the views run, and hands each finished frame to the node to publish.

The node (`ros/node.py`) gives it a `Host`: converting a message into a frame, its stamp, its depth image (`depth:
true`), closing and opening the cameras' gates, publishing, counting and logging. A frame that cannot be converted
is counted `malformed`; a batch that fails is retried frame by frame, so one bad frame costs only its own camera
(counted `failed`; a frame in parts that fails is given up); an unexpected error is logged and counted, and the
loop goes on. The stream owns
every camera's state over time, the frames in parts included (`Stream.continuing`, each with the view cap it started
under); the worker numbers each camera's frames as it takes them (`Job.sequence`: a frame in parts is continued by
its number, never by its stamp) and keeps the last frame size each camera sent (for the share's `view_cap`; every
frame replaces it); a camera whose record starts over (`Stream.starts_over`) has its share's engine time forgotten.

Where the detector copies frames ahead (`TiledDetector.stages`: a CUDA engine), the worker feeds the next frames
while a batch runs on the device: it takes the newest frame of each camera the share lets through, converts it and
starts its copy to the device (`TiledDetector.stage`), and the next cycle runs it (a newer frame of that camera
arrived meanwhile replaces it, counted `dropped`; a camera held meanwhile gets it back in its slot).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from tiled_detector.messages.images import ImageConversionError
from tiled_detector.ros.share import EngineShare, view_cap
from tiled_detector.ros.stats import FrameSlots
from tiled_detector.stream import Job, Step, Stream, StreamResult


@dataclass(frozen=True)
class Arrival:
    """A message as a camera's slot holds it: the camera's index, the message and when it arrived (monotonic s)."""

    index: int
    message: Any
    received: float


class Host(Protocol):
    """What the node does for the worker."""

    def prepare(self) -> None:
        """Apply changed settings before a batch."""

    def decode(self, index: int, message: Any) -> tuple[Any, str]:
        """Camera `index`'s message as an (H, W, C) frame and its encoding (ImageConversionError: malformed)."""

    def stamp(self, message: Any) -> int:
        """The message's header stamp in nanoseconds."""

    def depths(self, frames: list[tuple[int, int, tuple[int, int]]]) -> list[Any]:
        """The depth image paired with each (camera index, stamp, frame size) of a batch, or None."""

    def gate(self, held: set[int]) -> None:
        """Take no new message of the `held` cameras; take again from the others."""

    def publish(self, arrival: Arrival, job: Job, result: StreamResult) -> None:
        """Publish a finished frame's detections (and count it)."""

    def count(self, index: int, name: str) -> None:
        """Count an event of camera `index`."""

    def problem(self, index: int | None, text: str, error: bool) -> None:
        """Log a problem of camera `index` (None: of the node): an error, or a warning."""


class Worker:
    """The worker loop (module docstring) over the cameras `names` (the stream's names; `mask_cameras`: the name
    each camera's ignore mask is given for)."""

    def __init__(
        self,
        host: Host,
        stream: Stream,
        names: Sequence[str],
        mask_cameras: Sequence[str | None],
        slots: FrameSlots,
        share: EngineShare,
        frame_hw: dict[int, tuple[int, int]],
    ) -> None:
        self.host, self.stream, self.slots, self.share = host, stream, slots, share
        self.names, self.mask_cameras = list(names), list(mask_cameras)
        self.frame_hw = frame_hw  # camera index -> the size of its last frame taken
        self.largest_batch = 0  # most frames (cameras) detected in one batch so far
        # per camera, the frames taken so far (the last one's `Job.sequence`)
        self._taken = [0] * len(self.names)
        self._index = {name: index for index, name in enumerate(self.names)}
        # camera index -> a frame taken while the last batch ran: its arrival, frame and encoding (staged)
        self._ahead: dict[int, tuple[Arrival, Any, str]] = {}

    def run(self, stop: threading.Event) -> None:
        """Cycle until `stop` is set."""
        while not stop.is_set():
            self.cycle()

    def cycle(self, timeout: float = 0.1) -> None:
        """One batch: the frames the share lets through and the next parts (waits up to `timeout` s for a frame
        when there is no part to run)."""
        held = self.share.held()
        continuing = {self._index[job.camera] for job in self.stream.continuing()}
        self.host.gate(held | continuing)
        parts = [job for job in self.stream.continuing() if self._index[job.camera] not in held]
        self._return_held(held | continuing)
        items = self.slots.take(timeout=0.0 if parts or self._ahead else timeout, held=held | continuing)
        for index, _ in items:
            if self._ahead.pop(index, None) is not None:  # a newer frame of that camera came meanwhile
                self.host.count(index, "dropped")
        arrivals = sorted(
            [a for _, a in items] + [a for a, _, _ in self._ahead.values()], key=lambda a: a.index
        )
        if not arrivals and not parts:
            return
        try:
            self.process(arrivals, parts)
        except Exception:
            for job in parts:
                self.stream.give_up(job.camera)
            for arrival in arrivals:
                self.host.count(arrival.index, "failed")
                if arrival.index in self._ahead and self._ahead[arrival.index][0] is arrival:
                    del self._ahead[arrival.index]
            self.host.problem(None, f"a frame failed:\n{traceback.format_exc()}", error=True)

    def _return_held(self, held: set[int]) -> None:
        """A frame taken ahead of a camera held now goes back to its slot (dropped where a newer one waits)."""
        for index in held & self._ahead.keys():
            arrival, _, _ = self._ahead.pop(index)
            if self.slots.put_back(index, arrival):
                self.host.count(index, "dropped")

    def _stage_next(self) -> None:
        """While a batch runs on the device: take the newest frame of each camera the share lets through,
        convert it and start its copy to the device, for the next cycle (module docstring)."""
        held = self.share.held() | {self._index[job.camera] for job in self.stream.continuing()}
        for index, arrival in self.slots.take(timeout=0.0, held=held):
            try:
                frame, encoding = self.host.decode(index, arrival.message)
                self.stream.detector.stage([frame], [encoding], [index])
            except (ImageConversionError, ValueError):  # converted (and counted) again in its own cycle
                if self.slots.put_back(index, arrival):
                    self.host.count(index, "dropped")
                continue
            self._ahead[index] = (arrival, frame, encoding)

    def process(self, arrivals: Sequence[Arrival], parts: Sequence[Job] = ()) -> None:
        """Convert the newest frame of each camera in `arrivals`, detect them in one batch with the next part of
        each frame in `parts`, charge the share with the views run and publish each finished frame."""
        self.host.prepare()
        jobs: list[Job] = []
        for arrival in arrivals:
            try:
                frame, encoding = self._converted(arrival)
            except ImageConversionError as error:
                self.host.count(arrival.index, "malformed")
                self.host.problem(arrival.index, f"skipped a malformed image: {error}", error=False)
                continue
            self.frame_hw[arrival.index] = (int(frame.shape[0]), int(frame.shape[1]))
            self._taken[arrival.index] += 1
            jobs.append(
                Job(
                    self.names[arrival.index],
                    frame,
                    self.host.stamp(arrival.message),
                    encoding,
                    slot=arrival.index,
                    mask_camera=self.mask_cameras[arrival.index],
                    context=arrival,
                    sequence=self._taken[arrival.index],
                )
            )
        paired = self.host.depths([(j.context.index, j.stamp_ns, j.frame.shape[:2]) for j in jobs])
        jobs = [replace(job, depth=depth) for job, depth in zip(jobs, paired, strict=True)]
        jobs.extend(parts)
        self.largest_batch = max(self.largest_batch, len(jobs))
        start = time.monotonic()
        feed = self._stage_next if self.stream.detector.stages else None
        steps = self._detect(jobs, self.frame_view_cap(jobs), feed)
        self.share.forget({s.job.context.index for s in steps if s.started_over is not None})
        self.share.charge([(s.job.context.index, s.views) for s in steps], time.monotonic() - start)
        for step in steps:
            if step.result is not None:
                self.host.publish(step.job.context, step.job, step.result)

    def _converted(self, arrival: Arrival) -> tuple[Any, str]:
        """The arrival's frame and encoding: converted when it was taken ahead (it is staged), else now."""
        ahead = self._ahead.pop(arrival.index, None)
        if ahead is not None and ahead[0] is arrival:
            return ahead[1], ahead[2]
        return self.host.decode(arrival.index, arrival.message)

    def frame_view_cap(self, jobs: Sequence[Job]) -> int:
        """The most views a frame runs in one batch (`ros.share.view_cap`), from the views of the frames of the
        cameras sending (their last size, or the size in this batch)."""
        if len(self.names) < 2:
            return 0
        sending = self.share.sending()
        sizes = {i: hw for i, hw in self.frame_hw.items() if i in sending}
        sizes.update({job.context.index: job.frame.shape[:2] for job in jobs})
        detector = self.stream.detector
        return view_cap(
            [detector.plan_for(h, w, self.mask_cameras[i]).batch_size for i, (h, w) in sizes.items()]
        )

    def _detect(self, jobs: Sequence[Job], cap: int, feed: Callable[[], None] | None = None) -> list[Step]:
        """The steps of `jobs`, all in one batch (`feed` called while it runs); when that fails, each frame alone
        (a frame in parts re-runs the same part), so that one bad frame costs only its own camera (counted, and a
        frame in parts given up)."""
        if not jobs:
            return []
        try:
            return self.stream.run(jobs, cap) if feed is None else self.stream.run(jobs, cap, feed)
        except (RuntimeError, ValueError) as error:
            if len(jobs) == 1:
                index = jobs[0].context.index
                self.stream.give_up(jobs[0].camera)
                self.host.count(index, "failed")
                self.host.problem(index, f"detection failed for one frame: {error}", error=True)
                return []
        return [step for job in jobs for step in self._detect([job], cap)]
