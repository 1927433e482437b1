"""CPU threads of the processes this package starts (the `tiled-detector` CLI and the ROS node), set before torch
loads; a process that imports the library itself keeps its own settings."""

from __future__ import annotations

import os
import sys

# libgomp (torch's CPU threads) keeps idle threads spinning for GOMP_SPINCOUNT rounds after each parallel op
# (default 300000): after preprocessing they would keep the cores busy well into the next ONNX Runtime call. A
# tenth of that still bridges the gaps between consecutive torch ops (far fewer slows the merge; docs/PERFORMANCE.md)
SPIN_COUNT = "30000"


def short_spin() -> None:
    """Idle torch CPU threads yield soon (GOMP_SPINCOUNT, unless the environment sets it); only takes effect before
    torch is imported."""
    if "torch" not in sys.modules:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
