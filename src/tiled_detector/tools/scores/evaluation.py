"""What tiling buys: COCO metrics of full-frame vs tiled detection on held-out synthetic scenes.

Each configuration is the pipeline's own `TiledDetector` with some settings changed (sharing one engine):
"full" is a single letterboxed view of the frame (one tile the size of the frame, which the planner letterboxes
exactly like the full-frame view), "tiles" the tiles alone, "tiles+full" the default, and "tiles+full/<merge>"
each merge method with the default match metric. Metrics: COCO AP, AP50, AP_small (area < 32^2) and recall
(AR@100) from pycocotools, the duplicate rate (share of ground-truth objects matched at IoU >= 0.5 by two or more
detections of their class) and the mean pipeline time per frame. With `motion` the frames are one moving scene
(`synthetic.make_sequence`, ground truth with identities), each configuration's detections go through the
detector's `tracker` (one camera, 30 Hz stamps) through the same `Stream` as the node, and IDF1, MOTA and identity
switches (py-motmetrics), views per frame (mean, max), frames per second (wall time of the whole stream step:
schedule, detection, tracking), the boxes reported from an earlier frame (`predicted_boxes`) and the new-object
latency are added. `budgets` runs the default tiling once per `tile_budget` instead of the tiling configurations
(`budget_name`; 0 = every tile every frame), and beside each budget what a user could do instead at the same mean
tiles per frame (`tracking.schedule.alternative`): every tile on one frame in k ("interval N") and the tiles in turn
("round_robin N"). The camera moves as `MotionStyle` says (pan, rotation, zoom, shake); where the stream estimates
its motion (`motion_compensation: image`), the estimate's error (`motion_error_px`: the mean distance of the frame's
corners moved by the estimate and by the true motion) and the frames it fell back to the identity
(`motion_fallbacks`) are added.

With `obb` (`eval --obb`) the scenes are the rotated world (`rotated_scenes`: boats, cars and trucks at any angle,
scattered and in dense rows; moving ones drive and turn) scored on the detections' rotated boxes by polygon IoU:
AP50 is DOTA's (`scoring.dota_ap50`: its devkit's rules, the mean over classes), recall its recall, duplicates and
the MOT metrics matched by polygon IoU (COCO's AP and AP_small, which are axis-aligned, are left out).

New-object latency: for each object that appears after the first frame and that full tiling (every tile, every
frame, same run) detects at some frame, the frames from its first ground-truth appearance to the first frame in
which a box detected in that frame (not carried over) matches it (same class, IoU >= 0.5); p50 / p95 / max over
those objects (an object never detected counts as the sequence's remaining length); `latency_vs_full_*`: the
frames from full tiling's first detection of each such object to this configuration's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.pipeline.merge import MergeMethod
from tiled_detector.stream import Stream
from tiled_detector.tools.scoring import box_iou, coco_stats, dota_ap50, mot_metrics, rotated_iou
from tiled_detector.tools.worlds.rotated_scenes import make_rotated_scene, make_rotated_sequence
from tiled_detector.tools.worlds.synthetic import MotionStyle, coco_ground_truth, make_scene, make_sequence
from tiled_detector.tracking.geometry import corner_error
from tiled_detector.tracking.schedule import ScheduleKind
from tiled_detector.types import Detections

DEFAULT_SEED = 7  # held out: training samples come from make_crop streams, never from make_scene
METRICS = ("AP", "AP50", "AP_small", "recall", "duplicate_rate", "ms_per_frame")
MOT_METRICS = ("IDF1", "MOTA", "id_switches")
LATENCY_METRICS = ("latency_p50", "latency_p95", "latency_max", "latency_vs_full_p95", "latency_vs_full_max")
STREAM_METRICS = (
    "views_per_frame",
    "views_per_frame_max",
    "frames_per_second",
    "predicted_boxes",
    *LATENCY_METRICS,
    "motion_error_px",
    "motion_fallbacks",
)
FRAME_NS = 33_333_333  # stamps of an evaluated sequence: 30 Hz
MERGES = tuple(method.value for method in MergeMethod)  # every merge method, so a new one is evaluated too
CONFIGS: tuple[str, ...] = ("full", "tiles", "tiles+full", *(f"tiles+full/{m}" for m in MERGES))


def budget_name(budget: int, kind: ScheduleKind = ScheduleKind.TRACKS) -> str:
    """The configuration name of a tile budget (or of an alternative at the same mean tiles per frame)."""
    if budget == 0:
        return "every tile"
    return f"tile_budget {budget}" if kind is ScheduleKind.TRACKS else f"{kind.value} {budget}"


def schedule_kind(name: str) -> ScheduleKind:
    """The schedule a configuration's stream runs."""
    first = name.split(maxsplit=1)[0]
    return ScheduleKind(first) if first in {k.value for k in ScheduleKind} else ScheduleKind.TRACKS


def config_changes(name: str, width: int, height: int) -> dict[str, Any]:
    """Detector settings that turn the default detector into configuration `name`."""
    if schedule_kind(name) is not ScheduleKind.TRACKS or name.startswith("tile_budget "):
        return {"tile_budget": int(name.split()[1])}
    if name == "every tile":
        return {"tile_budget": 0}
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
    """Ground-truth objects matched (IoU >= `iou`, same class) by two or more detections (rotated truth (N, 5):
    by polygon IoU with the detections' rotated boxes)."""
    if len(gt_boxes) == 0 or len(found) == 0:
        return 0
    hits = (_overlap(gt_boxes, found) >= iou) & (gt_classes[:, None] == found.class_ids[None, :])
    return int((hits.sum(axis=1) >= 2).sum())


def _overlap(truth: np.ndarray, found: Detections) -> np.ndarray:
    """IoU of truth boxes with detections: axis-aligned, or by polygon with rotated truth (N, 5)."""
    if truth.shape[-1] == 5:
        return rotated_iou(truth, found.obb if found.obb is not None else np.zeros((0, 5)))
    return box_iou(truth, found.boxes)


def rotated_metrics(
    truth: Sequence[tuple[np.ndarray, np.ndarray]], detections: Sequence[Detections]
) -> dict[str, float]:
    """DOTA's AP50 (mAP50 over classes) and recall of the detections' rotated boxes against rotated truth."""
    found = dota_ap50(
        [(d.obb if d.obb is not None else np.zeros((0, 5)), d.scores, d.class_ids) for d in detections], truth
    )
    return {"AP50": float(found["mAP50"]), "recall": float(found["recall"])}


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
    stream: Stream | None = None
    ids: list[np.ndarray] | None = None
    fresh: list[np.ndarray] | None = None  # per frame: which boxes were detected in it (not carried over)
    views: list[int] = field(default_factory=list)
    predicted: int = 0
    wall_s: float = 0.0
    motion_errors: list[float] = field(default_factory=list)  # per frame with a motion estimate
    fallbacks: int = 0


def first_detections(
    identities: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    found: Sequence[Detections],
    fresh: Sequence[np.ndarray],
    iou: float = 0.5,
) -> dict[int, int]:
    """Object id -> the first frame in which a box detected in that frame matches it (same class, IoU >= `iou`);
    `identities` per frame: the truth's boxes, class ids and object ids."""
    first: dict[int, int] = {}
    for index, ((boxes, classes, ids), detections, new) in enumerate(
        zip(identities, found, fresh, strict=True)
    ):
        if not len(boxes) or not new.any():
            continue
        overlap = _overlap(boxes, detections[new]) >= iou
        overlap &= classes[:, None] == detections.class_ids[new][None, :]
        for object_id in ids[overlap.any(axis=1)].tolist():
            first.setdefault(object_id, index)
    return first


def new_object_latency(
    identities: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    found: dict[int, int],
    reference: dict[int, int],
) -> dict[str, float]:
    """p50 / p95 / max frames from each new object's first appearance to its first detection (module docstring),
    over the objects `reference` (full tiling's first detections) found; `found`: this configuration's."""
    appeared: dict[int, int] = {}
    for index, (_, _, ids) in enumerate(identities):
        for object_id in ids.tolist():
            appeared.setdefault(object_id, index)
    frames = len(identities)
    new = [i for i in reference if appeared[i] > 0]
    if not new:
        return dict.fromkeys(LATENCY_METRICS, 0.0)
    delays = [found.get(i, frames) - appeared[i] for i in new]
    later = [found.get(i, frames) - reference[i] for i in new]
    p50, p95 = np.percentile(delays, [50, 95])
    return {
        "latency_p50": float(p50),
        "latency_p95": float(p95),
        "latency_max": float(max(delays)),
        "latency_vs_full_p95": float(np.percentile(later, 95)),
        "latency_vs_full_max": float(max(later)),
    }


def evaluate(
    detector: Any,
    frames: int = 100,
    seed: int = DEFAULT_SEED,
    width: int = 1920,
    height: int = 1080,
    configs: Sequence[str] = CONFIGS,
    progress: Callable[[int, int], None] | None = None,
    motion: bool = False,
    camera: MotionStyle | None = None,
    budgets: Sequence[int] = (),
    obb: bool = False,
) -> dict[str, dict[str, float]]:
    """Metrics per configuration on `frames` scenes of `make_scene` (or one moving scene: `motion`, the camera
    moving as `camera` says; see the module docstring), or per tile budget (`budgets`, with `motion`); with `obb`
    the rotated world (`make_rotated_scene`, `make_rotated_sequence`) scored on rotated boxes.

    `detector` is a `TiledDetector`; each configuration is `detector.with_config(...)`, and configurations
    that end up equal (e.g. "tiles+full" and "tiles+full/nms" by default) are run once.
    """
    if budgets:
        if not motion:
            raise ValueError("tile budgets are compared on a moving scene: give motion (eval --motion)")
        configs = ["every tile"] + [
            budget_name(b, k) for b in dict.fromkeys(budgets) if b for k in ScheduleKind
        ]
    variants = {name: detector.with_config(**config_changes(name, width, height)) for name in configs}
    distinct: dict[str, str] = {}  # config name -> name of the first equal config
    for name, variant in variants.items():
        key = (variant.config, schedule_kind(name))
        distinct[name] = next(n for n in variants if (variants[n].config, schedule_kind(n)) == key)
    tallies = {
        name: _Tally(
            [],
            stream=Stream(variants[name], schedule_kind(name)) if motion else None,
            ids=[] if motion else None,
            fresh=[] if motion else None,
        )
        for name in configs
        if distinct[name] == name
    }
    truth: list[tuple[np.ndarray, np.ndarray]] = []
    identities: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    if obb and camera is not None and camera != MotionStyle():
        raise ValueError("the rotated world's sequences have a still camera: no camera motion with obb")
    scenes = _scenes(seed, frames, width, height, motion, camera, obb)
    for index, scene in enumerate(scenes):
        shapes = scene.obb if obb else scene.boxes
        truth.append((shapes, scene.class_ids))
        if motion:
            identities.append((shapes, scene.class_ids, scene.ids))
        for name, tally in tallies.items():
            if tally.stream is None:
                found = variants[name].detect(scene.image)
                tally.milliseconds += found.timings.get("total", 0.0)
            else:
                start = time.perf_counter()
                result = tally.stream.process([scene.image], [index * FRAME_NS], ["eval"])[0]
                tally.wall_s += time.perf_counter() - start
                found = result.detections
                tally.milliseconds += found.timings.get("total", 0.0)
                tally.ids.append(np.arange(len(found)) if result.track_ids is None else result.track_ids)  # type: ignore[union-attr]
                tally.fresh.append(result.fresh)  # type: ignore[union-attr]
                tally.views.append(result.views)
                tally.predicted += result.predicted
                if result.motion is not None and result.motion.estimated and not obb:
                    tally.motion_errors.append(
                        corner_error(result.motion.matrix, scene.camera, (height, width))
                    )
                    tally.fallbacks += result.motion.fallback
            tally.detections.append(found)
            tally.duplicates += duplicate_count(shapes, scene.class_ids, found)
        if progress is not None:
            progress(index + 1, frames)
    n_objects = max(sum(len(classes) for _, classes in truth), 1)
    if obb:
        quality = {name: rotated_metrics(truth, tally.detections) for name, tally in tallies.items()}
    else:
        ground_truth = coco_ground_truth(truth, [(width, height)] * frames)
        quality = {name: coco_metrics(ground_truth, tally.detections) for name, tally in tallies.items()}
    computed = {
        name: {
            **quality[name],
            "duplicate_rate": tally.duplicates / n_objects,
            "ms_per_frame": tally.milliseconds / max(frames, 1),
        }
        for name, tally in tallies.items()
    }
    if motion:
        firsts = {
            name: first_detections(identities, t.detections, t.fresh or []) for name, t in tallies.items()
        }
        reference = firsts[next(iter(tallies))]
        for name, tally in tallies.items():
            computed[name].update(
                **mot_metrics(
                    [(b, i) for b, _, i in identities],
                    [
                        (d.obb if obb else d.boxes, i)
                        for d, i in zip(tally.detections, tally.ids or [], strict=True)
                    ],
                    overlap_of=rotated_iou if obb else box_iou,
                ),
                views_per_frame=float(np.mean(tally.views)),
                views_per_frame_max=int(max(tally.views)),
                frames_per_second=frames / max(tally.wall_s, 1e-9),
                predicted_boxes=tally.predicted,
                **new_object_latency(identities, firsts[name], reference),
            )
            if tally.motion_errors:
                computed[name].update(
                    motion_error_px=float(np.mean(tally.motion_errors)), motion_fallbacks=tally.fallbacks
                )
    return {name: dict(computed[distinct[name]]) for name in configs}


def _scenes(
    seed: int, frames: int, width: int, height: int, motion: bool, camera: MotionStyle | None, obb: bool
) -> Iterator[Any]:
    """The evaluated frames: still scenes (frame i of set `seed`) or one moving scene, of the detect world or, with
    `obb`, of the rotated one."""
    if motion:
        if obb:
            return make_rotated_sequence(seed, frames, width, height)
        return make_sequence(seed, frames, width, height, camera or MotionStyle())
    scene = make_rotated_scene if obb else make_scene
    return (scene(scene_seed(seed, index), width, height) for index in range(frames))


_COUNTS = {
    "id_switches",
    "views_per_frame_max",
    "predicted_boxes",
    "latency_max",
    "latency_vs_full_max",
    "motion_fallbacks",
}
_ONE_DECIMAL = {
    "ms_per_frame",
    "frames_per_second",
    "views_per_frame",
    "latency_p50",
    "latency_p95",
    "latency_vs_full_p95",
}
_TWO_DECIMALS = {"motion_error_px"}


def _cell(metric: str, value: float) -> str:
    if metric in _COUNTS:
        return f"{value:g}"
    if metric in _TWO_DECIMALS:
        return f"{value:.2f}"
    return f"{value:.1f}" if metric in _ONE_DECIMAL else f"{value:.3f}"


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    """One row per configuration, one column per metric (the MOT metrics too where computed)."""
    metrics = [m for m in (*METRICS, *MOT_METRICS, *STREAM_METRICS) if all(m in v for v in results.values())]
    lines = ["| config | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
    for name, values in results.items():
        lines.append(f"| {name} | " + " | ".join(_cell(m, values[m]) for m in metrics) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(results: dict[str, dict[str, float]], path: Path) -> None:
    """Grouped bars of AP, AP50, AP_small and recall per configuration (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    shown = [m for m in ("AP", "AP50", "AP_small", "recall") if all(m in results[n] for n in names)]
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


def budget_chart(results: dict[str, dict[str, float]], path: Path) -> None:
    """AP50 and IDF1 (left axis) and frames per second (right axis) against views per frame, one point per tile
    budget (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(results, key=lambda n: results[n]["views_per_frame"])
    fig, quality = plt.subplots(figsize=(7.5, 4.5))
    speed = quality.twinx()
    styles = ("-", ":", "-.")  # the budget's schedule and the others
    for kind, style in zip(ScheduleKind, styles, strict=True):
        series = [n for n in names if schedule_kind(n) is kind or n == "every tile"]
        views = [results[n]["views_per_frame"] for n in series]
        label = "" if kind is ScheduleKind.TRACKS else f" ({kind.value})"
        for metric, marker in (("AP50", "o"), ("IDF1", "s")):
            if all(metric in results[n] for n in series):
                quality.plot(
                    views, [results[n][metric] for n in series], style, marker=marker, label=metric + label
                )
        if kind is ScheduleKind.TRACKS:
            speed.plot(
                views, [results[n]["frames_per_second"] for n in series], "k--", marker="^", label="frames/s"
            )
            for name, x in zip(series, views, strict=True):
                quality.annotate(name, (x, 0.05), rotation=90, fontsize="x-small", ha="center")
    quality.set_ylim(0, 1.05)
    quality.set_xlabel("engine views per frame (tiles run + full-frame view)")
    quality.set_ylabel("AP50 / IDF1")
    speed.set_ylabel("frames per second")
    lines = quality.get_legend_handles_labels()[0] + speed.get_legend_handles_labels()[0]
    quality.legend(lines, [line.get_label() for line in lines], loc="center left", fontsize="x-small")
    quality.set_title("Tile budget: quality and speed against engine views per frame")
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
    if all("views_per_frame" in v for v in results.values()) and any(
        k.startswith("tile_budget") for k in results
    ):
        budget_chart(results, paths["chart"])
    else:
        bar_chart(results, paths["chart"])
    return paths
