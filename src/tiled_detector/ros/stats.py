"""The node's frame slots (the newest frame of each camera) and its counters and latencies for /diagnostics."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Collection
from typing import Any

import numpy as np

# frames ... : received, processed, dropped (a newer one replaced it), lost (the middleware's message-lost events),
# malformed, failed, cpu_decoded (compressed frames the GPU decoder did not take), annotated (debug images drawn),
# motion_fallback (frames whose camera-motion estimate failed its checks: the identity was used)
COUNTERS = (
    "received",
    "processed",
    "dropped",
    "lost",
    "skipped",
    "malformed",
    "failed",
    "cpu_decoded",
    "annotated",
    "motion_fallback",
)


# Fast DDS keeps its sample-lost counts in int32: a cumulative count at or above this is not a count
_INT32_MAX = (1 << 31) - 1


class LostFrames:
    """Frames a subscription lost on the way, from the middleware's message-lost events: what the cumulative
    `total_count` grew by since the last event when it is a count, else one frame (the event itself says at least
    one was lost). rmw_fastrtps (kilted, PyPI) hands over values that are no counts for fragmented frames (int32
    -2**31 and -1 sign-extended to 64 bits, 2**31 - 1, and 0 repeated), so `total_count_change` summed as it
    comes can count billions of frames lost of a few hundred sent."""

    def __init__(self) -> None:
        self._total = 0

    def add(self, total_count: int, total_count_change: int) -> int:
        """The frames one event adds to the count."""
        if 0 <= total_count < _INT32_MAX and total_count > self._total:
            added, self._total = total_count - self._total, total_count
            return added
        return 1


class SkippedFrames:
    """Frames a publisher sent that this subscription never took (replaced in the middleware's keep-last queue
    while the host was busy): the gaps between the publication sequence numbers of one publisher's consecutive
    messages (the middleware hands one over with each message), less the frames the middleware reported lost
    (`LostFrames`: those are gaps too). A publisher's first message, or one numbered lower than the last (it
    restarted), counts nothing. The last number of the `PUBLISHERS` most recent publishers is kept."""

    PUBLISHERS = 64

    def __init__(self) -> None:
        self._last: dict[Any, int] = {}
        self._lost = 0  # frames reported lost that no gap has accounted for yet

    def lost(self, count: int) -> None:
        """The middleware reported `count` frames lost."""
        self._lost += count

    def add(self, publisher: Any, sequence: int) -> int:
        """The frames skipped before this message, numbered `sequence` by `publisher`."""
        last = self._last.pop(publisher, None)
        self._last[publisher] = sequence
        if len(self._last) > self.PUBLISHERS:
            self._last.pop(next(iter(self._last)))
        if last is None or sequence <= last:
            return 0
        gap = sequence - last - 1
        known = min(gap, self._lost)
        self._lost -= known
        return gap - known


def takes_message_info(subscription_type: type) -> bool:
    """Whether this rclpy hands a subscription callback of two arguments each message's info: Iron and later
    (`Subscription.CallbackType.WithMessageInfo`, chosen from the callback's signature; Jazzy's rclpy 7.1.6 has no
    `rclpy.subscription.MessageInfo` type, yet does); Humble's calls every callback with the message alone (rclpy
    humble, `executors.py` `_take_subscription`)."""
    return hasattr(getattr(subscription_type, "CallbackType", None), "WithMessageInfo")


def publication(info: Any) -> tuple[Any, int] | None:
    """(publisher, publication sequence number) from a message info (rclpy's dict): the publisher its gid's bytes
    where the rclpy gives one (Kilted), else None (Jazzy's 7.1.6 gives none); None without a sequence number."""
    sequence = info.get("publication_sequence_number") if isinstance(info, dict) else None
    if sequence is None:
        return None
    gid = info.get("publisher_gid")
    return (tuple(gid.get("data", ())) if isinstance(gid, dict) else gid), int(sequence)


class FrameSlots:
    """The newest frame of each input (camera): `put` replaces an unprocessed frame of that input (a drop);
    `take` waits for any frame and hands over the newest frame of every input that has one."""

    def __init__(self, count: int = 1) -> None:
        self._cond = threading.Condition()
        self._items: list[Any] = [None] * count
        self._closed = False

    def put(self, index: int, item: Any) -> bool:
        """Store `item` as input `index`'s newest frame; True when it replaced one the worker never saw."""
        with self._cond:
            dropped = self._items[index] is not None
            self._items[index] = item
            self._cond.notify()
            return dropped

    def put_back(self, index: int, item: Any) -> bool:
        """Return an `item` taken from input `index` to its slot, unless a newer one is there: True when it was
        (the item is then the one dropped)."""
        with self._cond:
            if self._items[index] is not None:
                return True
            self._items[index] = item
            return False

    def take(self, timeout: float, held: Collection[int] = ()) -> list[tuple[int, Any]]:
        """(input index, frame) of every input with a new frame, in input order, except the `held` inputs' (their
        frames stay, a newer one replacing them); [] after `timeout` seconds without any, or once closed."""
        with self._cond:
            ready = [i for i, item in enumerate(self._items) if item is not None and i not in held]
            if not self._closed and not ready:
                self._cond.wait(timeout)
                ready = [i for i, item in enumerate(self._items) if item is not None and i not in held]
            taken = [(i, self._items[i]) for i in ready]
            for i in ready:
                self._items[i] = None
            return taken

    def close(self) -> None:
        """Wake the worker for shutdown."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Stats:
    """Counters and recent latencies shared by the callback, the worker and the diagnostics timer."""

    WINDOW = 300

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.latency_ms: deque[float] = deque(maxlen=self.WINDOW)
        self.stages: dict[str, deque[float]] = {}
        # engine views run, their most in a frame, carried
        self.views = self.views_max = self.predicted = 0
        self._last_counts = dict(self.counts)
        self._last_time = time.monotonic()

    def add(self, name: str, count: int = 1) -> None:
        """Count `count` events."""
        with self.lock:
            self.counts[name] += count

    def record(
        self, latency_ms: float, timings: dict[str, float], views: int = 0, predicted: int = 0
    ) -> None:
        """Record one processed frame: its latency, stage timings, engine views run and boxes reported from an
        earlier frame."""
        with self.lock:
            self.counts["processed"] += 1
            self.views += views
            self.views_max = max(self.views_max, views)
            self.predicted += predicted
            self.latency_ms.append(latency_ms)
            for stage, ms in timings.items():
                self.stages.setdefault(stage, deque(maxlen=self.WINDOW)).append(ms)

    def snapshot(self) -> dict[str, float | int]:
        """Counters (integers), rates since the last snapshot and latency percentiles."""
        with self.lock:
            now = time.monotonic()
            elapsed = max(now - self._last_time, 1e-9)
            out: dict[str, float | int] = {f"frames_{k}": v for k, v in self.counts.items()}
            out["input_rate_hz"] = (self.counts["received"] - self._last_counts["received"]) / elapsed
            out["output_rate_hz"] = (self.counts["processed"] - self._last_counts["processed"]) / elapsed
            out["views_per_frame"] = self.views / max(self.counts["processed"], 1)
            out["views_per_frame_max"] = self.views_max
            out["predicted_boxes"] = self.predicted
            for name in ("processed", "dropped", "lost", "skipped", "malformed", "failed"):
                out[f"{name}_since_last"] = self.counts[name] - self._last_counts[name]
            self._last_counts, self._last_time = dict(self.counts), now
            series = {"latency": self.latency_ms, **self.stages}
            for name, values in series.items():
                if values:
                    p50, p95 = np.percentile(np.fromiter(values, float), [50, 95])
                    out[f"{name}_ms_p50"], out[f"{name}_ms_p95"] = float(p50), float(p95)
            return out
