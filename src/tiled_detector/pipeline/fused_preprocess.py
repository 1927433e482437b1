"""Every view of a frame cut, resized, converted and normalised into the engine's batch by one Triton kernel.

The torch preprocessing (`preprocess.Preprocessor`) writes tiles by strided copies per block, letterboxed tiles
and the full-frame view through gathers, lerps, fills and copies: a dozen launches a frame. Here one launch writes
the views of one frame (all of them, a chunk of them, or a tile budget's chosen ones, named by a device index that a
captured graph reads at each replay): each output pixel is F.interpolate's bilinear sample (align_corners False:
source = (pixel + 0.5) x region / resized - 0.5, clamped at 0, the next pixel clamped to the region) of its view's
region, each source pixel the frame's value times the encoding's factor (the model's grey past the frame's border),
the model's grey outside the resized view (letterbox padding), then (x - mean) / std; a view the same size as the
model input (a tile) reads one source pixel per output pixel. The torch preprocessing stays the reference and the
fallback (the CPU, platforms without triton); the two agree to float32 rounding before the batch's own dtype.
"""

# ruff: noqa: N803  (Triton kernels: compile-time constants and sizes are named in capitals)

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tiled_detector.pipeline import kernels
from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.tiling import TilePlan
from tiled_detector.runtime.errors import one_line

LOG = logging.getLogger(__name__)
TABLES = 32  # plans whose view tables a writer keeps on the device

PIXELS = 1024  # output pixels per program
TABLE = 10  # per view: region y, x, height, width; resized height, width; pad y, x; scale y, x

_found = kernels.triton()
if _found is not None:
    triton, tl = _found

    @triton.jit
    def _sample(frame_ptr, y, x, s_y, s_x, s_c, c, height, width, factor, pad, mask):
        """Pixel (y, x) channel c of the frame times `factor`, or `pad` past its border."""
        inside = (y >= 0) & (y < height) & (x >= 0) & (x < width) & mask
        value = tl.load(frame_ptr + y * s_y + x * s_x + c * s_c, mask=inside, other=0).to(tl.float32)
        return tl.where(inside, value * factor, pad)

    @triton.jit
    def _views_kernel(
        frame_ptr,
        table_ptr,
        index_ptr,
        out_ptr,
        height,
        width,
        s_y,
        s_x,
        s_c,
        out_h,
        out_w,
        o_b,
        o_c,
        o_y,
        o_x,
        first,
        count,
        full_view,
        factor,
        pad,
        c0,
        c1,
        c2,
        shift0,
        shift1,
        shift2,
        inverse0,
        inverse1,
        inverse2,
        INDEXED: tl.constexpr,
        NORMALIZE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        image = tl.program_id(0)
        if INDEXED:  # a tile budget: the chosen tiles (device indices), then the full-frame view
            view = tl.where(image < count, tl.load(index_ptr + tl.minimum(image, count - 1)), full_view)
        else:
            view = first + image
        row = table_ptr + view * 10
        top = tl.load(row).to(tl.int32)
        left = tl.load(row + 1).to(tl.int32)
        region_h = tl.load(row + 2).to(tl.int32)
        region_w = tl.load(row + 3).to(tl.int32)
        resized_h = tl.load(row + 4).to(tl.int32)
        resized_w = tl.load(row + 5).to(tl.int32)
        pad_y = tl.load(row + 6).to(tl.int32)
        pad_x = tl.load(row + 7).to(tl.int32)
        scale_y = tl.load(row + 8)
        scale_x = tl.load(row + 9)
        p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = p < out_h * out_w
        oy = p // out_w
        ox = p % out_w
        yy = oy - pad_y
        xx = ox - pad_x
        placed = inside & (yy >= 0) & (yy < resized_h) & (xx >= 0) & (xx < resized_w)
        out = out_ptr + image * o_b + oy * o_y + ox * o_x
        for k in tl.static_range(3):
            if k == 0:
                c = c0
            elif k == 1:
                c = c1
            else:
                c = c2
            if (region_h == resized_h) & (region_w == resized_w):  # a view the model input's size: one tap
                value = _sample(
                    frame_ptr, top + yy, left + xx, s_y, s_x, s_c, c, height, width, factor, pad, placed
                )
            else:
                source_y = tl.maximum((yy.to(tl.float32) + 0.5) * scale_y - 0.5, 0.0)
                source_x = tl.maximum((xx.to(tl.float32) + 0.5) * scale_x - 0.5, 0.0)
                y0 = source_y.to(tl.int32)
                x0 = source_x.to(tl.int32)
                y1 = y0 + (y0 < region_h - 1).to(tl.int32)
                x1 = x0 + (x0 < region_w - 1).to(tl.int32)
                wy = source_y - y0.to(tl.float32)
                wx = source_x - x0.to(tl.float32)
                a = _sample(
                    frame_ptr, top + y0, left + x0, s_y, s_x, s_c, c, height, width, factor, pad, placed
                )
                b = _sample(
                    frame_ptr, top + y0, left + x1, s_y, s_x, s_c, c, height, width, factor, pad, placed
                )
                d = _sample(
                    frame_ptr, top + y1, left + x0, s_y, s_x, s_c, c, height, width, factor, pad, placed
                )
                e = _sample(
                    frame_ptr, top + y1, left + x1, s_y, s_x, s_c, c, height, width, factor, pad, placed
                )
                value = (1.0 - wy) * ((1.0 - wx) * a + wx * b) + wy * ((1.0 - wx) * d + wx * e)
            value = tl.where(placed, value, pad)
            if NORMALIZE:  # in the batch's dtype, as torch's addcmul on the batch
                value = value.to(out_ptr.dtype.element_ty).to(tl.float32)
                if k == 0:
                    value = shift0 + value * inverse0
                elif k == 1:
                    value = shift1 + value * inverse1
                else:
                    value = shift2 + value * inverse2
            tl.store(out + k * o_c, value.to(out_ptr.dtype.element_ty), mask=inside)


def view_table(plan: TilePlan, device: torch.device) -> torch.Tensor:
    """(B, TABLE) float32 on `device`: each view's frame region, resized size, padding and scales (region over
    resized, float32 as torch computes F.interpolate's)."""
    rows = []
    for k in range(plan.batch_size):
        if k < plan.num_tiles:
            x1, y1, x2, y2 = (int(v) for v in plan.tiles[k])
            box = plan.tile_letterbox
        else:
            x1, y1, x2, y2 = 0, 0, plan.frame_hw[1], plan.frame_hw[0]
            box = plan.frame_letterbox
        (rh, rw), (h, w) = box.resized_hw, (y2 - y1, x2 - x1)
        scales = np.float32(h) / np.float32(rh), np.float32(w) / np.float32(rw)
        rows.append([y1, x1, h, w, rh, rw, box.pad_y, box.pad_x, *scales])
    return torch.tensor(np.array(rows, np.float32), device=device)


def affine(
    mean: tuple[float, ...], std: tuple[float, ...], dtype: torch.dtype
) -> tuple[tuple[float, ...], ...]:
    """(shift, inverse) per channel of (x - mean) / std as the torch preprocessing holds them: float32, then the
    batch's dtype."""
    std32 = np.asarray(std, np.float32)
    inverse, shift = np.float32(1.0) / std32, -np.asarray(mean, np.float32) / std32
    if dtype == torch.float16:
        inverse, shift = inverse.astype(np.float16), shift.astype(np.float16)
    return tuple(float(v) for v in shift), tuple(float(v) for v in inverse)


def prepare(
    frame: torch.Tensor,
    table: torch.Tensor,
    out: torch.Tensor,
    sources: tuple[int, int, int],
    factor: float,
    pad: float,
    normalize: tuple[tuple[float, ...], ...] | None,
    views: tuple[int, int] | None = None,
    chosen: torch.Tensor | None = None,
    full_view: int = -1,
) -> None:
    """Write views of the (H, W, C) `frame` into `out` (N, 3, H, W; any strides) in one launch: views
    views[0]..views[1]-1 of the plan whose `view_table` is `table`, or (`chosen`: (S,) int64 tile indices on the
    device) the chosen tiles, then the full-frame view `full_view` when it is >= 0. `sources`: the frame channel
    of each model channel; `factor`: the encoding's value scale; `pad`: the grey of padding and of pixels past the
    border; `normalize`: (shift, inverse) per channel (`affine`), or None."""
    first, count, indexed = 0, 0, chosen is not None and len(chosen) > 0
    if chosen is None:
        assert views is not None
        first, images = views[0], views[1] - views[0]
    elif indexed:
        count, images = len(chosen), len(chosen) + int(full_view >= 0)
    else:  # no tile chosen: the full-frame view alone
        first, images = full_view, int(full_view >= 0)
    if images <= 0:
        return
    height, width = out.shape[2:]
    shift, inverse = normalize if normalize is not None else ((0.0,) * 3, (1.0,) * 3)
    _views_kernel[(images, triton.cdiv(height * width, PIXELS))](
        frame,
        table,
        chosen if indexed else table,
        out,
        frame.shape[0],
        frame.shape[1],
        *frame.stride(),
        height,
        width,
        *out.stride(),
        first,
        count,
        full_view,
        float(factor),
        float(pad),
        *sources,
        *shift,
        *inverse,
        INDEXED=indexed,
        NORMALIZE=normalize is not None,
        BLOCK=PIXELS,
        **kernels.launch_options(),
    )


class Writer:
    """The kernel for one preprocessor: each plan's view table on the device (made once), its input format's
    constants, and the torch preprocessing for good where the kernel fails (`write` then says False, with one
    WARNING line)."""

    def __init__(
        self,
        fmt: Any,
        dtype: torch.dtype,
        device: torch.device,
        sources: Callable[[Encoding], tuple[int, ...]],
    ) -> None:
        self.format, self.dtype, self.device, self.sources = fmt, dtype, device, sources
        self.working = True
        self._tables: dict[TilePlan, torch.Tensor] = {}
        self._normalize = affine(fmt.mean, fmt.std, dtype) if fmt.normalizes else None

    def write(
        self, frame: torch.Tensor, plan: TilePlan, enc: Encoding, out: torch.Tensor, **which: Any
    ) -> bool:
        """`prepare` of the frame's views `which` (views, or chosen and full_view) into `out`; False where the
        kernel does not run (it failed once: the caller's torch preprocessing writes them)."""
        if not self.working:
            return False
        table = self._tables.get(plan)
        if table is None:
            if len(self._tables) >= TABLES:
                self._tables.clear()
            table = self._tables[plan] = view_table(plan, self.device)
        factor, pad = self.format.factor(enc), self.format.pad
        try:
            prepare(frame, table, out, self.sources(enc), factor, pad, self._normalize, **which)  # type: ignore[arg-type]
        except Exception as error:
            LOG.warning(
                "the preprocessing kernel failed (%s): the torch preprocessing runs from now on",
                one_line(error),
            )
            self.working = False
            return False
        return True
