"""The bundled default model: files, labels, output layout, and that it finds objects in a generated scene."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import torch

from tiled_detector.config import DetectorConfig
from tiled_detector.detector import TiledDetector
from tiled_detector.models import default_model_path, load_labels
from tiled_detector.tools.scoring import box_iou
from tiled_detector.tools.worlds.synthetic import CLASSES, make_scene


def test_bundled_files_are_small_and_present() -> None:
    onnx_path = default_model_path()
    ts_path = onnx_path.with_suffix(".ts")
    assert onnx_path.is_file() and ts_path.is_file()
    assert onnx_path.stat().st_size + ts_path.stat().st_size < 5 * 1024 * 1024
    assert (onnx_path.parent / "MODEL_CARD.md").is_file()


def test_labels_match_synthetic_classes() -> None:
    assert load_labels(default_model_path()) == list(CLASSES)
    assert load_labels(default_model_path().with_suffix(".ts")) == list(CLASSES)


def test_labels_lookup_order(tmp_path) -> None:
    model = tmp_path / "mine.onnx"
    model.write_bytes(b"")
    assert load_labels(model) is None
    (tmp_path / "labels.txt").write_text("a\nb\n")
    assert load_labels(model) == ["a", "b"]
    (tmp_path / "mine.labels.txt").write_text("x\n\ny\n")
    assert load_labels(model) == ["x", "y"]  # <stem>.labels.txt wins, blank lines skipped
    shutil.copy(default_model_path().with_suffix(".ts"), tmp_path / "other.ts")
    (tmp_path / "labels.txt").unlink()
    assert load_labels(tmp_path / "other.ts") is None  # nothing beside it: the file's own labels count
    detector = TiledDetector(tmp_path / "other.ts", backend="torch")
    assert detector.labels == tuple(CLASSES)  # the TorchScript "labels" extra file, read by the torch engine


def test_the_bundled_default_follows_the_backend() -> None:
    assert default_model_path("torch").suffix == ".ts" and default_model_path().suffix == ".onnx"
    assert DetectorConfig(backend="torch").model == default_model_path().with_suffix(".ts")
    assert DetectorConfig(backend="onnxruntime").model == DetectorConfig().model == default_model_path()


def test_onnx_interface_is_yolov8_layout() -> None:
    model = onnx.load(str(default_model_path()))
    assert model.opset_import[0].version >= 17
    (inp,) = model.graph.input
    (out,) = model.graph.output
    assert inp.name == "images" and out.name == "output0"
    in_dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    out_dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    assert isinstance(in_dims[0], str) and in_dims[1:] == [3, 640, 640]  # dynamic batch
    assert isinstance(out_dims[0], str) and out_dims[1:] == [4 + len(CLASSES), 80 * 80]


@pytest.mark.filterwarnings("ignore:.*torch.jit.load.*:DeprecationWarning")
def test_torchscript_matches_onnx() -> None:
    import onnxruntime as ort

    files: dict[str, str] = {"input_shape": "", "labels": ""}
    ts = torch.jit.load(str(default_model_path().with_suffix(".ts")), _extra_files=files)
    assert bytes(files["input_shape"]) == b"-1,3,640,640"  # traced batch-agnostic: one call per frame
    x = torch.rand(2, 3, 640, 640, generator=torch.Generator().manual_seed(0))
    session = ort.InferenceSession(str(default_model_path()), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        ts_out = ts(x).numpy()
    assert onnx_out.shape == (2, 8, 6400)
    np.testing.assert_allclose(ts_out, onnx_out, atol=2e-3)
    assert np.all((onnx_out[:, 4:] >= 0) & (onnx_out[:, 4:] <= 1))


@pytest.mark.filterwarnings("ignore:.*torch.jit.load.*:DeprecationWarning")
@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_bundled_model_finds_objects(backend: str) -> None:
    """Recall at IoU 0.5 (same class) on a held-out frame with the default pipeline."""
    from tiled_detector.detector import TiledDetector

    model = default_model_path() if backend == "onnxruntime" else default_model_path().with_suffix(".ts")
    detector = TiledDetector(model, backend=backend)
    assert detector.labels == CLASSES
    scene = make_scene(424242, 1280, 720)
    found = detector.detect(scene.image)
    hits = (box_iou(scene.boxes, found.boxes) >= 0.5) & (scene.class_ids[:, None] == found.class_ids[None])
    recall = hits.any(axis=1).mean()
    precision = hits.any(axis=0).mean()
    assert recall >= 0.8, f"recall {recall:.2f} on {len(scene.boxes)} objects"
    assert precision >= 0.7, f"precision {precision:.2f} of {len(found)} detections"
