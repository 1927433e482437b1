"""What the node's detections mean, as vision_msgs says it: VisionInfo and LabelInfo, published once per
configuration (on activation) on transient-local topics.

VisionInfo, fields as vision_msgs 4.1.1 defines them: `method` names the pipeline and says what `class_id`
holds ("tiled_detector <model file> (<backend>, <precision>); class_id: label names" with `output_format: labels`,
"...; class_id: ids" with `ids`); `database_location` says where the class names live: the node's parameter
`labels` (read it with `ros2 param get <node> labels`; index = the numeric class id); `database_version`
identifies that list of names (a hash of them, the same in every run: a listener compares it to know it reads the
same names). LabelInfo (vision_msgs 4.x): the same names as a class_map (id -> name) and the score threshold
(`conf_threshold`; published again when it changes).
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


def vision_info(
    model: str | Path, backend: str, precision: str, labels: Sequence[str], header: Any, names: bool = True
) -> Any:
    """The VisionInfo message of a loaded model (module docstring), with `header` (stamp of the configuration);
    `names`: class_id holds the label names (else the numeric ids)."""
    from vision_msgs.msg import VisionInfo

    held = "label names" if names else "ids"
    return VisionInfo(
        header=header,
        method=f"tiled_detector {Path(model).name} ({backend}, {precision}); class_id: {held}",
        database_location=LABELS_PARAMETER,
        database_version=labels_version(labels),
    )


def label_info(labels: Sequence[str], threshold: float, header: Any = None) -> Any:
    """The LabelInfo message of a model's class names (index = id) and score threshold (vision_msgs 4.x)."""
    from vision_msgs.msg import LabelInfo, VisionClass

    info = LabelInfo(
        class_map=[VisionClass(class_id=index, class_name=str(name)) for index, name in enumerate(labels)],
        threshold=float(threshold),
    )
    if header is not None:
        info.header = header
    return info
