"""YOLOX through the torch backend on a GPU: a TorchScript of the real YOLOX-nano weights, captured as one CUDA graph
per frame, equal to the CPU path (torch on the CPU, and ONNX Runtime on the original file).

    PYTHONPATH=src:<onnx2torch's site> python3 scripts/yolox_check.py --onnx yolox_nano.onnx --photos DIR \
        [--device cuda] [--out DIR]

The TorchScript is made from the ONNX file (its batch-1 export rewritten to a dynamic batch by
`engines.rebatch`, converted by onnx2torch, traced), since YOLOX's own `tools/export_torchscript.py` needs YOLOX's
source; its input conventions stay YOLOX's (read from the head's shape: layout yolox). Checks (FAIL lines, exit 1):
the same detections on the device as on the CPU and as ONNX Runtime's (boxes within 0.5 px, scores within 1e-3);
one whole captured frame program per frame size (no split, no eager fallback). Writes the TorchScript to --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from tiled_detector import TiledDetector
from tiled_detector.engines.rebatch import dynamic_batch_model
from tiled_detector.tools.frames import read_image
from tiled_detector.tools.synthetic import make_scene


def torchscript(onnx_path: Path, out: Path) -> Path:
    """The ONNX model as TorchScript (onnx2torch, traced at batch 2 from its dynamic-batch rewrite)."""
    from onnx2torch import convert

    module = convert(str(dynamic_batch_model(onnx_path))).eval()
    example = torch.rand(2, 3, 416, 416) * 255
    with torch.no_grad():
        traced = torch.jit.trace(module, example)
    path = out / f"{onnx_path.stem}.ts"
    torch.jit.save(traced, str(path), _extra_files={"input_shape": "-1,3,416,416"})
    return path


def same(name: str, a, b, failures: list[str]) -> None:
    """Whether two detections agree (same count; boxes within 0.5 px, scores within 1e-3, same classes)."""
    ok = len(a) == len(b)
    if ok and len(a):
        order_a, order_b = np.lexsort(a.boxes.T[::-1]), np.lexsort(b.boxes.T[::-1])
        ok = (np.abs(a.boxes[order_a] - b.boxes[order_b]).max() <= 0.5
              and np.abs(a.scores[order_a] - b.scores[order_b]).max() <= 1e-3
              and (a.class_ids[order_a] == b.class_ids[order_b]).all())  # fmt: skip
    print(f"equality {name}: {len(a)} vs {len(b)} detections: {'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(name)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--photos", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ts = torchscript(args.onnx, args.out)
    print(f"torchscript: {ts}")
    settings = dict(tile_size=(416, 416), overlap=0.2, conf_threshold=0.25)
    gpu = TiledDetector(ts, backend="torch", device=args.device, **settings)
    cpu = TiledDetector(ts, backend="torch", device="cpu", **settings)
    ort = TiledDetector(args.onnx, backend="onnxruntime", device="cpu", **settings)
    print(
        f"input format: {gpu.input_format}; labels {gpu.labels[:3]}...; engine max_batch {gpu.engine.max_batch}"
    )
    paths = sorted(args.photos.glob("*")) if args.photos else []
    frames = [(p.name, read_image(p).image) for p in paths if p.suffix in {".jpg", ".jpeg", ".png"}]
    frames += [(f"synthetic {w}x{h}", make_scene(1, w, h).image) for w, h in ((1920, 1080), (3840, 2160))]
    failures: list[str] = []
    for name, image in frames:
        on_gpu, on_cpu, on_ort = gpu.detect(image), cpu.detect(image), ort.detect(image)
        gpu.detect(image)  # a replay of the capture
        same(f"{name} {args.device} == torch cpu", gpu.detect(image), on_cpu, failures)
        same(f"{name} torch cpu == onnxruntime cpu", on_cpu, on_ort, failures)
        del on_gpu
    runner = gpu._runner
    captured = len(runner._captured)
    sizes = len({image.shape[:2] for _, image in frames})
    whole = runner.captures and not runner.split
    print(f"captured: {captured} frame programs for {sizes} frame sizes, whole graph: {whole}")
    if args.device.startswith("cuda") and (not whole or captured != sizes):
        failures.append("one whole captured graph per frame size")
    print("ALL OK" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
