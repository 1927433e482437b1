"""Tiles cut from a frame in host memory into float32 model inputs, the CPU's fast path of `pipeline.preprocess`.

A tile's interleaved channels are split apart by OpenCV (vectorised), then each channel is converted and scaled in
one contiguous numpy pass: the same values as the torch path (the integer value converted to float32, then
multiplied by the float32 factor), at about a third of its time here, where torch's conversion reads the frame's
interleaved channels with a stride (issue 57). The torch path stays the reference (and the GPU's path).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch


def readable(frame: torch.Tensor) -> bool:
    """Whether OpenCV can read an (H, W, C) host frame: 8- or 16-bit, its pixels packed (rows at any stride)."""
    channels = frame.shape[2]
    return (
        frame.device.type == "cpu"
        and frame.dtype in (torch.uint8, torch.uint16)
        and frame.stride(2) == 1
        and frame.stride(1) == channels
    )


def write(
    frame: torch.Tensor,
    boxes: np.ndarray,
    tile_hw: tuple[int, int],
    sources: tuple[int, int, int],
    dst: torch.Tensor,
    factor: float,
    planes: torch.Tensor,
) -> None:
    """Tiles `boxes` (N, 4) x1, y1, x2, y2 (inside the frame, `tile_hw` each) of a `readable` frame into `dst` (N, 3,
    th, tw) float32 (contiguous): model channel c from frame channel `sources[c]`, times `factor`. `planes` (T, C,
    th, tw) in the frame's dtype: scratch for the split channels of T workers, the tiles shared among as many threads
    (OpenCV and numpy let go of the GIL; T = 1: this thread alone)."""
    pixels, out = frame.numpy(), dst.numpy()
    workers = min(len(planes), len(boxes))
    if workers <= 1:
        _tiles(pixels, boxes, tile_hw, sources, out, factor, planes[0].numpy(), range(len(boxes)))
        return
    parts = [range(k, len(boxes), workers) for k in range(workers)]
    jobs = [
        _pool(workers).submit(_tiles, pixels, boxes, tile_hw, sources, out, factor, planes[k].numpy(), part)
        for k, part in enumerate(parts)
    ]
    for job in jobs:
        job.result()


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="host-tiles")


def _tiles(
    pixels: np.ndarray,
    boxes: np.ndarray,
    tile_hw: tuple[int, int],
    sources: tuple[int, int, int],
    out: np.ndarray,
    factor: float,
    planes: np.ndarray,
    picked: range,
) -> None:
    """Tiles `picked` of `write`, with one worker's planes."""
    th, tw = tile_hw
    for k in picked:
        x0, y0 = int(boxes[k, 0]), int(boxes[k, 1])
        _convert(pixels[y0 : y0 + th, x0 : x0 + tw], sources, out[k], factor, planes)


def write_sampled(
    frame: torch.Tensor,
    rows: tuple[int, int, int],
    cols: tuple[int, int, int],
    sources: tuple[int, int, int],
    dst: torch.Tensor,
    factor: float,
    planes: torch.Tensor,
) -> bool:
    """An evenly spaced subsample of a `readable` frame (`rows`, `cols`: first, step, count; the full view of an odd
    integer downscale, 1920 -> 640 every 3rd pixel from the 2nd) into `dst` (3, h, w) float32 (rows at any stride),
    as `write` writes a tile: each output's block of `step` pixels read as one pixel of step x C channels, of which
    OpenCV takes the ones read without a copy of the subsample (a strided copy of 3-byte pixels is slow in numpy and
    torch alike). `planes` (4, h, w) in the frame's dtype. False (nothing written) where the blocks do not fit the
    row."""
    (r0, rs, rh), (c0, cs, rw) = rows, cols
    channels = frame.shape[2]
    if c0 >= cs or cs * rw > frame.shape[1]:
        return False
    pixels = frame.numpy()[r0::rs][:rh, : cs * rw]
    blocks = pixels.reshape(rh, rw, cs * channels)  # (a view: each row's pixels are contiguous)
    _convert(blocks, tuple(c0 * channels + s for s in sources), dst.numpy(), factor, planes.numpy())
    return True


def _convert(
    pixels: np.ndarray, sources: tuple[int, ...], out: np.ndarray, factor: float, planes: np.ndarray
) -> None:
    """(h, w, C) pixels (packed, rows at any stride) -> `out` (3, h, w): channel c from pixel channel `sources[c]`,
    the channels taken apart by OpenCV into `planes` (at least min(C, 4) and 3 of (h, w)): all of them by `split`
    (vectorised for up to 4 channels), else the ones read by `mixChannels`; each converted and scaled by numpy."""
    import cv2

    channels = pixels.shape[2]
    if channels == 1:
        picked = [pixels[..., 0]] * len(sources)
    elif channels <= 4:
        cv2.split(pixels, list(planes[:channels]))
        picked = [planes[s] for s in sources]
    else:
        wanted = sorted(set(sources))
        cv2.mixChannels(
            [pixels], list(planes[: len(wanted)]), [v for k, s in enumerate(wanted) for v in (s, k)]
        )
        picked = [planes[wanted.index(s)] for s in sources]
    scale = np.float32(factor)
    for channel, plane in enumerate(picked):
        # float32 arithmetic whatever numpy's scalar rules (numpy 1.x would pick float16 for a small scalar)
        np.multiply(plane, scale, out=out[channel], dtype=np.float32, casting="unsafe")
