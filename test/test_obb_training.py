"""tools/train/obb_training.py, how the bundled rotated-box model is made: one training step on generated rotated crops,
ProbIoU's symmetries, and the export wrapper's output against a numpy reference of ultralytics' OBB layout."""

from __future__ import annotations

import math

import numpy as np
import torch

from tiled_detector.tools.train import obb_training as obb
from tiled_detector.tools.train import training
from tiled_detector.tools.worlds.rotated_scenes import CLASSES


def test_training_step_reaches_every_output() -> None:
    torch.manual_seed(0)
    model = obb.RotatedDetector(len(CLASSES))
    dataset = training.CropDataset(3, 2, 128, 0.5, sampler=obb.rotated_sample)
    images, targets = training.collate([dataset[i] for i in range(2)])
    assert len(targets) > 0 and targets.shape[1] == 7  # batch index, class, cx, cy, w, h, angle
    cls, ltrb, angle = model(images.float() / 255.0)
    assert (
        cls.shape == (2, len(CLASSES), 16, 16)
        and ltrb.shape == (2, 4, 16, 16)
        and angle.shape == (2, 1, 16, 16)
    )
    loss, parts = obb.rotated_loss(cls, ltrb, angle, targets)
    loss.backward()
    assert torch.isfinite(loss) and parts["pos"] >= len(targets)  # every target gets at least its centre cell
    for layer in (model.cls_out, model.box_out, model.angle_out):
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_probiou_ignores_which_side_is_w_and_turns_of_pi() -> None:
    box = torch.tensor([30.0, 20.0, 24.0, 6.0, 0.4])
    same = torch.stack(
        [
            box,
            torch.tensor([30.0, 20.0, 6.0, 24.0, 0.4 + math.pi / 2]),
            box + torch.tensor([0, 0, 0, 0, math.pi]),
        ]
    )
    np.testing.assert_allclose(obb.probiou(box.expand(3, 5), same), 1.0, atol=1e-3)
    turned = box + torch.tensor([0, 0, 0, 0, math.pi / 2])  # the same centre and size, crossed
    far = box + torch.tensor([100.0, 0, 0, 0, 0])
    values = obb.probiou(box.expand(2, 5), torch.stack([turned, far]))
    assert values[0] < 0.6 and values[1] < 1e-3


def reference_obb_layout(cls: np.ndarray, ltrb: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """ultralytics' OBB head as exported, in numpy: per cell (row-major, stride 8) the distances to the box's
    sides in its own frame (dist2rbox) and the angle (sigmoid - 0.25) x pi -> (4 + C + 1, A)."""
    c, h, w = cls.shape
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    anchors = (np.stack([xs.ravel(), ys.ravel()], 1) + 0.5) * 8
    d = ltrb.reshape(4, -1).T * 8
    theta = (1 / (1 + np.exp(-angle.reshape(-1))) - 0.25) * math.pi
    fx, fy = (d[:, 2] - d[:, 0]) / 2, (d[:, 3] - d[:, 1]) / 2
    cx = anchors[:, 0] + fx * np.cos(theta) - fy * np.sin(theta)
    cy = anchors[:, 1] + fx * np.sin(theta) + fy * np.cos(theta)
    scores = 1 / (1 + np.exp(-cls.reshape(c, -1)))
    return np.concatenate([np.stack([cx, cy, d[:, 0] + d[:, 2], d[:, 1] + d[:, 3]]), scores, theta[None]])


def test_export_wrapper_writes_ultralytics_obb_layout() -> None:
    torch.manual_seed(1)
    model = obb.RotatedDetector(len(CLASSES)).eval()
    x = torch.rand(1, 3, 640, 640)
    with torch.no_grad():
        out = obb.ObbLayout(model)(x)[0].double().numpy()
        cls, ltrb, angle = (t[0].double().numpy() for t in model(x))
    assert out.shape == (4 + len(CLASSES) + 1, 6400)
    np.testing.assert_allclose(out, reference_obb_layout(cls, ltrb, angle), rtol=1e-4, atol=1e-3)


def test_exported_files_load_as_rotated_box_models_with_no_flag(tmp_path) -> None:
    """Both files say `task: obb` (ONNX metadata, TorchScript config.txt) and name the classes (labels file, extra
    file): the pipeline reads them as ultralytics OBB heads with no layout flag."""
    from tiled_detector import TiledDetector
    from tiled_detector.pipeline.layouts import OutputLayout

    torch.manual_seed(0)
    onnx_path, ts_path = obb.export_rotated(obb.RotatedDetector(len(CLASSES)), tmp_path)
    for path in (onnx_path, ts_path):
        found = TiledDetector(path).resolved
        assert found.layout is OutputLayout.OBB and "task obb" in found.decided_by
        assert found.labels == CLASSES and found.num_classes == len(CLASSES)
