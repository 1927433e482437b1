"""What the node reports on /diagnostics: the problems its counters show and why a camera is silent."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from tiled_detector.ros.fastdds import FASTDDS_PROFILE

SILENT_AFTER_S = 3.0  # no frame for this long while the input has publishers: WARN (and /diagnostics)


def input_problem(topic: str, last_frame: float, publishers: int) -> str | None:
    """Why no frame arrives on `topic` (last one at `last_frame`, monotonic), when none has for
    `SILENT_AFTER_S` (None while frames flow)."""
    silent_s = time.monotonic() - last_frame
    if silent_s < SILENT_AFTER_S:
        return None
    if not publishers:
        return f"no publisher on {topic}"
    profile = os.environ.get("FASTDDS_DEFAULT_PROFILES_FILE") or str(FASTDDS_PROFILE)
    return (
        f"{topic} has {publishers} publisher(s) but no frame arrived for {silent_s:.0f} s: large images need "
        f"the shared-memory Fast DDS profile in the publisher's environment too: "
        f"export FASTDDS_DEFAULT_PROFILES_FILE={profile} before starting the camera driver / ros2 bag play"
    )


def problems(values: Mapping[str, Any]) -> list[str]:
    """The problems a `Stats.snapshot()` shows since the last one (malformed, failed, lost or skipped frames)."""
    lost, skipped = values["lost_since_last"], values.get("skipped_since_last", 0)
    return [
        text
        for count, text in (
            (values["malformed_since_last"], "skipping malformed frames"),
            (values["failed_since_last"], "frames failed"),
            (lost, f"{lost} frame(s) lost before the node (transport)"),
            (
                skipped,
                f"{skipped} frame(s) replaced in the input queue before the node took them (a busy host)",
            ),
        )
        if count
    ]


def status(name: str, values: Mapping[str, Any], found: list[str], hardware_id: str) -> DiagnosticStatus:
    """A status named `name`: WARN with the `found` problems as its message, else OK; `values` as key/values."""
    return DiagnosticStatus(
        level=DiagnosticStatus.WARN if found else DiagnosticStatus.OK,
        name=name,
        message="; ".join(found) or "ok",
        hardware_id=hardware_id,
        values=[
            KeyValue(key=k, value=f"{v:.3f}" if isinstance(v, float) else str(v)) for k, v in values.items()
        ],
    )
