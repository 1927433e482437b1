"""What the 3D step costs per frame: the positions stage alone (`pipeline.depth.locate` on a frame's packed rows),
and a whole frame of the detector with and without its depth image.

    .venv/bin/python benchmarks/depth_cost.py --device cpu --size 1920x1080            # the CPU target (<= 5 ms)
    python3 benchmarks/depth_cost.py --device cuda --size 3840x2160 --objects 300     # the GPU target (<= 0.3 ms)

Rows printed as JSON, one per measurement (medians over --runs, after warm-up):
- `locate`: the stage alone on `--objects` result rows and a depth image of the frame's size (16UC1); on CUDA
  replayed as a captured graph and timed with CUDA events (`graph_ms`), and eager (`eager_ms`); on the CPU, host
  wall time (median and least) and the CPU time of the calling thread (`thread_cpu_ms`: with OMP_NUM_THREADS=1 all
  of the step's work, whatever else loads the machine). Its input is what the frame program hands it (fixed shapes on CUDA: max_detections rows, valid or not).
- `frame`: `TiledDetector.detect` on a synthetic depth scene with and without its depth (the frame program
  captured on CUDA as in the node), the difference being the whole 3D step with its upload; the 2D outputs are
  checked bit-identical, and on CUDA that every frame replays one captured graph.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from tiled_detector import TiledDetector
from tiled_detector.config import DetectorConfig
from tiled_detector.pipeline.depth import DepthImage, locate
from tiled_detector.tools.worlds.depth_scenes import camera_for, make_depth_scene


def _rows(count: int, width: int, height: int, device: str) -> torch.Tensor:
    """`count` result rows of boxes of 8-80 px spread over the frame, and a status row."""
    rng = np.random.default_rng(0)
    sides = np.exp(rng.uniform(np.log(8), np.log(80), count))
    x, y = rng.uniform(0, width - 80, count), rng.uniform(0, height - 80, count)
    rows = np.zeros((count + 1, 8), np.float32)
    rows[:count, :4] = np.stack([x, y, x + sides, y + sides], axis=1)
    rows[:count, 4:7] = (0.9, 0.0, 1.0)
    return torch.from_numpy(rows).to(device)


def _timed_locate(device: str, width: int, height: int, objects: int, runs: int) -> dict[str, object]:
    settings = DetectorConfig().frame_settings(None)
    depth = np.full((height, width), 20000, np.uint16)
    image = torch.from_numpy(depth).to(device)
    camera = camera_for(width, height)
    rows = _rows(objects, width, height, device)

    def step() -> torch.Tensor:
        depths = [DepthImage(image, camera)]
        return locate(
            rows, [(height, width)], depths, settings.depth_scale, settings.depth_min, settings.depth_max
        )

    for _ in range(5):
        step()
    if device == "cpu":
        times, cpu = [], []  # wall time, and this thread's CPU time (what the step costs whatever else runs)
        for _ in range(runs):
            start, started = time.perf_counter(), time.thread_time()
            step()
            times.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.thread_time() - started) * 1e3)
        return {
            "row": "locate",
            "device": device,
            "objects": objects,
            "size": f"{width}x{height}",
            "threads": torch.get_num_threads(),
            "host_ms": statistics.median(times),
            "host_ms_min": min(times),
            "thread_cpu_ms": statistics.median(cpu),
        }
    from tiled_detector.runtime.devices import cuda_graph

    def event_ms(function) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        begin.record()
        for _ in range(runs):
            function()
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end) / runs

    replay, outputs = cuda_graph(step)
    replay()
    torch.cuda.synchronize()
    same = torch.equal(outputs, step())
    return {
        "row": "locate",
        "device": device,
        "gpu": torch.cuda.get_device_name(),
        "objects": objects,
        "size": f"{width}x{height}",
        "graph_ms": event_ms(replay),
        "eager_ms": event_ms(step),
        "graph_equals_eager": bool(same),
    }


def _timed_frames(
    device: str, width: int, height: int, runs: int, backend: str, precision: str
) -> dict[str, object]:
    scene = make_depth_scene(11, width, height)
    depth = DepthImage(scene.depth_mm(), scene.camera)
    detector = TiledDetector(device=device, backend=backend, precision=precision)
    captures = []
    if detector._runner.captures:  # count the captures the runner makes (each frame after the first replays)
        original = detector._runner._capture
        detector._runner._capture = lambda function: (captures.append(1), original(function))[1]
    with_depth, without, stage, identical = [], [], [], True
    for index in range(runs + 3):
        start = time.perf_counter()
        plain = detector.detect(scene.scene.image)
        middle = time.perf_counter()
        located = detector.detect(scene.scene.image, depth=depth)
        end = time.perf_counter()
        names = ("boxes", "scores", "class_ids")
        identical &= all(getattr(plain, n).tobytes() == getattr(located, n).tobytes() for n in names)
        if index >= 3:
            without.append((middle - start) * 1e3)
            with_depth.append((end - middle) * 1e3)
            stage.append(located.timings.get("positions", 0.0))
    return {
        "row": "frame",
        "device": device,
        "size": f"{width}x{height}",
        "backend": detector.engine.backend.value,
        "precision": detector.engine.precision.value,
        "objects": len(located),
        "with_depth_ms": statistics.median(with_depth),
        "without_depth_ms": statistics.median(without),
        "added_ms": statistics.median(with_depth) - statistics.median(without),
        "positions_stage_ms": statistics.median(stage),
        "captures": len(captures),
        "2d_bit_identical": bool(identical),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--size", default="1920x1080", help="frame WIDTHxHEIGHT")
    parser.add_argument("--objects", type=int, default=300, help="result rows the positions stage takes")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--frame-runs", type=int, default=10, help="whole frames with and without depth")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    print(json.dumps(_timed_locate(args.device, width, height, args.objects, args.runs)), flush=True)
    if args.frame_runs:
        row = _timed_frames(args.device, width, height, args.frame_runs, args.backend, args.precision)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
