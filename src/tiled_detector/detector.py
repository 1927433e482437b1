"""`TiledDetector`: the whole pipeline for one frame, on the engine's device from upload to one download.

plan (cached per frame size) -> preprocess into the batch -> ONE engine call for all tiles + the full-frame view
-> decode (threshold, class filter, per-image top-k) -> map to frame pixels -> seam suppression -> merge ->
max_detections -> boxes, scores and classes packed into one tensor and copied to the host once.

On an accelerator the post-processing is sync-free: fixed-size candidates (each image's top-k, compacted on the
device to a capacity) with validity masks, so nothing reads a count back before the one download. The download
carries the valid flag of each row (compacted on the host) and a status row; when that row says the fixed-size
result is not proven exact (more candidates than the capacity, an NMS chain deeper than the fixed rounds, a merge
group needing SAHI's sequential re-check), the frame is post-processed again on the exact, synchronising path.
On the CPU that exact path is used directly (host syncs cost nothing there).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from tiled_detector.config import ENGINE_FIELDS, DetectorConfig
from tiled_detector.decode import Decoded, OutputLayout, PaddedDecoded, decode_padded, detect_layout
from tiled_detector.engines.base import Engine, load_engine
from tiled_detector.merge import merge, merge_padded, suppress_truncated
from tiled_detector.preprocess import Encoding, Preprocessor, as_frame_tensor
from tiled_detector.tiling import TilePlan, make_plan
from tiled_detector.types import Detections
from tiled_detector.zero_copy import as_torch_tensor

_MIN_CAPACITY = 1024  # sync-free candidates per frame at first (doubled up to _MAX_CAPACITY when exceeded)
_MAX_CAPACITY = 4096  # (N, N) matrices: beyond this, frames keep taking the exact path
# The exact path merges at most this many candidates per frame (the best scores): its (N, N) matrices stay under
# about half a gigabyte whatever the frame (433 views x top_k 100 could be 43,300 candidates: 7.5 GB per matrix).
MAX_CANDIDATES = 2 * _MAX_CAPACITY
_MIN_SLOTS, _MAX_SLOTS = 8, 256  # merge-group positions walked by the sync-free merge (adapted likewise)
_MIN_ROUNDS, _MAX_ROUNDS = 16, 256  # NMS fixed-point rounds of the sync-free merge (adapted likewise)
_RETRY_AFTER = 30  # frames taking the exact path directly after one exceeded a sync-free limit at its maximum


def _valid_first(valid: torch.Tensor) -> torch.Tensor:
    """Permutation putting the True rows first, each part in its original order (fixed shape, no sync)."""
    return torch.sort((~valid).to(torch.int32), stable=True).indices


class _StageClock:
    """Stage durations. CUDA: events on the current stream, read after the final download (no extra syncs);
    with `sync` every stage boundary synchronises instead (host wall time per stage). CPU: host wall time."""

    def __init__(self, device: torch.device, sync: bool) -> None:
        self._events = device.type == "cuda" and not sync
        self._sync = device if device.type == "cuda" and sync else None
        self._marks: list[tuple[str, Any]] = []
        self._start = self._now()

    def _now(self) -> Any:
        if self._events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self._sync is not None:
            torch.cuda.synchronize(self._sync)
        return time.perf_counter()

    def mark(self, stage: str) -> None:
        """End of `stage` (and start of the next)."""
        self._marks.append((stage, self._now()))

    def timings(self) -> dict[str, float]:
        """Stage -> milliseconds, plus `total` (call after the results reached the host). A stage that ran
        more than once (post-processing again on the exact path) gets the sum of its runs."""
        result: dict[str, float] = {}
        previous = self._start
        for stage, now in self._marks:
            elapsed = previous.elapsed_time(now) if self._events else (now - previous) * 1000.0
            result[stage] = result.get(stage, 0.0) + elapsed
            previous = now
        result["total"] = sum(result.values())
        return result


def _model_labels(model: object) -> tuple[str, ...] | None:
    """Class names shipped next to the model by `tiled_detector.models`, when that package is installed."""
    try:
        from tiled_detector.models import load_labels
    except ImportError:
        return None
    labels = load_labels(model)
    return tuple(labels) if labels else None


class TiledDetector:
    """Tiled detection with one engine call per frame. Not thread-safe (it reuses its input buffers).

    `TiledDetector(model, backend, device, tile_size=(w, h), overlap, full_frame, conf_threshold, **more)` takes
    any other `DetectorConfig` field as a keyword (`engine=` reuses a loaded engine).
    """

    def __init__(
        self,
        model: Any = None,
        backend: str = "auto",
        device: str = "cpu",
        tile_size: tuple[int, int] = (640, 640),
        overlap: float = 0.2,
        full_frame: bool = True,
        conf_threshold: float = 0.25,
        *,
        engine: Engine | None = None,
        **more: Any,
    ) -> None:
        settings = dict(
            backend=backend,
            device=device,
            tile_size=tile_size,
            overlap=overlap,
            full_frame=full_frame,
            conf_threshold=conf_threshold,
            **more,
        )
        if model is not None:
            settings["model"] = model
        self._setup(DetectorConfig(**settings), engine)

    @classmethod
    def from_config(cls, config: DetectorConfig, engine: Engine | None = None) -> TiledDetector:
        """A detector for `config`, loading its engine unless a loaded `engine` is given."""
        detector = cls.__new__(cls)
        detector._setup(config, engine)
        return detector

    def _setup(self, config: DetectorConfig, engine: Engine | None) -> None:
        if engine is None:
            engine = load_engine(
                config.model,
                config.backend,
                config.device,
                config.precision,
                config.max_batch,
                **config.engine_options,
            )
        elif engine.device.type != torch.device(config.device).type:
            raise ValueError(
                f"engine runs on {engine.device}, but the config asks for device {config.device}"
            )
        self._config = config
        self._engine = engine
        self._labels = config.labels or engine.labels or _model_labels(config.model)
        self._preprocessor = Preprocessor(
            engine.device, engine.input.dtype, engine.input_hw, config.channel_order
        )
        self._num_classes = len(self._labels) if self._labels else None
        self._layout = self._resolve_layout()
        self._sync_free = config.sync_free and engine.device.type != "cpu"
        self._capacity = _MIN_CAPACITY  # candidates kept by the sync-free path; grows when a frame needs more
        self._slots = _MIN_SLOTS  # merge-group positions the sync-free merge walks; likewise
        self._rounds = _MIN_ROUNDS  # NMS rounds of the sync-free merge; likewise
        self._exact_frames = 0  # frames left to take the exact path directly (a limit at its maximum was hit)

    def _resolve_layout(self) -> OutputLayout:
        """The output layout, found once from the engine's output shapes when they are static (an ambiguous
        shape raises here, asking for the layout)."""
        shapes = {o.name: o.shape for o in self._engine.outputs}
        if self._config.layout is not OutputLayout.AUTO or any(d < 0 for s in shapes.values() for d in s[1:]):
            return self._config.layout
        return detect_layout(shapes, self._num_classes)

    @property
    def config(self) -> DetectorConfig:
        """The validated settings."""
        return self._config

    @property
    def engine(self) -> Engine:
        """The loaded engine (shared by detectors made with `with_config`)."""
        return self._engine

    @property
    def labels(self) -> tuple[str, ...] | None:
        """Class names: the config's, else the model's, else None."""
        return self._labels

    def with_config(self, **changes: Any) -> TiledDetector:
        """A detector with `changes` applied that shares this one's engine.

        Thresholds, merging, tiling, classes and the like apply per call; changing an engine setting
        (model, backend, device, precision, max_batch, engine_options) raises: build a new detector for that.
        """
        config = self._config.replace(**changes)
        reload = sorted(
            name for name in ENGINE_FIELDS if getattr(config, name) != getattr(self._config, name)
        )
        if reload:
            raise ValueError(f"changing {', '.join(reload)} needs a new engine: create a new TiledDetector")
        return TiledDetector.from_config(config, engine=self._engine)

    def plan_for(self, height: int, width: int) -> TilePlan:
        """The (cached) tile plan for frames of this size."""
        return make_plan(
            (height, width),
            self._config.tile_hw,
            self._config.overlap,
            self._engine.input_hw,
            self._config.full_frame,
        )

    def detect(
        self, frame: np.ndarray | torch.Tensor, encoding: str | Encoding = Encoding.RGB8
    ) -> Detections:
        """Detect objects in an (H, W, C) frame (numpy or torch, any device); boxes in frame pixels."""
        clock = _StageClock(self._engine.device, self._config.profile)
        device_frame = self._preprocessor.upload(frame, encoding)
        clock.mark("upload")
        return self._detect(device_frame, encoding, clock)

    def detect_device(self, frame: Any, encoding: str | Encoding = Encoding.RGB8) -> Detections:
        """Detect objects in a frame already on the engine's device, with no copy of the input at all.

        `frame` is an (H, W, C) torch tensor, a DLPack capsule, or any object with `__dlpack__` or
        `__cuda_array_interface__` (CuPy, Numba, NVIDIA decoders); memory elsewhere raises `ZeroCopyError`.
        """
        tensor = as_frame_tensor(as_torch_tensor(frame, self._engine.device), encoding)
        return self._detect(tensor, encoding, _StageClock(self._engine.device, self._config.profile))

    def _detect(self, frame: torch.Tensor, encoding: str | Encoding, clock: _StageClock) -> Detections:
        plan = self.plan_for(frame.shape[0], frame.shape[1])
        found = self._infer_and_decode(frame, plan, encoding, clock)
        host = None
        if self._exact_frames:
            self._exact_frames -= 1
        elif self._sync_free:
            host = self._postprocess_sync_free(found, plan, clock)
        if host is None:  # CPU, or the sync-free result was not proven exact: the exact path
            packed = self._postprocess_exact(found.compact(), plan, clock)
            host = packed.cpu().numpy()
            clock.mark("download")
        return Detections(host[:, :4], host[:, 4], host[:, 5].astype(np.int64), clock.timings())

    def _infer_and_decode(
        self, frame: torch.Tensor, plan: TilePlan, encoding: str | Encoding, clock: _StageClock
    ) -> PaddedDecoded:
        """Preprocess, infer and decode the plan's views in chunks of at most `max_batch` images (one chunk for
        any usual frame), so a huge frame never holds more than one engine batch of images; each chunk's
        outputs shrink to their per-image top-k candidates before the next chunk runs."""
        cfg, step = self._config, self._engine.max_batch
        parts = []
        for start in range(0, plan.batch_size, step):
            stop = min(start + step, plan.batch_size)
            buffer = self._engine.input_buffer(stop - start)  # the engine's bound input, written in place
            batch = self._preprocessor.prepare(frame, plan, encoding, buffer, (start, stop))
            clock.mark("preprocess")
            outputs = self._engine.infer(batch)
            clock.mark("infer")
            found = decode_padded(
                outputs, self._layout, cfg.conf_threshold, cfg.top_k, cfg.classes, self._num_classes
            )
            parts.append(found._replace(image_index=found.image_index + start) if start else found)
            clock.mark("decode")
        if len(parts) == 1:
            return parts[0]
        return PaddedDecoded(*(torch.cat(field) for field in zip(*parts, strict=True)))

    def _postprocess_exact(self, found: Decoded, plan: TilePlan, clock: _StageClock) -> torch.Tensor:
        """frame pixels -> seam rule -> merge -> top rows packed (M, 6), with data-dependent shapes."""
        cfg = self._config
        if len(found.scores) > MAX_CANDIDATES:  # a candidate flood: the best ones, in their original order
            best = found.scores.topk(MAX_CANDIDATES).indices.sort().values
            found = Decoded(*(t[best] for t in found))
        boxes = plan.to_frame(found.boxes, found.image_index)
        scores, class_ids = found.scores.float(), found.class_ids
        if cfg.seam_suppression:
            keep = suppress_truncated(
                boxes, scores, class_ids, found.image_index, plan, class_agnostic=cfg.class_agnostic
            )
            boxes, scores, class_ids = boxes[keep], scores[keep], class_ids[keep]
        boxes, scores, class_ids = merge(
            boxes, scores, class_ids, cfg.merge, cfg.match_metric, cfg.merge_threshold, cfg.class_agnostic
        )
        top = cfg.max_detections  # merge returns detections ranked by score
        packed = torch.cat([boxes[:top], scores[:top, None], class_ids[:top, None].float()], dim=1)
        clock.mark("merge")
        return packed

    def _postprocess_sync_free(
        self, found: PaddedDecoded, plan: TilePlan, clock: _StageClock
    ) -> np.ndarray | None:
        """The same result with fixed shapes and one download; None when it is not proven exact."""
        cfg = self._config
        count = found.valid.sum()
        capacity = self._capacity
        if len(found.valid) > capacity:  # the valid rows first, in order, then cut to the capacity
            first = _valid_first(found.valid)[:capacity]
            found = type(found)(*(t[first] for t in found))
        boxes = plan.to_frame(found.boxes, found.image_index)
        scores, class_ids, valid = found.scores.float(), found.class_ids, found.valid
        if cfg.seam_suppression:
            valid = suppress_truncated(
                boxes,
                scores,
                class_ids,
                found.image_index,
                plan,
                class_agnostic=cfg.class_agnostic,
                valid=valid,
            )
        merged = merge_padded(
            boxes,
            scores,
            class_ids,
            valid,
            cfg.merge,
            cfg.match_metric,
            cfg.merge_threshold,
            cfg.class_agnostic,
            nms_rounds=self._rounds,
            slots=self._slots,
        )
        rows = _valid_first(merged.valid)[: cfg.max_detections]  # rank order is kept among the valid rows
        status = torch.cat(
            [
                count.float()[None],
                merged.exact.float()[None],
                merged.largest.float()[None],
                merged.scores.new_zeros(4),
            ]
        )
        packed = torch.cat(
            [
                torch.cat(
                    [
                        merged.boxes[rows],
                        merged.scores[rows, None],
                        merged.class_ids[rows, None].float(),
                        merged.valid[rows, None].float(),
                    ],
                    dim=1,
                ),
                status[None],
            ]
        )
        clock.mark("merge")
        host = packed.cpu().numpy()
        clock.mark("download")
        if not self._adapt(int(host[-1, 0]), host[-1, 1] == 1.0, int(host[-1, 2])):
            return None
        rows_host = host[:-1]
        return rows_host[rows_host[:, 6] > 0, :6]

    def _adapt(self, needed: int, exact: bool, largest: int) -> bool:
        """Grow the sync-free limits a frame exceeded (candidates, group size, NMS rounds); True when the frame's
        result is exact. When a limit already at its maximum was exceeded, the next `_RETRY_AFTER` frames go
        straight to the exact path instead of running both."""
        capacity, slots, rounds = self._capacity, self._slots, self._rounds
        if needed > capacity:
            self._capacity = min(_MAX_CAPACITY, 1 << (needed - 1).bit_length())
        if largest > slots:
            self._slots = min(_MAX_SLOTS, 1 << (largest - 1).bit_length())
        elif not exact:  # the group walk was long enough, so the NMS fixed point was not reached
            self._rounds = min(_MAX_ROUNDS, 2 * rounds)
        maxed = (
            (needed > capacity >= _MAX_CAPACITY)
            or (largest > slots >= _MAX_SLOTS)
            or (not exact and largest <= slots and rounds >= _MAX_ROUNDS)
        )
        if maxed:
            self._exact_frames = _RETRY_AFTER
        return needed <= capacity and exact
