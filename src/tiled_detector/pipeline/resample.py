"""A downscaled view read the way F.interpolate's bilinear sampling reads it (align_corners=False), from an integer
frame: only the rows and columns each output pixel reads (two, or one where every weight is 0, e.g. an odd integer
downscale 1920 -> 640), through strided views where they are evenly spaced and gathers elsewhere, so the cost
follows the view, not the frame (the full-frame view of `pipeline.preprocess`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Samples:
    """F.interpolate's bilinear sampling along one axis (align_corners=False) for `out` outputs: each reads
    `taps` source pixels (2, or 1 where every weight is 0, e.g. an odd integer downscale 1920 -> 640), at
    `start` + `step` * output + tap when they are evenly spaced (integer downscales: 1280 -> 640, 3840 -> 640;
    read through a strided view), else at `index` (out * taps,) (one gather); `weight` (out,) is each output's
    weight of its second tap (None with one tap)."""

    out: int
    taps: int
    weight: torch.Tensor | None
    start: int = 0
    step: int = 1
    index: torch.Tensor | None = None

    def pick(self, image: torch.Tensor, dim: int) -> torch.Tensor:
        """`image` with axis `dim` replaced by the (out, taps) pixels read along it (a view where evenly
        spaced, else one gather)."""
        if self.index is not None:
            return image.index_select(dim, self.index).unflatten(dim, (self.out, self.taps))
        size, stride = list(image.shape), list(image.stride())
        size[dim : dim + 1] = [self.out, self.taps]
        stride[dim : dim + 1] = [self.step * stride[dim], stride[dim]]
        return image.as_strided(size, stride, image.storage_offset() + self.start * image.stride(dim))


@functools.lru_cache(maxsize=32)
def bilinear_axis(size: int, out: int, device: torch.device) -> Samples:
    """The `Samples` of `out` outputs from `size` pixels, built once per (size, out, device)."""
    scale = torch.tensor(size, dtype=torch.float32) / out
    source = ((torch.arange(out, dtype=torch.float32) + 0.5) * scale - 0.5).clamp_min(0)
    first = source.to(torch.int64)
    weight = source - first
    taps = 2 if bool(weight.any()) else 1
    index = torch.stack([first, torch.where(first < size - 1, first + 1, first)], 1)[:, :taps]
    step = int(first[1] - first[0]) if out > 1 else 1
    even = step > 0 and torch.equal(
        index, first[:1, None] + step * torch.arange(out)[:, None] + torch.arange(taps)
    )
    weights = weight.to(device) if taps == 2 else None
    if even:
        return Samples(out, taps, weights, int(first[0]), step)
    return Samples(out, taps, weights, index=index.reshape(-1).to(device))


def sampled_bilinear(frame: torch.Tensor, size: tuple[int, int], scale: float) -> torch.Tensor:
    """Bilinear downscale of an (H, W, C) integer frame times `scale` to `size`, as a (1, C, h, w) float32 image,
    equal to F.interpolate's (to float rounding): only the rows and columns each output pixel reads (two, or one
    where its weight is 0) are picked (rows first, then columns) and converted, so the cost follows the view,
    not the frame."""
    rows = bilinear_axis(frame.shape[0], size[0], frame.device)
    cols = bilinear_axis(frame.shape[1], size[1], frame.device)
    picked = cols.pick(rows.pick(frame, 0), 2).permute(4, 0, 1, 2, 3).float()  # (C, h, row taps, w, col taps)
    across = (
        picked[..., 0]
        if cols.weight is None
        else torch.lerp(picked[..., 0], picked[..., 1], cols.weight.view(1, 1, 1, -1))
    )
    down = (
        across[:, :, 0]
        if rows.weight is None
        else torch.lerp(across[:, :, 0], across[:, :, 1], rows.weight.view(1, -1, 1))
    )
    return down.mul_(scale).unsqueeze(0)
