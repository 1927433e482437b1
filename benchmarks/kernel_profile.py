"""Where a frame's device time goes, kernel by kernel: the frame program eagerly under torch.profiler with each
stage as a range (kernels launched per stage, their summed device time, CUDA-event ms per stage), the captured
frame graph replayed under the profiler (kernels per replay, the graph's nodes where torch keeps the graph) and the
engine alone on the same views (kernels per call). Works on any checkout with the frame program's current
signature (`FrameProgram(frames, encodings, plan, settings, limits, mark)`), so the same command measures two
branches.

    PYTHONPATH=src python3 benchmarks/kernel_profile.py [--model M] [--precision fp16] [--size 1920x1080 ...] \
        [--conf 0.25] [--runs 20] [--json out.json]

Prints one block per frame size: `ours` = the frame graph's kernels less the engine's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiled_detector import TiledDetector
from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.tiling import batch_plan
from tiled_detector.tools.worlds.synthetic import make_scene

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _trace(prof: Any) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text()).get("traceEvents", [])


def _device_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") in DEVICE_CATEGORIES]


def _launches(events: list[dict[str, Any]]) -> dict[int, float]:
    """correlation id -> host timestamp of the launch (runtime / driver calls)."""
    return {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }


class Stages:
    """A `mark` callback that opens one profiler range per stage (named after its index, the stage's name
    known only at its end) and records CUDA events at each boundary."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.events = [torch.cuda.Event(enable_timing=True)]
        self.events[0].record()
        self._range = torch.profiler.record_function("stage0")
        self._range.__enter__()

    def __call__(self, stage: str) -> None:
        self._range.__exit__(None, None, None)
        self.names.append(stage)
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)
        self._range = torch.profiler.record_function(f"stage{len(self.names)}")
        self._range.__enter__()

    def close(self) -> None:
        self._range.__exit__(None, None, None)

    def milliseconds(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for name, a, b in zip(self.names, self.events, self.events[1:], strict=False):
            out[name] += a.elapsed_time(b)
        return dict(out)


def eager_stages(detector: TiledDetector, frame: torch.Tensor) -> dict[str, Any]:
    """The frame program run eagerly (with the detector's grown limits) under the profiler: per stage the
    kernels launched, their device ms, and the CUDA-event ms."""
    plan = batch_plan([detector.plan_for(*frame.shape[:2])])
    settings, limits = detector._frame_settings, detector._limits
    program = detector._program
    for _ in range(2):
        program([frame], [Encoding.RGB8], plan, settings, limits)
    torch.cuda.synchronize()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        stages = Stages()
        packed = program([frame], [Encoding.RGB8], plan, settings, limits, stages)[0]
        packed.cpu()
        stages("download")
        stages.close()
        torch.cuda.synchronize()
    events = _trace(prof)
    ranges = {
        int(e["name"][5:]): (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("stage")
    }
    launched = _launches(events)
    counts: Counter[str] = Counter()
    device_us: Counter[str] = Counter()
    names: Counter[str] = Counter()
    for event in _device_events(events):
        ts = launched.get(event.get("args", {}).get("correlation"))
        stage = next((i for i, (a, b) in ranges.items() if ts is not None and a <= ts <= b), None)
        name = stages.names[stage] if stage is not None and stage < len(stages.names) else "other"
        counts[name] += 1
        device_us[name] += float(event.get("dur", 0))
        names[f"{name}: {str(event.get('name'))[:70]}"] += 1
    return {
        "kernels": dict(counts),
        "device_ms": {k: round(v / 1000, 4) for k, v in device_us.items()},
        "event_ms": {k: round(v, 4) for k, v in stages.milliseconds().items()},
        "top": names.most_common(40),
    }


def replayed(detector: TiledDetector, frame: torch.Tensor, runs: int) -> dict[str, Any]:
    """The captured frame: kernels per replay (profiler), graph nodes (where kept), median ms of detect."""
    for _ in range(3):
        detector.detect_device(frame)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            detector.detect_device(frame)
        torch.cuda.synchronize()
    device = _device_events(_trace(prof))
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        detector.detect_device(frame)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    nodes = None
    try:
        from tiled_detector.runtime.devices import graph_nodes

        entries = list(detector._runner._captured.values())
        nodes = graph_nodes(entries[-1][0]) if entries else None
    except ImportError:  # a checkout without graph_nodes
        pass
    return {
        "kernels_per_frame": len(device) / 5,
        "device_ms_per_frame": round(sum(float(e.get("dur", 0)) for e in device) / 5000, 4),
        "graph_nodes": nodes,
        "detect_ms": round(statistics.median(times), 4),
        "captured": detector._runner.captures and not detector._runner.split,
    }


def engine_alone(detector: TiledDetector, views: int, runs: int) -> dict[str, Any]:
    engine = detector.engine
    batch = torch.rand((views, *engine.input.shape[1:]), generator=torch.Generator().manual_seed(0))
    batch = batch.to(engine.device, engine.input.dtype, memory_format=engine.memory_format)
    chunks = torch.split(batch, engine.max_batch)

    def call() -> None:
        for chunk in chunks:
            engine.infer(chunk)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    kernels = len(_device_events(_trace(prof)))
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        call()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return {"kernels": kernels, "graph_ms": round(statistics.median(times), 4)}


def check(detector: TiledDetector, reference: TiledDetector, frame: torch.Tensor) -> str:
    """The frame through the kernels (captured, replayed) against the torch stages (captured) and against the
    kernels run eagerly: the same detections (boxes within fp16 rounding: 1e-3 relative)."""
    eager = TiledDetector.from_config(detector.config.replace(cuda_graph=False), engine=detector.engine)
    found = [d.detect_device(frame) for d in (detector, reference, eager)]
    problems = []
    for name, other in (("torch stages", found[1]), ("eager", found[2])):
        if len(other) != len(found[0]) or not np.array_equal(other.class_ids, found[0].class_ids):
            problems.append(f"{name}: {len(other)} detections against {len(found[0])}")
            continue
        worst = float(np.abs(other.boxes - found[0].boxes).max(initial=0.0))
        if worst > 1e-3 * max(frame.shape):
            problems.append(f"{name}: boxes differ by {worst:.4f} px")
    return "OK" if not problems else "FAIL " + "; ".join(problems)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--size", nargs="+", default=["1920x1080", "3840x2160"])
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--check",
        action="store_true",
        help="also the same frames through the torch stages (TILED_DETECTOR_KERNELS=torch) and eagerly: detections equal",
    )
    args = parser.parse_args()
    options: dict[str, Any] = dict(
        backend="torch", device="cuda", precision=args.precision, conf_threshold=args.conf
    )
    if args.model:
        options["model"] = args.model
    reference = None
    if args.check:  # the torch stages (read when a frame program is made), on the same engine
        os.environ["TILED_DETECTOR_KERNELS"] = "torch"
        reference = TiledDetector(**options)
        os.environ.pop("TILED_DETECTOR_KERNELS")
    detector = TiledDetector(**options)
    results = {}
    for size in args.size:
        width, height = (int(v) for v in size.split("x"))
        frame = torch.from_numpy(make_scene(1, width, height).image).cuda()
        replay = replayed(detector, frame, args.runs)  # (grows the limits the eager run then uses)
        eager = eager_stages(detector, frame)
        views = detector.plan_for(height, width).batch_size
        model = engine_alone(detector, views, args.runs)
        ours = replay["kernels_per_frame"] - model["kernels"]
        results[size] = {"replay": replay, "eager": eager, "model": model, "ours": ours, "views": views}
        print(
            f"{size} ({views} views): frame graph {replay['kernels_per_frame']:.0f} kernels "
            f"(nodes {replay['graph_nodes']}), {replay['device_ms_per_frame']:.3f} ms device, detect "
            f"{replay['detect_ms']:.3f} ms, captured whole {replay['captured']}; engine alone "
            f"{model['kernels']} kernels, graph {model['graph_ms']:.3f} ms; ours {ours:.0f} kernels"
        )
        print(f"  eager kernels per stage {eager['kernels']}")
        print(f"  eager device ms per stage {eager['device_ms']}")
        print(f"  eager CUDA-event ms per stage {eager['event_ms']}")
        if reference is not None:
            results[size]["check"] = check(detector, reference, frame)
            print(f"  check {results[size]['check']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print("torch", torch.__version__, torch.cuda.get_device_name(), "numpy", np.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
