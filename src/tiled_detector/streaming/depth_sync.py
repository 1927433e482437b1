"""Pairing each camera's colour frames with its depth images by stamp, as message_filters' ApproximateTime would,
and with its latest camera info; ROS-free (the node feeds it messages, anything with a stamp).

Per camera: the last `QUEUE` depth images (their stamps and payloads: about a third of a second at 30 Hz) and the
latest camera info (a camera's calibration does not change between frames). A colour frame gets the depth image
whose stamp is nearest its own (of two as near, the newer), when that is within the tolerance
(`depth_sync_tolerance`); otherwise why not: no camera info yet, no depth image yet, or none within the tolerance
(with the nearest offset). Every colour frame is paired anew, whatever its stamp (a camera may stamp two frames
alike); the frame keeps its depth image with it (`stream.Job.depth`), through all its parts. A depth image that
comes after its colour frame is waited for, at most `wait_s`, while one can still come (no depth image newer than
the colour stamp plus the tolerance has arrived since the stamps last went back); a camera whose last wait ran out
waits no more until it pairs again (stamps that never pair cost one wait, not one per frame).

Stamps that go back (a looped bag, a restarted camera or clock: the stream's reset rule, `stream.Stream.starts_over`)
start the pairing over: a depth image stamped before the newest queued one empties the queue first, and a colour
frame stamped before the last one waits for the depth images of its new stamps while those queued are all newer.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from tiled_detector.settings.options import Option

QUEUE = 10  # depth images kept per camera (message_filters' usual queue size)


class Unpaired(Option):
    """Why a colour frame got no depth."""

    NO_CAMERA_INFO = "no_camera_info"
    NO_DEPTH = "no_depth"
    NOT_WITHIN_TOLERANCE = "not_within_tolerance"


@dataclass(frozen=True)
class Pairing:
    """A colour frame's depth image and camera info, or (depth None) why it has none (`cause`, `text`)."""

    depth: Any = None
    info: Any = None
    offset_s: float = 0.0  # depth stamp minus colour stamp
    cause: Unpaired | None = None
    text: str = ""


class DepthSync:
    """Depth images and camera infos of `cameras` cameras, paired to colour frames by stamp (module docstring).
    Thread-safe: callbacks add, the worker pairs."""

    def __init__(self, cameras: int, queue: int = QUEUE) -> None:
        self._depths = [deque[tuple[int, Any]](maxlen=queue) for _ in range(cameras)]
        self._infos: list[Any] = [None] * cameras
        self._gave_up = [False] * cameras  # its last wait ran out
        self._colour_ns: list[int | None] = [None] * cameras  # the last colour stamp paired
        self._behind = [False] * cameras  # the colour stamps went back, the depth images' not yet
        self._changed = threading.Condition()

    def add_depth(self, camera: int, stamp_ns: int, depth: Any) -> None:
        """A depth image of `camera` with its header stamp."""
        with self._changed:
            depths = self._depths[camera]
            if (
                depths and stamp_ns < depths[-1][0]
            ):  # went back: the images queued cannot pair with what comes
                depths.clear()
                self._behind[camera] = False
            depths.append((int(stamp_ns), depth))
            self._changed.notify_all()

    def add_info(self, camera: int, info: Any) -> None:
        """A camera info of `camera` (the latest is kept)."""
        with self._changed:
            self._infos[camera] = info
            self._changed.notify_all()

    def pair(self, camera: int, stamp_ns: int, tolerance_s: float, wait_s: float = 0.0) -> Pairing:
        """The depth image nearest the colour stamp `stamp_ns` within `tolerance_s`, and the latest camera info;
        waiting up to `wait_s` for a depth image that may still come (module docstring)."""
        tolerance = round(tolerance_s * 1e9)
        with self._changed:
            last, self._colour_ns[camera] = self._colour_ns[camera], int(stamp_ns)
            queued = self._depths[camera]
            if last is not None and stamp_ns < last:  # went back: a new stream, its one wait
                self._gave_up[camera] = False
                if queued and queued[-1][0] > stamp_ns + tolerance:  # before the depth images did
                    self._behind[camera] = True
            deadline = time.monotonic() + (0.0 if self._gave_up[camera] else wait_s)
            while True:
                pairing = self._nearest(camera, int(stamp_ns), tolerance)
                depths = self._depths[camera]
                may_come = not depths or depths[-1][0] < stamp_ns + tolerance or self._behind[camera]
                remaining = deadline - time.monotonic()
                if pairing.depth is not None or pairing.cause is Unpaired.NO_CAMERA_INFO or not may_come:
                    break
                if remaining <= 0:
                    self._gave_up[camera] = wait_s > 0
                    return pairing
                self._changed.wait(remaining)
            self._gave_up[camera] = self._behind[camera] = False
        return pairing

    def _nearest(self, camera: int, stamp_ns: int, tolerance_ns: int) -> Pairing:
        info = self._infos[camera]
        if info is None:
            return Pairing(cause=Unpaired.NO_CAMERA_INFO, text="no camera info has arrived yet")
        depths = self._depths[camera]
        if not depths:
            return Pairing(cause=Unpaired.NO_DEPTH, text="no depth image has arrived yet")
        stamp, depth = min(reversed(depths), key=lambda entry: abs(entry[0] - stamp_ns))  # a tie: the newer
        offset = (stamp - stamp_ns) / 1e9
        if abs(stamp - stamp_ns) > tolerance_ns:
            return Pairing(
                offset_s=offset,
                cause=Unpaired.NOT_WITHIN_TOLERANCE,
                text=f"the nearest depth image is {offset:+.3f} s from the colour frame's stamp "
                f"(depth_sync_tolerance {tolerance_ns / 1e9:g} s)",
            )
        return Pairing(depth, info, offset)
