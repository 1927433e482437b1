"""`TiledDetector`: tiled detection of one frame or several, on the engine's device from upload to one download.

Per call: plans (cached per frame size) -> upload (one host-to-device copy per frame, into a static device frame)
-> the frame program (`program.FrameProgram`: tiles and views into the engine batch, the fewest engine calls
`max_batch` allows, decode, frame pixels, seam rule, merge, the best `max_detections` per frame) -> boxes,
scores and classes of every frame in one device-to-host copy.

On an accelerator the post-processing is sync-free (`Limits`: fixed-size candidates with validity masks), so
the host never waits mid-frame. The download carries a status row; when it says the fixed-size result is not
proven exact (more candidates than the capacity, an NMS chain deeper than the fixed rounds, a merge group
larger than the slots walked), the host grows the limits and post-processes that batch again on the exact path.
On the CPU the exact path is used directly (host syncs cost nothing there).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tiled_detector.config import ENGINE_FIELDS, Applies, DetectorConfig
from tiled_detector.engines.base import Engine
from tiled_detector.model_files.engine_setup import default_capture, default_compiler, load_config_engine
from tiled_detector.model_files.resolve import Resolved, engine_view, file_view, resolve
from tiled_detector.pipeline import keypoints as keypoint_stage
from tiled_detector.pipeline import masks as mask_stage
from tiled_detector.pipeline.decode import PaddedDecoded
from tiled_detector.pipeline.depth import COLUMNS as DEPTH_COLUMNS
from tiled_detector.pipeline.depth import DepthImage, aligned, unpack_positions
from tiled_detector.pipeline.encodings import Encoding, as_frame_tensor
from tiled_detector.pipeline.frame_settings import FrameSettings
from tiled_detector.pipeline.layouts import ROTATED_LAYOUTS
from tiled_detector.pipeline.policy import IgnoreMasks, mask_path
from tiled_detector.pipeline.postprocess import COLUMNS, OBB_COLUMNS, Limits, unpack
from tiled_detector.pipeline.preprocess import InputFormat, Preprocessor
from tiled_detector.pipeline.program import Capture, FrameProgram, Runner, finish, no_mark
from tiled_detector.pipeline.tiling import (
    BatchPlan,
    TilePlan,
    ViewSelection,
    batch_plan,
    make_plan,
    select_views,
    selection_views,
)
from tiled_detector.pipeline.upload import Uploader
from tiled_detector.pipeline.zero_copy import as_torch_tensor
from tiled_detector.runtime.stage_clock import StageClock
from tiled_detector.runtime.threads import fit_to_load
from tiled_detector.types import Detections

LOG = logging.getLogger(__name__)
# batches taking the exact path directly after one exceeded a sync-free limit at its maximum
_RETRY_AFTER = 30
_VIEW_BUFFERS = 64  # chosen-view buffers kept (one per batch plan and count of chosen tiles per frame)


class TiledDetector:
    """Tiled detection with the fewest engine calls per frame (one on a GPU). Not thread-safe (it reuses its
    input buffers).

    `TiledDetector(model, backend, device, tile_size=(w, h), overlap, full_frame, conf_threshold, **more)` takes
    any other `DetectorConfig` field as a keyword (`engine=` reuses a loaded engine); tile_size None (auto): the
    model's input size.
    """

    def __init__(
        self,
        model: Any = None,
        backend: str = "auto",
        device: str = "cpu",
        tile_size: tuple[int, int] | None = None,
        overlap: float = 0.2,
        full_frame: bool = True,
        conf_threshold: float = 0.25,
        *,
        engine: Engine | None = None,
        capture: Capture | None = None,
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
        self._setup(DetectorConfig(**settings), engine, capture)

    @classmethod
    def from_config(
        cls, config: DetectorConfig, engine: Engine | None = None, capture: Capture | None = None
    ) -> TiledDetector:
        """A detector for `config`, loading its engine unless a loaded `engine` is given; with `capture` the
        sync-free frame program is captured once per key and replayed (`program.Runner`)."""
        detector = cls.__new__(cls)
        detector._setup(config, engine, capture)
        return detector

    def _setup(self, config: DetectorConfig, engine: Engine | None, capture: Capture | None = None) -> None:
        early = None
        if engine is None:  # a file the detector refuses is refused before anything is loaded or cached
            view = file_view(config)
            early = resolve(config, view) if view is not None else None
            engine = load_config_engine(config)
        elif engine.device.type != torch.device(config.device).type:
            raise ValueError(
                f"engine runs on {engine.device}, but the config asks for device {config.device}"
            )
        # derived from the config and the engine (a change of labels or layout rebuilds: `reconfigure`), before
        # anything is replaced: an unknown class name or an ambiguous layout leaves the detector as it was
        view = engine_view(engine)
        resolved = early if early is not None and early.view.same_head(view) else resolve(config, view)
        if resolved.coco_by_family:
            LOG.info(
                "%s names no classes: its 80 classes are taken for COCO's (person, bicycle, car, ...); set "
                "labels to name them otherwise",
                config.model,
            )
        labels, input_format = resolved.labels, resolved.input_format
        frame_settings = config.frame_settings(labels)
        self._config, self._engine, self._frame_settings = config, engine, frame_settings
        self._labels, self._num_classes, self._layout = labels, resolved.num_classes, resolved.layout
        self._input_format, self._resolved = input_format, resolved
        preprocessor = Preprocessor(
            engine.device,
            engine.input.dtype,
            engine.input_hw,
            input_format,
            engine.memory_format,
            capacity=engine.max_batch,
        )
        self._sync_free = config.sync_free and engine.device.type != "cpu"
        self._capture = capture  # the caller's own capture function, kept when settings change
        self._uploader = Uploader(engine.device)
        self._depth_uploader = Uploader(engine.device)  # depth images, one slot per frame slot
        self._masks = IgnoreMasks()  # the ignore masks scaled to the frame sizes seen (bounded)
        joints = None if resolved.keypoints is None else resolved.keypoints.shape
        self._keypoint_shape = joints  # a pose head's (joints, values per joint); None: no keypoints
        self._program = FrameProgram(
            engine, preprocessor, self._layout, self._num_classes, default_compiler(config, engine), joints
        )
        # the caller's own capture function (a test's stand-in) where given, as long as `cuda_graph` is on
        chosen = capture if capture is not None and config.cuda_graph else default_capture(config, engine)
        self._runner = Runner(chosen, split=not engine.capturable)
        self._limits = Limits()  # the sync-free path's fixed sizes; grown when a batch needs more
        # per (batch plan, tiles chosen per frame): the device buffer of the chosen views a capture reads
        self._views: dict[tuple[BatchPlan, tuple[int, ...]], torch.Tensor] = {}
        self._exact_batches = (
            0  # batches left to take the exact path directly (a limit at its maximum was hit)
        )
        self.degenerate_rows = getattr(self, "degenerate_rows", 0)  # model rows that were no box, dropped
        # compose each frame's label image on the device (the node: while `masks` has a subscriber); on the
        # accelerator path only (the CPU composes it where it is used, faster there)
        self.label_images = getattr(self, "label_images", False)

    @property
    def rotated(self) -> bool:
        """Whether the model gives rotated boxes (`Detections.obb`)."""
        return self._layout in ROTATED_LAYOUTS

    def _count_degenerate(self, count: int) -> None:
        """Model rows that were no rectangle (w or h <= 0, NaN): counted in `degenerate_rows`, one WARN the first
        time."""
        if count and not self.degenerate_rows:
            LOG.warning(
                "%s gave %d rotated boxes with w or h <= 0 or a NaN angle: dropped (counted in degenerate_rows)",
                self._config.model,
                count,
            )
        self.degenerate_rows += count

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

    @property
    def resolved(self) -> Resolved:
        """How the model file was read: layout, family, labels and input conventions, with their sources."""
        return self._resolved

    @property
    def tile_size(self) -> tuple[int, int]:
        """Tile width and height in use (`tile_size`, or with auto the model's input size)."""
        height, width = self._config.tile_hw_for(self._engine.input_hw)
        return width, height

    @property
    def input_format(self) -> InputFormat:
        """How frames become the model's input (the settings, else the model file, else its family)."""
        return self._input_format

    @property
    def frame_settings(self) -> FrameSettings:
        """What the frame program reads (class names resolved against `labels`): the settings part of its
        capture key."""
        return self._frame_settings

    def with_config(self, **changes: Any) -> TiledDetector:
        """A detector with `changes` applied that shares this one's engine (`update` changes this one).

        Thresholds, merging, tiling, classes and the like apply per call; changing an engine setting
        (model, backend, device, precision, max_batch, engine_options) raises: build a new detector for that.
        """
        return TiledDetector.from_config(
            self._same_engine(self._config.replace(**changes)), engine=self._engine
        )

    def update(self, **changes: Any) -> None:
        """Apply runtime `changes` (thresholds, tiles, overlap, merging, classes, ...) from the next call.

        Keeps the engine, the buffers and the learned sync-free limits (engine settings raise, as in `with_config`)."""
        self.reconfigure(self._config.replace(**changes))

    def reconfigure(self, config: DetectorConfig) -> None:
        """`update` to a whole config (its engine settings must be this detector's): a change of a setting that
        `Applies.DETECTOR` rebuilds the detector around its engine; the others apply from the next call."""
        if Applies.DETECTOR in self._same_engine(config).changed(self._config):
            self._setup(config, self._engine, self._capture)
            return
        # raises for an unknown class name or masks asked of a model without them: nothing changes
        if config.masks and not self._resolved.segments:
            raise ValueError(
                f"masks: true, but {config.model} has no mask prototypes (not a segmentation model)"
            )
        if config.keypoints and self._resolved.keypoints is None:
            raise ValueError(f"keypoints: true, but {config.model} is not a pose model (no keypoint columns)")
        frame_settings = config.frame_settings(self._labels)
        self._config, self._frame_settings = config, frame_settings

    def _same_engine(self, config: DetectorConfig) -> DetectorConfig:
        """`config`, when its engine settings are this detector's (else a ValueError naming them)."""
        reload = sorted(n for n in ENGINE_FIELDS if getattr(config, n) != getattr(self._config, n))
        if reload:
            raise ValueError(f"changing {', '.join(reload)} needs a new engine: create a new TiledDetector")
        return config

    def plan_for(self, height: int, width: int, camera: str | None = None) -> TilePlan:
        """The (cached) tile plan for frames of this size from `camera` (its ignore mask: `ignore_mask`)."""
        path = mask_path(self._config.ignore_mask, camera)
        return make_plan(
            (height, width),
            self._config.tile_hw_for(self._engine.input_hw),
            self._config.overlap,
            self._engine.input_hw,
            self._config.full_frame,
            self._config.roi,
            None if path is None else self._masks.get(path, (height, width)),
            self._input_format.letterbox,
        )

    def detect(
        self,
        frame: np.ndarray | torch.Tensor,
        encoding: str | Encoding = Encoding.RGB8,
        camera: str | None = None,
        depth: DepthImage | None = None,
    ) -> Detections:
        """Detect objects in an (H, W, C) frame (numpy or torch, any device) from `camera` (which ignore mask
        applies: `ignore_mask`); boxes in frame pixels. With `depth` (its aligned depth image and camera matrix)
        each detection's position and size too (`Detections.positions`, `sizes`)."""
        return self.detect_many(
            [frame], [encoding], cameras=[camera], depths=None if depth is None else [depth]
        )[0]

    def detect_many(
        self,
        frames: Sequence[np.ndarray | torch.Tensor],
        encodings: Sequence[str | Encoding] | str | Encoding = Encoding.RGB8,
        slots: Sequence[int] | None = None,
        cameras: Sequence[str | None] | None = None,
        tiles: Sequence[np.ndarray | None] | None = None,
        on_device: Callable[[list[torch.Tensor]], None] | None = None,
        depths: Sequence[DepthImage | None] | None = None,
        while_running: Callable[[], None] | None = None,
    ) -> list[Detections]:
        """Detect objects in several frames (any sizes and encodings) at once: all their tiles and views go
        through the fewest engine calls `max_batch` allows, and each frame gets the `Detections` that `detect`
        would give it (merging never mixes frames; `max_detections` is per frame). Timings are the batch's.

        `slots` names each frame's upload buffer (default: its position); give a source (a camera) the same
        slot every call, so that its buffers, and a captured frame program, are reused when some sources have
        no frame in a batch. `cameras` names each frame's camera, for its ignore mask (`ignore_mask`; None: the
        mask for every camera). `tiles` gives, per frame, the indices of the tiles of its plan (`plan_for`) to run
        (a tile budget; None: every tile); the full-frame view always runs. A captured program is keyed by how
        many tiles each frame runs, not which. `on_device` is called with the frames on the engine's device (H, W, C
        each), before the frame program is queued behind its work (the stream's camera-motion estimate).

        `depths` gives each frame its aligned depth image and camera matrix (`pipeline.depth.DepthImage`; None for a
        frame without one): each is uploaded beside its frame, and the frame program adds every detection's
        position (`Detections.positions`, `sizes`; the boxes, scores and classes are what they are without it).
        A depth image of another aspect ratio than its frame, or a camera matrix that fits neither, raises
        `DepthError` (a ValueError) before anything runs.

        `while_running` is called once, after the frame program is queued on the device and before its results
        are read: the time to `stage` the next frames (their copy then overlaps this batch's device work; on the
        CPU, where the program has run by then, nothing overlaps)."""
        fit_to_load()  # (our own processes: torch's CPU threads follow the host's load)
        encodings = self._encodings(encodings, len(frames))
        slots = range(len(frames)) if slots is None else slots
        if len(slots) != len(frames) or len(set(slots)) != len(slots):
            raise ValueError(f"slots must name each of the {len(frames)} frames once, got {list(slots)}")
        cameras = [None] * len(frames) if cameras is None else list(cameras)
        if len(cameras) != len(frames):
            raise ValueError(f"got {len(frames)} frames but {len(cameras)} cameras")
        if depths is not None and len(depths) != len(frames):
            raise ValueError(f"got {len(frames)} frames but {len(depths)} depth images")
        checked = None  # each depth as a tensor, with the camera matrix for its frame's size
        if depths is not None:
            checked = [
                None if d is None else aligned(d, f.shape[:2]) for f, d in zip(frames, depths, strict=True)
            ]
        clock = StageClock(self._engine.device, self._config.profile)
        static = self._runner.captures  # a captured program reads the same device frames every time
        uploaded = [
            self._uploader.upload(f, e, slot, static)
            for slot, f, e in zip(slots, frames, encodings, strict=True)
        ]
        if checked is not None:
            checked = [
                None if d is None else d._replace(image=self._depth_uploader.place(d.image, slot, static))
                for slot, d in zip(slots, checked, strict=True)
            ]
        clock.mark("upload")
        if on_device is not None:
            on_device(uploaded)
            clock.mark("motion")
        running = functools.cache(while_running or (lambda: None))  # runs at most once
        found = self._detect(uploaded, encodings, cameras, clock, tiles, checked, running)
        running()  # (a batch with no view to run calls it here)
        return found

    @property
    def stages(self) -> bool:
        """True where `stage` copies frames ahead (host frames to a CUDA engine, pinned memory available)."""
        return self._uploader.stages

    def stage(
        self,
        frames: Sequence[np.ndarray | torch.Tensor],
        encodings: Sequence[str | Encoding] | str | Encoding = Encoding.RGB8,
        slots: Sequence[int] | None = None,
    ) -> list[bool]:
        """Start copying the frames of a coming `detect_many` call (the same objects, the same `slots`) to the
        device now, from pinned memory on a copy stream of their own (`pipeline.upload`): called from
        `while_running`, the copies overlap the batch running. Per frame whether it was staged (False: a CPU
        engine, a frame already on the device, or no pinned memory; it is copied as usual when detected).
        Raises what `detect_many` raises for a frame it cannot take."""
        encodings = self._encodings(encodings, len(frames))
        slots = range(len(frames)) if slots is None else slots
        return [self._uploader.stage(f, e, s) for f, e, s in zip(frames, encodings, slots, strict=True)]

    def detect_device(
        self, frame: Any, encoding: str | Encoding = Encoding.RGB8, camera: str | None = None
    ) -> Detections:
        """Detect objects in a frame already on the engine's device (from `camera`, as in `detect`), with no copy
        of the input at all.

        `frame` is an (H, W, C) torch tensor, a DLPack capsule, or any object with `__dlpack__` or
        `__cuda_array_interface__` (CuPy, Numba, NVIDIA decoders); memory elsewhere raises `ZeroCopyError`.
        """
        tensor = as_torch_tensor(frame, self._engine.device)
        clock = StageClock(self._engine.device, self._config.profile)
        if self._runner.captures:  # a captured program reads its static device frame (a device-side copy)
            tensor = self._uploader.upload(tensor, encoding, static=True)
            clock.mark("upload")
        return self._detect(
            [as_frame_tensor(tensor, encoding)], [Encoding.from_value(encoding)], [camera], clock
        )[0]

    @staticmethod
    def _encodings(encodings: Sequence[str | Encoding] | str | Encoding, count: int) -> list[Encoding]:
        if isinstance(encodings, str | Encoding):
            return [Encoding.from_value(encodings)] * count
        if len(encodings) != count:
            raise ValueError(f"got {count} frames but {len(encodings)} encodings")
        return [Encoding.from_value(e) for e in encodings]

    def _detect(
        self,
        frames: list[torch.Tensor],
        encodings: list[Encoding],
        cameras: Sequence[str | None],
        clock: StageClock,
        tiles: Sequence[np.ndarray | None] | None = None,
        depths: Sequence[DepthImage | None] | None = None,
        running: Callable[[], None] = lambda: None,
    ) -> list[Detections]:
        if not frames:
            return []
        plan = batch_plan(
            [self.plan_for(f.shape[0], f.shape[1], c) for f, c in zip(frames, cameras, strict=True)]
        )
        chosen = self._selection(plan, tiles)
        if not (plan if chosen is None else chosen).batch_size:  # no view to run (full_frame off)
            located = [None if d is None else np.zeros((0, 3)) for d in depths or [None] * len(frames)]
            return [
                Detections(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), {}, p, p) for p in located
            ]
        host = found = masks = None
        if self._exact_batches:
            self._exact_batches -= 1
        elif self._sync_free:
            result, found = self._sync_free_pass(frames, encodings, plan, clock, chosen, depths, running)
            host, masks = (None, None) if result is None else result
        if host is None:  # CPU, or the sync-free result was not proven exact: the exact path
            if found is None:
                found = self._program.candidates(
                    frames, encodings, plan, self._frame_settings, clock.mark, chosen
                )
            packed, built = finish(
                found,
                plan,
                self._frame_settings,
                None,
                clock.mark,
                keypoint_shape=self._keypoint_shape,
            )
            if built is None:
                clock.mark("merge")
            if depths is not None:
                packed = self._program.positions(
                    packed, plan, self._frame_settings, depths, exact=True, masks=built
                )
                clock.mark("positions")
            running()
            labels = self._labels_here(built)
            bytes_ = FrameProgram.mask_bytes(packed, built, plan, self._frame_settings, labels, clock.mark)
            host, masks = self._download(packed, bytes_, self._label_pixels(plan, labels))
            clock.mark("download")
        timings = clock.timings()
        extra = OBB_COLUMNS if self.rotated else 0
        joints = self._joints
        posed = [None] * plan.num_frames
        if joints:
            posed = keypoint_stage.unpack(host, plan.num_frames, COLUMNS + extra, joints)
        located = [(None, None)] * plan.num_frames
        joint_positions = [None] * plan.num_frames
        if depths is not None:
            start = COLUMNS + extra + 3 * joints
            located = [
                (None, None) if d is None else p
                for d, p in zip(depths, unpack_positions(host, start, plan.num_frames), strict=True)
            ]
            if joints:
                where = keypoint_stage.unpack(host, plan.num_frames, start + DEPTH_COLUMNS, joints)
                joint_positions = [None if d is None else w for d, w in zip(depths, where, strict=True)]
        self._count_degenerate(int(host[-1, 3]))
        shown = mask_stage.frame_masks(host[:-1], masks, plan, self._frame_settings.mask_scale)
        return [
            Detections(
                rows[:, :4],
                rows[:, 4],
                rows[:, 5].astype(np.int64),
                dict(timings),
                *at,
                obb=rows[:, 6:] if extra else None,
                masks=m,
                keypoints=k,
                keypoint_positions=w,
            )
            for rows, at, m, k, w in zip(
                unpack(host, plan.num_frames, extra), located, shown, posed, joint_positions, strict=True
            )
        ]

    @property
    def _joints(self) -> int:
        """The joints each downloaded row carries (0: none: not a pose model, or `keypoints: false`)."""
        shape = self._keypoint_shape
        return 0 if shape is None or self._frame_settings.keypoints is False else shape[0]

    def _labels_here(self, built: Any) -> bool:
        """Whether this batch's label images are composed on the device: asked for, masks built, the
        accelerator's path."""
        return bool(self.label_images) and built is not None and self._sync_free

    def _label_pixels(self, plan: BatchPlan, labels: bool) -> int:
        """The label images' pixels of the batch's frames (0 where they are not composed on the device)."""
        sizes = mask_stage.label_sizes(plan, self._frame_settings.mask_scale)
        return sum(h * w for h, w in sizes) if labels else 0

    def _download(
        self, packed: torch.Tensor, built: torch.Tensor | None, label_pixels: int = 0
    ) -> tuple[np.ndarray, mask_stage.HostMasks | None]:
        """The packed rows and, where built, the masks (and the label images after them), in one device-to-host
        copy."""
        if built is None:
            return packed.cpu().numpy(), None
        data = torch.cat([packed.contiguous().view(torch.uint8).reshape(-1), built]).cpu().numpy()
        size = packed.numel() * packed.element_size()
        host = data[:size].view(np.float32).reshape(packed.shape)
        return host, mask_stage.unpack(data[size:], packed.shape[0] - 1, label_pixels)

    def _selection(self, plan: BatchPlan, tiles: Sequence[np.ndarray | None] | None) -> ViewSelection | None:
        """The chosen views of a batch on the engine's device (None: every view). Where the program is captured,
        the indices are copied into a buffer kept per (plan, counts), the one its capture reads."""
        if tiles is None or all(t is None for t in tiles):
            return None
        if len(tiles) != plan.num_frames:
            raise ValueError(f"got {plan.num_frames} frames but {len(tiles)} tile selections")
        picked = [np.arange(p.num_tiles) if t is None else t for p, t in zip(plan.plans, tiles, strict=True)]
        counts, views = selection_views(plan, picked)
        device = self._engine.device
        if not self._runner.captures:
            return select_views(plan, counts, torch.as_tensor(views, device=device))
        key = (plan, counts)
        buffer = self._views.get(key)
        if buffer is None:
            if len(self._views) >= _VIEW_BUFFERS:
                self._views.pop(next(iter(self._views)))
            buffer = self._views[key] = torch.empty(views.shape, dtype=torch.int64, device=device)
        buffer.copy_(torch.from_numpy(views), non_blocking=False)
        return select_views(plan, counts, buffer)

    def _sync_free_pass(
        self,
        frames: list[torch.Tensor],
        encodings: list[Encoding],
        plan: BatchPlan,
        clock: StageClock,
        chosen: ViewSelection | None = None,
        depths: Sequence[DepthImage | None] | None = None,
        running: Callable[[], None] = lambda: None,
    ) -> tuple[tuple[np.ndarray, mask_stage.HostMasks | None] | None, PaddedDecoded]:
        """The batch through the frame program with fixed limits and one download, and its candidates; the
        rows (and masks) are None when the status row says they are not proven exact (the limits it exceeded
        grow)."""
        settings, limits = self._frame_settings, self._limits
        # the capture key: everything the frame program reads (frame buffers, plan, how many views of each frame
        # run and the buffer naming them, settings, limits)
        views = None if chosen is None else (chosen.counts, chosen.views.data_ptr())
        located = None
        if depths is not None:  # each depth image's buffer, size, type and camera matrix
            located = tuple(
                None if d is None else (d.image.data_ptr(), tuple(d.image.shape), d.image.dtype, d.intrinsics)
                for d in depths
            )
        # (and whether the label images are composed: a second capture, selected by the `masks` subscription)
        labels = bool(self.label_images) and self._resolved.segments and settings.masks is not False
        key = (
            plan,
            tuple(encodings),
            tuple(f.data_ptr() for f in frames),
            views,
            settings,
            limits,
            located,
            labels,
        )
        mark = no_mark if self._runner.captures else clock.mark  # a capture records no stage times
        program = self._program
        packed, found, built = self._runner.run(
            key,
            lambda: program(frames, encodings, plan, settings, limits, mark, chosen, depths, labels),
            lambda: (
                program.split(frames, encodings, plan, settings, limits, chosen, depths, labels)
                if program.can_split
                else None
            ),
        )
        if self._runner.captures:
            clock.mark("graph")  # the replayed frame program, preprocessing to packed rows
        running()  # the host's time while the device runs the batch
        host, masks = self._download(packed, built, self._label_pixels(plan, labels and built is not None))
        clock.mark("download")
        needed, exact, largest = int(host[-1, 0]), host[-1, 1] == 1.0, int(host[-1, 2])
        pixels, pairs = 0 if masks is None else masks.needed, int(host[-1, 4])
        self._limits, maxed = limits.grown(needed, exact, largest, pixels, pairs)
        if maxed:
            self._exact_batches = _RETRY_AFTER
        fits = needed <= limits.capacity and exact and pixels <= limits.mask_pixels
        return ((host, masks) if fits else None), found
