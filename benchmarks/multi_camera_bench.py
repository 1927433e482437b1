"""Several cameras on one GPU: one detector batching every camera's frame (what the node does with `cameras`)
against one detector per camera, each in its own process (one node per camera), on the same GPU.

    PYTHONPATH=src python benchmarks/multi_camera_bench.py [--model M.ts] [--cameras 4] [--size 1920x1080]
        [--seconds 10] [--precision fp16] [--out results.json]

Without --model the YOLOv8n architecture (seeded random weights, benchmarks/networks.py) is traced to
TorchScript. Both setups run flat out for --seconds on frames of the same size (each camera its own synthetic
scene). Reported per setup: frames/s per camera, the torch allocator's peak (engine weights + activations +
pipeline buffers) summed over processes, and the GPU memory of the processes as nvidia-smi sees it (CUDA
contexts included), when nvidia-smi is there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tiled_detector.detector import TiledDetector
from tiled_detector.tools.worlds.synthetic import make_scene


def _detector(args: argparse.Namespace) -> TiledDetector:
    return TiledDetector(args.model, backend="torch", device="cuda", precision=args.precision)


def _frames(args: argparse.Namespace, count: int, first: int = 0) -> list:
    width, height = map(int, args.size.split("x"))
    return [make_scene(100 + first + i, width, height).image for i in range(count)]


def _process_memory_mb() -> dict[int, float]:
    """GPU memory per process id (MiB), from nvidia-smi ({} without it)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = (line.split(",") for line in out.strip().splitlines() if line.strip())
    return {int(pid): float(mb) for pid, mb in rows}


def _loop(detect, seconds: float, start_at: float) -> int:
    """Frames (calls) of `detect` done in `seconds` from wall time `start_at`."""
    while time.time() < start_at:
        time.sleep(0.001)
    done, stop = 0, time.time() + seconds
    while time.time() < stop:
        detect()
        done += 1
    torch.cuda.synchronize()
    return done


def batched(args: argparse.Namespace) -> dict:
    """One detector, every camera's frame in one detect_many call."""
    detector, frames = _detector(args), _frames(args, args.cameras)
    slots = list(range(args.cameras))
    for _ in range(5):
        detector.detect_many(frames, slots=slots)
    torch.cuda.reset_peak_memory_stats()
    calls = _loop(lambda: detector.detect_many(frames, slots=slots), args.seconds, time.time())
    smi = _process_memory_mb()
    return {
        "fps_per_camera": calls / args.seconds,
        "torch_peak_mb": torch.cuda.max_memory_allocated() / 2**20,
        "process_mb": smi.get(os.getpid()),
    }


def worker(args: argparse.Namespace) -> None:
    """One camera's detector (a child process of `separate`): prints its frames/s and memory as JSON."""
    detector, (frame,) = _detector(args), _frames(args, 1, args.index)
    for _ in range(5):
        detector.detect(frame)
    torch.cuda.reset_peak_memory_stats()
    Path(args.ready).touch()
    go = Path(args.go)
    while not go.exists():  # the parent writes the common start time once every worker has loaded
        time.sleep(0.01)
    calls = _loop(lambda: detector.detect(frame), args.seconds, float(go.read_text()))
    print(
        json.dumps(
            {
                "fps": calls / args.seconds,
                "torch_peak_mb": torch.cuda.max_memory_allocated() / 2**20,
                "process_mb": _process_memory_mb().get(os.getpid()),
            }
        ),
        flush=True,
    )


def separate(args: argparse.Namespace) -> dict:
    """One detector per camera, each in its own process, all running at once."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        base = [
            sys.executable,
            __file__,
            "--worker",
            "--model",
            str(args.model),
            "--size",
            args.size,
            "--seconds",
            str(args.seconds),
            "--precision",
            args.precision,
        ]
        ready = [folder / f"ready{i}" for i in range(args.cameras)]
        go = folder / "go"
        procs = [
            subprocess.Popen(
                [*base, "--index", str(i), "--ready", str(ready[i]), "--go", str(go)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(args.cameras)
        ]
        while not all(r.exists() for r in ready):
            if any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError("a worker failed")
            time.sleep(0.1)
        (folder / "go.tmp").write_text(str(time.time() + 1.0))
        (folder / "go.tmp").rename(go)
        results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    return {
        "fps_per_camera": sum(r["fps"] for r in results) / len(results),
        "torch_peak_mb": sum(r["torch_peak_mb"] for r in results),
        "process_mb": sum(r["process_mb"] for r in results)
        if all(r["process_mb"] for r in results)
        else None,
        "workers": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--cameras", type=int, default=4)
    parser.add_argument("--size", default="1920x1080")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ready", help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.model is None:
        from networks import YoloV8nLike, save_torchscript

        torch.manual_seed(0)
        args.model = save_torchscript(YoloV8nLike(), Path(tempfile.mkdtemp()) / "yolov8n.ts", (640, 640))
    results = {
        "cameras": args.cameras,
        "size": args.size,
        "precision": args.precision,
        "one_detector": batched(args),
        "one_detector_per_camera": separate(args),
    }
    one, many = results["one_detector"], results["one_detector_per_camera"]
    results["throughput_ratio"] = one["fps_per_camera"] / many["fps_per_camera"]
    results["torch_memory_ratio"] = one["torch_peak_mb"] / many["torch_peak_mb"]
    if one["process_mb"] and many["process_mb"]:
        results["process_memory_ratio"] = one["process_mb"] / many["process_mb"]
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
