"""`tiled-detector demo`: the main job.

Makes the bundled sample bag (deterministic synthetic 1920x1080 camera frames with ground truth), starts the
detector node as a real process with config/detector.yaml and the bundled model, replays the bag into it
lock-step over Fast DDS, prints a report and writes one annotated frame.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.commands.settings import add_settings, default_params_file, flag_parameters


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the demo."""
    parser.add_argument("--frames", type=int, default=30, help="frames in the sample bag (default 30)")
    parser.add_argument(
        "--motion",
        action="store_true",
        help="a moving scene (make-bag --motion) through the node with tracker bytetrack: IDF1, MOTA "
        "and identity switches next to AP50, track ids drawn",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the sample bag's first frame")
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--out", type=Path, default=Path("demo_out"), help="sample bag, replay record, image")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object (last line)")
    add_settings(parser, params_file_help="the node's params file (default config/detector.yaml)")


def run(args: argparse.Namespace) -> int:
    """Make the sample bag, replay it lock-step through the node, report."""
    from tiled_detector.harness.recording import make_synthetic_bag
    from tiled_detector.harness.replay import ReplayError, ReplayOptions, replay_bag
    from tiled_detector.tools.worlds.synthetic import MotionStyle

    if args.frames < 1:
        raise SystemExit("--frames must be at least 1")
    say = (lambda *_: None) if args.json else print
    params_file = args.params_file or default_params_file()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    bag = make_synthetic_bag(
        args.out / "sample_bag",
        args.frames,
        args.seed,
        args.width,
        args.height,
        force=True,
        camera=MotionStyle() if args.motion else None,
    )
    say(
        f"sample bag: {bag} ({args.frames} frames {args.width}x{args.height}, {time.monotonic() - started:.1f} s)"
    )
    say(f"replaying it lock-step through the detector node ({params_file})")
    parameters = flag_parameters(args)
    if args.motion:
        parameters.setdefault("tracker", "bytetrack")
    options = ReplayOptions(params_file=params_file, parameters=parameters)
    try:
        report = replay_bag(bag, options, output=args.out / "replay")
    except ReplayError as error:
        print(f"demo failed: {error}")
        return 1
    answered = [r for r in report.records if r.detections is not None]
    if not answered:
        print(f"demo failed: the node answered none of the {report.frames_sent} frames")
        return 1
    counts = [len(r.detections[1]) for r in answered]
    busy_s = sum(r.latency_ms for r in answered) / 1e3
    image_path = _write_snapshot(
        bag, answered, report.labels, args.out / "demo_annotated.png", params_file, options.parameters
    )
    summary = {
        "frames": len(answered),
        "frames_sent": report.frames_sent,
        "frames_with_detections": int(sum(c > 0 for c in counts)),
        "detections": int(sum(counts)),
        "detections_per_frame": float(np.mean(counts)) if counts else 0.0,
        "latency_ms_p50": report.latency_ms_p50,
        "latency_ms_p95": report.latency_ms_p95,
        "fps": len(answered) / busy_s if busy_s else 0.0,
        "AP50": report.ap50,
        "precision": report.precision,
        "recall": report.recall,
        "frames_skipped": report.summary()[
            "frames_skipped"
        ],  # sent but never taken by the node (None: not counted)
        **(
            {k: v for k, v in report.summary().items() if k in ("IDF1", "MOTA", "id_switches")}
            if args.motion
            else {}
        ),
        "annotated_image": str(image_path),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        tracking = (
            f"tracking: IDF1 {summary['IDF1']:.3f}, MOTA {summary['MOTA']:.3f}, identity switches "
            f"{summary['id_switches']}\n"
            if summary.get("IDF1") is not None
            else ""
        )
        print(
            f"\n{summary['frames']}/{summary['frames_sent']} frames answered ({args.width}x{args.height}), "
            f"{summary['frames_with_detections']} with detections, {summary['detections_per_frame']:.1f} "
            f"detections/frame\nlatency p50 {summary['latency_ms_p50']:.1f} ms, p95 {summary['latency_ms_p95']:.1f} "
            f"ms, {summary['fps']:.2f} frames/s (lock-step, camera message in -> detections out, over DDS), "
            f"{summary['frames_skipped']} frames skipped\n"
            f"against ground truth: AP50 {summary['AP50']:.3f}, precision {summary['precision']:.3f}, "
            f"recall {summary['recall']:.3f}\n"
            f"{tracking}annotated frame: {image_path}"
        )
    return 0 if len(answered) == report.frames_sent else 1


def _tiling(params_file: Path, overrides: dict[str, Any]) -> tuple[tuple[int, int], float]:
    """Tile size and overlap the node runs with: the flags', else the params file's, else the defaults (auto: the
    model's input size)."""
    from tiled_detector.config import DetectorConfig
    from tiled_detector.model_files.engine_setup import load_config_engine
    from tiled_detector.model_files.resolve import file_view
    from tiled_detector.parameters import DETECTOR_PARAMETERS, config_changes, read_params_file

    values = {p.name: p.default for p in DETECTOR_PARAMETERS} | read_params_file(params_file) | overrides
    config = DetectorConfig(**config_changes({n: v for n, v in values.items() if v is not None}))
    view = file_view(config) if config.tile_size is None else None
    input_hw = view.input_hw if view is not None else load_config_engine(config).input_hw
    height, width = config.tile_hw_for(input_hw)
    return (width, height), config.overlap


def _write_snapshot(
    bag: Path,
    answered: list,
    labels: tuple[str, ...],
    path: Path,
    params_file: Path,
    overrides: dict[str, Any],
) -> Path:
    """Annotate the answered frame with the most detections (tiles drawn) and write it atomically as PNG."""
    import cv2

    from tiled_detector.harness.bags import IMAGE, deserialize, read_messages
    from tiled_detector.messages.images import imgmsg_to_array
    from tiled_detector.pipeline.tiling import plan_tiles
    from tiled_detector.tools.annotate import annotate, annotated_encoding
    from tiled_detector.types import Detections

    best = max(answered, key=lambda r: len(r.detections[1]))
    message = next(m for m in read_messages(bag) if m.msgtype == IMAGE and m.stamp_ns == best.stamp_ns)
    frame, encoding = imgmsg_to_array(deserialize(message.data, IMAGE))
    (tile_width, tile_height), overlap = _tiling(params_file, overrides)
    tiles = plan_tiles(frame.shape[0], frame.shape[1], tile_height, tile_width, overlap)
    tracked = overrides.get("tracker", "none") != "none"
    drawn = annotate(
        frame, Detections(*best.detections), labels, tiles, track_ids=best.ids if tracked else None
    )
    bgr = drawn[..., ::-1] if annotated_encoding(encoding) == "rgb8" else drawn
    ok, data = cv2.imencode(".png", np.ascontiguousarray(bgr))
    if not ok:
        raise RuntimeError(f"could not encode {path}")
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(data.tobytes())
    os.replace(tmp.name, path)
    return path
