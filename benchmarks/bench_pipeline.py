"""Per-frame time of `TiledDetector.detect` vs the bare ONNX Runtime `session.run` on the same tile batch.

    .venv/bin/python benchmarks/bench_pipeline.py [--model M.onnx] [--runs 10] [--no-full-frame] [--conf 0.25]

Without --model a YOLOv8n-sized network (random weights, the YOLOv8n layer widths and head) is exported to a
temporary ONNX file. Both measurements alternate in one loop so machine load affects them alike; medians and
their ratio are printed. `tiled-detector bench` measures the same per stage, on every backend.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from networks import YoloV8nLike, save_onnx


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="ONNX model (default: a YOLOv8n-sized random network)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each (after 2 warm-up runs)")
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--tile", type=int, default=640)
    parser.add_argument("--overlap", type=float, default=0.2)
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads")
    parser.add_argument("--no-full-frame", dest="full_frame", action="store_false")
    parser.add_argument("--scene", action="store_true", help="a synthetic scene (real detections), not noise")
    args = parser.parse_args(argv)

    import onnxruntime as ort

    from tiled_detector.detector import TiledDetector

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or save_onnx(YoloV8nLike(), Path(tmp) / "yolov8n_like.onnx", (640, 640))
        detector = TiledDetector(
            model,
            backend="onnxruntime",
            tile_size=(args.tile, args.tile),
            overlap=args.overlap,
            full_frame=args.full_frame,
            conf_threshold=args.conf,
            engine_options={} if args.threads is None else {"threads": args.threads},
        )
        # configured like the engine's session: with ONNX Runtime's default spinning, the idle threads of one
        # session keep spinning into the next measurement of the loop and slow it on 2 cores
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = args.threads or 0
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        plan = detector.plan_for(args.height, args.width)
        rng = np.random.default_rng(0)
        if args.scene:
            from tiled_detector.tools.worlds.synthetic import make_scene

            frame = make_scene(3, args.width, args.height).image
        else:
            frame = rng.integers(0, 256, (args.height, args.width, 3), dtype=np.uint8)
        batch = rng.random((plan.batch_size, 3, *detector.engine.input_hw), dtype=np.float32)
        feed = {session.get_inputs()[0].name: batch}
        bare, pipeline, stages = [], [], []
        for i in range(args.runs + 2):
            start = time.perf_counter()
            session.run(None, feed)
            middle = time.perf_counter()
            dets = detector.detect(frame)
            end = time.perf_counter()
            if i >= 2:
                bare.append(middle - start)
                pipeline.append(end - middle)
                stages.append(dets.timings)
    bare_ms, pipe_ms = _median_ms(bare), _median_ms(pipeline)
    print(
        f"{args.width}x{args.height}, {plan.num_tiles} tiles of {args.tile} (+{int(args.full_frame)} full frame), "
        f"overlap {args.overlap}, conf {args.conf}, torch threads {torch.get_num_threads()}, median of {args.runs}"
    )
    print(f"bare session.run, batch {plan.batch_size}: {bare_ms:8.1f} ms")
    print(f"TiledDetector.detect:            {pipe_ms:8.1f} ms  ({len(dets)} detections)")
    print(f"ratio: {pipe_ms / bare_ms:.3f}; pipeline {1000.0 / pipe_ms:.2f} frames/s")
    names = list(stages[0])
    print(
        "stages (median ms): "
        + ", ".join(f"{n} {statistics.median(s[n] for s in stages):.1f}" for n in names)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
