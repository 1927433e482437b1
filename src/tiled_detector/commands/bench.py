"""`tiled-detector bench`: time the pipeline per stage against the same engine's model-only time, per backend,
precision and frame size; print a table and write DIR/bench.csv, DIR/bench.png and DIR/env.json."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from tiled_detector.commands.progress import TextProgress
from tiled_detector.commands.settings import add_settings, frame_size, parameter_values
from tiled_detector.config import DetectorConfig, settings

EPILOG = """examples:
  tiled-detector bench                                     # bundled model, auto backend, fp32/fp16/int8, 1080p + 4K
  tiled-detector bench --model yolov8n.onnx --backend tensorrt torch --precision fp16 --device cuda --out out/b
  tiled-detector bench --size 1920x1080 --runs 50 --peer sahi   # also SAHI's default on the same model (optional)
  tiled-detector bench --device cuda --input device          # frames already on the GPU (e.g. nvJPEG-decoded)
Combinations an engine cannot run are rows marked unsupported, with the reason. int8 runs the model's Q/DQ copy
(ONNX Runtime, TensorRT), quantized once from --calibration (default: the bundled synthetic sample frames). `ratio` is end to end over the
same engine's model-only time on the same images in the same engine calls (at most max_batch each; 4 on a CPU),
replayed as a CUDA graph where it can be captured, both measured alternately in this run: it is the number to
compare across machines."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of bench."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--backend", nargs="+", default=["auto"], choices=settings()["backend"].kind.choices)
    parser.add_argument(
        "--precision",
        nargs="+",
        default=["fp32", "fp16", "int8"],
        choices=settings()["precision"].kind.choices,
    )
    parser.add_argument(
        "--size",
        nargs="+",
        type=frame_size,
        default=[(1920, 1080), (3840, 2160)],
        metavar="WxH",
        help="frame sizes (default 1920x1080 3840x2160)",
    )
    parser.add_argument("--runs", type=int, default=20, help="timed frames per configuration (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed frames first (default 3)")
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="report folder (default ./bench_out)"
    )
    parser.add_argument(
        "--input",
        choices=("host", "device"),
        default="host",
        help="where frames start: host memory (default; one upload per frame) or already on the "
        "engine's device (GPU-decoded or zero-copy sources)",
    )
    parser.add_argument("--peer", choices=("sahi",), help="also time a peer on the same model and frames")
    parser.add_argument(
        "--masks-subscribed",
        action="store_true",
        help="a segmentation model's label image made every frame, as the node makes it while its masks topic "
        "has a subscriber (on CUDA on the device: its device time is labels_device_ms)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON object (last line)")
    add_settings(parser, only=[n for n in settings() if n not in ("backend", "precision")])


def run(args: argparse.Namespace) -> int:
    """Measure every configuration, print the table, write the report; 1 when nothing could be measured."""
    from tiled_detector.commands.env import collect, cpu_name
    from tiled_detector.engines.cache import atomic_write
    from tiled_detector.parameters import build_detector, config_changes
    from tiled_detector.tools.benchmark import csv_text, peer_sahi, plot, run_bench, table

    if args.runs < 1 or args.warmup < 0:
        print(f"--runs must be >= 1 and --warmup >= 0, got {args.runs} and {args.warmup}", file=sys.stderr)
        return 2
    values = parameter_values(args)
    total = len(args.backend) * len(args.precision) * len(args.size) * (args.runs + args.warmup)
    bar = TextProgress()
    done = 0

    def progress(steps: int = 1) -> None:
        nonlocal done
        done += steps
        bar("bench", min(done, total), total)

    # int8 without calibration: the bundled sample frames (the bench's own frames are synthetic), with a warning
    build = functools.partial(build_detector, sample_calibration=True)
    rows = run_bench(
        values,
        args.backend,
        args.precision,
        args.size,
        args.runs,
        args.warmup,
        build,
        progress,
        on_device=args.input == "device",
        masks_subscribed=args.masks_subscribed,
    )
    changes = config_changes(values)
    # the bundled model follows the backend
    config = DetectorConfig(**{**changes, "backend": args.backend[0]})
    if args.peer == "sahi":
        rows += peer_sahi(config.model, args.size, args.runs, args.warmup, changes)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "bench.csv", csv_text(rows).encode())
    report = collect()
    gpus = [g["name"] for g in report["gpus"] if "name" in g] if config.device.startswith("cuda") else []
    plot(rows, args.out / "bench.png", f"{config.model.name} on {', '.join(gpus) or cpu_name()}")
    atomic_write(args.out / "env.json", (json.dumps(report, indent=2, default=str) + "\n").encode())
    print(table(rows))
    tracked = next((r.values["tracker_300_ms"] for r in rows if "tracker_300_ms" in r.values), None)
    if tracked is not None:
        print(
            f"tracker (bytetrack, one camera, 300 detections a frame): {tracked:.3f} ms per frame on the host"
        )
    for row in rows:  # why a frame was not captured as one CUDA graph
        if row.values.get("cuda_graph_reason"):
            print(
                f"{row.backend} {row.precision} {row.size}: cuda_graph {row.values['cuda_graph']}, "
                f"{row.values['cuda_graph_reason']}"
            )
    for width, height in args.size:
        size = f"{width}x{height}"
        peer = next((r for r in rows if r.backend == "sahi" and r.size == size and r.status == "ok"), None)
        ours = [r for r in rows if r.backend != "sahi" and r.size == size and r.status == "ok"]
        if peer and ours:
            best = min(ours, key=lambda r: r.values["total_ms"])
            ratio = peer.values["total_ms"] / best.values["total_ms"]
            print(f"{size}: SAHI's default takes {ratio:.1f}x our fastest ({best.backend} {best.precision})")
    print(f"wrote {args.out / 'bench.csv'}, {args.out / 'bench.png'}, {args.out / 'env.json'}")
    if args.json:
        print(json.dumps({"rows": [r.record() for r in rows]}))
    return 0 if any(r.status == "ok" for r in rows) else 1
