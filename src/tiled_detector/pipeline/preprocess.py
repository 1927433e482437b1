"""Device frame -> engine input batch: tile crops and a letterboxed full frame, written in place.

The raw frame is already on the device (`tiled_detector.pipeline.upload`); everything here runs there. Tiles that form a
grid inside the frame are copied with one strided view per block (per block and channel where the channel order
reverses, BGR into RGB; on the CPU in bands of rows, so that float32's scaling pass reads from cache), others with
one batched gather (channel reorder and mono -> 3 channels folded in) and padded with the model's grey (`InputFormat`) past
the border; tiles are letterboxed in one `F.interpolate` call when the tile size differs from the model input. A
downscaled full frame reads only the pixels bilinear sampling uses (2 rows and 2 columns per output pixel, 1 where
the weight is 0) from the integer frame, through strided views where they are evenly spaced (integer downscales)
and gathers elsewhere, so its cost follows the view, not the frame (no full-frame float copy). Results are written
in place into a batch tensor (B, 3, H, W) in the engine's layout (channels-last for fp16 on CUDA: tile rows are
then contiguous on both sides of the copy), the engine's bound input or one reused across frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from tiled_detector.pipeline import host_tiles, kernels
from tiled_detector.pipeline.encodings import Encoding, as_frame_tensor
from tiled_detector.pipeline.resample import bilinear_axis, sampled_bilinear
from tiled_detector.pipeline.tiling import Letterbox, TilePlan
from tiled_detector.runtime.devices import concrete_device
from tiled_detector.settings.options import check_channel_order

PAD_VALUE = 114.0 / 255.0  # YOLO's grey at the default input scale
DEFAULT_SCALE = 1.0 / 255.0


@dataclass(frozen=True)
class InputFormat:
    """How the model wants its input: channel order, a multiplier on 0-255 pixel values (`scale`), then per channel
    (x - mean) / std (in the model's channel order), views resized and placed at the centre or top-left of the
    input, or stretched over all of it (`letterbox`), padding and pixels past a frame's border at grey level `pad_value` (0-255). The defaults
    are ultralytics' (RGB, 1/255, centred, 114). Checked on construction (ValueError naming the setting)."""

    channel_order: str = "rgb"
    scale: float = DEFAULT_SCALE
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    letterbox: str = "center"
    pad_value: float = 114.0

    def __post_init__(self) -> None:
        check_channel_order(self.channel_order)
        number = lambda v: isinstance(v, int | float) and not isinstance(v, bool)  # noqa: E731
        if not number(self.scale) or not self.scale > 0:
            raise ValueError(f"input_scale must be a number > 0, got {self.scale!r}")
        for name, values in (("input_mean", self.mean), ("input_std", self.std)):
            if not isinstance(values, tuple | list) or len(values) != 3 or not all(map(number, values)):
                raise ValueError(f"{name} must be 3 numbers, one per input channel, got {values!r}")
        if 0 in self.std:
            raise ValueError(f"input_std must not hold a 0 (it divides), got {list(self.std)}")
        if self.letterbox not in ("center", "top_left", "stretch"):
            raise ValueError(f"letterbox must be center, top_left or stretch, got {self.letterbox!r}")
        if not number(self.pad_value) or not 0 <= self.pad_value <= 255:
            raise ValueError(f"pad_value must be a grey level in [0, 255], got {self.pad_value!r}")
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))

    def factor(self, enc: Encoding) -> float:
        """The multiplier on an encoding's raw values (16-bit values are 0-65535, `scale` is per 0-255 level)."""
        return enc.scale if self.scale == DEFAULT_SCALE else self.scale * 255.0 * enc.scale

    @property
    def pad(self) -> float:
        """The padding's value before normalisation."""
        return self.pad_value * self.scale

    @property
    def normalizes(self) -> bool:
        """Whether (x - mean) / std changes anything."""
        return self.mean != (0.0, 0.0, 0.0) or self.std != (1.0, 1.0, 1.0)


CPU_BAND_ROWS = 64  # tile rows converted and scaled together on the CPU (about 1 MB per tile: stays in cache)
_CACHED = 32  # tile copies and scratch tensors kept (per frame size and tile range)


@dataclass(frozen=True)
class _Block:
    """Tiles whose starts step evenly along both axes: per channel, one strided view of the frame covers them
    all and one strided view of the batch (seen as a (rows, cols) grid of tiles) receives them."""

    grid_rows: slice
    grid_cols: slice
    origin: tuple[int, int]  # y, x of the block's first tile
    step: tuple[int, int]  # y, x distance between neighbouring tiles


@dataclass(frozen=True)
class _TileCopy:
    """How one plan's tiles are cut from a frame: strided `blocks` when the tiles form a grid inside the frame,
    else one gather with clamped `rows` / `cols` indices and an `outside` mask of padded pixels."""

    tile_hw: tuple[int, int]
    grid_hw: tuple[int, int]
    blocks: tuple[_Block, ...] = ()
    rows: torch.Tensor | None = None  # (N, 1, th, 1) int64
    cols: torch.Tensor | None = None  # (N, 1, 1, tw) int64
    outside: torch.Tensor | None = None  # (N, 1, th, tw) bool, True where a tile lies past the border


def _even_runs(starts: list[int]) -> list[tuple[int, int, int]]:
    """Split sorted tile starts into runs with one step: (index of the first, count, step)."""
    runs, i = [], 0
    while i < len(starts):
        j = i + 1
        step = starts[j] - starts[i] if j < len(starts) else 0
        while j + 1 < len(starts) and starts[j + 1] - starts[j] == step:
            j += 1
        count = min(j + 1, len(starts)) - i
        runs.append((i, count, step))
        i += count
    return runs


def _tile_copy(tiles: np.ndarray, height: int, width: int, device: torch.device) -> _TileCopy:
    """Precompute the cheapest way to cut `tiles` (N, 4) from a (height, width) frame."""
    tile_hw = (int(tiles[0, 3] - tiles[0, 1]), int(tiles[0, 2] - tiles[0, 0]))
    ys, xs = sorted(set(tiles[:, 1].tolist())), sorted(set(tiles[:, 0].tolist()))
    grid = np.array([[x, y, x + tile_hw[1], y + tile_hw[0]] for y in ys for x in xs])
    inside = tiles[:, :2].min() >= 0 and tiles[:, 2].max() <= width and tiles[:, 3].max() <= height
    if inside and np.array_equal(grid, tiles):
        blocks = tuple(
            _Block(slice(ry, ry + ny), slice(rx, rx + nx), (ys[ry], xs[rx]), (sy, sx))
            for ry, ny, sy in _even_runs(ys)
            for rx, nx, sx in _even_runs(xs)
        )
        return _TileCopy(tile_hw, (len(ys), len(xs)), blocks=blocks)
    t = torch.tensor(tiles, dtype=torch.int64, device=device)
    rows = t[:, 1:2] + torch.arange(tile_hw[0], device=device)  # (N, th)
    cols = t[:, 0:1] + torch.arange(tile_hw[1], device=device)  # (N, tw)
    outside = ~(
        ((rows >= 0) & (rows < height))[:, None, :, None] & ((cols >= 0) & (cols < width))[:, None, None, :]
    )
    return _TileCopy(
        tile_hw,
        (len(tiles), 1),
        rows=rows.clamp(0, height - 1)[:, None, :, None],
        cols=cols.clamp(0, width - 1)[:, None, None, :],
        outside=outside,
    )


class Preprocessor:
    """Turns frames into the engine's input batch on `device` (not thread-safe: it owns reused buffers)."""

    def __init__(
        self,
        device: str | torch.device,
        dtype: torch.dtype,
        input_hw: tuple[int, int],
        channel_order: str | InputFormat = "rgb",
        memory_format: torch.memory_format = torch.contiguous_format,
        capacity: int = 1,
    ) -> None:
        # the input conventions (a channel order alone: ultralytics' for the rest)
        self.format = channel_order if isinstance(channel_order, InputFormat) else InputFormat(channel_order)
        self.channel_order = self.format.channel_order
        # its own batch is allocated at least this large (the engine's max_batch), once: a captured frame program
        # keeps writing the same memory, which a larger batch asked for later would otherwise replace
        self.capacity = capacity
        self.device = concrete_device(device)
        self.dtype = dtype
        self.memory_format = memory_format  # the batch's layout: the engine's (`Engine.memory_format`)
        self.input_hw = (int(input_hw[0]), int(input_hw[1]))
        self._batch: torch.Tensor | None = None
        # (plan, tile range) -> how to cut those tiles; frame / tile shape -> scratch tensor (bounded caches: a
        # batch of several frames alternates between their plans and sizes)
        self._copies: dict[tuple[TilePlan, tuple[int, int]], _TileCopy] = {}
        self._scratch: dict[tuple[str, tuple[int, ...], torch.dtype], torch.Tensor] = {}
        self._order: dict[tuple[int, int, int], torch.Tensor] = {}
        # (plan, frame shape and strides) -> the plan's tile starts in `_windows` (the plan kept alive with it)
        self._starts: dict[tuple[int, ...], tuple[TilePlan, torch.Tensor | None]] = {}
        # (x - mean) / std as x * inverse + shift, per channel on the device (None: nothing to do)
        self._affine = None
        if self.format.normalizes:
            std = torch.tensor(self.format.std, dtype=torch.float32)
            inverse, shift = 1.0 / std, -torch.tensor(self.format.mean, dtype=torch.float32) / std
            self._affine = tuple(t.view(3, 1, 1).to(self.device, dtype) for t in (shift, inverse))
        # where the Triton kernels run: every view of a frame in one launch (`fused_preprocess.Writer`)
        self._fused = None
        if kernels.enabled(self.device):
            from tiled_detector.pipeline import fused_preprocess

            self._fused = fused_preprocess.Writer(self.format, self.dtype, self.device, self._sources)

    def run(
        self,
        frame: np.ndarray | torch.Tensor,
        plan: TilePlan,
        encoding: str | Encoding = Encoding.RGB8,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write the tiles (+ full-frame view) of a frame anywhere into the batch and return it (B, 3, H, W)
        (a plain copy to the device first: the pipeline's upload is `tiled_detector.pipeline.upload`)."""
        return self.prepare(as_frame_tensor(frame, encoding).to(self.device), plan, encoding, out)

    def prepare(
        self,
        frame: torch.Tensor,
        plan: TilePlan,
        encoding: str | Encoding = Encoding.RGB8,
        out: torch.Tensor | None = None,
        views: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Write the tiles and the full-frame view of a device frame (H, W, C) into the batch and return it.

        `views` (start, stop) writes only those batch images of the plan (a chunk of a frame with more views
        than one engine call takes), at batch positions 0..stop-start-1. `out` is a buffer to write into (e.g. an
        engine's bound input, at least that long); without it the preprocessor's own batch tensor is reused.
        """
        enc = Encoding.from_value(encoding)
        frame = as_frame_tensor(frame, enc)
        if frame.device != self.device:
            raise ValueError(f"frame is on {frame.device}, the preprocessor writes on {self.device}")
        start, stop = views or (0, plan.batch_size)
        if not 0 <= start < stop <= plan.batch_size:
            raise ValueError(f"views must be (start, stop) within 0..{plan.batch_size}, got {views}")
        batch = self.batch(stop - start, out)
        if self._fused is not None and self._fused.write(frame, plan, enc, batch, views=(start, stop)):
            return batch
        n_tiles = len(plan.tiles)
        order = self._channel_order(enc)
        tiles_stop = min(stop, n_tiles)
        if start < tiles_stop:
            self._write_tiles(frame, plan, (start, tiles_stop), enc, order, batch[: tiles_stop - start])
        if plan.full_frame and start <= n_tiles < stop:
            self._write_full_frame(frame, plan, enc, batch[n_tiles - start])
        self._normalize(batch)
        return batch

    def _normalize(self, images: torch.Tensor) -> None:
        """(x - mean) / std in place, in one pass (only for a model whose input format asks for it)."""
        if self._affine is not None and len(images):
            torch.addcmul(self._affine[0], images, self._affine[1], out=images)

    def prepare_chosen(
        self,
        frame: torch.Tensor,
        plan: TilePlan,
        encoding: Encoding,
        out: torch.Tensor,
        tiles: torch.Tensor,
        full_frame: bool,
    ) -> None:
        """Write the plan's tiles `tiles` ((S,) int64 indices on the device, which a captured program reads as
        they are at each replay) into out[:S], then the full-frame view into out[S] when `full_frame`.

        Tiles inside the frame are S windows of one strided view of it (`_windows`: one index_select, whatever
        tiles are chosen); tiles reaching past its border (a frame smaller than a tile) are one gather."""
        enc = Encoding.from_value(encoding)
        count = len(tiles)
        full_view = plan.num_tiles if full_frame else -1
        if self._fused is not None and self._fused.write(
            frame, plan, enc, out, chosen=tiles, full_view=full_view
        ):
            return
        if count:
            tile_hw = (int(plan.tiles[0, 3] - plan.tiles[0, 1]), int(plan.tiles[0, 2] - plan.tiles[0, 0]))
            same_size = tile_hw == self.input_hw
            dst = out[:count] if same_size else self._buffer("tiles", (count, 3, *tile_hw))
            starts = self._tile_starts(plan, frame)
            if starts is not None:
                picked = _windows(frame, tile_hw).index_select(0, starts[tiles])  # (S, th, tw, C)
                colors = picked[..., : 1 if frame.shape[2] == 1 else 3].permute(0, 3, 1, 2)
                view = _channels(colors, self._sources(enc))
                if self.dtype == torch.float32:  # convert, then scale in place (as `_write_tiles`)
                    dst.copy_(view)
                    dst.mul_(self.format.factor(enc))
                else:
                    torch.mul(view, self.format.factor(enc), out=dst)
            else:
                copy = self._tile_copy(plan, (0, plan.num_tiles), *frame.shape[:2])
                assert copy.rows is not None and copy.cols is not None and copy.outside is not None
                order = self._channel_order(enc)[None, :, None, None]
                torch.mul(frame[copy.rows[tiles], copy.cols[tiles], order], self.format.factor(enc), out=dst)
                dst.masked_fill_(copy.outside[tiles], self.format.pad)
            if not same_size:
                _letterbox_into(dst, plan.tile_letterbox, out[:count], self.format.pad)
        if full_frame:
            self._write_full_frame(frame, plan, enc, out[count])
        self._normalize(out[: count + int(full_frame)])

    def _tile_starts(self, plan: TilePlan, frame: torch.Tensor) -> torch.Tensor | None:
        """(N,) int64 on the device: where each tile of the plan starts in `_windows(frame)` (elements); None when
        a tile reaches past the frame's border."""
        key = (id(plan), *frame.shape, *frame.stride())
        if key not in self._starts:
            if len(self._starts) >= _CACHED:
                self._starts.clear()
            height, width = frame.shape[:2]
            tiles, starts = plan.tiles, None
            if tiles[:, :2].min() >= 0 and tiles[:, 2].max() <= width and tiles[:, 3].max() <= height:
                offsets = tiles[:, 1] * frame.stride(0) + tiles[:, 0] * frame.stride(1)
                starts = torch.tensor(offsets, dtype=torch.int64, device=self.device)
            self._starts[key] = (plan, starts)
        return self._starts[key][1]

    def batch(self, batch_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """The first `batch_size` images of `out` (checked to fit), or of the preprocessor's own reused batch."""
        shape = (3, *self.input_hw)
        if out is not None:
            if out.dim() != 4 or tuple(out.shape[1:]) != shape or out.shape[0] < batch_size:
                raise ValueError(
                    f"out must be (>={batch_size}, {', '.join(map(str, shape))}), got {tuple(out.shape)}"
                )
            layout = out.is_contiguous(memory_format=self.memory_format)
            if out.dtype != self.dtype or out.device != self.device or not layout:
                kind = (
                    "contiguous"
                    if self.memory_format == torch.contiguous_format
                    else "channels-last contiguous"
                )
                raise ValueError(
                    f"out must be a {kind} {self.dtype} tensor on {self.device}, "
                    f"got {out.dtype} on {out.device}" + ("" if layout else " in another layout")
                )
            return out[:batch_size]
        if self._batch is None or self._batch.shape[0] < batch_size:  # kept at the largest batch asked for
            self._batch = self.new_batch(max(batch_size, self.capacity))
        return self._batch[:batch_size]

    def new_batch(self, batch_size: int) -> torch.Tensor:
        """A new (uninitialised) batch tensor of `batch_size` model inputs in the engine's dtype and layout."""
        return torch.empty(
            (batch_size, 3, *self.input_hw),
            dtype=self.dtype,
            device=self.device,
            memory_format=self.memory_format,
        )

    def _sources(self, enc: Encoding) -> tuple[int, int, int]:
        """Source channel of each of the model's three input channels."""
        return enc.rgb_order[::-1] if self.channel_order == "bgr" else enc.rgb_order

    def _channel_order(self, enc: Encoding) -> torch.Tensor:
        key = self._sources(enc)
        if key not in self._order:
            self._order[key] = torch.tensor(key, dtype=torch.int64, device=self.device)
        return self._order[key]

    def _tile_copy(self, plan: TilePlan, tiles: tuple[int, int], height: int, width: int) -> _TileCopy:
        key = (plan, tiles)
        if key not in self._copies:
            if len(self._copies) >= _CACHED:
                self._copies.clear()
            self._copies[key] = _tile_copy(plan.tiles[tiles[0] : tiles[1]], height, width, self.device)
        return self._copies[key]

    def _buffer(
        self,
        kind: str,
        shape: tuple[int, ...],
        like: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """A reused scratch tensor of this kind and shape (`like`: with its memory format) in `dtype` (default: the
        engine's)."""
        dtype = self.dtype if dtype is None else dtype
        key = (kind, shape, dtype)
        if key not in self._scratch:
            if len(self._scratch) >= _CACHED:
                self._scratch.clear()
            self._scratch[key] = (
                torch.empty(shape, dtype=dtype, device=self.device)
                if like is None
                else torch.empty_like(like, dtype=dtype)
            )
        return self._scratch[key]

    def _write_tiles(
        self,
        frame: torch.Tensor,
        plan: TilePlan,
        tiles: tuple[int, int],
        enc: Encoding,
        order: torch.Tensor,
        dst: torch.Tensor,
    ) -> None:
        copy = self._tile_copy(plan, tiles, frame.shape[0], frame.shape[1])
        boxes = plan.tiles[tiles[0] : tiles[1]]
        same_size = copy.tile_hw == self.input_hw
        tiles = dst if same_size else self._buffer("tiles", (len(dst), 3, *copy.tile_hw))
        # float32: convert each channel with one strided copy, then scale the contiguous tiles (two passes instead
        # of mul's slower cast-and-copy; on the CPU band by band, so the second pass reads what the first left in
        # cache); fp16 keeps the float32 product (16-bit values overflow fp16). A CPU splits the channels with
        # OpenCV first where it can read the frame (`_cpu_tiles`)
        convert_then_scale = self.dtype == torch.float32
        factor = self.format.factor(enc)
        cpu = convert_then_scale and self.device.type == "cpu"
        if copy.blocks and not (cpu and self._cpu_tiles(frame, boxes, copy.tile_hw, enc, tiles, factor)):
            grid = tiles.view(*copy.grid_hw, *tiles.shape[1:])
            row_stride, col_stride, channel_stride = frame.stride()
            views = _channel_views(self._sources(enc))
            band = CPU_BAND_ROWS if self.device.type == "cpu" else copy.tile_hw[0]
            for block in copy.blocks:
                target = grid[block.grid_rows, block.grid_cols]
                first = frame.storage_offset() + block.origin[0] * row_stride + block.origin[1] * col_stride
                pairs = []
                for channels, source, step in views:
                    out = target[:, :, channels]
                    size = (*out.shape[:3], *copy.tile_hw)
                    strides = (
                        block.step[0] * row_stride,
                        block.step[1] * col_stride,
                        step * channel_stride,
                        row_stride,
                        col_stride,
                    )
                    pairs.append((out, frame.as_strided(size, strides, first + source * channel_stride)))
                for top in range(0, copy.tile_hw[0], band):
                    rows = slice(top, top + band)
                    for out, view in pairs:
                        if convert_then_scale:
                            out[..., rows, :].copy_(view[..., rows, :])
                        else:
                            torch.mul(view[..., rows, :], factor, out=out[..., rows, :])
                    if convert_then_scale:
                        target[..., rows, :].mul_(factor)
        elif not copy.blocks:
            crops = frame[copy.rows, copy.cols, order[None, :, None, None]]  # (N, 3, th, tw): one gather
            torch.mul(crops, factor, out=tiles)
            tiles.masked_fill_(copy.outside, self.format.pad)
        if not same_size:
            _letterbox_into(tiles, plan.tile_letterbox, dst, self.format.pad)

    def _cpu_tiles(
        self,
        frame: torch.Tensor,
        boxes: np.ndarray,
        tile_hw: tuple[int, int],
        enc: Encoding,
        dst: torch.Tensor,
        factor: float,
    ) -> bool:
        """The CPU's float32 tiles through `host_tiles.write` (its planes reused); False where it cannot read the
        frame (the torch path then writes them)."""
        if not host_tiles.readable(frame):
            return False
        workers = torch.get_num_threads()  # as many as torch's own CPU work takes (OMP_NUM_THREADS, the load)
        planes = self._buffer("planes", (workers, frame.shape[2], *tile_hw), dtype=frame.dtype)
        host_tiles.write(frame, boxes, tile_hw, self._sources(enc), dst, factor, planes)
        return True

    def _cpu_full_frame(
        self,
        frame: torch.Tensor,
        box: Letterbox,
        sources: tuple[int, int, int],
        factor: float,
        dst: torch.Tensor,
    ) -> bool:
        """A CPU's full-frame view where the downscale reads one evenly spaced pixel per output (its bilinear weights
        all 0: an odd integer downscale, 1920 -> 640) through `host_tiles.write_sampled`, the padding strips around
        it filled; False (nothing written) elsewhere (the torch path then writes it, the same values)."""
        if self.device.type != "cpu" or self.dtype != torch.float32 or not host_tiles.readable(frame):
            return False
        (rh, rw), py, px = box.resized_hw, box.pad_y, box.pad_x
        rows = bilinear_axis(frame.shape[0], rh, frame.device)
        cols = bilinear_axis(frame.shape[1], rw, frame.device)
        if rows.taps != 1 or cols.taps != 1 or rows.index is not None or cols.index is not None:
            return False
        planes = self._buffer("view planes", (4, rh, rw), dtype=frame.dtype)
        image = dst[:, py : py + rh, px : px + rw]
        if not host_tiles.write_sampled(
            frame, (rows.start, rows.step, rh), (cols.start, cols.step, rw), sources, image, factor, planes
        ):
            return False
        _pad_strips(dst.unsqueeze(0), box, self.format.pad)
        return True

    def _write_full_frame(
        self, frame: torch.Tensor, plan: TilePlan, enc: Encoding, dst: torch.Tensor
    ) -> None:
        box, sources = plan.frame_letterbox, self._sources(enc)
        if max(box.scales) <= 1.0 and self._cpu_full_frame(frame, box, sources, self.format.factor(enc), dst):
            return
        if max(box.scales) <= 1.0:  # downscale: only the pixels the view reads are picked and converted
            colors = frame[..., : 1 if frame.shape[2] == 1 else 3]
            resized = sampled_bilinear(colors, box.resized_hw, self.format.factor(enc))
            _place(resized, box, dst.unsqueeze(0), self.format.pad, sources)
            return
        color = frame[..., : 1 if frame.shape[2] == 1 else 3].permute(2, 0, 1).unsqueeze(0)
        scaled = self._buffer("frame", tuple(color.shape), like=color)  # channels-last, like the view
        # scale before any fp16 cast: mono16 overflows fp16
        torch.mul(color, self.format.factor(enc), out=scaled)
        _letterbox_into(scaled, box, dst.unsqueeze(0), self.format.pad, sources)


def _windows(frame: torch.Tensor, tile_hw: tuple[int, int]) -> torch.Tensor:
    """Every (th, tw) window of an (H, W, C) frame as one strided view (L, th, tw, C): window k starts k elements
    into the frame, so the tile at (y, x) is window y * row stride + x * column stride (no copy)."""
    (rows, cols, channels), (th, tw) = frame.stride(), tile_hw
    height, width = frame.shape[:2]
    count = (height - th) * rows + (width - tw) * cols + 1
    return frame.as_strided(
        (count, th, tw, frame.shape[2]), (1, rows, cols, channels), frame.storage_offset()
    )


def _channel_views(sources: tuple[int, int, int]) -> list[tuple[slice, int, int]]:
    """(model channels, first source channel, source channel step) of the strided views that read `sources`: one
    view of all three when they are evenly spaced going up (RGB into an RGB model, or mono into all three: a
    channels-last batch is then written in contiguous rows), else one view per channel (BGR into RGB)."""
    step = sources[1] - sources[0]
    if step >= 0 and sources[2] - sources[1] == step:
        return [(slice(0, 3), sources[0], step)]
    return [(slice(k, k + 1), source, 0) for k, source in enumerate(sources)]


def _letterbox_into(
    images: torch.Tensor,
    box: Letterbox,
    dst: torch.Tensor,
    pad: float,
    sources: tuple[int, ...] | None = None,
) -> None:
    """Letterbox (N, C, h, w) `images` into `dst` (N, 3, H, W), padded with `pad`.

    One bilinear resize to `box.resized_hw`, then channels `sources` of the result picked (reorder / mono -> 3
    channels on the small image)."""
    _place(
        F.interpolate(images, size=box.resized_hw, mode="bilinear", align_corners=False),
        box,
        dst,
        pad,
        sources,
    )


def _place(
    resized: torch.Tensor, box: Letterbox, dst: torch.Tensor, pad: float, sources: tuple[int, ...] | None
) -> None:
    """Write resized (N, C, rh, rw) images (channels `sources` of them, default all) padded with `pad` into `dst`
    (N, 3, H, W)."""
    _pad_strips(dst, box, pad)
    (rh, rw), py, px = box.resized_hw, box.pad_y, box.pad_x
    dst[:, :, py : py + rh, px : px + rw].copy_(_channels(resized, sources))


def _pad_strips(dst: torch.Tensor, box: Letterbox, pad: float) -> None:
    """Fill the padding around a letterboxed image in `dst` (N, 3, H, W) with `pad` (the image's own pixels are
    written once, by whoever places it)."""
    (rh, rw), py, px = box.resized_hw, box.pad_y, box.pad_x
    height, width = dst.shape[2:]
    for rows, cols in (
        (slice(0, py), slice(0, width)),
        (slice(py + rh, height), slice(0, width)),
        (slice(py, py + rh), slice(0, px)),
        (slice(py, py + rh), slice(px + rw, width)),
    ):
        if rows.stop != rows.start and cols.stop != cols.start:
            dst[:, :, rows, cols].fill_(pad)


def _channels(images: torch.Tensor, sources: tuple[int, ...] | None) -> torch.Tensor:
    """Channels `sources` of (N, C, h, w) images: a view for all of them in order or one repeated (mono), a flip
    for all in reverse (BGR <-> RGB); the only orders encodings and models ask for."""
    if sources is None or sources == tuple(range(images.shape[1])):
        return images
    if len(set(sources)) == 1:
        return images[:, sources[0] : sources[0] + 1].expand(-1, len(sources), -1, -1)
    if sources == tuple(range(images.shape[1] - 1, -1, -1)):
        return images.flip(1)
    raise ValueError(f"channel order {sources} of {images.shape[1]} channels is not supported")
