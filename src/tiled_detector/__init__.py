"""tiled_detector: tiled small-object detection for ROS 2.

The public names are loaded lazily so that `import tiled_detector` stays cheap (no torch import).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> defining module
_EXPORTS = {
    "plan_tiles": "tiled_detector.pipeline.tiling",
    "merge_detections": "tiled_detector.pipeline.merge",
    "TiledDetector": "tiled_detector.detector",
    "DetectorConfig": "tiled_detector.config",
    "Detections": "tiled_detector.types",
    "default_model_path": "tiled_detector.models",
}

__all__ = [
    "Detections",
    "DetectorConfig",
    "TiledDetector",
    "__version__",
    "default_model_path",
    "merge_detections",
    "plan_tiles",
]

if TYPE_CHECKING:
    from tiled_detector.config import DetectorConfig
    from tiled_detector.detector import TiledDetector
    from tiled_detector.models import default_model_path
    from tiled_detector.pipeline.merge import merge_detections
    from tiled_detector.pipeline.tiling import plan_tiles
    from tiled_detector.types import Detections


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tiled_detector' has no attribute {name!r}")
