"""Upload: a host frame into a static device frame, the pipeline's one host-to-device copy.

On CUDA every frame slot (one per frame of a batch) owns a pinned staging buffer and a device frame that are
reused while the frame shape stays the same, so the device work of later frames always reads the same memory
(what a captured CUDA graph needs). Frames already on the device, and any frame for a CPU engine, are used
where they are, with no copy.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from tiled_detector.devices import concrete_device
from tiled_detector.pipeline.encodings import Encoding, as_frame_tensor


class _Slot(NamedTuple):
    pinned: torch.Tensor
    device: torch.Tensor
    copied: torch.cuda.Event | None  # CUDA: recorded after the copy out of `pinned`


class Uploader:
    """Host frames -> (H, W, C) tensors on `device` (not thread-safe: it owns reused buffers); any other host
    tensor through `place`."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = concrete_device(device)
        self._slots: dict[int, _Slot] = {}

    def upload(
        self,
        frame: np.ndarray | torch.Tensor,
        encoding: str | Encoding = Encoding.RGB8,
        slot: int = 0,
        static: bool = False,
    ) -> torch.Tensor:
        """The frame as an (H, W, C) tensor on the device: one host-to-device copy (into slot `slot`'s static
        device frame), none when it is already there. `static` copies it into the slot's device frame even when
        it is already on the device (a captured frame program reads the same memory every time)."""
        return self.place(as_frame_tensor(frame, encoding), slot, static)

    def place(self, tensor: torch.Tensor, slot: int = 0, static: bool = False) -> torch.Tensor:
        """`upload` of a tensor already checked for what it holds (a frame, a depth image): on the device, copied
        once into slot `slot`'s device buffer where needed."""
        staging = self.device.type == "cuda" and tensor.device.type == "cpu"
        if not static and not staging:
            return tensor if tensor.device == self.device else tensor.to(self.device)
        staged = self._slots.get(slot)
        if staged is None or staged.device.shape != tensor.shape or staged.device.dtype != tensor.dtype:
            staged = _Slot(
                torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=staging),
                torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device),
                torch.cuda.Event() if self.device.type == "cuda" else None,
            )
            self._slots[slot] = staged
        elif staging:
            staged.copied.synchronize()  # the previous frame's copy out of the pinned buffer is done
        if not staging:
            return staged.device.copy_(tensor)
        staged.pinned.copy_(tensor)
        staged.device.copy_(staged.pinned, non_blocking=True)
        staged.copied.record()
        return staged.device
