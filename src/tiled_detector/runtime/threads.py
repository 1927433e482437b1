"""CPU threads of the processes this package starts (the `tiled-detector` CLI and the ROS node), set before torch
loads; a process that imports the library itself keeps its own settings."""

from __future__ import annotations

import os
import sys
import time

# libgomp (torch's CPU threads) keeps idle threads spinning for GOMP_SPINCOUNT rounds after each parallel op
# (default 300000): after preprocessing they would keep the cores busy well into the next ONNX Runtime call. A
# tenth of that still bridges the gaps between consecutive torch ops (far fewer slows the merge; docs/PERFORMANCE.md)
SPIN_COUNT = "30000"
# runnable tasks (the 1-minute load average) above the cores by more than this: the host is oversubscribed
LOAD_MARGIN = 1.5
CHECK_S = 1.0  # the load is looked at most this often

_following: dict[
    str, float
] = {}  # while following: "cores" (torch's own thread count) and "checked" (monotonic s)


def short_spin() -> None:
    """Idle torch CPU threads yield soon (GOMP_SPINCOUNT, unless the environment sets it); only takes effect before
    torch is imported."""
    if "torch" not in sys.modules:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)


def follow_load() -> None:
    """From now on `fit_to_load` sets this process's torch CPU threads from the host's load (the CLI and the node;
    not where the environment sets OMP_NUM_THREADS)."""
    if "OMP_NUM_THREADS" not in os.environ:
        _following["checked"] = -float("inf")


def fit_to_load(clock: float | None = None) -> int | None:
    """While following (`follow_load`), at most once every `CHECK_S` seconds: one torch CPU thread while the host
    is oversubscribed (its 1-minute load average above its cores + `LOAD_MARGIN`), else torch's own count (one per
    core). A parallel op waits for its slowest thread, and on an oversubscribed host one of them is always waiting
    for a core: on this 2-core machine at load 12, a 1080p frame's torch work took 636 ms on two threads and 79 ms
    on one (docs/PERFORMANCE.md). Returns the count set, None when nothing was looked at."""
    if "checked" not in _following:
        return None
    now = time.monotonic() if clock is None else clock
    if now - _following["checked"] < CHECK_S:
        return None
    import torch

    _following["checked"] = now
    cores = int(_following.setdefault("cores", torch.get_num_threads()))
    threads = 1 if os.getloadavg()[0] > cores + LOAD_MARGIN else cores
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
