"""The real PP-PicoDet-S and NanoDet-m weights (ONNX files) on a GPU: each file converted by onnx2torch (its
dynamic-batch rewrite, traced at batch 2) and run by the torch backend on CUDA, against the ONNX file itself on
ONNX Runtime on the CPU, on photos and a synthetic 1080p frame (boxes within 0.5 px, scores within 1e-3, same
classes; TF32 off). onnx2torch's modules read shapes on the host, so the engine runs between captured parts.

    PYTHONPATH=src:<onnx2torch's site> python3 benchmarks/gfl_real_weights.py --models DIR [--photos DIR]

DIR holds picodet_s_416_coco.onnx and nanodet_m_416.onnx (../shared/models). The TorchScripts go to --out, for
`tiled-detector bench --backend torch --device cuda`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from gfl_check import NANODET, PICODET
from tiled_detector import TiledDetector
from tiled_detector.models import coco_labels
from tiled_detector.tools.frames import read_image
from tiled_detector.tools.worlds.synthetic import make_scene
from yolox_check import same, torchscript

FAMILIES = {"picodet_s_416_coco": PICODET, "nanodet_m_416": NANODET}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--photos", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gfl_real"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    photos = sorted(args.photos.glob("*")) if args.photos else []
    frames = [(p.name, read_image(p).image) for p in photos if p.suffix.lower() in {".jpg", ".jpeg", ".png"}]
    frames.append(("synthetic 1920x1080", make_scene(1, 1920, 1080).image))
    failures: list[str] = []
    for name, conventions in FAMILIES.items():
        onnx = args.models / f"{name}.onnx"
        try:
            path = torchscript(onnx, args.out, {**conventions, "labels": "\n".join(coco_labels())})
        except Exception as error:  # onnx2torch lacks converters for some exports
            print(f"{name}: onnx2torch cannot convert it: {type(error).__name__}: {error}")
            failures.append(f"{name}: conversion")
            continue
        device = TiledDetector(path, device=args.device, backend="torch")
        cpu = TiledDetector(onnx, device="cpu", backend="onnxruntime")
        print(f"{name}: {path}; layout {device.resolved.layout.value}; input {device.input_format}")
        for label, image in frames:
            found = device.detect(image), cpu.detect(image)
            same(f"{name}: {label} {args.device} (onnx2torch) == onnxruntime cpu", *found, failures)
    print("ALL OK" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
