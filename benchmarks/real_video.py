"""Tracks and the tile budget on real video: our `Stream` (tracker bytetrack, camera-motion compensation as by
default) against supervision's `sv.ByteTrack` (its defaults) fed the same detections, and the tile budget against
every tile, on a MOTChallenge sequence (img1/ frames, gt/gt.txt), scored by py-motmetrics at IoU 0.5 against the
pedestrians its ground truth asks to consider (`tiled_detector.tools.scores.truth.read_mot`).

    .venv/bin/python benchmarks/real_video.py --seq MOT16-09 --model ../shared/models/yolox_nano.onnx \\
        --frames 150 --modes full tiles+full --budget 8 --tile-size 416 --cache /tmp/mot09.npz

Rows: per detections mode (`full`: one letterboxed view of the whole frame; `tiles`; `tiles+full`, the default)
ours and `sv.ByteTrack` (when supervision is importable; 0.26.1 was measured) on the same raw detections, and per
`--budget N` ours with `tile_budget` N (live: the schedule picks each frame's tiles). Raw detections are cached per
mode and tile size in `--cache` (an .npz) and reused. Prints a markdown table; `--json` adds one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.parameters import build_detector
from tiled_detector.pipeline.encodings import as_frame_tensor
from tiled_detector.stream import Stream
from tiled_detector.tools.frames import image_paths, read_image
from tiled_detector.tools.scores.truth import read_mot
from tiled_detector.tools.scoring import box_iou
from tiled_detector.types import Detections

MODES = ("full", "tiles", "tiles+full")


class Cached:
    """A stand-in detector for a `Stream` without a budget: the cached detections in order, the real frames to the
    stream's motion estimate, the real detector's plan and settings."""

    def __init__(self, detector: Any, found: list[Detections]) -> None:
        self.detector, self.found, self.next = detector, found, 0

    @property
    def config(self) -> Any:
        return self.detector.config

    def plan_for(self, height: int, width: int, camera: str | None = None) -> Any:
        return self.detector.plan_for(height, width, camera)

    def detect_many(self, frames, encodings=None, slots=None, cameras=None, tiles=None, on_device=None):
        if on_device is not None:
            on_device([as_frame_tensor(f, "rgb8") for f in frames])
        self.next += len(frames)
        return self.found[self.next - len(frames) : self.next]


def scores(
    truth: list[tuple[np.ndarray, np.ndarray]], boxes: list[np.ndarray], ids: list[np.ndarray]
) -> dict:
    """IDF1, MOTA, identity switches, recall and precision (py-motmetrics, IoU 0.5)."""
    import motmetrics

    accumulator = motmetrics.MOTAccumulator(auto_id=True)
    for (truth_boxes, truth_ids), b, i in zip(truth, boxes, ids, strict=True):
        overlap = box_iou(truth_boxes, b)
        accumulator.update(
            truth_ids.tolist(), np.asarray(i).tolist(), np.where(overlap >= 0.5, 1 - overlap, np.nan)
        )
    names = ["idf1", "mota", "num_switches", "recall", "precision"]
    row = motmetrics.metrics.create().compute(accumulator, metrics=names).iloc[0]
    keys = ("IDF1", "MOTA", "id_switches", "recall", "precision")
    return {key: float(row[name]) for key, name in zip(keys, names, strict=True)}


def stream_run(detector: Any, frames: list[np.ndarray], period_ns: int) -> tuple[list, list, float]:
    """Our stream over the frames: boxes and track ids per frame, and the mean engine views per frame."""
    stream, boxes, ids, views = Stream(detector), [], [], []
    for index, frame in enumerate(frames):
        result = stream.process([frame], [index * period_ns], ["camera"])[0]
        boxes.append(result.detections.boxes.astype(np.float64))
        ids.append(result.track_ids)
        views.append(result.views)
    return boxes, ids, float(np.mean(views))


def sv_run(found: list[Detections], rate: float) -> tuple[list, list] | None:
    """supervision's ByteTrack (its defaults) over the same detections; None without supervision."""
    try:
        import supervision as sv
    except ImportError:
        return None
    tracker, boxes, ids = sv.ByteTrack(frame_rate=round(rate)), [], []
    for d in found:
        out = tracker.update_with_detections(
            sv.Detections(
                xyxy=d.boxes.astype(np.float32), confidence=d.scores.astype(np.float32), class_id=d.class_ids
            )
        )
        boxes.append(np.asarray(out.xyxy, np.float64).reshape(-1, 4))
        ids.append(np.asarray(out.tracker_id, np.int64))
    return boxes, ids


def cached(path: Path | None, key: str, count: int, compute: Any) -> list[Detections]:
    """Raw detections of `key` for `count` frames from the .npz at `path` (computed and added when missing)."""
    data = dict(np.load(path)) if path is not None and path.exists() else {}
    if f"{key}/offsets" in data and len(data[f"{key}/offsets"]) - 1 >= count:
        offsets = data[f"{key}/offsets"]
        parts = [data[f"{key}/{n}"] for n in ("boxes", "scores", "class_ids")]
        return [Detections(*(p[a:b] for p in parts)) for a, b in itertools.pairwise(offsets[: count + 1])]
    found = compute()
    if path is not None:
        data[f"{key}/offsets"] = np.cumsum([0] + [len(d) for d in found])
        for name in ("boxes", "scores", "class_ids"):
            data[f"{key}/{name}"] = np.concatenate([getattr(d, name) for d in found])
        temporary = path.with_suffix(".tmp.npz")
        np.savez_compressed(temporary, **data)
        temporary.replace(path)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seq", type=Path, required=True, help="MOTChallenge sequence folder (img1/, gt/gt.txt)"
    )
    parser.add_argument("--model", required=True, help="the detector's model file (classes: person)")
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--rate", type=float, default=30.0, help="frame rate of the stamps (Hz)")
    parser.add_argument("--tile-size", type=int, default=640)
    parser.add_argument("--modes", nargs="+", default=["full", "tiles+full"], choices=MODES)
    parser.add_argument("--budget", type=int, nargs="*", default=[], help="tile budgets to run (tiles+full)")
    parser.add_argument(
        "--cache", type=Path, default=None, help="an .npz of raw detections, read and extended"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    paths = image_paths(args.seq / "img1")[: args.frames]
    frames = [read_image(p).image for p in paths]
    truth_file = read_mot(args.seq / "gt" / "gt.txt")
    height, width = frames[0].shape[:2]
    truth = [truth_file.in_frame(i, width, height)[:2] for i in range(len(frames))]
    period = round(1e9 / args.rate)
    base = build_detector(
        {
            "model": args.model,
            "classes": ["person"],
            "tracker": "bytetrack",
            "tile_width": args.tile_size,
            "tile_height": args.tile_size,
        }
    )
    changes = {
        "full": {"tile_size": (width, height), "full_frame": False},
        "tiles": {"full_frame": False},
        "tiles+full": {},
    }
    rows = []
    for mode in args.modes:
        detector = base.with_config(**changes[mode])
        key = mode if mode == "full" else f"{mode}@{args.tile_size}"
        raw = detector.with_config(tracker="none")
        found = cached(args.cache, key, len(frames), lambda raw=raw: [raw.detect(f) for f in frames])
        start = time.perf_counter()
        boxes, ids, views = stream_run(Cached(detector, found), frames, period)
        rows.append(
            {
                "detections": key,
                "tracker": "ours",
                "views": views,
                **scores(truth, boxes, ids),
                "tracker_s": time.perf_counter() - start,
            }
        )
        theirs = sv_run(found, args.rate)
        if theirs is not None:
            rows.append(
                {"detections": key, "tracker": "sv.ByteTrack", "views": views, **scores(truth, *theirs)}
            )
    for budget in args.budget:
        boxes, ids, views = stream_run(base.with_config(tile_budget=budget), frames, period)
        rows.append(
            {
                "detections": f"tiles+full@{args.tile_size} tile_budget {budget}",
                "tracker": "ours",
                "views": views,
                **scores(truth, boxes, ids),
            }
        )
    print(f"{args.seq.name}, {len(frames)} frames, {width}x{height}, model {args.model}")
    print("| detections | tracker | views/frame | IDF1 | MOTA | id switches | recall | precision |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['detections']} | {r['tracker']} | {r['views']:.1f} | {r['IDF1']:.3f} | {r['MOTA']:.3f} | "
            f"{r['id_switches']:.0f} | {r['recall']:.3f} | {r['precision']:.3f} |"
        )
    if args.json:
        print(json.dumps({"sequence": args.seq.name, "frames": len(frames), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
