"""Our own CPU work per frame on a CPU, by stage: the main thread's CPU time (`time.thread_time`) in each stage of
`TiledDetector.detect`, so that other processes on a shared machine do not count (wall times there move 2-8x
within minutes); `own` is everything but the engine calls. Medians over `--frames` frames of one synthetic scene.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_stages.py --size 1920x1080 --frames 20

Run it from two checkouts alternately (`PYTHONPATH=OTHER/src`) to compare them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types

from tiled_detector import TiledDetector, stage_clock
from tiled_detector.tools.worlds.synthetic import make_scene


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1920x1080", help="frame WxH (default 1920x1080)")
    parser.add_argument("--frames", type=int, default=20, help="frames measured after 3 warm-up ones")
    parser.add_argument("--backend", default="onnxruntime")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    stage_clock.time = types.SimpleNamespace(perf_counter=time.thread_time)  # stage times: this thread's CPU
    detector = TiledDetector(backend=args.backend)
    frame = make_scene(3, width, height).image
    stages = [detector.detect(frame).timings for _ in range(args.frames + 3)][3:]
    medians = {name: round(statistics.median(s[name] for s in stages), 2) for name in stages[0]}
    medians["own"] = round(medians["total"] - medians.get("infer", 0.0), 2)
    print(json.dumps({"size": args.size, "cpu_ms": medians}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
