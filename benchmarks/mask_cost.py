"""What instance masks cost per frame: the same detector with masks on and off, frames alternating, and on CUDA
whether the frame program is still one captured graph (no split, one capture per key) and the device memory the
masks take.

    GPU: PYTHONPATH=src python3 benchmarks/mask_cost.py --device cuda --precision fp16 --size 3840x2160 \
             --objects 100 --runs 30
    CPU: .venv/bin/python benchmarks/mask_cost.py --model ../shared/models/yolov8n-seg_int8.onnx \
             --photo ../shared/data/mot17_mini/MOT17-04-FRCNN/img1/000001.jpg --runs 5

Without `--model`, a YOLOv8n-seg-sized network with random weights (`networks.YoloV8nSegLike`, 640 input) traced to
TorchScript runs through the torch backend, `conf_threshold` 0 and `max_detections` `--objects`: every frame keeps
that many detections (boxes of 16 to 64 px; each view's `top_k` about twice that over the frame's views), all with
masks. With `--model` and `--photo`, the real file on a real
frame at the given threshold. Prints the milliseconds per frame each way, the ratio, the objects and mask pixels per
frame, and (CUDA) captures, split and peak memory; `--json` writes them (with each stage's median milliseconds).

A frame with masks is timed up to its label image (`InstanceMasks.labels`: on CUDA composed on the device and
downloaded with the masks, `TiledDetector.label_images`; on the CPU composed on the host from the masks' boxes and
bits on first use): what the node pays per frame while its `masks` topic has a subscriber (`ms_labels`: the host's
part after the call). `--no-labels`: the detector's call alone (detect --json, no label image).
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


def _frame(args: argparse.Namespace) -> np.ndarray:
    if args.photo:
        import cv2

        return np.ascontiguousarray(cv2.imread(str(args.photo))[..., ::-1])
    from tiled_detector.tools.worlds.synthetic import make_scene

    width, height = (int(v) for v in args.size.split("x"))
    return make_scene(0, width, height).image


def _model(args: argparse.Namespace, folder: Path, frame: np.ndarray) -> dict:
    """The detector's settings: the real file, or the random network traced (torch backend), each view's top
    candidates enough for `--objects` kept after the merge (a frame's candidates about twice that: no flood)."""
    if args.model:
        return {"model": args.model, "conf_threshold": args.conf}
    from networks import YoloV8nSegLike, save_torchscript
    from tiled_detector.pipeline.tiling import make_plan

    torch.manual_seed(0)  # the same random network (and masks) run after run
    path = save_torchscript(YoloV8nSegLike(), folder / "yolov8n-seg-like.ts", (640, 640))
    views = make_plan(frame.shape[:2], (640, 640), 0.2, (640, 640), True).batch_size
    top_k = max(1, -(-2 * args.objects // views))
    return {
        "model": path,
        "backend": "torch",
        "conf_threshold": 0.0,
        "max_detections": args.objects,
        "top_k": top_k,
    }


def _timed(detector: TiledDetector, frame: np.ndarray, labels: bool) -> tuple[float, float, object]:
    """The frame's milliseconds (with `labels`: up to its label image), those of the label image alone, and its
    detections."""
    if detector.engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    found = detector.detect(frame)  # ends with the one download: the device has finished
    detected = time.perf_counter()
    if labels and found.masks is not None:
        found.masks.labels  # noqa: B018 (composed on first use: the node's `masks` topic)
    end = time.perf_counter()
    return (end - start) * 1e3, (end - detected) * 1e3, found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--photo", type=Path)
    parser.add_argument("--size", default="1920x1080", help="synthetic frame WxH (without --photo)")
    parser.add_argument("--objects", type=int, default=50, help="detections kept per frame (random network)")
    parser.add_argument("--conf", type=float, default=0.25, help="score threshold (--model)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--no-labels", action="store_true", help="time the detector's call alone, not the label image"
    )
    args = parser.parse_args()
    frame = _frame(args)
    with tempfile.TemporaryDirectory() as folder:
        settings = _model(args, Path(folder), frame)
        masked = TiledDetector(device=args.device, precision=args.precision, masks=True, **settings)
        plain = TiledDetector.from_config(masked.config.replace(masks=False), engine=masked.engine)
        labels = not args.no_labels
        # as the node while `masks` has a subscriber: the label image composed on the device (CUDA)
        masked.label_images = labels
        for _ in range(args.warmup):  # captures, grown limits, cached plans
            _timed(masked, frame, labels)
            _timed(plain, frame, labels)
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        times: dict[str, list[float]] = {"masks": [], "no masks": [], "labels": []}
        stages: dict[str, dict[str, list[float]]] = {"masks": {}, "no masks": {}}
        peak = {}
        for _ in range(args.runs):
            for name, detector in (("no masks", plain), ("masks", masked)):
                if args.device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                elapsed, composing, found = _timed(detector, frame, labels)
                times[name].append(elapsed)
                if name == "masks":
                    times["labels"].append(composing)
                for stage, ms in found.timings.items():
                    stages[name].setdefault(stage, []).append(ms)
                if args.device.startswith("cuda"):
                    peak[name] = torch.cuda.max_memory_allocated() / 2**20
        result = {
            "device": str(masked.engine.device),
            "precision": args.precision,
            "frame": f"{frame.shape[1]}x{frame.shape[0]}",
            "objects": len(found),
            "mask_pixels": int(found.masks.areas.sum()) if found.masks is not None else 0,
            "views": masked.plan_for(*frame.shape[:2]).batch_size,
            "ms_no_masks": statistics.median(times["no masks"]),
            "ms_masks": statistics.median(times["masks"]),
            "labels_timed": labels,
            "ms_labels": statistics.median(times["labels"]),
            "stages_ms": {
                name: {stage: statistics.median(v) for stage, v in per.items()}
                for name, per in stages.items()
            },
        }
        result["ratio"] = result["ms_masks"] / result["ms_no_masks"]
        runner = masked._runner
        result["captured"] = runner.captures
        result["split"] = runner.split
        result["captures"] = len(runner._captured)
        if peak:
            result["peak_mib_masks"], result["peak_mib_no_masks"] = peak["masks"], peak["no masks"]
        print(
            f"{result['device']} {args.precision} {result['frame']}: {result['objects']} objects, "
            f"{result['mask_pixels']} mask pixels, {result['views']} views: {result['ms_no_masks']:.2f} ms without "
            f"masks, {result['ms_masks']:.2f} ms with ({100 * (result['ratio'] - 1):+.1f} %"
            + (f"; label image {result['ms_labels']:.2f} ms of it" if labels else ", no label image")
            + f"); captured "
            f"{result['captured']}, split {result['split']}, {result['captures']} capture(s)"
            + (f"; peak {peak['masks']:.0f} MiB with masks, {peak['no masks']:.0f} without" if peak else "")
        )
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
