"""The pipeline's vision_msgs/VisionInfo: what the node's detections mean, published once per configuration.

Fields as vision_msgs defines them: `method` names the pipeline ("tiled_detector <model file> (<backend>, <precision>)");
`database_location` says where the class names live: the node's parameter `labels` (read it with
`ros2 param get <node> labels`; index = the numeric class id); `database_version` identifies that list of names
(a hash of them, the same in every run: a listener compares it to know it reads the same names).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LABELS_PARAMETER = "labels"  # the node parameter holding the class names (`database_location`)


def labels_version(labels: Sequence[str]) -> int:
    """A non-negative int32 identifying a list of class names (CRC-32 of the names, one per line)."""
    return zlib.crc32("\n".join(labels).encode()) & 0x7FFFFFFF


def vision_info(model: str | Path, backend: str, precision: str, labels: Sequence[str], header: Any) -> Any:
    """The VisionInfo message of a loaded model (module docstring), with `header` (stamp of the configuration)."""
    from vision_msgs.msg import VisionInfo

    return VisionInfo(
        header=header,
        method=f"tiled_detector {Path(model).name} ({backend}, {precision})",
        database_location=LABELS_PARAMETER,
        database_version=labels_version(labels),
    )
