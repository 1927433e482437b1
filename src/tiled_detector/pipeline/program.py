"""The frame program: all the device work for one batch of frames as one function, and the runner that executes
it eagerly or captures it once per key and replays it.

`FrameProgram(frames, encodings, plan, settings, limits, chosen=None)`: device frames -> tiles (every tile of the
plan, or the `chosen` ones: a `ViewSelection` on the device, a tile budget) and letterboxed views written into
the engine's input (in chunks of at most `max_batch` images) -> engine -> decode (each chunk to its per-image top-k
candidates) -> `postprocess` -> packed rows + a status row. With fixed `Limits` nothing in it reads device data
on the host, so the whole function can be captured (e.g. as a CUDA graph) and replayed for the next frame of the
same key: its inputs are static buffers (the uploader's device frames) and its outputs are overwritten in place.
Limit growth and the exact fallback are host policy, outside (in `TiledDetector`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from tiled_detector.pipeline import kernels, keypoints, masks
from tiled_detector.pipeline import labels as label_images
from tiled_detector.pipeline.decode import PaddedDecoded, Prototypes, decode_padded, joined
from tiled_detector.pipeline.depth import COLUMNS as DEPTH_COLUMNS
from tiled_detector.pipeline.depth import DepthImage, RowMasks, locate
from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.frame_settings import FrameSettings
from tiled_detector.pipeline.layouts import ROTATED_LAYOUTS, OutputLayout
from tiled_detector.pipeline.postprocess import COLUMNS, OBB_COLUMNS, Limits, postprocess, postprocess_rows
from tiled_detector.pipeline.preprocess import Preprocessor
from tiled_detector.pipeline.tiling import BatchPlan, ViewSelection, pieces
from tiled_detector.runtime.devices import graph_nodes
from tiled_detector.runtime.errors import one_line

LOG = logging.getLogger(__name__)
T = TypeVar("T")
# capture(function) -> (replay, outputs): replay() recomputes `outputs` in place from the same input buffers
Capture = Callable[[Callable[[], T]], tuple[Callable[[], None], T]]
Mark = Callable[[str], None]
F = TypeVar("F", bound=Callable[..., Any])
Compiler = Callable[[F], F]  # a stage function -> an equivalent one (e.g. fused by torch.compile)


class Inference(Protocol):
    """What the frame program needs of an engine (`tiled_detector.engines.base.Engine` is one): at most
    `max_batch` images per call, into its bound input where it has one; its `outputs` (each with a name, a shape
    with -1 for a dynamic dimension, and a dtype) size the buffers of the split form."""

    max_batch: int
    outputs: Sequence[Any]

    def input_buffer(self, batch_size: int) -> torch.Tensor | None: ...

    def infer(self, batch: torch.Tensor) -> Mapping[str, torch.Tensor]: ...


def no_mark(stage: str) -> None:
    """Stage boundaries are not timed inside a capture."""


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
            LOG.warning(
                "torch.compile of %s failed (%s); running it uncompiled", function.__name__, one_line(error)
            )
            compiled = None
            return result

    return call  # type: ignore[return-value]


def finish(
    found: PaddedDecoded,
    plan: BatchPlan,
    settings: FrameSettings,
    limits: Limits | None,
    mark: Mark = no_mark,
    post: Callable[..., torch.Tensor] = postprocess,
    post_rows: Callable[..., Any] = postprocess_rows,
    keypoint_shape: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, masks.MaskRows | None]:
    """The candidates' `postprocess`: the packed rows; and with masks on for a segmentation head (`settings.masks`
    not false) the kept detections' masks (`masks.build`; `masks.pack` makes them bytes for the download), else
    None; with keypoints on for a pose head (`keypoint_shape`, `settings.keypoints` not false) each row's keypoints
    (`keypoints.build`) as 3 K columns after its own (`keypoints.columns`). `post` / `post_rows`: the
    post-processing functions (a program's compiled ones)."""
    posed = keypoint_shape is not None and settings.keypoints is not False and found.extra is not None
    segmented = settings.masks is not False and found.prototypes is not None
    if not posed and not segmented:
        return post(found, plan, settings, limits), None
    rows = post_rows(found, plan, settings, limits)
    mark("merge")
    packed = rows.packed
    if posed:
        assert keypoint_shape is not None
        joints = keypoints.build(
            packed,
            rows.members,
            found,
            plan,
            keypoint_shape,
            settings.keypoint_fusion,
            settings.class_agnostic,
        )
        packed = torch.cat([packed, keypoints.columns(joints)], 1)
        mark("keypoints")
    if not segmented:
        return packed, None
    built = masks.build(
        rows.packed,
        rows.members,
        found,
        plan,
        settings.mask_scale,
        None if limits is None else limits.mask_pixels,
    )
    mark("masks")
    return packed, built


def _fused_stages() -> tuple[Callable[..., PaddedDecoded], Callable[..., Any]]:
    """Decoding and the sync-free post-processing through the Triton kernels (`fused_decode`,
    `fused_postprocess`), each falling back to its torch stage for what it does not cover, and for good where its
    kernels fail (`kernels.guarded`)."""
    from tiled_detector.pipeline import fused_decode, fused_postprocess

    def rows(found: PaddedDecoded, plan: BatchPlan, settings: FrameSettings, limits: Limits | None) -> Any:
        if fused_postprocess.supports(found, plan, settings, limits):
            return fused_postprocess.postprocess_rows(found, plan, settings, limits)  # type: ignore[arg-type]
        return None

    return (
        kernels.guarded(fused_decode.decode_padded, decode_padded, "decoding"),
        kernels.guarded(rows, postprocess_rows, "post-processing"),
    )


class SplitProgram(NamedTuple):
    """A frame program in three parts, for an engine whose calls cannot be captured: `before` (capturable) writes
    every view into buffers it returns, `engine` (eager) runs the engine on them and writes its outputs into those
    buffers, `after` (capturable) reads them and returns the program's outputs."""

    before: Callable[[], Any]
    engine: Callable[[Any], None]
    after: Callable[[Any], Any]


class Runner:
    """Runs a frame program eagerly, or (with a `capture`) captures it once per key and replays it after.

    When the whole program cannot be captured (an engine whose forward synchronises with the host or makes a host
    tensor; or one that says so: `split`), the parts before and after the engine are captured and replayed and the
    engine alone runs eagerly between them, with one log line; when even those cannot be captured, everything
    runs eagerly, with one more."""

    def __init__(self, capture: Capture | None = None, max_captures: int = 8, split: bool = False) -> None:
        self._capture = capture
        self._max = max_captures
        self._split = split
        self._captured: dict[Hashable, tuple[Any, ...]] = {}
        self.reason = ""  # why a capture failed (the engine then runs between captured parts, or all eagerly)

    @property
    def captures(self) -> bool:
        """True when (parts of) the frame program are captured and replayed."""
        return self._capture is not None

    @property
    def split(self) -> bool:
        """True when the engine runs eagerly between the captured parts before and after it."""
        return self._capture is not None and self._split

    def run(
        self, key: Hashable, program: Callable[[], T], split: Callable[[], SplitProgram | None] | None = None
    ) -> T:
        """`program()`'s outputs: computed now (eager), or by replaying the capture made for `key` (the first call
        with a key captures; the program must then read only buffers that stay the same for that key); in the
        split form, the parts `split()` gives (None: there is none) replayed around the eager engine."""
        if self._capture is None:
            return program()
        entry = self._captured.get(key)
        parts = split() if self._split and split is not None else None
        if entry is None:
            if len(self._captured) >= self._max:  # frame sizes or settings changed: drop the oldest capture
                self._captured.pop(next(iter(self._captured)))
            try:
                entry = self._captured[key] = (
                    self._split_entry(parts) if self._split else self._capture(program)
                )
            except Exception as error:  # e.g. an engine that synchronises or allocates while captured
                self._captured.clear()
                self.reason = one_line(error)
                if self._split or split is None:
                    LOG.warning(
                        "capturing the frame program%s failed (%s); running it eagerly from now on",
                        " around the engine" if self._split else "",
                        one_line(error),
                    )
                    self._capture = None
                    return program()
                LOG.warning(
                    "capturing the frame program failed (%s): the engine runs eagerly from now on, between the "
                    "captured tiles/letterbox before it and decoding/seams/merge after it",
                    one_line(error),
                )
                self._split = True
                return self.run(key, program, split)
            if self._split:  # the new entry has computed its outputs: its engine ran between the two captures
                return entry[-1]
        if self._split:
            replay_before, state, replay_after, outputs = entry
            replay_before()
            parts.engine(state)  # type: ignore[union-attr]
            replay_after()
            return outputs
        replay, outputs = entry
        replay()
        return outputs

    def nodes(self, key: Hashable | None = None) -> int | None:
        """The node count (kernels, copies, memsets) of the graph captured for `key` (None: the latest capture);
        in the split form the two captured parts' together (the engine runs between them). None when nothing is
        captured or torch kept no graph (`devices.graph_nodes`)."""
        if not self._captured:
            return None
        entry = self._captured.get(key) if key is not None else list(self._captured.values())[-1]
        if entry is None:
            return None
        counts = [graph_nodes(entry[0])] + ([graph_nodes(entry[2])] if self._split else [])
        return None if None in counts else sum(counts)  # type: ignore[arg-type]

    def _split_entry(self, parts: SplitProgram | None) -> tuple[Any, ...]:
        """Capture the parts before and after the engine (running the engine between them once, so that the part
        after it reads real outputs while it is captured) and compute this frame's outputs."""
        if parts is None:
            raise RuntimeError("this frame program has no split form")
        replay_before, state = self._capture(parts.before)  # type: ignore[misc]
        replay_before()
        parts.engine(state)
        replay_after, outputs = self._capture(lambda: parts.after(state))  # type: ignore[misc]
        replay_after()
        return replay_before, state, replay_after, outputs


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
        keypoint_shape: tuple[int, int] | None = None,
    ) -> None:
        self.engine = engine
        self.keypoint_shape = keypoint_shape  # a pose head's (joints, values per joint); None: no keypoints
        self.preprocessor = preprocessor
        self.layout = layout
        self.num_classes = num_classes
        # decoding and the fixed-size post-processing, fused where a compiler is given, else by the Triton kernels
        # where they run (`kernels`; the torch stages where they do not cover a setting); the exact path's
        # data-dependent shapes stay with `postprocess` itself, in the detector
        self.kernels = compiler is None and kernels.enabled(preprocessor.device)
        if compiler:
            self.decode = compiler(decode_padded)
            self.postprocess = compiler(postprocess)
            self.postprocess_rows = compiler(postprocess_rows)
        elif self.kernels:
            self.decode, self.postprocess_rows = _fused_stages()
            self.postprocess = lambda *args: self.postprocess_rows(*args).packed
        else:
            self.decode, self.postprocess, self.postprocess_rows = (
                decode_padded,
                postprocess,
                postprocess_rows,
            )
        self.locate = compiler(locate) if compiler else locate

    def finish(
        self,
        found: PaddedDecoded,
        plan: BatchPlan,
        settings: FrameSettings,
        limits: Limits | None,
        mark: Mark = no_mark,
    ) -> tuple[torch.Tensor, masks.MaskRows | None]:
        """`finish` with this program's (compiled) stage functions."""
        return finish(
            found, plan, settings, limits, mark, self.postprocess, self.postprocess_rows, self.keypoint_shape
        )

    def candidates(
        self,
        frames: Sequence[torch.Tensor],
        encodings: Sequence[Encoding],
        plan: BatchPlan,
        settings: FrameSettings,
        mark: Mark = no_mark,
        chosen: ViewSelection | None = None,
    ) -> PaddedDecoded:
        """Every view of every frame (or the `chosen` ones) through the engine, decoded to candidates.

        Chunks of at most `max_batch` images (one engine call whenever the batch fits), each decoded to its
        per-image top-k before the next runs, so memory follows the engine batch, not the frames (a segmentation
        head's prototypes excepted: every view's stay on the device until the kept detections' masks are built).
        Image indices are the batch plan's."""
        parts = []
        size = (plan if chosen is None else chosen).batch_size
        for start, stop in self._chunks(plan, chosen):
            # the engine's bound input when it has one (written in place), else the preprocessor's batch
            batch = self.preprocessor.batch(stop - start, self.engine.input_buffer(stop - start))
            self._prepare(frames, encodings, plan, (start, stop), batch, chosen)
            mark("preprocess")
            outputs = self.engine.infer(batch)
            mark("infer")
            parts.append(self._decode(outputs, start, settings, chosen, copy=stop - start < size))
            mark("decode")
        return joined(parts)

    def _chunks(self, plan: BatchPlan, chosen: ViewSelection | None) -> list[tuple[int, int]]:
        """(start, stop) of the engine calls: the views in chunks of at most `max_batch`."""
        step, size = self.engine.max_batch, (plan if chosen is None else chosen).batch_size
        return [(start, min(start + step, size)) for start in range(0, size, step)]

    def _prepare(
        self,
        frames: Sequence[torch.Tensor],
        encodings: Sequence[Encoding],
        plan: BatchPlan,
        images: tuple[int, int],
        batch: torch.Tensor,
        chosen: ViewSelection | None,
    ) -> None:
        """Write batch images images[0]..images[1]-1 (of the plan, or of its `chosen` views) into `batch` (from
        its first image on)."""
        if chosen is None:
            for k, first, end in plan.pieces(*images):
                at = plan.starts[k] + first - images[0]
                self.preprocessor.prepare(
                    frames[k], plan.plans[k], encodings[k], batch[at : at + end - first], (first, end)
                )
            return
        for k, first, end in pieces(chosen.starts, *images):
            at, tiles = chosen.starts[k] + first, chosen.counts[k]
            self.preprocessor.prepare_chosen(
                frames[k],
                plan.plans[k],
                encodings[k],
                batch[at - images[0] : at - images[0] + end - first],
                chosen.views[1, at : chosen.starts[k] + min(end, tiles)],
                plan.plans[k].full_frame and first <= tiles < end,
            )

    def _decode(
        self,
        outputs: Mapping[str, torch.Tensor],
        start: int,
        settings: FrameSettings,
        chosen: ViewSelection | None,
        copy: bool = False,
    ) -> PaddedDecoded:
        """One engine call's outputs (batch images from `start` on) -> their per-image top-k candidates, their
        image indices the batch plan's views; a segmentation head's prototypes with the views they belong to
        (`copy`: copied, when the engine's next call would overwrite them)."""
        found = self.decode(
            outputs,
            self.layout,
            settings.conf_threshold,
            settings.top_k,
            settings.classes,
            self.num_classes,
            settings.class_thresholds,
            self.preprocessor.input_hw,
        )
        image = found.image_index + start if start else found.image_index
        if found.prototypes is not None:
            values = found.prototypes.values
            views = None if chosen is None else chosen.views[0][start : start + len(values)]
            found = found._replace(prototypes=Prototypes(values.clone() if copy else values, views))
        return found._replace(image_index=image if chosen is None else chosen.views[0][image])

    @property
    def can_split(self) -> bool:
        """Whether the split form works: every engine output has a static shape past the batch dimension."""
        return all(d >= 0 for output in self.engine.outputs for d in output.shape[1:])

    def split(
        self,
        frames: Sequence[torch.Tensor],
        encodings: Sequence[Encoding],
        plan: BatchPlan,
        settings: FrameSettings,
        limits: Limits | None,
        chosen: ViewSelection | None = None,
        depths: Sequence[DepthImage | None] | None = None,
        labels: bool = False,
    ) -> SplitProgram:
        """The same program in three parts for an engine whose calls cannot be captured (`Runner`): every view
        into a batch of the whole plan, the engine's calls (eager) with their outputs copied into buffers of the
        whole plan, then decoding and `postprocess`. The part before allocates those buffers, so that inside a
        capture they belong to its graph and live as long as it does."""
        views = (plan if chosen is None else chosen).batch_size

        def before() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            batch = self.preprocessor.new_batch(views)
            self._prepare(frames, encodings, plan, (0, views), batch, chosen)
            outputs = {
                o.name: torch.empty((views, *o.shape[1:]), dtype=o.dtype, device=batch.device)
                for o in self.engine.outputs
            }
            return batch, outputs

        def engine(state: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> None:
            batch, outputs = state
            for start, stop in self._chunks(plan, chosen):
                for name, value in self.engine.infer(batch[start:stop]).items():
                    outputs[name][start:stop].copy_(value)

        def after(
            state: tuple[torch.Tensor, dict[str, torch.Tensor]],
        ) -> tuple[torch.Tensor, PaddedDecoded, torch.Tensor | None]:
            _, outputs = state
            calls = [({n: o[a:b] for n, o in outputs.items()}, a) for a, b in self._chunks(plan, chosen)]
            found = joined([self._decode(out, start, settings, chosen) for out, start in calls])
            packed, built = self.finish(found, plan, settings, limits)
            packed = self.positions(packed, plan, settings, depths, masks=built)
            return packed, found, self.mask_bytes(packed, built, plan, settings, labels)

        return SplitProgram(before, engine, after)

    def __call__(
        self,
        frames: Sequence[torch.Tensor],
        encodings: Sequence[Encoding],
        plan: BatchPlan,
        settings: FrameSettings,
        limits: Limits | None,
        mark: Mark = no_mark,
        chosen: ViewSelection | None = None,
        depths: Sequence[DepthImage | None] | None = None,
        labels: bool = False,
    ) -> tuple[torch.Tensor, PaddedDecoded, torch.Tensor | None]:
        """The packed result rows + status row (see `postprocess`; with `depths`, each row's position after its
        columns: `positions`), the candidates (for an exact redo) and the kept detections' masks (`finish`; with
        `labels`, the frames' label images composed after them: `mask_bytes`)."""
        found = self.candidates(frames, encodings, plan, settings, mark, chosen)
        packed, built = self.finish(found, plan, settings, limits, mark=mark)
        if built is None:
            mark("merge")
        if depths is not None:
            packed = self.positions(packed, plan, settings, depths, masks=built)
            mark("positions")
        return packed, found, self.mask_bytes(packed, built, plan, settings, labels, mark)

    @staticmethod
    def mask_bytes(
        packed: torch.Tensor,
        built: masks.MaskRows | None,
        plan: BatchPlan,
        settings: FrameSettings,
        labels: bool,
        mark: Mark = no_mark,
    ) -> torch.Tensor | None:
        """The kept detections' masks packed for the download (`masks.pack`; None: no masks), with every frame's
        label image composed on the device after them where `labels` (`labels.frame_labels`)."""
        if built is None:
            return None
        image = None
        if labels:
            image = label_images.frame_labels(packed, built, plan, settings.mask_scale)
            mark("labels")
        return masks.pack(built, image)

    def positions(
        self,
        packed: torch.Tensor,
        plan: BatchPlan,
        settings: FrameSettings,
        depths: Sequence[DepthImage | None] | None,
        exact: bool = False,
        masks: masks.MaskRows | None = None,
    ) -> torch.Tensor:
        """`packed` with each row's position (`depth.locate`: x, y, z, sizes, valid) in columns after its own,
        from its frame's depth image on the device (None: `packed` as it is); a row with an instance mask (`masks`)
        from its mask's pixels. `exact` (the exact path, where host reads are free) locates the result rows only."""
        if depths is None:
            return packed
        frames_hw = [p.frame_hw for p in plan.plans]
        kept = (packed[:, 6] > 0).nonzero()[:, 0] if exact else None
        row_masks = None
        if masks is not None:
            areas = (masks.boxes[:, 2:] - masks.boxes[:, :2]).clamp_min(0).long().prod(dim=1)
            starts = areas.cumsum(0) - areas
            boxes = masks.boxes if kept is None else masks.boxes[kept]
            starts = starts if kept is None else starts[kept]
            row_masks = RowMasks(boxes, starts, masks.bits, settings.mask_scale)
        # (the exact path's row counts vary: uncompiled there, as `postprocess` is)
        rows = packed if kept is None else packed[kept]
        located = (locate if exact else self.locate)(
            rows,
            frames_hw,
            depths,
            settings.depth_scale,
            settings.depth_min,
            settings.depth_max,
            rows[:, COLUMNS : COLUMNS + OBB_COLUMNS] if self.layout in ROTATED_LAYOUTS else None,
            row_masks,
        )
        if kept is not None:
            located = packed.new_zeros((len(packed), DEPTH_COLUMNS)).index_copy_(0, kept, located)
        located = [located]
        if self.keypoint_shape is not None and settings.keypoints is not False:  # each joint's position too
            joints = self.keypoint_shape[0]
            start = COLUMNS + (OBB_COLUMNS if self.layout in ROTATED_LAYOUTS else 0)
            points = rows[:, start : start + 3 * joints].reshape(len(rows), joints, 3)
            where = keypoints.locate_joints(
                points,
                rows[:, 7].long(),
                frames_hw,
                depths,
                settings.depth_scale,
                settings.depth_min,
                settings.depth_max,
            ).reshape(len(rows), 3 * joints)
            if kept is not None:
                where = packed.new_full((len(packed), 3 * joints), float("nan")).index_copy_(0, kept, where)
            located.append(where)
        return torch.cat([packed, *located], dim=1)
