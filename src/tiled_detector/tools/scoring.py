"""Scoring detections against ground truth: box IoU, COCO metrics (pycocotools; boxes, and masks where the truth has
them), MOT metrics and 3D position errors, for `eval` and `replay`."""

from __future__ import annotations

import contextlib
import io
import itertools
from collections.abc import Iterable, Sequence

import numpy as np

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes (N, 4) x1y1x2y2, scores (N,), class ids (N,)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix (len(a), len(b)) of x1y1x2y2 boxes, in float64 (0 where the union is empty)."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(bottom_right - top_left, 0, None).prod(axis=2)
    area_a = (a[:, 2:] - a[:, :2]).clip(0).prod(axis=1)
    area_b = (b[:, 2:] - b[:, :2]).clip(0).prod(axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def coco_ground_truth(
    labels: Iterable[tuple[np.ndarray, np.ndarray]],
    sizes: Iterable[tuple[int, int]] | None = None,
    names: Sequence[str] | None = None,
    first_image_id: int = 1,
) -> dict:
    """COCO detection ground truth from per-image (boxes xyxy, class ids) and optional (width, height); category
    id = class id + 1, named by `names` (default: every class id found, named by its number)."""
    labels = list(labels)
    sizes = list(sizes) if sizes is not None else [(0, 0)] * len(labels)
    images, annotations = [], []
    for image_id, ((boxes, class_ids), (width, height)) in enumerate(
        zip(labels, sizes, strict=True), start=first_image_id
    ):
        images.append({"id": image_id, "width": width, "height": height, "file_name": f"{image_id:06d}.png"})
        for box, cls in zip(np.asarray(boxes).tolist(), np.asarray(class_ids).tolist(), strict=True):
            w, h = box[2] - box[0], box[3] - box[1]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "bbox": [box[0], box[1], w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    if names is None:
        found = sorted({int(c) for _, class_ids in labels for c in np.asarray(class_ids).tolist()})
        names = {c: str(c) for c in found}
    else:
        names = dict(enumerate(names))
    categories = [{"id": i + 1, "name": name, "supercategory": "object"} for i, name in names.items()]
    return {"images": images, "annotations": annotations, "categories": categories}


def coco_stats(
    ground_truth: dict, predictions: Sequence[Arrays], max_dets: Sequence[int] = (1, 10, 100)
) -> np.ndarray | None:
    """COCOeval's 12 summary numbers (AP, AP50, AP75, AP_small, ..., AR@max_dets[2], ...) of `predictions`, one per
    ground-truth image in order; None when there is no prediction at all. Categories of predictions that the
    ground truth lacks are added (they can only be false positives)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    results = [
        {
            "image_id": image["id"],
            "category_id": int(c) + 1,
            "bbox": [x1, y1, x2 - x1, y2 - y1],
            "score": float(s),
        }
        for image, (boxes, scores, classes) in zip(ground_truth["images"], predictions, strict=True)
        for (x1, y1, x2, y2), s, c in zip(
            np.asarray(boxes, float).tolist(),
            np.asarray(scores).tolist(),
            np.asarray(classes).tolist(),
            strict=True,
        )
    ]
    if not results:
        return None
    known = {c["id"] for c in ground_truth["categories"]}
    extra = sorted({r["category_id"] for r in results} - known)
    dataset = {**ground_truth, "categories": [*ground_truth["categories"], *({"id": c} for c in extra)]}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        truth = COCO()
        truth.dataset = dataset
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(results), "bbox")
        evaluation.params.maxDets = list(max_dets)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats


MaskFrame = tuple[
    np.ndarray, np.ndarray, np.ndarray, list
]  # boxes, scores, class ids, COCO RLEs (one per box)


def coco_mask_stats(
    truth: Sequence[tuple[np.ndarray, np.ndarray, Sequence[dict | None], tuple[int, int]]],
    predictions: Sequence[MaskFrame],
    max_dets: Sequence[int] = (1, 10, 100),
) -> np.ndarray | None:
    """COCOeval's 12 `segm` summary numbers (mask AP, AP50, ...) of `predictions` against `truth`, per image in order:
    truth (boxes xyxy, class ids, masks as COCO RLE (None: the box stands for it), (height, width)); predictions
    (boxes, scores, class ids, RLEs). None when there is no prediction."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, annotations, results = [], [], []
    for image_id, (
        (boxes, classes, masks, (height, width)),
        (p_boxes, p_scores, p_classes, p_masks),
    ) in enumerate(zip(truth, predictions, strict=True), start=1):
        images.append({"id": image_id, "width": width, "height": height})
        for box, cls, rle in zip(
            np.asarray(boxes, float).tolist(), np.asarray(classes).tolist(), masks, strict=True
        ):
            x1, y1, x2, y2 = box
            shape = rle if rle is not None else [[x1, y1, x2, y1, x2, y2, x1, y2]]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                    "segmentation": shape,
                }
            )
        for box, score, cls, rle in zip(
            np.asarray(p_boxes, float).tolist(), np.asarray(p_scores).tolist(), np.asarray(p_classes).tolist(),
            p_masks, strict=True,
        ):  # fmt: skip
            x1, y1, x2, y2 = box
            results.append(
                {
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": float(score),
                    "segmentation": rle,
                }
            )
    if not results:
        return None
    categories = sorted({a["category_id"] for a in annotations} | {r["category_id"] for r in results})
    dataset = {"images": images, "annotations": annotations, "categories": [{"id": c} for c in categories]}
    with contextlib.redirect_stdout(io.StringIO()):
        ground = COCO()
        ground.dataset = dataset
        ground.createIndex()
        evaluation = COCOeval(ground, ground.loadRes(results), "segm")
        evaluation.params.maxDets = list(max_dets)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats


def mot_metrics(
    truth: Sequence[tuple[np.ndarray, np.ndarray]],
    predicted: Sequence[tuple[np.ndarray, np.ndarray]],
    iou: float = 0.5,
) -> dict[str, float | int]:
    """IDF1, MOTA and identity switches (py-motmetrics, CLEAR MOT and ID measures) of a sequence: per frame, in
    order, the truth's and the prediction's (boxes x1, y1, x2, y2; ids); a prediction can match a truth box at
    IoU >= `iou`. A prediction without an id (negative: an untracked detection carries none) is an identity of its
    own."""
    import motmetrics

    accumulator = motmetrics.MOTAccumulator(auto_id=True)
    unnamed = itertools.count(-1, -1)  # (fresh identities below every id given)
    for (truth_boxes, truth_ids), (boxes, given) in zip(truth, predicted, strict=True):
        ids = [int(i) if i >= 0 else next(unnamed) for i in np.asarray(given).reshape(-1).tolist()]
        overlap = box_iou(
            np.asarray(truth_boxes, np.float64).reshape(-1, 4), np.asarray(boxes, np.float64).reshape(-1, 4)
        )
        # NaN: cannot match (motmetrics' convention)
        distances = np.where(overlap >= iou, 1.0 - overlap, np.nan)
        accumulator.update(np.asarray(truth_ids).tolist(), np.asarray(ids).tolist(), distances)
    summary = motmetrics.metrics.create().compute(accumulator, metrics=["idf1", "mota", "num_switches"])
    row = summary.iloc[0]
    return {"IDF1": float(row["idf1"]), "MOTA": float(row["mota"]), "id_switches": int(row["num_switches"])}


def matched(predicted: Arrays, truth: tuple[np.ndarray, np.ndarray], iou: float = 0.5) -> np.ndarray:
    """(M,) for each truth box the prediction matched to it (-1: none): one to one, same class, IoU >= `iou`,
    highest score first (COCO's greedy matching)."""
    boxes, scores, classes = predicted
    truth_boxes, truth_classes = truth
    found = np.full(len(truth_boxes), -1, np.int64)
    if not len(boxes) or not len(truth_boxes):
        return found
    overlaps = box_iou(boxes, truth_boxes)
    overlaps[np.asarray(classes)[:, None] != np.asarray(truth_classes)[None, :]] = 0.0
    for row in np.argsort(-np.asarray(scores), kind="stable"):
        candidates = np.where(found < 0, overlaps[row], 0.0)
        best = int(np.argmax(candidates))
        if candidates[best] >= iou:
            found[best] = row
    return found


def position_errors(
    predicted: Arrays,
    positions: np.ndarray,
    truth: tuple[np.ndarray, np.ndarray],
    true_positions: np.ndarray,
    min_size: float = 0.0,
) -> np.ndarray:
    """The relative position errors |p - p_true| / |p_true| of the truth objects of at least `min_size` px (the
    longer side of their box) that a prediction with a finite position matched (`matched`)."""
    found = matched(predicted, truth)
    boxes = np.asarray(truth[0], np.float64).reshape(-1, 4)
    big = (
        (boxes[:, 2:] - boxes[:, :2]).max(axis=1, initial=0.0) >= min_size
        if len(boxes)
        else np.zeros(0, bool)
    )
    chosen = np.flatnonzero((found >= 0) & big)
    estimate = np.asarray(positions, np.float64).reshape(-1, 3)[found[chosen]]
    true = np.asarray(true_positions, np.float64).reshape(-1, 3)[chosen]
    keep = np.isfinite(estimate).all(axis=1)
    return np.linalg.norm(estimate[keep] - true[keep], axis=1) / np.linalg.norm(true[keep], axis=1)
