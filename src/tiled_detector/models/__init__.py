"""The bundled default model (trained on `tiled_detector.tools.worlds.synthetic` scenes; see MODEL_CARD.md) and its labels;
the bundled rotated-box model (`obb.onnx` / `obb.ts`, trained on `tiled_detector.tools.worlds.rotated_scenes`) and pose
model (`pose.onnx` / `pose.ts`, trained on `tiled_detector.tools.worlds.pose_scenes`).

`default.onnx` / `default.ts` output the YOLOv8 layout (B, 4 + C, A): cx, cy, w, h in input pixels, then class
scores after a sigmoid, for (B, 3, 640, 640) float32 RGB input in [0, 1]. The same network in both formats: the
torch backend loads the TorchScript file, every other backend the ONNX file.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _bundled(stem: str, backend: object) -> Path:
    """The bundled file `stem` for `backend` (a `Backend` or its name): TorchScript for torch, else ONNX."""
    name = getattr(backend, "value", backend)
    return _HERE / (f"{stem}.ts" if name == "torch" else f"{stem}.onnx")


def default_model_path(backend: object = None) -> Path:
    """Path of the bundled model for `backend` (a `Backend` or its name): TorchScript for torch, else ONNX."""
    return _bundled("default", backend)


def obb_model_path(backend: object = None) -> Path:
    """Path of the bundled rotated-box model (`obb.onnx` / `obb.ts`, ultralytics' OBB layout, trained on
    `tools.rotated_scenes`) for `backend`: TorchScript for torch, else ONNX."""
    return _bundled("obb", backend)


def pose_model_path(backend: object = None) -> Path:
    """Path of the bundled pose model (`pose.onnx` / `pose.ts`, ultralytics' pose layout, 13 joints, trained on
    `tools.pose_scenes`) for `backend`: TorchScript for torch, else ONNX."""
    return _bundled("pose", backend)


COCO = "coco"  # `labels: [coco]` names COCO's 80 classes


def coco_labels() -> tuple[str, ...]:
    """COCO's 80 detection classes in their usual order (person, bicycle, car, ...): the class ids of models
    trained on COCO (YOLOX, ultralytics)."""
    return tuple(_parse((_HERE / "coco.names").read_text()) or ())


def _parse(text: str) -> list[str] | None:
    labels = [line.strip() for line in text.splitlines() if line.strip()]
    return labels or None


def load_labels(model_path: str | Path) -> list[str] | None:
    """Class names from a text file beside a model: `<stem>.labels.txt`, else `labels.txt` (one name per line);
    None when there is none (labels stored inside a model file are read by its engine)."""
    path = Path(model_path)
    for candidate in (path.with_name(f"{path.stem}.labels.txt"), path.with_name("labels.txt")):
        if candidate.is_file():
            return _parse(candidate.read_text())
    return None
