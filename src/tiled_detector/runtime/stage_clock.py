"""Stage durations of one call (upload, preprocessing, model, merge, download, ...): CUDA events on the current
stream read after the final download (no extra syncs), or host wall time."""

from __future__ import annotations

import time
from typing import Any

import torch


class StageClock:
    """Stage durations. CUDA: events on the current stream, read after the final download (no extra syncs);
    with `sync` every stage boundary synchronises instead (host wall time per stage). CPU: host wall time."""

    def __init__(self, device: torch.device, sync: bool) -> None:
        self._events = device.type == "cuda" and not sync
        self._sync = device if device.type == "cuda" and sync else None
        # looked up once: `Event.record()` without a stream looks up the current one every time (host time that
        # delays the frame program's launch)
        self._stream = torch.cuda.current_stream(device) if self._events else None
        self._marks: list[tuple[str, Any]] = []
        self._start = self._now()

    def _now(self) -> Any:
        if self._events:
            event = torch.cuda.Event(enable_timing=True)
            event.record(self._stream)
            return event
        if self._sync is not None:
            torch.cuda.synchronize(self._sync)
        return time.perf_counter()

    def mark(self, stage: str) -> None:
        """End of `stage` (and start of the next)."""
        self._marks.append((stage, self._now()))

    def timings(self) -> dict[str, float]:
        """Stage -> milliseconds, plus `total` (call after the results reached the host). A stage that ran
        more than once (post-processing again on the exact path) gets the sum of its runs."""
        result: dict[str, float] = {}
        previous = self._start
        for stage, now in self._marks:
            elapsed = previous.elapsed_time(now) if self._events else (now - previous) * 1000.0
            result[stage] = result.get(stage, 0.0) + elapsed
            previous = now
        result["total"] = sum(result.values())
        return result
