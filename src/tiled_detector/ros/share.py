"""Sharing one engine between cameras: every camera that is sending gets an equal share of the engine's time, so a
camera whose frames cost many times the others' (an 8K camera among 720p ones, a misconfigured driver) cannot set
the pace for all of them.

The rule: each camera's engine time is measured (a batch's wall time split between its frames by their engine
views) and decays exponentially (time constant `TAU_S`), which gives its recent fraction of the engine's time. A
camera whose fraction is above an equal share, 1/N of the time with N the cameras that sent a frame in the last
`ACTIVE_S` seconds, is held: its newest frame waits in its slot and the node takes no new message of it (they wait
in the middleware, where newer ones replace them: counted as skipped), and the others' frames are batched without
it until its fraction falls back under the share. Leaving its messages in the middleware matters as much as the
engine time: converting every message of a flood of 8K frames would keep the node's executor busy
(docs/PERFORMANCE.md). With one camera sending nothing is held. Holding is not work-conserving on purpose: the
engine may idle briefly rather than start a frame that makes every other camera's next frame wait for it. The state
is one decayed number and one arrival time per camera, reset with the node's cameras; a camera's decayed time is
forgotten when its stream starts over (`stream.Stream.starts_over`: a new frame size, stamps back, ...), with the
rest of what is kept of it.

A costly frame also runs in parts (`view_cap`: at most the cheapest sending camera's views per batch, the
stream's frames in parts): each batch runs the other cameras' frames and the next part of it, while its camera's
share allows, so the others wait for a part, never for a whole 8K frame; each part is charged the views it ran. A
camera that stopped sending no longer counts: a 4K camera left alone runs whole frames again.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

TAU_S = 2.0  # time constant of the decayed engine time
ACTIVE_S = 1.0  # a camera that sent a frame this recently counts among those sharing
# a frame of more views than this many times the cheapest camera's runs in parts of that many: 1, so that a batch of
# every camera's frame and the costly frame's next part gives each camera the same views (issue 59: with 2, an 8K
# camera's parts took twice a 720p frame's time in every batch, and its share overshot to 0.66 of the engine)
PART_FACTOR = 1
MIN_PART_VIEWS = 4  # (each part also runs the full-frame view: fewer views would be mostly that)


def view_cap(views: list[int]) -> int:
    """The most views one camera's frame runs in one batch, from the views of each camera's frames: `PART_FACTOR`
    times the cheapest camera's (at least `MIN_PART_VIEWS`), so a costly frame (an 8K camera among 720p ones) runs
    in parts between the others' frames instead of making each of them wait for all of it; 0 (no parts) with
    fewer than two cameras known."""
    if len(views) < 2:
        return 0
    return max(PART_FACTOR * min(views), MIN_PART_VIEWS)


class EngineShare:
    """Equal shares of the engine's time between the cameras that are sending (thread-safe: frames arrive on the
    executor's thread, batches are charged on the worker's)."""

    def __init__(
        self,
        cameras: int,
        tau_s: float = TAU_S,
        active_s: float = ACTIVE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._tau, self._active = tau_s, active_s
        self._used = [0.0] * cameras  # decayed engine seconds, as of `_at`
        self._at = clock()
        self._arrived = [-math.inf] * cameras
        self._held: set[int] = set()  # held at the last look: still sending (their frames are left waiting)

    def arrived(self, camera: int) -> None:
        """`camera` sent a frame now."""
        with self._lock:
            self._arrived[camera] = self._clock()

    def charge(self, frames: Iterable[tuple[int, int]], seconds: float) -> None:
        """A batch of `frames` ((camera, engine views) each) took `seconds`: each camera is charged its views'
        part."""
        frames = list(frames)
        views = sum(v for _, v in frames)
        with self._lock:
            self._decay()
            for camera, count in frames:
                self._used[camera] += seconds * (count / views if views else 1 / len(frames))

    def forget(self, cameras: Iterable[int]) -> None:
        """The engine time of `cameras` is forgotten (their streams started over)."""
        with self._lock:
            for camera in cameras:
                self._used[camera] = 0.0

    def fractions(self) -> list[float]:
        """Each camera's recent fraction of the engine's time."""
        with self._lock:
            self._decay()
            return [used / self._tau for used in self._used]

    def sending(self) -> set[int]:
        """The cameras that sent a frame in the last `ACTIVE_S` seconds, or are held (their frames wait)."""
        with self._lock:
            now = self._clock()
            return {c for c, t in enumerate(self._arrived) if now - t <= self._active or c in self._held}

    def held(self) -> set[int]:
        """The cameras above an equal share of the engine's time among those sending (none with one; a camera
        held counts as sending: its frames are only left waiting)."""
        with self._lock:
            self._decay()
            now = self._clock()
            sending = sum(now - t <= self._active or c in self._held for c, t in enumerate(self._arrived))
            share = 1.0 / max(sending, 1)
            held = set() if sending <= 1 else {c for c, u in enumerate(self._used) if u / self._tau > share}
            self._held = held
            return held

    def _decay(self) -> None:
        now = self._clock()
        factor = math.exp(-(now - self._at) / self._tau)
        self._used = [used * factor for used in self._used]
        self._at = now
