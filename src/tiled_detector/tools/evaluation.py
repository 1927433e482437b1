"""What tiling buys: COCO metrics of full-frame vs tiled detection on held-out synthetic scenes.

Each configuration is the pipeline's own `TiledDetector` with some settings changed (sharing one engine):
"full" is a single letterboxed view of the frame (one tile the size of the frame, which the planner letterboxes
exactly like the full-frame view), "tiles" the tiles alone, "tiles+full" the default, and "tiles+full/<merge>"
each merge method with the default match metric. Metrics: COCO AP, AP50, AP_small (area < 32^2) and recall
(AR@100) from pycocotools, the duplicate rate (share of ground-truth objects matched at IoU >= 0.5 by two or more
detections of their class) and the mean pipeline time per frame. With `motion` the frames are one moving scene
(`synthetic.make_sequence`, ground truth with identities), each configuration's detections go through the
detector's `tracker` (one camera, 30 Hz stamps) as in the node, and IDF1, MOTA and identity switches
(py-motmetrics) are added.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.pipeline.merge import MergeMethod
from tiled_detector.tools.scoring import box_iou, coco_stats, mot_metrics
from tiled_detector.tools.synthetic import coco_ground_truth, make_scene, make_sequence
from tiled_detector.tracking.bytetrack import TrackerKind
from tiled_detector.tracking.tracks import CameraTracks
from tiled_detector.types import Detections

DEFAULT_SEED = 7  # held out: training samples come from make_crop streams, never from make_scene
METRICS = ("AP", "AP50", "AP_small", "recall", "duplicate_rate", "ms_per_frame")
MOT_METRICS = ("IDF1", "MOTA", "id_switches")
FRAME_NS = 33_333_333  # stamps of an evaluated sequence: 30 Hz
MERGES = tuple(method.value for method in MergeMethod)  # every merge method, so a new one is evaluated too
CONFIGS: tuple[str, ...] = ("full", "tiles", "tiles+full", *(f"tiles+full/{m}" for m in MERGES))


def config_changes(name: str, width: int, height: int) -> dict[str, Any]:
    """Detector settings that turn the default detector into configuration `name`."""
    if name == "full":
        return {"tile_size": (width, height), "full_frame": False}
    if name == "tiles":
        return {"full_frame": False}
    if name == "tiles+full":
        return {}
    base, _, merge = name.partition("/")
    if base == "tiles+full" and merge in MERGES:
        return {"merge": merge}
    raise ValueError(f"unknown evaluation config {name!r}; expected one of: {', '.join(CONFIGS)}")


def scene_seed(seed: int, index: int) -> int:
    """Seed of frame `index` of the evaluation set `seed`."""
    return seed * 1_000_003 + index


def duplicate_count(gt_boxes: np.ndarray, gt_classes: np.ndarray, found: Detections, iou: float = 0.5) -> int:
    """Ground-truth objects matched (IoU >= `iou`, same class) by two or more detections."""
    if len(gt_boxes) == 0 or len(found) == 0:
        return 0
    hits = (box_iou(gt_boxes, found.boxes) >= iou) & (gt_classes[:, None] == found.class_ids[None, :])
    return int((hits.sum(axis=1) >= 2).sum())


def coco_metrics(ground_truth: dict, detections: Sequence[Detections]) -> dict[str, float]:
    """AP, AP50, AP_small and recall (AR@100) of `detections` (one per ground-truth image, in order)."""
    stats = coco_stats(ground_truth, [(d.boxes, d.scores, d.class_ids) for d in detections])
    if stats is None:
        return {"AP": 0.0, "AP50": 0.0, "AP_small": 0.0, "recall": 0.0}
    return {
        "AP": float(stats[0]),
        "AP50": float(stats[1]),
        "AP_small": float(stats[3]),
        "recall": float(stats[8]),
    }


@dataclass
class _Tally:
    """Per-configuration accumulation over frames."""

    detections: list[Detections]
    duplicates: int = 0
    milliseconds: float = 0.0
    tracks: CameraTracks | None = None
    ids: list[np.ndarray] | None = None


def evaluate(
    detector: Any,
    frames: int = 100,
    seed: int = DEFAULT_SEED,
    width: int = 1920,
    height: int = 1080,
    configs: Sequence[str] = CONFIGS,
    progress: Callable[[int, int], None] | None = None,
    motion: bool = False,
) -> dict[str, dict[str, float]]:
    """Metrics per configuration on `frames` scenes of `make_scene` (or one moving scene: `motion`; see the module
    docstring).

    `detector` is a `TiledDetector`; each configuration is `detector.with_config(...)`, and configurations
    that end up equal (e.g. "tiles+full" and "tiles+full/nms" by default) are run once.
    """
    variants = {name: detector.with_config(**config_changes(name, width, height)) for name in configs}
    distinct: dict[str, str] = {}  # config name -> name of the first equal config
    for name, variant in variants.items():
        distinct[name] = next(n for n in variants if variants[n].config == variant.config)
    tracked = motion and detector.config.tracker is not TrackerKind.NONE
    tallies = {
        name: _Tally([], tracks=CameraTracks(detector.config.tracker_settings()) if tracked else None,
                     ids=[] if motion else None)
        for name in configs if distinct[name] == name
    }  # fmt: skip
    truth: list[tuple[np.ndarray, np.ndarray]] = []
    identities: list[tuple[np.ndarray, np.ndarray]] = []
    scenes = (make_sequence(seed, frames, width, height) if motion
              else (make_scene(scene_seed(seed, index), width, height) for index in range(frames)))  # fmt: skip
    for index, scene in enumerate(scenes):
        truth.append((scene.boxes, scene.class_ids))
        if motion:
            identities.append((scene.boxes, scene.ids))
        for name, tally in tallies.items():
            found = variants[name].detect(scene.image)
            tally.milliseconds += found.timings.get("total", 0.0)
            ids = np.arange(len(found))
            if tally.tracks is not None:
                found, ids = tally.tracks.track("eval", index * FRAME_NS, found)
            tally.detections.append(found)
            if tally.ids is not None:
                tally.ids.append(ids)
            tally.duplicates += duplicate_count(scene.boxes, scene.class_ids, found)
        if progress is not None:
            progress(index + 1, frames)
    ground_truth = coco_ground_truth(truth, [(width, height)] * frames)
    n_objects = max(len(ground_truth["annotations"]), 1)
    computed = {
        name: {
            **coco_metrics(ground_truth, tally.detections),
            "duplicate_rate": tally.duplicates / n_objects,
            "ms_per_frame": tally.milliseconds / max(frames, 1),
            **(mot_metrics(identities, [(d.boxes, i) for d, i in zip(tally.detections, tally.ids, strict=True)])
               if tally.ids is not None else {}),
        }
        for name, tally in tallies.items()
    }  # fmt: skip
    return {name: dict(computed[distinct[name]]) for name in configs}


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    """One row per configuration, one column per metric (the MOT metrics too where computed)."""
    metrics = [*METRICS, *(m for m in MOT_METRICS if all(m in v for v in results.values()))]
    lines = ["| config | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
    for name, values in results.items():
        cells = [f"{values[m]:.1f}" if m == "ms_per_frame" else str(values[m]) if m == "id_switches"
                 else f"{values[m]:.3f}" for m in metrics]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(results: dict[str, dict[str, float]], path: Path) -> None:
    """Grouped bars of AP, AP50, AP_small and recall per configuration (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ("AP", "AP50", "AP_small", "recall")
    names = list(results)
    x = np.arange(len(names))
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(names)), 4.0))
    for k, metric in enumerate(shown):
        ax.bar(
            x + (k - (len(shown) - 1) / 2) * width, [results[n][metric] for n in names], width, label=metric
        )
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("COCO metric")
    ax.set_title("Tiled vs full-frame detection (synthetic held-out scenes)")
    ax.legend(ncols=len(shown), fontsize="small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(
    results: dict[str, dict[str, float]], out_dir: Path, meta: dict[str, Any]
) -> dict[str, Path]:
    """Write eval.json (meta + configs), eval.md (table) and eval.png (chart) into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "eval.json", "markdown": out_dir / "eval.md", "chart": out_dir / "eval.png"}
    paths["json"].write_text(json.dumps({**meta, "configs": results}, indent=2) + "\n")
    header = ", ".join(f"{k}: {v}" for k, v in meta.items())
    paths["markdown"].write_text(f"# tiled-detector eval\n\n{header}\n\n{markdown_table(results)}")
    bar_chart(results, paths["chart"])
    return paths
