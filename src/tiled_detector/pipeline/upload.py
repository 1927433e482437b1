"""Upload: a host frame into a static device frame, the pipeline's one host-to-device copy.

On CUDA every frame slot (one per frame of a batch, a camera in the node) owns a device frame that is reused while
the frame shape stays the same, so the device work of later frames always reads the same memory (what a captured
CUDA graph needs), and a staging ring for that shape: `RING` entries of a pinned host buffer and a device buffer,
each with its events. A host frame goes host -> pinned -> device frame. `stage` copies the next frame ahead, while
the current frame's program runs: host -> pinned on the calling thread, pinned -> the entry's device buffer on a
copy stream of its own, so that the copy overlaps the device's work; the `upload` of that frame then only orders
the compute stream after that copy (an event) and copies the entry's device buffer into the slot's device frame (a
device-side copy). Events keep every buffer safe: the host writes a pinned buffer only after its last copy out of it
is done, a device buffer is written only after its last copy into the device frame is done.

A frame of another shape (or type) in a slot starts a new ring: nothing staged for the old one is used. A staged
frame is used only by the `upload` of the same frame object (anything else is copied anew). Where pinned memory
cannot be allocated, frames are copied from pageable memory (synchronously), with one WARN line. Frames already on
the device, and any frame for a CPU engine, are used where they are, with no copy. The device side (buffers,
streams, events) is behind `Transfers`, so that the ring's order can be checked without CUDA.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from tiled_detector.pipeline.encodings import Encoding, as_frame_tensor
from tiled_detector.runtime.devices import concrete_device

LOG = logging.getLogger(__name__)
RING = 2  # staging entries per slot: the frame being copied ahead and the one its program reads


class Event(Protocol):
    """A point in a stream's work (`torch.cuda.Event`)."""

    def record(self) -> None:
        """Mark the current stream's work queued so far."""

    def synchronize(self) -> None:
        """Wait on the host until that work is done."""


class Transfers(Protocol):
    """The device side of staging: buffers, events, the copy stream and waits between streams."""

    def pinned(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A page-locked host buffer (RuntimeError when it cannot be allocated)."""

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A device buffer."""

    def event(self) -> Event:
        """A new event."""

    def copying(self) -> contextlib.AbstractContextManager[Any]:
        """Work queued inside runs on the copy stream (outside: the current, compute stream)."""

    def wait(self, event: Event) -> None:
        """The current stream's later work waits for `event` (no host wait)."""


class CudaTransfers:
    """`Transfers` of a CUDA device: a copy stream of its own."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream: torch.cuda.Stream | None = None  # created at the first staged copy

    def pinned(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device)

    def event(self) -> Event:
        return torch.cuda.Event()

    def copying(self) -> contextlib.AbstractContextManager[Any]:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return torch.cuda.stream(self._stream)

    def wait(self, event: Event) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)  # type: ignore[arg-type]


@dataclass
class _Entry:
    """One staging buffer pair: `copied` is recorded after the copy out of `pinned` into `device`, `released`
    after the copy out of `device` into a slot's device frame."""

    pinned: torch.Tensor
    device: torch.Tensor
    copied: Event
    released: Event
    used: bool = False  # its events have been recorded


@dataclass
class _Ring:
    """A slot's staging ring for one frame shape and type, and what is staged in it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    entries: list[_Entry]
    next: int = 0
    staged: dict[int, Any] = field(default_factory=dict)  # entry -> the frame object staged in it


class Uploader:
    """Host frames -> (H, W, C) tensors on `device` (not thread-safe: it owns reused buffers); any other host
    tensor through `place`; the next frame copied ahead through `stage`."""

    def __init__(self, device: str | torch.device, transfers: Transfers | None = None) -> None:
        self.device = concrete_device(device)
        cuda = self.device.type == "cuda"
        self._transfers = transfers if transfers is not None else CudaTransfers(self.device) if cuda else None
        self._frames: dict[int, torch.Tensor] = {}  # slot -> its static device frame
        self._rings: dict[int, _Ring] = {}  # slot -> its staging ring (host frames on an accelerator)
        self.pageable = False  # pinned memory could not be allocated: frames are copied from pageable memory

    @property
    def stages(self) -> bool:
        """True where `stage` copies ahead (host frames go to an accelerator through pinned memory)."""
        return self._transfers is not None and not self.pageable

    def upload(
        self,
        frame: np.ndarray | torch.Tensor,
        encoding: str | Encoding = Encoding.RGB8,
        slot: int = 0,
        static: bool = False,
    ) -> torch.Tensor:
        """The frame as an (H, W, C) tensor on the device: one host-to-device copy (into slot `slot`'s static
        device frame; from the staging ring where `stage` copied this frame ahead), none when it is already there.
        `static` copies it into the slot's device frame even when it is already on the device (a captured frame
        program reads the same memory every time)."""
        ring = self._rings.get(slot)
        if ring is not None:
            for index, source in list(ring.staged.items()):
                if source is frame:
                    del ring.staged[index]
                    return self._from_entry(slot, ring.entries[index])
        return self.place(as_frame_tensor(frame, encoding), slot, static)

    def stage(
        self, frame: np.ndarray | torch.Tensor, encoding: str | Encoding = Encoding.RGB8, slot: int = 0
    ) -> bool:
        """Copy host `frame` towards the device ahead of its `upload` (into slot `slot`'s ring, on the copy
        stream: it overlaps work already queued); False where nothing is staged (a CPU engine, a frame already on
        the device, no pinned memory): `upload` then copies it as usual. Raises what `upload` raises for a frame
        it cannot take."""
        tensor = as_frame_tensor(frame, encoding)
        if not self.stages or tensor.device.type != "cpu":
            return False
        ring = self._ring(slot, tensor)
        if ring is None:
            return False
        index = ring.next
        ring.next = (index + 1) % len(ring.entries)
        entry = ring.entries[index]
        ring.staged.pop(index, None)  # a frame staged there before and never uploaded is replaced
        self._fill(entry, tensor)
        ring.staged[index] = frame
        return True

    def place(self, tensor: torch.Tensor, slot: int = 0, static: bool = False) -> torch.Tensor:
        """`upload` of a tensor already checked for what it holds (a frame, a depth image): on the device, copied
        once into slot `slot`'s device buffer where needed."""
        host = self._transfers is not None and tensor.device.type == "cpu"
        if not static and not host:
            return tensor if tensor.device == self.device else tensor.to(self.device)
        target = self._frame(slot, tensor)
        if not host or self.pageable:
            return target.copy_(tensor)
        ring = self._ring(slot, tensor)
        if ring is None:  # pinned memory just failed
            return target.copy_(tensor)
        index = ring.next
        ring.next = (index + 1) % len(ring.entries)
        ring.staged.pop(index, None)
        entry = ring.entries[index]
        entry.copied.synchronize()  # the host writes a pinned buffer only after its last copy out of it
        entry.pinned.copy_(tensor)
        target.copy_(entry.pinned, non_blocking=True)  # on the compute stream, straight into the device frame
        entry.copied.record()
        entry.used = True
        return target

    def _frame(self, slot: int, tensor: torch.Tensor) -> torch.Tensor:
        """Slot `slot`'s static device frame for tensors like `tensor` (a new one when its shape or type
        changed)."""
        target = self._frames.get(slot)
        if target is None or target.shape != tensor.shape or target.dtype != tensor.dtype:
            target = self._frames[slot] = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
        return target

    def _ring(self, slot: int, tensor: torch.Tensor) -> _Ring | None:
        """Slot `slot`'s ring for tensors like `tensor`: a new one for a new shape or type (the old ring and
        what was staged in it are dropped once their copies are done); None when pinned memory cannot be had."""
        ring = self._rings.get(slot)
        shape = tuple(tensor.shape)
        if ring is not None and ring.shape == shape and ring.dtype == tensor.dtype:
            return ring
        if ring is not None:
            self._retire(self._rings.pop(slot))
        transfers = self._transfers
        assert transfers is not None
        try:
            entries = [
                _Entry(
                    transfers.pinned(shape, tensor.dtype),
                    transfers.empty(shape, tensor.dtype),
                    transfers.event(),
                    transfers.event(),
                )
                for _ in range(RING)
            ]
        except RuntimeError as error:  # page-locked memory exhausted (or not allowed)
            self.pageable = True
            LOG.warning(
                "pinned host memory for a %s frame could not be allocated (%s): frames are copied to %s "
                "from pageable memory from now on (slower, not overlapped)",
                "x".join(map(str, shape)),
                str(error).splitlines()[0] if str(error) else type(error).__name__,
                self.device,
            )
            return None
        ring = self._rings[slot] = _Ring(shape, tensor.dtype, entries)
        return ring

    @staticmethod
    def _retire(ring: _Ring) -> None:
        """Wait for a dropped ring's copies, so that its buffers are freed only when nothing uses them."""
        for entry in ring.entries:
            if entry.used:
                entry.copied.synchronize()
                entry.released.synchronize()

    def _fill(self, entry: _Entry, tensor: torch.Tensor) -> None:
        """host -> the entry's pinned buffer -> its device buffer, the device copy on the copy stream."""
        transfers = self._transfers
        assert transfers is not None
        entry.copied.synchronize()  # its last copy out of the pinned buffer is done
        entry.pinned.copy_(tensor)
        with transfers.copying():
            if entry.used:
                transfers.wait(entry.released)  # the device buffer's last copy into a device frame is done
            entry.device.copy_(entry.pinned, non_blocking=True)
            entry.copied.record()
        entry.used = True

    def _from_entry(self, slot: int, entry: _Entry) -> torch.Tensor:
        """A staged entry into slot `slot`'s device frame: the compute stream waits for the staged copy, then one
        device-side copy."""
        transfers = self._transfers
        assert transfers is not None
        target = self._frame(slot, entry.device)
        transfers.wait(entry.copied)
        target.copy_(entry.device, non_blocking=True)
        entry.released.record()
        return target
