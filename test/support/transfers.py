"""`pipeline.upload.Transfers` on the CPU, for the staging ring's tests: buffers are host tensors and copies happen at
once, and every step that orders the device's work is logged (`log`: which stream queued an event's record or a
wait, and the host's waits), so that a test checks the order the ring gives CUDA."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class RecordedEvent:
    """An event that logs its records (with the stream they were queued on) and host waits."""

    def __init__(self, transfers: RecordedTransfers, name: str) -> None:
        self._transfers, self.name = transfers, name

    def record(self) -> None:
        self._transfers.log.append(("record", self._transfers.stream, self.name))

    def synchronize(self) -> None:
        self._transfers.log.append(("host waits", self.name))


class RecordedTransfers:
    """Host buffers, a 'copy' stream beside the 'compute' one, events named e0, e1, ... in creation order (a ring
    entry's `copied` and `released` in turn); `pinned_fails` makes every pinned allocation raise as CUDA does when
    page-locked memory is exhausted."""

    def __init__(self, pinned_fails: bool = False) -> None:
        self.log: list[tuple[str, ...]] = []
        self.stream = "compute"
        self.pinned_fails = pinned_fails
        self.pinned_shapes: list[tuple[int, ...]] = []
        self._events = 0

    def pinned(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.pinned_fails:
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        self.pinned_shapes.append(tuple(shape))
        return torch.empty(shape, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def event(self) -> RecordedEvent:
        self._events += 1
        return RecordedEvent(self, f"e{self._events - 1}")

    @contextlib.contextmanager
    def copying(self) -> Iterator[None]:
        self.stream = "copy"
        try:
            yield
        finally:
            self.stream = "compute"

    def wait(self, event: RecordedEvent) -> None:
        self.log.append(("wait", self.stream, event.name))

    def taken(self) -> list[tuple[str, ...]]:
        """The log since the last call, cleared."""
        log, self.log = self.log, []
        return log
