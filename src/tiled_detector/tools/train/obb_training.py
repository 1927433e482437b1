"""Train the bundled rotated-box model on synthetic rotated scenes and export it (ONNX + TorchScript + labels).

The network is the bundled detector's (`training.TinyDetector`: depthwise-separable backbone, FPN to one stride-8
grid, decoupled class / box branches) with one more output, the angle, read from the box branch as ultralytics'
OBB head reads it: `(sigmoid - 0.25) x pi`, in [-pi/4, 3pi/4). Boxes are distances from the cell centre to the
four sides in the box's own frame (ultralytics' `dist2rbox`). Its exported output has ultralytics' OBB layout,
"output0" (B, 4 + C + 1, A): cx, cy, w, h in input pixels, per-class scores after a sigmoid, then the angle in
radians, so the pipeline decodes it like any YOLOv8 / YOLO11 OBB export; the files say `task: obb`.

Training: each stride-8 cell whose centre lies inside a rotated truth rectangle and within 1.5 strides of its
centre (or that holds the centre) is a positive for it (the smallest rectangle wins); classes use a quality focal
loss whose target is the ProbIoU of the predicted rectangle, boxes a ProbIoU loss (Llerena et al., "Gaussian
Bounding Boxes and Probabilistic Intersection-over-Union for Object Detection", 2021: the Hellinger distance
between the rectangles' Gaussians, which does not care which side is called w nor about turns of pi). Samples are
`rotated_scenes.make_rotated_crop` crops (objects cut by the crop border labelled with the minimum-area rectangle
of their part inside) and, with `--full-frame-prob`, 3x-downscaled larger crops as the full-frame view sees them.

    .venv/bin/python -m tiled_detector.tools.train.obb_training --device cuda --workers 7 --out OUT_DIR
"""

from __future__ import annotations

import math
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
    TinyDetector,
    anchor_centres,
)
from tiled_detector.tools.worlds.rotated_scenes import CLASSES, make_rotated_crop

STEM = "obb"  # obb.onnx, obb.ts, obb.labels.txt
MIN_FULL_FRAME_LENGTH = (
    6.0  # downscaled samples label objects at least this long (and 2 px wide) in input pixels
)
MIN_FULL_FRAME_WIDTH = 2.0


class RotatedDetector(TinyDetector):
    """`TinyDetector` with an angle output on its box branch."""

    def __init__(self, num_classes: int, width: int = 48) -> None:
        super().__init__(num_classes, width)
        self.angle_out = nn.Conv2d(width, 1, 1)
        nn.init.constant_(self.angle_out.bias, 0.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """Images (B, 3, H, W) in [0, 1] -> class logits (B, C, H/8, W/8), side distances (B, 4, ...) in strides
        (left, top, right, bottom in the box's frame), angle logits (B, 1, ...)."""
        p8 = self.neck(x)
        box = self.box_branch(p8)
        return self.cls_out(self.cls_branch(p8)), F.softplus(self.box_out(box)), self.angle_out(box)


def angle_of(logits: torch.Tensor) -> torch.Tensor:
    """ultralytics' OBB angle: (sigmoid - 0.25) x pi radians."""
    return (logits.sigmoid() - 0.25) * math.pi


def rotated_boxes(ltrb: torch.Tensor, angle: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """(B, A, 4) side distances in strides, (B, A, 1) angles in radians and (A, 2) cell centres -> (B, A, 5) cx, cy,
    w, h, angle in pixels (ultralytics' `dist2rbox`: the sides are measured in the box's own frame)."""
    d = ltrb * STRIDE
    half = (d[..., 2:] - d[..., :2]) / 2  # the centre's offset in the box's frame
    cos, sin = torch.cos(angle), torch.sin(angle)
    x = half[..., :1] * cos - half[..., 1:] * sin
    y = half[..., :1] * sin + half[..., 1:] * cos
    return torch.cat([centres + torch.cat([x, y], dim=-1), d[..., :2] + d[..., 2:], angle], dim=-1)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(2).transpose(1, 2)


class ObbLayout(nn.Module):
    """Export wrapper: (B, 3, S, S) -> "output0" (B, 4 + C + 1, A): cx, cy, w, h, sigmoid scores, angle."""

    def __init__(self, model: RotatedDetector, size: int = EXPORT_SIZE) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("centres", anchor_centres(size // STRIDE, size // STRIDE, torch.device("cpu")))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        cls, ltrb, angle = self.model(images)
        boxes = rotated_boxes(_flat(ltrb), angle_of(_flat(angle)), self.centres).transpose(1, 2)
        return torch.cat([boxes[:, :4], cls.flatten(2).sigmoid(), boxes[:, 4:]], dim=1)


# ----------------------------------------------------------------------------------------------------------
# data


def rotated_sample(seed: int, index: int, crop: int, full_frame_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """Training sample `index` as (image HWC uint8, targets (N, 6): class, cx, cy, w, h, angle): a tile-scale
    crop, or (with `full_frame_prob`) a 3x-downscaled larger crop whose objects shorter than
    `MIN_FULL_FRAME_LENGTH` (or narrower than `MIN_FULL_FRAME_WIDTH`) input pixels are left unlabelled."""
    rng = np.random.default_rng([seed, index])
    scene_seed = int(rng.integers(2**62))
    if rng.random() >= full_frame_prob:
        scene = make_rotated_crop(scene_seed, crop)
        image, obb, classes = scene.image, scene.obb, scene.class_ids
    else:
        big = make_rotated_crop(scene_seed, crop * FULL_FRAME_SCALE)
        image = cv2.resize(big.image, (crop, crop), interpolation=cv2.INTER_AREA)
        obb = big.obb.copy()
        obb[:, :4] /= FULL_FRAME_SCALE
        sides = np.sort(obb[:, 2:4], axis=1)
        keep = (sides[:, 0] >= MIN_FULL_FRAME_WIDTH) & (sides[:, 1] >= MIN_FULL_FRAME_LENGTH)
        obb, classes = obb[keep], big.class_ids[keep]
    return image, np.concatenate([classes[:, None].astype(np.float32), obb], axis=1)


# ----------------------------------------------------------------------------------------------------------
# loss


def _covariance(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (a, b, c) of the covariance [[a, c], [c, b]] of a uniform w x h rectangle turned by its angle."""
    var_w, var_h = boxes[..., 2] ** 2 / 12, boxes[..., 3] ** 2 / 12
    cos, sin = torch.cos(boxes[..., 4]), torch.sin(boxes[..., 4])
    return var_w * cos**2 + var_h * sin**2, var_w * sin**2 + var_h * cos**2, (var_w - var_h) * cos * sin


def probiou(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Elementwise ProbIoU of (..., 5) rotated boxes: 1 - the Hellinger distance of their Gaussians."""
    a1, b1, c1 = _covariance(a)
    a2, b2, c2 = _covariance(b)
    dx, dy = a[..., 0] - b[..., 0], a[..., 1] - b[..., 1]
    sa, sb, sc = a1 + a2, b1 + b2, c1 + c2
    det = sa * sb - sc**2
    t1 = (sa * dy**2 + sb * dx**2) / (det + eps) * 0.25
    t2 = (sc * dx * dy) / (det + eps) * 0.5  # the Mahalanobis distance's cross term
    dets = ((a1 * b1 - c1**2).clamp(min=0) * (a2 * b2 - c2**2).clamp(min=0)).sqrt()
    t3 = torch.log(det / (4 * dets + eps) + eps) * 0.5
    distance = (t1 - t2 + t3).clamp(eps, 100.0)
    return 1.0 - (1.0 - torch.exp(-distance) + eps).sqrt()


def assign_rotated(targets: torch.Tensor, batch: int, h: int, w: int, centres: torch.Tensor) -> torch.Tensor:
    """Centre sampling in the rectangles' own frames: per (image, cell) the index of its target (-1: none)."""
    assigned = torch.full((batch, h * w), -1, dtype=torch.long, device=centres.device)
    if len(targets) == 0:
        return assigned
    boxes = targets[:, 2:7]
    offset = centres[None] - boxes[:, None, :2]  # (M, A, 2)
    cos, sin = torch.cos(boxes[:, 4:5]), torch.sin(boxes[:, 4:5])
    along = offset[..., 0] * cos + offset[..., 1] * sin
    across = -offset[..., 0] * sin + offset[..., 1] * cos
    inside = (along.abs() < boxes[:, 2:3] / 2) & (across.abs() < boxes[:, 3:4] / 2)
    near = offset.abs().amax(dim=-1) < 1.5 * STRIDE
    holds_centre = torch.zeros_like(inside)
    cell = (boxes[:, :2] / STRIDE).floor().long()
    cell[:, 0].clamp_(0, w - 1)
    cell[:, 1].clamp_(0, h - 1)
    holds_centre[torch.arange(len(boxes)), cell[:, 1] * w + cell[:, 0]] = True
    candidate = (inside & near) | holds_centre
    area = boxes[:, 2] * boxes[:, 3]
    cost = torch.where(candidate, area[:, None], torch.full_like(area[:, None], math.inf))
    image_of = targets[:, 0].long()
    for b in range(batch):  # a few images per batch: the per-image loop is on the training path only
        mine = (image_of == b).nonzero().squeeze(1)
        if len(mine) == 0:
            continue
        best, idx = cost[mine].min(dim=0)
        assigned[b] = torch.where(torch.isfinite(best), mine[idx], assigned[b])
    return assigned


def rotated_loss(
    cls: torch.Tensor, ltrb: torch.Tensor, angle: torch.Tensor, targets: torch.Tensor, box_weight: float = 2.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """Quality focal loss on class scores (target = ProbIoU of the predicted rectangle) + ProbIoU loss on
    positives; `targets` (M, 7): batch index, class, cx, cy, w, h, angle."""
    b, _, h, w = cls.shape
    centres = anchor_centres(h, w, cls.device)
    logits = _flat(cls)
    boxes = rotated_boxes(_flat(ltrb), angle_of(_flat(angle)), centres)
    assigned = assign_rotated(targets, b, h, w, centres)
    pos = assigned >= 0
    quality = torch.zeros_like(logits)
    n_pos = max(int(pos.sum()), 1)
    box_loss = logits.sum() * 0.0
    if pos.any():
        matched = targets[assigned[pos]]
        overlap = probiou(boxes[pos], matched[:, 2:7])
        box_loss = (1.0 - overlap).sum() / n_pos
        quality[pos, matched[:, 1].long()] = overlap.detach().clamp(min=0.05)
    prob = logits.sigmoid()
    focal = F.binary_cross_entropy_with_logits(logits, quality, reduction="none") * (
        prob - quality
    ).abs().pow(2)
    cls_loss = focal.sum() / n_pos
    return cls_loss + box_weight * box_loss, {
        "cls": cls_loss.item(),
        "box": box_loss.item(),
        "pos": float(n_pos),
    }


# ----------------------------------------------------------------------------------------------------------
# validation (tile level, quick): DOTA's AP50 over a fixed set of crops, the pipeline's rotated merge


@torch.no_grad()
def validate_rotated(
    model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> float:
    """Mean over classes of DOTA's AP50 (polygon IoU) on validation crops: scores > 0.01, the best 300 per crop,
    merged by `merge_detections` (nms, iou 0.5, class-aware)."""
    from tiled_detector.pipeline.merge import merge_detections
    from tiled_detector.tools.scoring import dota_ap50

    model.eval()
    predictions, truth = [], []
    for image, target in data:
        cls, ltrb, angle = model(image[None].to(device).float() / 255.0)
        h, w = cls.shape[2:]
        boxes = rotated_boxes(_flat(ltrb), angle_of(_flat(angle)), anchor_centres(h, w, device))[0].cpu()
        score, label = _flat(cls)[0].sigmoid().cpu().max(dim=1)
        keep = (score > 0.01).nonzero().squeeze(1)
        keep = keep[score[keep].argsort(descending=True)[:300]]
        merged = merge_detections(
            boxes[keep], score[keep], label[keep], method="nms", metric="iou", threshold=0.5
        )
        predictions.append(tuple(np.asarray(t) for t in merged))
        truth.append((target[:, 1:6].numpy(), target[:, 0].long().numpy()))
    model.train()
    return dota_ap50(predictions, truth)["mAP50"]


# ----------------------------------------------------------------------------------------------------------
# export


def export_rotated(model: nn.Module, out: Path, stem: str = STEM) -> tuple[Path, Path]:
    """Write `<stem>.onnx` (dynamic batch; metadata task obb), `<stem>.ts` (TorchScript with input_shape, labels and
    config.txt {"task": "obb"}) and `<stem>.labels.txt` (the ONNX file's labels)."""
    wrapper = ObbLayout(model.cpu().eval())  # type: ignore[arg-type]
    rows = 4 + len(CLASSES) + 1
    return training.export_head(wrapper, out, stem, rows, CLASSES, {"task": "obb"}, f"{stem}.labels.txt")


ROTATED = Recipe(
    lambda: RotatedDetector(len(CLASSES)),
    rotated_sample,
    rotated_loss,
    validate_rotated,
    export_rotated,
    "the bundled rotated-box model",
)


def main(argv: list[str] | None = None) -> int:
    """`python -m tiled_detector.tools.train.obb_training`: `training.main`'s options, this recipe."""
    return training.main(argv, ROTATED, __doc__)


if __name__ == "__main__":
    sys.exit(main())
