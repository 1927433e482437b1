"""What keypoints cost per frame: the same pose network with its keypoints fused through tiles (`keypoints: true`,
per-joint fusion) and ignored (`keypoints: false`: the same engine, decoding and merge, no keypoint stage and no
keypoint columns in the download), frames alternating; on CUDA whether each frame program is one whole captured
graph (no split, one capture per key).

    GPU: PYTHONPATH=src:benchmarks python3 benchmarks/pose_cost.py --device cuda --precision fp16 \
             --size 3840x2160 --objects 100 --runs 30
    CPU: .venv/bin/python benchmarks/pose_cost.py --size 1920x1080 --objects 50 --runs 3

A YOLOv8n-pose-sized network with random weights (`networks.YoloV8nPoseLike`, 640 input, 17 joints x 3) traced to
TorchScript with ultralytics' pose metadata runs through the torch backend, `conf_threshold` 0 and
`max_detections` `--objects`: every frame keeps that many detections, each with 17 joints fused from the views of
its object. Prints the milliseconds per frame each way, the ratio (the issue's target: <= 1.10 at 4K, torch fp16,
one captured graph), the objects, and (CUDA) captures, split and peak memory; `--json` writes them (with each
stage's median milliseconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tiled_detector import TiledDetector


def _frame(size: str) -> np.ndarray:
    from tiled_detector.tools.worlds.synthetic import make_scene

    width, height = (int(v) for v in size.split("x"))
    return make_scene(0, width, height).image


def _model(args: argparse.Namespace, folder: Path, frame: np.ndarray) -> dict:
    """The detector's settings: the random pose network traced (torch backend), each view's top candidates enough
    for `--objects` kept after the merge (a frame's candidates about twice that: no flood)."""
    from networks import YoloV8nPoseLike, save_pose_torchscript
    from tiled_detector.pipeline.tiling import make_plan

    torch.manual_seed(0)  # the same random network run after run
    path = save_pose_torchscript(YoloV8nPoseLike(), folder / "yolov8n-pose-like.ts")
    views = make_plan(frame.shape[:2], (640, 640), 0.2, (640, 640), True).batch_size
    top_k = max(1, -(-2 * args.objects // views))
    return {
        "model": path,
        "backend": "torch",
        "conf_threshold": 0.0,
        "max_detections": args.objects,
        "top_k": top_k,
    }


def _timed(detector: TiledDetector, frame: np.ndarray) -> tuple[float, object]:
    """The frame's milliseconds up to its one download (the device has finished then) and its detections."""
    if detector.engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    found = detector.detect(frame)
    return (time.perf_counter() - start) * 1e3, found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--size", default="1920x1080", help="synthetic frame WxH")
    parser.add_argument("--objects", type=int, default=50, help="detections kept per frame")
    parser.add_argument("--fusion", default="joints", choices=["joints", "keeper"])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    frame = _frame(args.size)
    cuda = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory() as folder:
        settings = _model(args, Path(folder), frame)
        posed = TiledDetector(
            device=args.device,
            precision=args.precision,
            keypoints=True,
            keypoint_fusion=args.fusion,
            **settings,
        )
        plain = TiledDetector.from_config(posed.config.replace(keypoints=False), engine=posed.engine)
        for _ in range(args.warmup):  # captures, grown limits, cached plans
            _timed(posed, frame)
            _timed(plain, frame)
        times: dict[str, list[float]] = {"keypoints": [], "ignored": []}
        stages: dict[str, dict[str, list[float]]] = {"keypoints": {}, "ignored": {}}
        peak = {}
        found = None
        for _ in range(args.runs):
            for name, detector in (("ignored", plain), ("keypoints", posed)):
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                elapsed, result = _timed(detector, frame)
                times[name].append(elapsed)
                for stage, ms in result.timings.items():
                    stages[name].setdefault(stage, []).append(ms)
                if cuda:
                    peak[name] = torch.cuda.max_memory_allocated() / 2**20
                if name == "keypoints":
                    found = result
        assert found is not None and found.keypoints is not None
        result = {
            "device": str(posed.engine.device),
            "precision": args.precision,
            "frame": f"{frame.shape[1]}x{frame.shape[0]}",
            "fusion": args.fusion,
            "objects": len(found),
            "joints": int(found.keypoints.shape[1]),
            "views": posed.plan_for(*frame.shape[:2]).batch_size,
            "ms_ignored": statistics.median(times["ignored"]),
            "ms_keypoints": statistics.median(times["keypoints"]),
            "stages_ms": {n: {s: statistics.median(v) for s, v in per.items()} for n, per in stages.items()},
        }
        result["ratio"] = result["ms_keypoints"] / result["ms_ignored"]
        for name, detector in (("", posed), ("_ignored", plain)):
            runner = detector._runner
            result["captured" + name] = runner.captures
            result["split" + name] = runner.split
            result["captures" + name] = len(runner._captured)
        if peak:
            result["peak_mib_keypoints"], result["peak_mib_ignored"] = peak["keypoints"], peak["ignored"]
        print(
            f"{result['device']} {args.precision} {result['frame']} ({args.fusion}): {result['objects']} objects x "
            f"{result['joints']} joints, {result['views']} views: {result['ms_ignored']:.2f} ms with keypoints "
            f"ignored, {result['ms_keypoints']:.2f} ms with them ({100 * (result['ratio'] - 1):+.1f} %); captured "
            f"{result['captured']}, split {result['split']}, {result['captures']} capture(s)"
            + (
                f"; peak {peak['keypoints']:.0f} MiB with keypoints, {peak['ignored']:.0f} without"
                if peak
                else ""
            )
        )
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
