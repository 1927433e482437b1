"""The reset rule every per-camera state over time shares (tracks, camera motion, the tile schedule): a frame whose
stamp went back (a bag looped, sim time reset, a restarted camera) or jumped by more than the lost-track buffer
cannot continue the camera's stream."""

from __future__ import annotations


def broken(last_ns: int | None, stamp_ns: int, buffer_s: float) -> bool:
    """Whether a camera's frame at `stamp_ns` cannot continue its stream after `last_ns` (None: no frame yet): the
    stamps went back, or jumped by more than `buffer_s`."""
    return last_ns is not None and not 0 <= (stamp_ns - last_ns) / 1e9 <= buffer_s
