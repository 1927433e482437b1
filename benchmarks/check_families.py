"""Every ultralytics model family as its exporter writes it, loaded with no options (run where ultralytics is
installed, e.g. a CUDA machine: `benchmarks/cuda_runner.sh families`).

    PYTHONPATH=src python3 benchmarks/check_families.py [--out DIR] [--device cuda]

Per family (YOLOv5u, YOLOv8, YOLOv10, YOLO11, YOLO26, RT-DETR; built from ultralytics' yaml, random weights):
`export(format="torchscript")` and `export(format="onnx")` at their defaults (the ONNX's batch fixed at 1), each
loaded by `TiledDetector(path)` with nothing but the backend: the layout found, the class names read, the input, the
engine's batch (a batch-1 ONNX rewritten to a dynamic batch: more than 1), the engine calls a 1080p frame takes,
and one detect call. One row per file; FAIL rows say why; exit 1 on any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tiled_detector import TiledDetector
from tiled_detector.runtime.errors import one_line
from tiled_detector.tools.worlds.synthetic import make_scene

FAMILIES = ("yolov5nu", "yolov8n", "yolov10n", "yolo11n", "yolo26n", "rtdetr-l")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/families"))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    from ultralytics import RTDETR, YOLO

    args.out.mkdir(parents=True, exist_ok=True)
    frame = make_scene(1, 1920, 1080).image
    failed = 0
    print(
        "family    format       backend      layout             labels  input              batch  calls  found"
    )
    for family in FAMILIES:
        model = (RTDETR if family.startswith("rtdetr") else YOLO)(f"{family}.yaml")
        files = []
        for fmt in ("torchscript", "onnx"):
            try:
                options = {"simplify": False} if fmt == "onnx" else {}
                files.append((fmt, Path(model.export(format=fmt, imgsz=640, device=0, **options))))
            except Exception as error:  # ultralytics' own errors
                print(f"{family:<9} {fmt:<12} FAIL export: {one_line(error)}")
                failed += 1
        for fmt, path in files:
            backend, device = ("torch", args.device) if fmt == "torchscript" else ("onnxruntime", "cpu")
            try:
                detector = TiledDetector(path, backend=backend, device=device)
                found = detector.detect(frame)
                views = detector.plan_for(1080, 1920).batch_size
                engine = detector.engine
                print(
                    f"{family:<9} {fmt:<12} {backend:<12} {detector._layout.value:<18} {len(detector.labels or ()):>6}  "
                    f"{engine.input.shape!s:<18} {engine.max_batch:>5}  {-(-views // engine.max_batch):>5}  "
                    f"{len(found):>5}"
                )
            except Exception as error:  # what a user would see: the one line
                print(f"{family:<9} {fmt:<12} {backend:<12} FAIL: {one_line(error)}")
                failed += 1
    print("ALL OK" if not failed else f"{failed} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
