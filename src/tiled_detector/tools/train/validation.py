"""Tile-level validation of the bundled models while they train: greedy NMS, box IoU and all-point AP over a fixed
set of crops (quick, class-aware; the detector's own AP is `eval`'s)."""

from __future__ import annotations

import numpy as np
import torch


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices of the boxes greedy NMS keeps, best score first (one box at a time: validation's few boxes)."""
    order = scores.argsort(descending=True)
    keep = []
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    ious = box_iou(boxes[order], boxes[order])
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(order[i])
        suppressed |= ious[i] > iou_threshold
    return torch.stack(keep) if keep else torch.zeros(0, dtype=torch.long)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, M) IoU of xyxy boxes."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    area_a = (a[:, 2:] - a[:, :2]).prod(dim=1)
    area_b = (b[:, 2:] - b[:, :2]).prod(dim=1)
    return inter / (area_a[:, None] + area_b[None, :] - inter + 1e-7)


def average_precision(matches: list[tuple[float, bool]], n_gt: int) -> float:
    """All-point interpolated AP from (score, is_true_positive) pairs."""
    if n_gt == 0:
        return float("nan")
    matches.sort(key=lambda m: -m[0])
    tp = np.cumsum([m[1] for m in matches]) if matches else np.zeros(0)
    recall = tp / n_gt
    precision = tp / np.arange(1, len(tp) + 1)
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[1.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    return float(np.sum((mrec[1:] - mrec[:-1]) * mpre[1:]))
