"""tools/train/training.py, how the bundled model is made: one training step on generated crops, and the export wrapper's
YOLOv8 output layout."""

from __future__ import annotations

import numpy as np
import torch

from tiled_detector.tools.train import training as train
from tiled_detector.tools.worlds.synthetic import CLASSES


def test_training_step_and_export_layout() -> None:
    """One loss/backward step on two generated crops, and the export wrapper's YOLOv8 decoding."""
    torch.manual_seed(0)
    model = train.TinyDetector(len(CLASSES))
    images, targets = train.collate([train.CropDataset(3, 2, 128, 0.5)[i] for i in range(2)])
    assert len(targets) > 0 and targets.shape[1] == 6
    cls, ltrb = model(images.float() / 255.0)
    assert cls.shape == (2, len(CLASSES), 16, 16) and ltrb.shape == (2, 4, 16, 16)
    loss, parts = train.detection_loss(cls, ltrb, targets)
    loss.backward()
    assert torch.isfinite(loss) and parts["pos"] >= len(targets)  # every target gets at least its centre cell
    assert model.cls_out.weight.grad is not None and model.cls_out.weight.grad.abs().sum() > 0
    model.eval()
    x = torch.rand(1, 3, 640, 640)
    with torch.no_grad():
        out = train.YoloLayout(model)(x)
        cls, ltrb = model(x)
    xyxy = train.ltrb_to_xyxy(ltrb.flatten(2).transpose(1, 2), train.anchor_centres(80, 80, x.device))[0]
    np.testing.assert_allclose(out[0, :2].T, (xyxy[:, :2] + xyxy[:, 2:]) / 2, atol=1e-4)
    np.testing.assert_allclose(out[0, 2:4].T, xyxy[:, 2:] - xyxy[:, :2], atol=1e-4)
    np.testing.assert_allclose(out[0, 4:], cls.flatten(2)[0].sigmoid(), atol=1e-6)


def test_a_run_exports_its_files_before_it_validates(tmp_path) -> None:
    """A validation that fails (a machine without pycocotools, say) leaves the run's checkpoint and exported files."""
    import dataclasses

    import pytest

    def broken(*_: object) -> float:
        raise ModuleNotFoundError("No module named 'pycocotools'")

    recipe = dataclasses.replace(train.DETECTOR, validate=broken)
    argv = ["--out", str(tmp_path), "--steps", "1", "--batch", "2", "--crop", "64", "--workers", "0"]
    with pytest.raises(ModuleNotFoundError, match="pycocotools"):
        train.main([*argv, "--val-crops", "1", "--log-every", "1"], recipe)
    assert {p.name for p in tmp_path.iterdir()} >= {
        "checkpoint.pt",
        "default.onnx",
        "default.ts",
        "labels.txt",
    }
