"""JPEG frames decoded on the GPU (nvJPEG, through torchvision's `decode_jpeg`) straight into device memory.

A robot's compressed camera stream is otherwise decoded by OpenCV on the CPU, the weakest part of a Jetson (the
docs/NODE.md's "Compressed transport" gives the times). torchvision is optional: without it, or for a frame
that is not a JPEG (PNG) or that nvJPEG refuses, `GpuJpegDecoder.decode` returns None and the caller decodes on
the CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tiled_detector.runtime.devices import concrete_device

JPEG_MAGIC = b"\xff\xd8\xff"  # start of image + the first marker


def is_jpeg(data: np.ndarray) -> bool:
    """Whether a 1-D uint8 buffer starts like a JPEG file."""
    return data.size >= len(JPEG_MAGIC) and bytes(data[: len(JPEG_MAGIC)]) == JPEG_MAGIC


@functools.cache
def _decode_jpeg() -> Callable[..., Any] | None:
    """torchvision.io.decode_jpeg, when torchvision imports (with its compiled image ops), else None."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except (ImportError, OSError, RuntimeError):
        return None
    return functools.partial(decode_jpeg, mode=ImageReadMode.RGB)


class GpuJpegDecoder:
    """JPEG bytes -> an (H, W, 3) uint8 RGB frame on a CUDA device (`available` says whether it can)."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = concrete_device(device)
        self.available = self.device.type == "cuda" and _decode_jpeg() is not None

    def decode(self, data: np.ndarray) -> torch.Tensor | None:
        """The decoded frame on the device, or None when this one must be decoded on the CPU (not a JPEG, no
        GPU decoder, or nvJPEG failed on it)."""
        if not self.available or not is_jpeg(data):
            return None
        try:
            # (a copy of the bytes: message buffers are read-only, and torch wants writable host memory)
            decoded = _decode_jpeg()(torch.from_numpy(data.copy()), device=self.device)
        except RuntimeError:  # e.g. a truncated or unusual JPEG (OpenCV gets its own try)
            return None
        return decoded.permute(1, 2, 0)
