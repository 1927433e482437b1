"""Replay reports: what each replayed frame got, and scores against the bag's ground truth.

AP50 (COCO, pycocotools) plus precision and recall at IoU 0.5 over the answered frames; a dropped frame is
counted in `dropped` / the drop rate instead. A bag whose ground truth is rotated boxes (`make-bag --obb`,
`--truth-format dota / yolo-obb`) is scored on the answers' rotated boxes (center.theta) by polygon IoU: AP50 is
DOTA's (its devkit's rules, `scoring.dota_ap50`), difficult objects (score 0 in the truth) ignored; recall over the
other objects, precision over the detections not of a difficult one. When the bag's ground truth carries identities (`make-bag --motion`),
also IDF1, MOTA and identity switches (py-motmetrics) of the answers' Detection2D ids over every frame sent (a
dropped frame is one with no answer). Pure numpy / pycocotools / motmetrics: no ROS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tiled_detector.settings.options import Option
from tiled_detector.tools.scoring import (
    Arrays,
    RotatedTruth,
    box_iou,
    coco_ground_truth,
    coco_stats,
    dota_ap50,
)

DEPTH_KEYS = ("depth_error_median", "depth_error_p95", "objects_3d")
MASK_KEYS = ("mask_AP", "mask_AP50", "label_images", "label_images_missing", "label_images_wrong")
KEYPOINT_KEYS = ("kp_AP", "kp_AP50", "keypoint_arrays", "keypoint_arrays_missing", "keypoint_arrays_wrong")
WORK_KEYS = (
    "views_per_frame",
    "views_per_frame_max",
    "frames_per_second",
    "predicted_boxes",
    "frames_skipped",
)


class Mode(Option):
    """How frames are played into the node."""

    LOCKSTEP = "lockstep"
    REALTIME = "realtime"


@dataclass(frozen=True)
class FrameRecord:
    """One frame sent: its stamp, latency (ms; None when unanswered), the detections it got and their
    Detection2D ids (track ids with the node's `tracker` on)."""

    stamp_ns: int
    latency_ms: float | None
    detections: Arrays | None
    ids: np.ndarray | None = None


@dataclass(frozen=True)
class Scores:
    """Detection quality over the answered frames that have ground truth (None without ground truth)."""

    ap50: float | None = None
    precision: float | None = None
    recall: float | None = None


@dataclass(frozen=True)
class ReplayReport:
    """Outcome of one replay."""

    mode: str
    frames_sent: int
    frames_answered: int
    ap50: float | None
    precision: float | None
    recall: float | None
    latency_ms_p50: float | None
    latency_ms_p95: float | None
    records: tuple[FrameRecord, ...] = field(default=(), compare=False, repr=False)  # per frame sent
    labels: tuple[str, ...] = ()  # class names indexed by the records' class ids
    tracking: dict[str, float | int] | None = None  # IDF1, MOTA, id_switches (ground truth with identities)
    # the node's work: views_per_frame (mean, max; from its /diagnostics), frames_per_second (answers over the
    # time from the first frame sent to the last answer), predicted_boxes (detections reported from an earlier
    # frame: a tile budget's tiles not run), frames_skipped (frames sent that the node never took, from its
    # /diagnostics; None where the middleware gives no sequence numbers)
    work: dict[str, float | int | None] | None = None
    # a bag with depth (`harness.depth_replay`): depth_error_median, depth_error_p95 (relative), objects_3d
    depth: dict[str, float | int | None] | None = None
    # a segmentation model (`mask_scores`): mask_AP, mask_AP50 (truth with masks), label_images (received),
    # label_images_missing (answers with detections but no label image), label_images_wrong (not the array's)
    masks: dict[str, float | int | None] | None = None
    # a pose model (`keypoint_scores`): kp_AP, kp_AP50 (OKS; truth with keypoints), keypoint_arrays (received),
    # keypoint_arrays_missing (answers with detections but no KeypointsArray), keypoint_arrays_wrong (not one
    # entry per detection)
    keypoints: dict[str, float | int | None] | None = None

    @property
    def dropped(self) -> int:
        return self.frames_sent - self.frames_answered

    @property
    def drop_rate(self) -> float:
        return self.dropped / self.frames_sent if self.frames_sent else 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON report (keys as documented for `tiled-detector replay --json`)."""
        return {
            "mode": self.mode,
            "frames_sent": self.frames_sent,
            "frames_answered": self.frames_answered,
            "dropped": self.dropped,
            "drop_rate": self.drop_rate,
            "AP50": self.ap50,
            "precision": self.precision,
            "recall": self.recall,
            "latency_ms_p50": self.latency_ms_p50,
            "latency_ms_p95": self.latency_ms_p95,
            **{key: (self.tracking or {}).get(key) for key in ("IDF1", "MOTA", "id_switches")},
            **{key: (self.work or {}).get(key) for key in WORK_KEYS},
            **{key: (self.depth or {}).get(key) for key in DEPTH_KEYS},
            **{key: (self.masks or {}).get(key) for key in MASK_KEYS},
            **{key: (self.keypoints or {}).get(key) for key in KEYPOINT_KEYS},
        }


# --- scoring (pure numpy / pycocotools) -------------------------------------------------------------------


def true_positives(predicted: Arrays, truth: tuple[np.ndarray, np.ndarray], iou: float = 0.5) -> int:
    """Predictions matched one-to-one to a same-class truth box with IoU >= `iou`, highest score first."""
    boxes, scores, classes = predicted
    truth_boxes, truth_classes = truth
    if len(boxes) == 0 or len(truth_boxes) == 0:
        return 0
    overlaps = box_iou(boxes, truth_boxes)
    overlaps[np.asarray(classes)[:, None] != np.asarray(truth_classes)[None, :]] = 0.0
    free = np.ones(len(truth_boxes), bool)
    matched = 0
    for row in overlaps[np.argsort(-np.asarray(scores), kind="stable")]:
        candidates = np.where(free, row, 0.0)
        best = int(np.argmax(candidates))
        if candidates[best] >= iou:
            free[best] = False
            matched += 1
    return matched


def coco_ap50(predicted: Mapping[int, Arrays], truth: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> float:
    """COCO AP at IoU 0.5 (pycocotools, up to 1000 detections per image) over the images of `truth`."""
    stamps = sorted(truth)
    if not any(len(truth[s][0]) for s in stamps):
        raise ValueError("AP50 needs at least one ground-truth box")
    empty: Arrays = (np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))
    stats = coco_stats(
        coco_ground_truth(truth[s] for s in stamps),
        [predicted.get(s, empty) for s in stamps],
        max_dets=(1, 10, 1000),
    )
    return 0.0 if stats is None else float(stats[1])


def score(predicted: Mapping[int, Arrays], truth: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> Scores:
    """AP50, precision and recall at IoU 0.5 over the frames that have both an answer and ground truth."""
    common = sorted(set(predicted) & set(truth))
    if not common or not any(len(truth[s][0]) for s in common):
        return Scores()
    hits = sum(true_positives(predicted[s], truth[s]) for s in common)
    n_predicted = sum(len(predicted[s][0]) for s in common)
    n_truth = sum(len(truth[s][0]) for s in common)
    ap50 = coco_ap50({s: predicted[s] for s in common}, {s: truth[s] for s in common})
    return Scores(ap50, hits / n_predicted if n_predicted else 0.0, hits / n_truth)


def rotated_score(predicted: Mapping[int, Arrays], truth: Mapping[int, RotatedTruth]) -> Scores:
    """DOTA's AP50, precision and recall (module docstring) of rotated boxes over the frames that have both an
    answer and ground truth with an object that is not difficult."""
    common = sorted(set(predicted) & set(truth))
    if not any((~np.asarray(truth[s][2], bool)).any() for s in common):
        return Scores()
    found = dota_ap50([predicted[s] for s in common], [truth[s] for s in common])
    judged = sum(len(predicted[s][0]) for s in common) - int(found["ignored"])
    precision = int(found["true_positives"]) / judged if judged else 0.0
    return Scores(float(found["mAP50"]), precision, float(found["recall"]))


def summarize(
    mode: Mode,
    records: Sequence[FrameRecord],
    truth: Mapping[int, tuple[np.ndarray, np.ndarray]] | Mapping[int, RotatedTruth],
    rotated: bool = False,
) -> ReplayReport:
    """The report of a replay from its frame records and the ground truth (stamp -> boxes, class ids; `rotated`:
    rotated boxes, class ids, difficult)."""
    answered = {r.stamp_ns: r.detections for r in records if r.detections is not None}
    latencies = [r.latency_ms for r in records if r.latency_ms is not None]
    scores = rotated_score(answered, truth) if rotated else score(answered, truth)  # type: ignore[arg-type]
    p50, p95 = (float(v) for v in np.percentile(latencies, [50, 95])) if latencies else (None, None)
    return ReplayReport(
        mode.value,
        len(records),
        len(answered),
        scores.ap50,
        scores.precision,
        scores.recall,
        p50,
        p95,
        tuple(records),
    )


def label_masks(
    labels: np.ndarray, boxes: np.ndarray, frame_hw: tuple[int, int] | None = None
) -> list[dict[str, Any]] | None:
    """A label image's masks as COCO RLE, one per detection of its array (`boxes`, frame pixels; value k + 1: the
    k-th), at the label image's size; None when it does not match the array: a value beyond it, or a detection's
    pixels outside its box (`frame_hw`: the frame's size, when the label image is smaller)."""
    from tiled_detector.tools.segmentation import crop_rle

    count = len(boxes)
    if labels.size and int(labels.max()) > count:
        return None
    height, width = labels.shape
    scale = labels.shape[1] / frame_hw[1] if frame_hw is not None else 1.0
    found = []
    for k in range(count):
        ys, xs = np.nonzero(labels == k + 1)
        if not len(xs):
            found.append(crop_rle(np.zeros((0, 0), bool), (0, 0), (height, width)))
            continue
        x1, y1, x2, y2 = (np.asarray(boxes[k], np.float64) * scale).tolist()
        if xs.min() < np.floor(x1) - 1 or ys.min() < np.floor(y1) - 1 or xs.max() > x2 or ys.max() > y2:
            return None
        x0, y0 = int(xs.min()), int(ys.min())
        crop = labels[y0 : int(ys.max()) + 1, x0 : int(xs.max()) + 1] == k + 1
        found.append(crop_rle(crop, (x0, y0), (height, width)))
    return found


def mask_scores(
    answers: Mapping[int, Arrays],
    label_images: Mapping[int, Any],
    truth: Mapping[int, tuple[np.ndarray, np.ndarray]],
    truth_masks: Mapping[int, Sequence[dict | None]],
    frame_hw: tuple[int, int],
) -> dict[str, float | int | None]:
    """The node's label images (stamp -> sensor_msgs/Image mono16) against its answers: how many came, how many
    answers with detections had none, how many hold a value beyond their array; and mask AP / AP50 (pycocotools
    `segm`) over the answered frames whose truth has masks (a label image smaller than its frame, `mask_scale`,
    resized to `frame_hw`, the frames' size)."""
    import cv2

    from tiled_detector.messages.images import imgmsg_to_array
    from tiled_detector.tools.scoring import coco_mask_stats

    missing = sum(1 for stamp, found in answers.items() if len(found[0]) and stamp not in label_images)
    wrong, frames, predicted = 0, [], []
    for stamp, found in sorted(answers.items()):
        if stamp not in label_images:
            continue
        labels = imgmsg_to_array(label_images[stamp])[0].reshape(label_images[stamp].height, -1)
        masks = label_masks(labels, found[0], frame_hw)
        if masks is None:
            wrong += 1
            continue
        rles = truth_masks.get(stamp)
        if rles is None or stamp not in truth:
            continue
        if labels.shape != frame_hw:
            resized = cv2.resize(labels, frame_hw[::-1], interpolation=cv2.INTER_NEAREST)
            masks = label_masks(resized, found[0]) or []
        size = frame_hw
        frames.append((truth[stamp][0], truth[stamp][1], rles, size))
        predicted.append((*found, masks))
    stats = coco_mask_stats(frames, predicted) if frames else None
    return {
        "mask_AP": None if stats is None else float(stats[0]),
        "mask_AP50": None if stats is None else float(stats[1]),
        "label_images": len(label_images),
        "label_images_missing": missing,
        "label_images_wrong": wrong,
    }


def keypoint_scores(
    answers: Mapping[int, Arrays],
    keypoint_arrays: Mapping[int, Any],
    truth: Mapping[int, tuple[np.ndarray, ...]],
    truth_keypoints: Mapping[int, tuple[np.ndarray, np.ndarray]],
) -> dict[str, float | int | None]:
    """The node's keypoints (stamp -> tiled_detector_msgs/KeypointsArray) against its answers: how many came, how
    many answers with detections had none, how many do not hold one entry per detection; and keypoint AP / AP50
    (OKS, `scoring.coco_keypoint_stats`) over the answered frames whose truth has keypoints (stamp -> (N, K, 3)
    x, y, visibility and (N,) areas). ValueError where the node's joints are not as many as the truth's."""
    from tiled_detector.messages.keypoints import msg_to_keypoints
    from tiled_detector.tools.scoring import coco_keypoint_stats

    missing = sum(1 for stamp, found in answers.items() if len(found[0]) and stamp not in keypoint_arrays)
    wrong, frames, predicted = 0, [], []
    for stamp, found in sorted(answers.items()):
        if stamp not in keypoint_arrays:
            continue
        points = msg_to_keypoints(keypoint_arrays[stamp])[0]
        if len(points) != len(found[0]):
            wrong += 1
            continue
        if stamp in truth_keypoints and stamp in truth:
            frames.append((truth[stamp][0], truth[stamp][1], *truth_keypoints[stamp]))
            predicted.append((*found, points))
    stats = coco_keypoint_stats(frames, predicted) if frames else {}
    return {
        "kp_AP": stats.get("kp_AP"),
        "kp_AP50": stats.get("kp_AP50"),
        "keypoint_arrays": len(keypoint_arrays),
        "keypoint_arrays_missing": missing,
        "keypoint_arrays_wrong": wrong,
    }


# --- class names shared by ground truth and answers -------------------------------------------------------


def class_names(messages: Iterable[Any]) -> list[str]:
    """Sorted class names (vision_msgs 4.x `results[].hypothesis.class_id`) used in Detection2DArrays."""
    return sorted({r.hypothesis.class_id for m in messages for d in m.detections for r in d.results})


def to_arrays(messages: Mapping[int, Any], labels: Sequence[str], rotated: bool = False) -> dict[int, Arrays]:
    """stamp -> Detection2DArray  =>  stamp -> (boxes, scores, class ids by index in `labels`); `rotated`: the boxes
    are the rotated ones (N, 5: centre, size, center.theta)."""
    from tiled_detector.messages.detections import msg_obb, msg_to_detections

    found = {stamp: msg_to_detections(msg, labels) for stamp, msg in messages.items()}
    if rotated:
        return {stamp: (msg_obb(messages[stamp]), scores, ids) for stamp, (_, scores, ids) in found.items()}
    return found
