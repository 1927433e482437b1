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
    import cv2

    th, tw = tile_hw
    split = list(planes)
    scale = np.float32(factor)
    for k in picked:
        x0, y0 = int(boxes[k, 0]), int(boxes[k, 1])
        tile = pixels[y0 : y0 + th, x0 : x0 + tw]
        if len(split) > 1:
            cv2.split(tile, split)
        for channel, source in enumerate(sources):
            plane = split[source] if len(split) > 1 else tile[..., 0]
            # float32 arithmetic whatever numpy's scalar rules (numpy 1.x would pick float16 for a small scalar)
            np.multiply(plane, scale, out=out[k, channel], dtype=np.float32, casting="unsafe")
