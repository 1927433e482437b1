"""What the node reports on /diagnostics: the problems its counters show and why a camera is silent."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from tiled_detector.ros_launch.fastdds import (
    FASTDDS_PROFILE,
    profile_in_use,
    profile_variables,
    running_major,
)

SILENT_AFTER_S = 3.0  # no frame for this long while the input has publishers: WARN (and /diagnostics)


def input_problem(topic: str, last_frame: float, publishers: int) -> str | None:
    """Why no frame arrives on `topic` (last one at `last_frame`, monotonic), when none has for
    `SILENT_AFTER_S` (None while frames flow). The fix names the profile variable the Fast DDS this process runs
    reads (both where the version is unknown): the camera driver runs the same distro."""
    silent_s = time.monotonic() - last_frame
    if silent_s < SILENT_AFTER_S:
        return None
    if not publishers:
        return f"no publisher on {topic}"
    major = running_major()
    profile = profile_in_use(os.environ, major) or str(FASTDDS_PROFILE)
    exports = " ".join(f"{name}={profile}" for name in profile_variables(major))
    version = f"Fast DDS {major}" if major is not None else "Fast DDS 2.x reads the first, 3.x the second"
    return (
        f"{topic} has {publishers} publisher(s) but no frame arrived for {silent_s:.0f} s: large images need "
        f"the shared-memory Fast DDS profile in the publisher's environment too: "
        f"export {exports} ({version}) before starting the camera driver / ros2 bag play"
    )


def problems(values: Mapping[str, Any]) -> list[str]:
    """The problems a `Stats.snapshot()` shows since the last one (malformed, failed, lost or skipped frames)."""
    lost, skipped = values["lost_since_last"], values.get("skipped_since_last", 0)
    return ["no frame answered: every frame since the last report failed"] * all_failed(values) + [
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


def all_failed(values: Mapping[str, Any]) -> bool:
    """Whether every frame taken since the last snapshot failed: some failed or were malformed, none answered."""
    failed = values.get("failed_since_last", 0) + values.get("malformed_since_last", 0)
    return failed > 0 and values.get("processed_since_last", 0) == 0


def status(name: str, values: Mapping[str, Any], found: list[str], hardware_id: str) -> DiagnosticStatus:
    """A status named `name`: ERROR when every frame of the window failed (`all_failed`), WARN with the `found`
    problems as its message, else OK; `values` as key/values."""
    level = DiagnosticStatus.WARN if found else DiagnosticStatus.OK
    return DiagnosticStatus(
        level=DiagnosticStatus.ERROR if all_failed(values) else level,
        name=name,
        message="; ".join(found) or "ok",
        hardware_id=hardware_id,
        values=[
            KeyValue(key=k, value=f"{v:.3f}" if isinstance(v, float) else str(v)) for k, v in values.items()
        ],
    )
