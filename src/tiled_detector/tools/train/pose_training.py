"""Train the bundled pose model on synthetic figures and export it (ONNX + TorchScript + labels).

The network is the bundled detector's (`training.TinyDetector`: depthwise-separable backbone, FPN to one stride-8
grid, decoupled class / box branches) with a third branch for the keypoints (two separable blocks of 64 channels):
per cell and joint an offset from the cell centre (x 2 strides) and a visibility logit. Its exported output has ultralytics' pose layout, "output0"
(B, 4 + C + K x 3, A): cx, cy, w, h in input pixels, per-class scores after a sigmoid, then each joint's x, y (input
pixels) and visibility (after a sigmoid), joint after joint, so the pipeline decodes it like any YOLOv8 / YOLO11 pose
export; the files say `imgsz`, `stride`, `task: pose`, `kpt_shape` [K, 3], `names` and `kpt_names` as ultralytics
writes them (and `skeleton`, the joints' bones, which ultralytics does not write).

Training: the bundled detector's assignment and loss (`training.detection_loss`) for classes and boxes, and on the
same positive cells ultralytics' keypoint loss: 1 - exp(-d^2 / (2 s^2 (2 sigma)^2)) per labelled joint (d its
distance, s^2 the truth box's area, sigma 1 / K: OKS as a loss) plus `L1_WEIGHT` x d / s (OKS's loss vanishes for
a joint several tolerances away), averaged over the labelled joints, plus a binary
cross-entropy of each joint's visibility against whether it is labelled (a joint outside the crop is not: the model
learns to say where it cannot see). Samples are `pose_scenes.make_pose_crop` crops and, with `--full-frame-prob`,
3x-downscaled larger crops as the full-frame view sees them (figures shorter than `MIN_FULL_FRAME_HEIGHT` input
pixels left unlabelled: the tiles find those).

    .venv/bin/python -m tiled_detector.tools.train.pose_training --device cuda --workers 7 --out OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from tiled_detector.tools.train import training
from tiled_detector.tools.train.training import (
    EXPORT_SIZE,
    FULL_FRAME_SCALE,
    STRIDE,
    Recipe,
    SepBlock,
    TinyDetector,
    anchor_centres,
    assign,
    detection_loss,
    ltrb_to_xyxy,
)
from tiled_detector.tools.train.validation import nms
from tiled_detector.tools.worlds.pose_scenes import CLASSES, JOINTS, SKELETON, make_pose_crop

STEM = "pose"  # pose.onnx, pose.ts, pose.labels.txt
MIN_FULL_FRAME_HEIGHT = 12.0  # downscaled samples label figures at least this tall in input pixels
REACH = 2.0 * STRIDE  # a joint offset of 1 is this many pixels from the cell centre
KEYPOINT_WIDTH = 64  # channels of the keypoint branch (two separable blocks)
KEYPOINT_WEIGHT, VISIBILITY_WEIGHT = 6.0, 1.0
# the OKS loss vanishes for a joint several tolerances away (all of them, at the start): this much of the joint's
# distance over the object's size (its box's square root) pulls it in from afar
L1_WEIGHT = 0.5


class PoseDetector(TinyDetector):
    """`TinyDetector` with a keypoint branch: per joint an offset and a visibility logit."""

    def __init__(self, num_classes: int, joints: int = len(JOINTS), width: int = 48) -> None:
        super().__init__(num_classes, width)
        self.joints = joints
        self.kpt_branch = nn.Sequential(
            SepBlock(width, KEYPOINT_WIDTH), SepBlock(KEYPOINT_WIDTH, KEYPOINT_WIDTH)
        )
        self.kpt_out = nn.Conv2d(KEYPOINT_WIDTH, joints * 3, 1)
        nn.init.constant_(self.kpt_out.bias, 0.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """Images (B, 3, H, W) in [0, 1] -> class logits (B, C, H/8, W/8), box distances ltrb in strides, keypoints
        (B, K x 3, H/8, W/8): per joint x, y offsets (in `REACH` units) and a visibility logit."""
        p8 = self.neck(x)
        cls = self.cls_out(self.cls_branch(p8))
        ltrb = F.softplus(self.box_out(self.box_branch(p8)))
        return cls, ltrb, self.kpt_out(self.kpt_branch(p8))


def keypoints(raw: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """(B, K x 3, H, W) raw keypoints + (H x W, 2) cell centres -> (B, A, K, 3) x, y in pixels, visibility logit."""
    b, channels = raw.shape[:2]
    flat = raw.flatten(2).transpose(1, 2).reshape(b, -1, channels // 3, 3)
    xy = centres[None, :, None, :] + flat[..., :2] * REACH
    return torch.cat([xy, flat[..., 2:]], dim=-1)


class PoseLayout(nn.Module):
    """Export wrapper: (B, 3, S, S) -> "output0" (B, 4 + C + K x 3, A): cx, cy, w, h, sigmoid scores, then x, y,
    sigmoid visibility per joint (ultralytics' pose layout)."""

    def __init__(self, model: PoseDetector, size: int = EXPORT_SIZE) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("centres", anchor_centres(size // STRIDE, size // STRIDE, torch.device("cpu")))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        cls, ltrb, raw = self.model(images)
        d = ltrb.flatten(2).transpose(1, 2) * STRIDE  # (B, A, 4)
        x1y1, x2y2 = self.centres - d[..., :2], self.centres + d[..., 2:]
        box = torch.cat([(x1y1 + x2y2) * 0.5, x2y2 - x1y1], dim=-1).transpose(1, 2)
        points = keypoints(raw, self.centres)
        points = torch.cat([points[..., :2], points[..., 2:].sigmoid()], dim=-1)
        return torch.cat([box, cls.flatten(2).sigmoid(), points.flatten(2).transpose(1, 2)], dim=1)


# ----------------------------------------------------------------------------------------------------------
# data


def pose_sample(seed: int, index: int, crop: int, full_frame_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """Training sample `index` as (image HWC uint8, targets (N, 5 + K x 3): class, x1, y1, x2, y2, then x, y,
    labelled (0 / 1) per joint): a tile-scale crop, or (with `full_frame_prob`) a 3x-downscaled larger crop whose
    figures shorter than `MIN_FULL_FRAME_HEIGHT` input pixels are left unlabelled."""
    rng = np.random.default_rng([seed, index])
    scene_seed = int(rng.integers(2**62))
    if rng.random() >= full_frame_prob:
        scene = make_pose_crop(scene_seed, crop)
        image, boxes, points = scene.image, scene.boxes, scene.keypoints.copy()
    else:
        big = make_pose_crop(scene_seed, crop * FULL_FRAME_SCALE)
        image = cv2.resize(big.image, (crop, crop), interpolation=cv2.INTER_AREA)
        boxes, points = big.boxes / FULL_FRAME_SCALE, big.keypoints.copy()
        points[..., :2] /= FULL_FRAME_SCALE
        keep = (boxes[:, 3] - boxes[:, 1]) >= MIN_FULL_FRAME_HEIGHT
        boxes, points = boxes[keep], points[keep]
    points[..., 2] = points[..., 2] > 0
    classes = np.zeros((len(boxes), 1), np.float32)
    flat = points.reshape(len(boxes), 3 * len(JOINTS))
    return image, np.concatenate([classes, boxes, flat], axis=1).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------
# loss


def pose_loss(
    cls: torch.Tensor, ltrb: torch.Tensor, raw: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """`training.detection_loss` + the keypoint loss (module docstring) on the same positives; `targets` (M, 6 + K
    x 3): batch index, class, x1, y1, x2, y2, then x, y, labelled per joint."""
    b, _, h, w = cls.shape
    centres = anchor_centres(h, w, cls.device)
    (assigned,) = assign(targets, b, h, w, centres)
    loss, parts = detection_loss(cls, ltrb, targets, assigned=assigned)
    pos = assigned >= 0
    joints = raw.shape[1] // 3
    keypoint_loss = visibility_loss = raw.sum() * 0.0
    if pos.any():
        matched = targets[assigned[pos]]
        truth = matched[:, 6:].reshape(-1, joints, 3)
        labelled = truth[..., 2]
        predicted = keypoints(raw, centres)[pos]  # (P, K, 3)
        offset = predicted[..., :2] - truth[..., :2]
        sides = (matched[:, 4:6] - matched[:, 2:4]).clamp(min=1.0)
        area = (sides[:, 0] * sides[:, 1])[:, None]
        scale = 2.0 * (2.0 / joints) ** 2 * area  # 2 s^2 (2 sigma)^2
        per_joint = 1.0 - torch.exp(-offset.pow(2).sum(dim=-1) / scale)
        per_joint = per_joint + L1_WEIGHT * offset.abs().sum(dim=-1) / area.sqrt()  # a pull from afar
        share = labelled.sum(dim=1).clamp(min=1.0)
        keypoint_loss = ((per_joint * labelled).sum(dim=1) / share).mean()
        visibility_loss = F.binary_cross_entropy_with_logits(predicted[..., 2], labelled)
    total = loss + KEYPOINT_WEIGHT * keypoint_loss + VISIBILITY_WEIGHT * visibility_loss
    return total, {**parts, "kpt": keypoint_loss.item(), "vis": visibility_loss.item()}


# ----------------------------------------------------------------------------------------------------------
# validation (tile level, quick): keypoint AP (OKS) over a fixed set of crops


@torch.no_grad()
def validate_pose(
    model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> float:
    """COCO keypoint AP (OKS 0.50:0.95, sigmas 1 / K) on validation crops: scores > 0.01, greedy NMS at IoU 0.5,
    the best 100 per crop."""
    from tiled_detector.tools.scoring import coco_keypoint_stats

    model.eval()
    truth, predictions = [], []
    for image, target in data:
        cls, ltrb, raw = model(image[None].to(device).float() / 255.0)
        h, w = cls.shape[2:]
        centres = anchor_centres(h, w, device)
        boxes = ltrb_to_xyxy(ltrb.flatten(2).transpose(1, 2).float(), centres)[0].cpu()
        points = keypoints(raw.float(), centres)[0].cpu()
        scores = cls.flatten(2)[0].T.sigmoid().max(dim=1).values.float().cpu()
        chosen = (scores > 0.01).nonzero().squeeze(1)
        chosen = chosen[nms(boxes[chosen], scores[chosen], 0.5)][:100]
        found = points[chosen]
        found[..., 2] = found[..., 2].sigmoid()
        predictions.append(
            (boxes[chosen].numpy(), scores[chosen].numpy(), np.zeros(len(chosen)), found.numpy())
        )
        joints = (target.shape[1] - 5) // 3
        truth.append(
            (
                target[:, 1:5].numpy(),
                target[:, 0].long().numpy(),
                target[:, 5:].reshape(-1, joints, 3).numpy(),
            )
        )
    model.train()
    return float(coco_keypoint_stats(truth, predictions)["kp_AP"] or 0.0)


# ----------------------------------------------------------------------------------------------------------
# export


def export_pose(model: nn.Module, out: Path, stem: str = STEM) -> tuple[Path, Path]:
    """Write `<stem>.onnx` (dynamic batch; metadata imgsz, stride, task pose, kpt_shape, names, kpt_names, skeleton,
    as ultralytics' exporter writes them but the skeleton), `<stem>.ts`
    (TorchScript with input_shape, labels and the same metadata as config.txt) and `<stem>.labels.txt`."""
    joints = model.joints  # type: ignore[attr-defined]
    metadata = {
        "imgsz": [EXPORT_SIZE, EXPORT_SIZE],
        "stride": STRIDE,
        "task": "pose",
        "kpt_shape": [joints, 3],
        "names": dict(enumerate(CLASSES)),
        "kpt_names": {k: list(JOINTS) for k in range(len(CLASSES))},
        "skeleton": [list(bone) for bone in SKELETON],
    }
    wrapper = PoseLayout(model.cpu().eval())  # type: ignore[arg-type]
    rows = 4 + len(CLASSES) + 3 * joints
    return training.export_head(wrapper, out, stem, rows, CLASSES, metadata, f"{stem}.labels.txt")


POSE = Recipe(
    lambda: PoseDetector(len(CLASSES)),
    pose_sample,
    pose_loss,
    validate_pose,
    export_pose,
    "the bundled pose model",
    "kp_AP",
)


def main(argv: list[str] | None = None) -> int:
    """`python -m tiled_detector.tools.train.pose_training`: `training.main`'s options, this recipe."""
    return training.main(argv, POSE, __doc__)


if __name__ == "__main__":
    sys.exit(main())
