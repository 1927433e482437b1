"""The frame program: all the device work for one batch of frames as one function, and the runner that executes
it eagerly or captures it once per key and replays it.

`FrameProgram(frames, encodings, plan, settings, limits)`: device frames -> tiles and letterboxed views written into the
engine's input (in chunks of at most `max_batch` images) -> engine -> decode (each chunk to its per-image top-k
candidates) -> `postprocess` -> packed rows + a status row. With fixed `Limits` nothing in it reads device data
on the host, so the whole function can be captured (e.g. as a CUDA graph) and replayed for the next frame of the
same key: its inputs are static buffers (the uploader's device frames) and its outputs are overwritten in place.
Limit growth and the exact fallback are host policy, outside (in `TiledDetector`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import torch

from tiled_detector.errors import one_line
from tiled_detector.pipeline.decode import OutputLayout, PaddedDecoded, decode_padded
from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.frame_settings import FrameSettings
from tiled_detector.pipeline.postprocess import Limits, postprocess
from tiled_detector.pipeline.preprocess import Preprocessor
from tiled_detector.pipeline.tiling import BatchPlan

LOG = logging.getLogger(__name__)
T = TypeVar("T")
# capture(function) -> (replay, outputs): replay() recomputes `outputs` in place from the same input buffers
Capture = Callable[[Callable[[], T]], tuple[Callable[[], None], T]]
Mark = Callable[[str], None]
F = TypeVar("F", bound=Callable[..., Any])
Compiler = Callable[[F], F]  # a stage function -> an equivalent one (e.g. fused by torch.compile)


class Inference(Protocol):
    """What the frame program needs of an engine (`tiled_detector.engines.base.Engine` is one): at most
    `max_batch` images per call, into its bound input where it has one."""

    max_batch: int

    def input_buffer(self, batch_size: int) -> torch.Tensor | None: ...

    def infer(self, batch: torch.Tensor) -> Mapping[str, torch.Tensor]: ...


def no_mark(stage: str) -> None:
    """Stage boundaries are not timed inside a capture."""


def cuda_graph(function: Callable[[], T]) -> tuple[Callable[[], None], T]:
    """Capture `function` as one `torch.cuda.CUDAGraph` (after a warm-up run on a side stream, which lets
    libraries allocate their workspaces): (replay, outputs), replay() recomputing `outputs` in place."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        function()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = function()
    return graph.replay, outputs


# compiled variants kept per stage function: one per frame size and sync-free `Limits` (each limit doubles up to
# its maximum: at most 18 per frame size). torch's default (8) silently ran a 4K candidate flood uncompiled after
# the limits had grown at 1080p and 4K in one process.
RECOMPILE_LIMIT = 64


def fused(function: F) -> F:
    """`function` through `torch.compile` (static shapes: compiled at the first call of each shape, up to
    `RECOMPILE_LIMIT` variants). When compiling fails (no triton, no C compiler, an unsupported op) the call runs
    uncompiled, and every call after it, with one log line; an error the plain function raises too (bad input)
    is raised as it is."""
    dynamo = torch._dynamo.config
    name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    setattr(dynamo, name, max(getattr(dynamo, name), RECOMPILE_LIMIT))
    compiled: Callable[..., Any] | None = torch.compile(function, dynamic=False)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal compiled
        if compiled is None:
            return function(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except Exception as error:
            result = function(*args, **kwargs)  # raises here when the input, not compiling, was the problem
            LOG.warning("torch.compile of %s failed (%s); running it uncompiled", function.__name__,
                        one_line(error))  # fmt: skip
            compiled = None
            return result

    return call  # type: ignore[return-value]


class Runner:
    """Runs a device function eagerly, or (with a `capture`) captures it once per key and replays it after."""

    def __init__(self, capture: Capture | None = None, max_captures: int = 8) -> None:
        self._capture = capture
        self._max = max_captures
        self._captured: dict[Hashable, tuple[Callable[[], None], Any]] = {}

    @property
    def captures(self) -> bool:
        """True when functions are captured and replayed."""
        return self._capture is not None

    def run(self, key: Hashable, function: Callable[[], T]) -> T:
        """`function()`'s outputs: computed now (eager), or by replaying the capture made for `key` (the first
        call with a key captures; the function must then read only buffers that stay the same for that key)."""
        if self._capture is None:
            return function()
        entry = self._captured.get(key)
        if entry is None:
            if len(self._captured) >= self._max:  # frame sizes or settings changed: drop the oldest capture
                self._captured.pop(next(iter(self._captured)))
            try:
                entry = self._captured[key] = self._capture(function)
            except Exception as error:  # e.g. an engine that synchronises or allocates while captured
                LOG.warning(
                    "capturing the frame program failed (%s); running it eagerly from now on", one_line(error)
                )
                self._capture = None
                self._captured.clear()
                return function()
        replay, outputs = entry
        replay()
        return outputs


class FrameProgram:
    """prepare -> infer -> decode -> postprocess over a `BatchPlan`, on the engine's device (not thread-safe:
    it writes the engine's and the preprocessor's reused buffers)."""

    def __init__(
        self,
        engine: Inference,
        preprocessor: Preprocessor,
        layout: OutputLayout,
        num_classes: int | None,
        compiler: Compiler | None = None,
    ) -> None:
        self.engine = engine
        self.preprocessor = preprocessor
        self.layout = layout
        self.num_classes = num_classes
        # decoding and the fixed-size post-processing, fused where a compiler is given (the exact path's
        # data-dependent shapes stay with `postprocess` itself, in the detector)
        self.decode = compiler(decode_padded) if compiler else decode_padded
        self.postprocess = compiler(postprocess) if compiler else postprocess

    def candidates(
        self,
        frames: Sequence[torch.Tensor],
        encodings: Sequence[Encoding],
        plan: BatchPlan,
        settings: FrameSettings,
        mark: Mark = no_mark,
    ) -> PaddedDecoded:
        """Every view of every frame through the engine, in chunks of at most `max_batch` images (one engine call
        whenever the batch fits), each chunk decoded to its per-image top-k before the next runs, so memory
        follows the engine batch, not the frames."""
        step, parts = self.engine.max_batch, []
        for start in range(0, plan.batch_size, step):
            stop = min(start + step, plan.batch_size)
            # the engine's bound input when it has one (written in place), else the preprocessor's batch
            batch = self.preprocessor.batch(stop - start, self.engine.input_buffer(stop - start))
            for k, first, end in plan.pieces(start, stop):
                at = plan.starts[k] + first - start
                out = batch[at : at + end - first]
                self.preprocessor.prepare(frames[k], plan.plans[k], encodings[k], out, (first, end))
            mark("preprocess")
            outputs = self.engine.infer(batch)
            mark("infer")
            found = self.decode(
                outputs,
                self.layout,
                settings.conf_threshold,
                settings.top_k,
                settings.classes,
                self.num_classes,
            )
            parts.append(found._replace(image_index=found.image_index + start) if start else found)
            mark("decode")
        if len(parts) == 1:
            return parts[0]
        return PaddedDecoded(*(torch.cat(field) for field in zip(*parts, strict=True)))

    def __call__(
        self,
        frames: Sequence[torch.Tensor],
        encodings: Sequence[Encoding],
        plan: BatchPlan,
        settings: FrameSettings,
        limits: Limits | None,
        mark: Mark = no_mark,
    ) -> tuple[torch.Tensor, PaddedDecoded]:
        """The packed result rows + status row (see `postprocess`), and the candidates (for an exact redo)."""
        found = self.candidates(frames, encodings, plan, settings, mark)
        packed = self.postprocess(found, plan, settings, limits)
        mark("merge")
        return packed, found
