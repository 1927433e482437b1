"""`eval --pose`: what tiles buy for keypoints, COCO keypoint AP of full-frame vs tiled detection on held-out
synthetic scenes of figures (`pose_scenes`), and per-joint fusion against the keeper's keypoints on the figures cut
by tile seams.

Each configuration is the pipeline's own `TiledDetector` with some settings changed (sharing one engine), as in
`evaluation`: "full" a single letterboxed view of the frame, "tiles" the tiles alone, "tiles+full" the default
(keypoints fused per joint across the views of each merge group), and "tiles+full/keeper" the same detections with
each one's keypoints taken whole from the kept member of its merge group (the keeper's keypoints: per-joint fusion
off). Metrics: keypoint AP (pycocotools' `keypoints`: OKS, sigma 1 / K for the figures' 13 joints; AP over OKS
0.50:0.95, AP50, AP75, recall; `scoring.coco_keypoint_stats`), box AP50, and the same keypoint AP over the figures
an inner tile edge crosses (`seam_kp_AP`, `seam_kp_AP50`: the other figures ignored, a detection of one counting
neither way), the number of those figures, and the mean pipeline time per frame; the keeper's row says whether its
detections (boxes, scores, classes) are those of tiles+full, frame by frame (`same_detections`: the two ways then
differ in their keypoints alone).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.tools.scoring import coco_ground_truth, coco_keypoint_stats, coco_stats
from tiled_detector.tools.worlds.pose_scenes import CLASSES, cut_by_seams, make_pose_scene

CONFIGS: tuple[str, ...] = ("full", "tiles", "tiles+full", "tiles+full/keeper")
METRICS = (
    "kp_AP",
    "kp_AP50",
    "kp_AP75",
    "kp_recall",
    "box_AP50",
    "seam_kp_AP",
    "seam_kp_AP50",
    "seam_objects",
    "ms_per_frame",
)
MAX_DETECTIONS = 300  # per frame, for the keypoint AP: a 4K frame holds about 160 figures
# the setting that turns per-joint fusion off: each detection keeps its keeper's keypoints
KEEPER = {"keypoint_fusion": "keeper"}


def config_changes(name: str, width: int, height: int) -> dict[str, Any]:
    """Detector settings that turn the default detector into configuration `name`."""
    changes: dict[str, dict[str, Any]] = {
        "full": {"tile_size": (width, height), "full_frame": False},
        "tiles": {"full_frame": False},
        "tiles+full": {},
        "tiles+full/keeper": KEEPER,
    }
    if name not in changes:
        raise ValueError(f"unknown pose evaluation config {name!r}; expected one of: {', '.join(CONFIGS)}")
    return changes[name]


def evaluate_pose(
    detector: Any,
    frames: int,
    seed: int,
    width: int,
    height: int,
    configs: Sequence[str] = CONFIGS,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, dict[str, float | None]]:
    """Metrics per configuration (module docstring) of `detector` (a `TiledDetector` of a pose model) on `frames`
    scenes of `make_pose_scene` (frame i of set `seed`: `evaluation.scene_seed`)."""
    from tiled_detector.tools.scores.evaluation import scene_seed

    variants = {name: detector.with_config(**config_changes(name, width, height)) for name in configs}
    tiles = detector.with_config(**config_changes("tiles", width, height)).plan_for(height, width).tiles
    truth, seams, boxes = [], [], []
    found: dict[str, list[tuple[np.ndarray, ...]]] = {name: [] for name in configs}
    milliseconds = dict.fromkeys(configs, 0.0)
    for index in range(frames):
        scene = make_pose_scene(scene_seed(seed, index), width, height)
        cut = cut_by_seams(scene.boxes, tiles, width, height)
        truth.append((scene.boxes, scene.class_ids, scene.keypoints, scene.areas))
        seams.append((scene.boxes, scene.class_ids, scene.keypoints, scene.areas, ~cut))
        boxes.append((scene.boxes, scene.class_ids))
        for name, variant in variants.items():
            detections = variant.detect(scene.image)
            if detections.keypoints is None:
                raise ValueError(
                    f"{detector.config.model} gives no keypoints: eval --pose needs a pose model"
                )
            found[name].append(
                (detections.boxes, detections.scores, detections.class_ids, detections.keypoints)
            )
            milliseconds[name] += detections.timings.get("total", 0.0)
        if progress is not None:
            progress(index + 1, frames)
    ground_truth = coco_ground_truth(boxes, [(width, height)] * frames, CLASSES)
    results: dict[str, dict[str, Any]] = {}
    for name in configs:
        everything = coco_keypoint_stats(truth, found[name], max_dets=MAX_DETECTIONS)
        on_seams = coco_keypoint_stats(seams, found[name], max_dets=MAX_DETECTIONS)
        box = coco_stats(ground_truth, [f[:3] for f in found[name]], max_dets=(1, 10, MAX_DETECTIONS))
        results[name] = {
            **{key: everything[key] for key in ("kp_AP", "kp_AP50", "kp_AP75", "kp_recall")},
            "box_AP50": 0.0 if box is None else float(box[1]),
            "seam_kp_AP": on_seams["kp_AP"],
            "seam_kp_AP50": on_seams["kp_AP50"],
            "seam_objects": int(sum((~s[4]).sum() for s in seams)),
            "ms_per_frame": milliseconds[name] / max(frames, 1),
        }
    if "tiles+full" in found and "tiles+full/keeper" in found:  # the two ways differ in keypoints alone
        results["tiles+full/keeper"]["same_detections"] = all(
            np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
            for a, b in zip(found["tiles+full"], found["tiles+full/keeper"], strict=True)
        )
    return results


def markdown_table(results: dict[str, dict[str, float | None]]) -> str:
    """One row per configuration, one column per metric."""
    lines = ["| config | " + " | ".join(METRICS) + " |", "|---|" + "---:|" * len(METRICS)]
    for name, values in results.items():
        cells = []
        for metric in METRICS:
            value = values.get(metric)
            if value is None:
                cells.append("n/a")
            elif metric == "seam_objects":
                cells.append(f"{value:g}")
            else:
                cells.append(f"{value:.1f}" if metric == "ms_per_frame" else f"{value:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(
    results: dict[str, dict[str, float | None]], out_dir: Path, meta: dict[str, Any]
) -> list[Path]:
    """Write eval_pose.json (meta + configs) and eval_pose.md (the table) into `out_dir` (each through a temporary
    file and a rename)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    header = ", ".join(f"{k}: {v}" for k, v in meta.items())
    texts = {
        "eval_pose.json": json.dumps({**meta, "configs": results}, indent=2) + "\n",
        "eval_pose.md": f"# tiled-detector eval --pose\n\n{header}\n\n{markdown_table(results)}",
    }
    paths = []
    for name, text in texts.items():
        temporary = out_dir / f".{name}.tmp"
        temporary.write_text(text)
        paths.append(temporary.replace(out_dir / name))
    return paths
