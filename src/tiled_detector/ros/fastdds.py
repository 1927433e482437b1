"""The Fast DDS profile shipped for large images (shared-memory segment and port queue sized for 4K frames)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

FASTDDS_PROFILE = Path(str(resources.files("tiled_detector") / "resources" / "fastdds_large_images.xml"))
