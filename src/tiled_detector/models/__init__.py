"""The bundled default model (trained on `tiled_detector.tools.synthetic` scenes; see MODEL_CARD.md) and its labels.

`default.onnx` / `default.ts` output the YOLOv8 layout (B, 4 + C, A): cx, cy, w, h in input pixels, then class
scores after a sigmoid, for (B, 3, 640, 640) float32 RGB input in [0, 1].
"""

from __future__ import annotations

import zipfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def default_model_path() -> Path:
    """Path of the bundled ONNX model."""
    return _HERE / "default.onnx"


def _torchscript_labels(model_path: Path) -> list[str] | None:
    """The "labels" extra file of a TorchScript archive (read from the zip, without loading the model)."""
    if not zipfile.is_zipfile(model_path):
        return None
    with zipfile.ZipFile(model_path) as archive:
        names = [n for n in archive.namelist() if n.endswith("/extra/labels")]
        return _parse(archive.read(names[0]).decode()) if names else None


def _parse(text: str) -> list[str] | None:
    labels = [line.strip() for line in text.splitlines() if line.strip()]
    return labels or None


def load_labels(model_path: str | Path) -> list[str] | None:
    """Class names for a model: `<stem>.labels.txt` or `labels.txt` beside it, else a TorchScript model's
    "labels" extra file; None when there are none."""
    path = Path(model_path)
    for candidate in (path.with_name(f"{path.stem}.labels.txt"), path.with_name("labels.txt")):
        if candidate.is_file():
            return _parse(candidate.read_text())
    if path.suffix.lower() in {".ts", ".pt", ".torchscript"} and path.is_file():
        return _torchscript_labels(path)
    return None
