"""tools/train/pose_training.py, how the bundled pose model is made: one training step on generated crops of figures
reaching every output, the keypoint loss at the truth and away from it, and the export wrapper's output against a
numpy reference of ultralytics' pose layout, its files' metadata as ultralytics writes it."""

from __future__ import annotations

import ast
import json
import zipfile

import numpy as np
import onnx
import torch

from tiled_detector.tools.train import pose_training as pose
from tiled_detector.tools.train import training
from tiled_detector.tools.worlds.pose_scenes import CLASSES, JOINTS, SKELETON


def test_training_step_reaches_every_output() -> None:
    torch.manual_seed(0)
    model = pose.PoseDetector(len(CLASSES))
    dataset = training.CropDataset(3, 2, 160, 0.5, sampler=pose.pose_sample)
    images, targets = training.collate([dataset[i] for i in range(2)])
    assert len(targets) > 0 and targets.shape[1] == 6 + 3 * len(JOINTS)  # batch, class, box, joints
    assert set(np.unique(targets[:, 8::3].numpy())) <= {0.0, 1.0}  # labelled or not
    cls, ltrb, raw = model(images.float() / 255.0)
    assert cls.shape == (2, 1, 20, 20) and ltrb.shape == (2, 4, 20, 20) and raw.shape == (2, 39, 20, 20)
    loss, parts = pose.pose_loss(cls, ltrb, raw, targets)
    loss.backward()
    assert torch.isfinite(loss) and parts["pos"] >= len(targets) and parts["kpt"] > 0
    for layer in (model.cls_out, model.box_out, model.kpt_out):
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_keypoint_loss_vanishes_at_the_truth_and_grows_away_from_it() -> None:
    """Raw keypoints that put every joint on its truth (and say so) cost nothing but the box terms; moved away,
    the keypoint term grows with the distance."""
    model = pose.PoseDetector(len(CLASSES))
    images, targets = training.collate([training.CropDataset(7, 1, 320, 0.0, sampler=pose.pose_sample)[0]])
    assert len(targets) >= 2 and targets[:, 8::3].sum() > 10
    cls, ltrb, _ = model(images.float() / 255.0)
    h, w = cls.shape[2:]
    centres = training.anchor_centres(h, w, cls.device)
    (assigned,) = training.assign(targets, 1, h, w, centres)

    def raw_for(shift: float) -> torch.Tensor:
        raw = torch.zeros(1, 3 * len(JOINTS), h * w)
        for cell in (assigned[0] >= 0).nonzero().squeeze(1):
            truth = targets[assigned[0, cell], 6:].reshape(-1, 3)
            offset = (truth[:, :2] + shift - centres[cell]) / pose.REACH
            raw[0, :, cell] = torch.cat([offset, (truth[:, 2:] * 2 - 1) * 20], dim=1).reshape(-1)
        return raw.reshape(1, -1, h, w)

    parts = [pose.pose_loss(cls, ltrb, raw_for(shift), targets)[1] for shift in (0.0, 2.0, 8.0)]
    assert parts[0]["kpt"] < 1e-5 and parts[0]["vis"] < 1e-6
    assert 0 < parts[1]["kpt"] < parts[2]["kpt"]


def reference_pose_layout(cls: np.ndarray, ltrb: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """ultralytics' pose head as exported, in numpy: per cell (row-major, stride 8) cx, cy, w, h, sigmoid scores,
    then per joint x, y (the cell centre + 2 strides x the offset) and its sigmoid visibility -> (4 + C + 3K, A)."""
    c, h, w = cls.shape
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    anchors = (np.stack([xs.ravel(), ys.ravel()], 1) + 0.5) * 8
    d = ltrb.reshape(4, -1).T * 8
    x1y1, x2y2 = anchors - d[:, :2], anchors + d[:, 2:]
    box = np.concatenate([(x1y1 + x2y2) / 2, x2y2 - x1y1], axis=1).T
    points = raw.reshape(-1, 3, h * w).transpose(2, 0, 1)  # (A, K, 3)
    xy = anchors[:, None, :] + points[..., :2] * 16
    visible = 1 / (1 + np.exp(-points[..., 2:]))
    joints = np.concatenate([xy, visible], axis=2).reshape(h * w, -1).T
    return np.concatenate([box, 1 / (1 + np.exp(-cls.reshape(c, -1))), joints])


def test_export_wrapper_writes_ultralytics_pose_layout() -> None:
    torch.manual_seed(1)
    model = pose.PoseDetector(len(CLASSES)).eval()
    x = torch.rand(1, 3, 640, 640)
    with torch.no_grad():
        out = pose.PoseLayout(model)(x)[0].double().numpy()
        cls, ltrb, raw = (t[0].double().numpy() for t in model(x))
    assert out.shape == (4 + 1 + 3 * 13, 6400)
    np.testing.assert_allclose(out, reference_pose_layout(cls, ltrb, raw), rtol=1e-4, atol=1e-3)


def test_exported_files_say_what_ultralytics_writes(tmp_path) -> None:
    """ONNX metadata_props (values str() of Python values) and TorchScript config.txt (JSON): task pose, kpt_shape,
    names and kpt_names as ultralytics' exporter writes them, and the skeleton; labels beside the ONNX file."""
    torch.manual_seed(0)
    onnx_path, ts_path = pose.export_pose(pose.PoseDetector(len(CLASSES)), tmp_path)
    props = {p.key: p.value for p in onnx.load(str(onnx_path)).metadata_props}
    assert props["task"] == "pose" and props["kpt_shape"] == "[13, 3]" and props["names"] == "{0: 'person'}"
    assert ast.literal_eval(props["kpt_names"]) == {0: list(JOINTS)}
    assert ast.literal_eval(props["skeleton"]) == [list(bone) for bone in SKELETON]
    with zipfile.ZipFile(ts_path) as archive:
        config = json.loads(
            archive.read(next(n for n in archive.namelist() if n.endswith("extra/config.txt")))
        )
    assert config["task"] == "pose" and config["kpt_shape"] == [13, 3] and config["names"] == {"0": "person"}
    assert (tmp_path / "pose.labels.txt").read_text() == "person\n"
    assert onnx_path.stat().st_size + ts_path.stat().st_size < 4_000_000
