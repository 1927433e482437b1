"""Scoring detections against ground truth: box IoU, COCO metrics (pycocotools; boxes, and masks where the truth has
them), COCO keypoint AP (OKS), MOT metrics and 3D position errors, for `eval` and `replay`; rotated boxes by polygon
IoU and DOTA's AP50.

Keypoint AP is pycocotools' `keypoints` evaluation: a detection matches a truth object of its class by their object
keypoint similarity, OKS = mean over the object's labelled joints (visibility > 0) of exp(-d^2 / (2 s^2 k^2)), d the
joint's distance, s^2 the object's area (its annotation's `area`; 0.53 x its box where none is given, ultralytics'
rule), k = 2 sigma per joint: COCO's sigmas for 17 joints (its person keypoints), 1 / K each for K other joints
(ultralytics' rule); AP over OKS 0.50:0.95 and AP50, up to `max_dets` detections per image (COCO's keypoint default
is 20 people an image: dense frames need more). Truth without labelled joints is ignored, as are crowd regions and
the objects a caller marks ignored (a detection that matches one counts neither way).

DOTA's AP50 is its devkit's task-1 evaluation (CAPTAIN-WHU/DOTA_devkit, `dota_evaluation_task1.py`, as its `main`
runs it): per class, the detections of every image in descending score; each is matched to the truth object of
its class in its image with the highest polygon IoU; above 0.5 (strictly) it is a true positive when that object
is not difficult and not matched yet, a false positive (a duplicate) when it is matched, and neither when it is
difficult; below, a false positive. Recall counts the objects that are not difficult. AP is the VOC 2007 11-point
interpolated precision (recall 0, 0.1, ..., 1); mAP50 the mean over the classes that have an object that is not
difficult.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes (N, 4) x1y1x2y2, scores (N,), class ids (N,)
# truth of one image for DOTA's AP: shapes (rotated boxes (N, 5) or quadrilaterals (N, 4, 2)), class ids, and
# optionally which objects are difficult (N,) bool
RotatedTruth = tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, np.ndarray]
DOTA_IOU = 0.5
# COCO's person keypoint sigmas (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles; cocoeval.py)
COCO_SIGMAS = (
    np.array(
        [0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07, 0.87, 0.87, 0.89, 0.89]
    )
    / 10.0
)
BOX_AREA_SHARE = (
    0.53  # a truth object's area for OKS where none is given: this share of its box (ultralytics')
)
KEYPOINT_METRICS = ("kp_AP", "kp_AP50", "kp_AP75", "kp_AP_medium", "kp_AP_large", "kp_recall")


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
            np.asarray(p_boxes, float).tolist(),
            np.asarray(p_scores).tolist(),
            np.asarray(p_classes).tolist(),
            p_masks,
            strict=True,
        ):
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


def keypoint_sigmas(joints: int) -> np.ndarray:
    """The OKS sigma of each of `joints` joints: COCO's for 17, else 1 / K each (ultralytics' rule)."""
    if joints < 1:
        raise ValueError(f"keypoints need at least one joint, got {joints}")
    return COCO_SIGMAS.copy() if joints == len(COCO_SIGMAS) else np.full(joints, 1.0 / joints)


# truth of one image for keypoint AP: boxes (N, 4) xyxy, class ids (N,), keypoints (N, K, 3) x, y, visibility
# (0: not labelled), then optionally areas (N,) (None: `BOX_AREA_SHARE` x the box) and ignored (N,) bool
KeypointTruth = tuple[np.ndarray, ...]
# predictions of one image: boxes (N, 4), scores (N,), class ids (N,), keypoints (N, K, 3) x, y, score
KeypointFrame = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def coco_keypoint_stats(
    truth: Sequence[KeypointTruth],
    predictions: Sequence[KeypointFrame],
    sigmas: np.ndarray | None = None,
    max_dets: int = 100,
) -> dict[str, float | None]:
    """COCO keypoint AP (module docstring) of `predictions` against `truth`, per image in order: `KEYPOINT_METRICS`
    (kp_AP over OKS 0.50:0.95, kp_AP50, kp_AP75, medium and large objects, kp_recall), None where no truth object
    counts (an empty area range); 0 without any prediction. `sigmas`: one per joint (default `keypoint_sigmas`)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if len(truth) != len(predictions):
        raise ValueError(f"need one prediction per truth image, got {len(predictions)} and {len(truth)}")
    joints = _joint_count(truth, predictions)
    sigmas = keypoint_sigmas(joints) if sigmas is None else np.asarray(sigmas, np.float64)
    if len(sigmas) != joints:
        raise ValueError(f"{len(sigmas)} OKS sigmas for keypoints of {joints} joints")
    images, annotations, results = [], [], []
    for image_id, (frame, (p_boxes, p_scores, p_classes, p_points)) in enumerate(
        zip(truth, predictions, strict=True), start=1
    ):
        boxes, classes, points = (np.asarray(a, np.float64) for a in frame[:3])
        boxes = boxes.reshape(-1, 4)
        areas = frame[3] if len(frame) > 3 and frame[3] is not None else None
        ignored = frame[4] if len(frame) > 4 and frame[4] is not None else np.zeros(len(boxes), bool)
        sides = boxes[:, 2:] - boxes[:, :2]
        areas = sides.prod(axis=1) * BOX_AREA_SHARE if areas is None else np.asarray(areas, np.float64)
        images.append({"id": image_id})
        for box, cls, joint, area, ignore in zip(
            boxes.tolist(),
            classes.tolist(),
            points.reshape(len(boxes), joints, 3),
            areas.tolist(),
            np.asarray(ignored, bool).tolist(),
            strict=True,
        ):
            labelled = joint[:, 2] > 0
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                    "area": area,
                    "iscrowd": int(ignore),
                    "keypoints": np.where(labelled[:, None], joint, 0.0).ravel().tolist(),
                    "num_keypoints": int(labelled.sum()),
                }
            )
        for score, cls, joint in zip(
            np.asarray(p_scores).tolist(),
            np.asarray(p_classes).tolist(),
            np.asarray(p_points, np.float64).reshape(len(p_boxes), joints, 3),
            strict=True,
        ):
            results.append(
                {
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "score": score,
                    "keypoints": joint.ravel().tolist(),
                }
            )
    if not results:
        return dict.fromkeys(KEYPOINT_METRICS, 0.0)
    categories = sorted({a["category_id"] for a in annotations} | {r["category_id"] for r in results})
    dataset = {"images": images, "annotations": annotations, "categories": [{"id": c} for c in categories]}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        ground = COCO()
        ground.dataset = dataset
        ground.createIndex()
        evaluation = COCOeval(ground, ground.loadRes(results), "keypoints")
        evaluation.params.kpt_oks_sigmas = sigmas
        evaluation.params.maxDets = [max_dets]
        evaluation.evaluate()
        evaluation.accumulate()
    return _keypoint_summary(evaluation)


def _joint_count(truth: Sequence[KeypointTruth], predictions: Sequence[KeypointFrame]) -> int:
    """The joint count every truth object and prediction shares (ValueError naming both where they differ)."""
    counts = {np.asarray(frame[2]).shape[1] for frame in truth if np.asarray(frame[2]).size}
    found = {np.asarray(frame[3]).shape[1] for frame in predictions if np.asarray(frame[3]).size}
    if len(counts | found) > 1:
        raise ValueError(
            f"keypoints of {sorted(found)} joints scored against truth of {sorted(counts)} joints"
        )
    if not counts | found:
        raise ValueError("no keypoints to score: neither the truth nor the predictions have any")
    return next(iter(counts | found))


def _keypoint_summary(evaluation: Any) -> dict[str, float | None]:
    """`KEYPOINT_METRICS` from an accumulated COCOeval (as its `summarize` computes them, at its one maxDets)."""
    params = evaluation.params
    precision, recall = (
        evaluation.eval["precision"],
        evaluation.eval["recall"],
    )  # (T, R, K, A, M), (T, K, A, M)

    def mean(values: np.ndarray) -> float | None:
        valid = values[values > -1]
        return float(valid.mean()) if valid.size else None

    area = params.areaRngLbl.index
    at = {iou: np.flatnonzero(np.isclose(params.iouThrs, iou)) for iou in (0.5, 0.75)}
    return {
        "kp_AP": mean(precision[:, :, :, area("all"), -1]),
        "kp_AP50": mean(precision[at[0.5], :, :, area("all"), -1]),
        "kp_AP75": mean(precision[at[0.75], :, :, area("all"), -1]),
        "kp_AP_medium": mean(precision[:, :, :, area("medium"), -1]),
        "kp_AP_large": mean(precision[:, :, :, area("large"), -1]),
        "kp_recall": mean(recall[:, :, area("all"), -1]),
    }


def mot_metrics(
    truth: Sequence[tuple[np.ndarray, np.ndarray]],
    predicted: Sequence[tuple[np.ndarray, np.ndarray]],
    iou: float = 0.5,
    overlap_of: Callable[[np.ndarray, np.ndarray], np.ndarray] = box_iou,
) -> dict[str, float | int]:
    """IDF1, MOTA and identity switches (py-motmetrics, CLEAR MOT and ID measures) of a sequence: per frame, in
    order, the truth's and the prediction's (boxes x1, y1, x2, y2, or rotated boxes with `overlap_of`
    `rotated_iou`; ids); a prediction can match a truth box at IoU >= `iou`. A prediction without an id
    (negative: an untracked detection carries none) is an identity of its own."""
    import motmetrics

    accumulator = motmetrics.MOTAccumulator(auto_id=True)
    unnamed = itertools.count(-1, -1)  # (fresh identities below every id given)
    for (truth_boxes, truth_ids), (boxes, given) in zip(truth, predicted, strict=True):
        ids = [int(i) if i >= 0 else next(unnamed) for i in np.asarray(given).reshape(-1).tolist()]
        overlap = overlap_of(np.asarray(truth_boxes, np.float64), np.asarray(boxes, np.float64))
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


def polygons(shapes: np.ndarray) -> np.ndarray:
    """(N, 4, 2) convex corners of rotated boxes (N, 5: cx, cy, w, h, angle, ultralytics' xywhr) or of
    quadrilaterals given as (N, 4, 2) or (N, 8) (x1, y1, ..., x4, y4); a quadrilateral that is not convex (a few
    DOTA labels) is replaced by its convex hull (a vertex repeated where the hull has three)."""
    from tiled_detector.geometry.polygons import corners

    shapes = np.asarray(shapes, np.float64)
    if shapes.ndim == 2 and shapes.shape[1] == 5:
        return corners(shapes)
    if shapes.size == 0:
        return np.zeros((0, 4, 2))
    if shapes.shape[-2:] != (4, 2) and not (shapes.ndim == 2 and shapes.shape[1] == 8):
        raise ValueError(
            f"rotated shapes must be (N, 5) boxes or (N, 4, 2) / (N, 8) corners, got {shapes.shape}"
        )
    quads = shapes.reshape(-1, 4, 2).copy()
    edges = np.roll(quads, -1, axis=1) - quads
    turns = (
        edges[:, :, 0] * np.roll(edges, -1, axis=1)[:, :, 1]
        - edges[:, :, 1] * np.roll(edges, -1, axis=1)[:, :, 0]
    )
    for k in np.flatnonzero(~((turns >= 0).all(axis=1) | (turns <= 0).all(axis=1))):
        import cv2

        hull = cv2.convexHull(quads[k].astype(np.float32)).reshape(-1, 2)
        quads[k] = np.concatenate([hull, hull[-1:].repeat(4 - len(hull), axis=0)])
    return quads


def rotated_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Polygon IoU matrix (len(a), len(b)) of rotated boxes or quadrilaterals (`polygons`), in float64: the
    pipeline's exact convex-polygon intersection (`pipeline.rotated.pairwise_overlap`, in bounded chunks)."""
    import torch

    from tiled_detector.pipeline.rotated import pairwise_overlap

    first, second = polygons(a), polygons(b)
    if not len(first) or not len(second):
        return np.zeros((len(first), len(second)))
    overlap = pairwise_overlap(torch.from_numpy(first), torch.from_numpy(second), metric="iou")
    return overlap.double().numpy()


def voc07_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """The VOC 2007 11-point AP: the mean over recall levels 0, 0.1, ..., 1 of the best precision at that recall
    or more (0 where none reaches it)."""
    levels = np.arange(0.0, 1.1, 0.1)  # as the devkit spells it (0.6 is 0.6000000000000001 there too)
    return float(np.mean([precision[recall >= t].max() if (recall >= t).any() else 0.0 for t in levels]))


def _difficult(truth: RotatedTruth) -> np.ndarray:
    return np.asarray(truth[2], bool) if len(truth) == 3 else np.zeros(len(truth[1]), bool)


def dota_ap50(
    predictions: Sequence[Arrays], truth: Sequence[RotatedTruth], iou: float = DOTA_IOU
) -> dict[str, float | dict[str, float] | int]:
    """DOTA's AP50 (module docstring) of `predictions` (per image: rotated boxes (N, 5), scores, class ids)
    against `truth` (per image, in the same order: `RotatedTruth`). Returns mAP50, recall (over every class:
    true positives / objects that are not difficult), true_positives, false_positives, ignored (detections of a
    difficult object), objects and per_class {class id: AP50}; mAP50 and recall are 0 without an object that is
    not difficult (detections of a class without one are not counted)."""
    if len(predictions) != len(truth):
        raise ValueError(f"need one prediction per truth image, got {len(predictions)} and {len(truth)}")
    overlaps = [rotated_iou(p[0], t[0]) for p, t in zip(predictions, truth, strict=True)]
    classes = sorted(
        {
            int(c)
            for t in truth
            for c, d in zip(np.asarray(t[1]).tolist(), _difficult(t), strict=True)
            if not d
        }
    )
    per_class: dict[str, float] = {}
    totals = {"true_positives": 0, "false_positives": 0, "ignored": 0, "objects": 0}
    for cls in classes:
        rows = []  # (score, image, detection) of this class
        for image, (_, scores, labels) in enumerate(predictions):
            rows += [(float(scores[k]), image, k) for k in np.flatnonzero(np.asarray(labels) == cls)]
        rows.sort(key=lambda row: -row[0])
        matched = [np.zeros(len(t[1]), bool) for t in truth]
        npos = sum(int((~_difficult(t) & (np.asarray(t[1]) == cls)).sum()) for t in truth)
        tp, fp = np.zeros(len(rows)), np.zeros(len(rows))
        for n, (_, image, k) in enumerate(rows):
            mine = np.asarray(truth[image][1]) == cls
            row = np.where(mine, overlaps[image][k], -np.inf) if mine.any() else np.zeros(0)
            best = int(np.argmax(row)) if len(row) else -1
            if best >= 0 and row[best] > iou:
                if _difficult(truth[image])[best]:
                    totals["ignored"] += 1
                    continue
                if matched[image][best]:
                    fp[n] = 1.0
                else:
                    tp[n], matched[image][best] = 1.0, True
            else:
                fp[n] = 1.0
        tp_sum, fp_sum = np.cumsum(tp), np.cumsum(fp)
        recall = tp_sum / npos
        precision = tp_sum / np.maximum(tp_sum + fp_sum, np.finfo(np.float64).eps)
        per_class[str(cls)] = voc07_ap(recall, precision)
        totals["true_positives"] += int(tp.sum())
        totals["false_positives"] += int(fp.sum())
        totals["objects"] += npos
    return {
        "mAP50": float(np.mean(list(per_class.values()))) if per_class else 0.0,
        "recall": totals["true_positives"] / totals["objects"] if totals["objects"] else 0.0,
        **totals,
        "per_class": per_class,
    }
