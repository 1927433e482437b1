"""A recording with ground truth scored in this process: its frames through a `Stream` over the detector (the
node's path without ROS: tile budget, camera motion, tracker; one camera, the given stamps), scored as `replay`
scores the node's answers: AP50 (pycocotools, up to 1000 detections a frame, classes matched by name) and, where
the truth carries identities, IDF1, MOTA and identity switches (py-motmetrics, IoU 0.5) over every frame; rotated
truth (frames with `obb`) as `replay` scores a rotated bag: DOTA's AP50 by polygon IoU, difficult objects ignored,
the tracks matched by polygon IoU. On the same frames, settings and stamps it gives what `replay --json` reports
through the node over DDS."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tiled_detector.stream import Stream
from tiled_detector.tools.frames import Frame
from tiled_detector.tools.scoring import (
    Arrays,
    coco_ground_truth,
    coco_stats,
    dota_ap50,
    mot_metrics,
    rotated_iou,
)

SCORES = ("AP50", "IDF1", "MOTA", "id_switches")


def score_stream(
    detector: Any,
    frames: Iterable[Frame],
    stamps_ns: Iterable[int],
    truth_labels: Sequence[str],
    camera: str = "camera",
) -> dict[str, float | int | None]:
    """`SCORES` of `frames` (each with its ground truth: boxes, class ids indexing `truth_labels`, identities or
    None) run one by one through a `Stream` over `detector` (a `TiledDetector`) at `stamps_ns`; None where a
    score cannot be given (no truth box: AP50; no identities: the tracking scores). Also `frames`."""
    stream = Stream(detector)
    names = list(detector.labels or ())
    index: dict[str, int] = {}  # class name -> the class id scored (the truth's and the detector's by name)

    def by_name(classes: Iterable[str]) -> np.ndarray:
        return np.array([index.setdefault(name, len(index)) for name in classes], np.int64)

    truth: list[tuple[np.ndarray, np.ndarray]] = []
    truth_ids: list[np.ndarray | None] = []
    difficult: list[np.ndarray] = []
    rotated = False
    found: list[Arrays] = []
    tracked: list[tuple[np.ndarray, np.ndarray]] = []
    for frame, stamp in zip(frames, stamps_ns, strict=False):
        if frame.boxes is None or frame.class_ids is None:
            raise ValueError("every frame scored needs its ground truth")
        result = stream.process([frame.image], [stamp], [camera], [frame.encoding])[0]
        assert result is not None  # one frame, no view cap: never run in parts
        dets = result.detections
        rotated = frame.obb is not None
        shapes = frame.obb if rotated else frame.boxes
        answered = (dets.obb if dets.obb is not None else _upright(dets.boxes)) if rotated else dets.boxes
        truth.append((shapes, by_name(truth_labels[c] for c in frame.class_ids.tolist())))
        difficult.append(np.zeros(len(shapes), bool) if frame.difficult is None else frame.difficult)
        truth_ids.append(frame.ids)
        found.append(
            (
                answered,
                dets.scores,
                by_name(names[c] if c < len(names) else str(c) for c in dets.class_ids.tolist()),
            )
        )
        tracked.append((answered, np.arange(len(dets)) if result.track_ids is None else result.track_ids))
    scores: dict[str, float | int | None] = {"frames": len(truth), **dict.fromkeys(SCORES)}
    if rotated and any((~d).any() for d in difficult):
        with_flags = [(b, c, d) for (b, c), d in zip(truth, difficult, strict=True)]
        scores["AP50"] = float(dota_ap50(found, with_flags)["mAP50"])
    elif not rotated and any(len(boxes) for boxes, _ in truth):
        stats = coco_stats(coco_ground_truth(truth), found, max_dets=(1, 10, 1000))
        scores["AP50"] = 0.0 if stats is None else float(stats[1])
    if truth and all(ids is not None for ids in truth_ids):
        paired = [(b, i) for (b, _), i in zip(truth, truth_ids, strict=True)]
        scores.update(mot_metrics(paired, tracked, **({"overlap_of": rotated_iou} if rotated else {})))
    return scores


def _upright(boxes: np.ndarray) -> np.ndarray:
    """(N, 5) rotated boxes at angle 0 of axis-aligned ones (a detect model scored against rotated truth)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.concatenate(
        [(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2], np.zeros((len(boxes), 1))], 1
    )
