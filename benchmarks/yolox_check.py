"""YOLOX through the torch backend on a GPU: a TorchScript of the real YOLOX-nano weights, captured as one CUDA graph
per frame, equal to the CPU path (torch on the CPU, and ONNX Runtime on the original file).

    PYTHONPATH=src:<onnx2torch's site> python3 benchmarks/yolox_check.py --onnx yolox_nano.onnx --photos DIR \
        [--device cuda] [--out DIR]

Two TorchScripts: the real weights, from the ONNX file (its batch-1 export rewritten to a dynamic batch by
`engines.rebatch`, converted by onnx2torch, traced; onnx2torch's modules read shapes on the host, so the frame
program is captured around the engine), and with --yolox-source YOLOX-nano built from YOLOX's own source with random
weights and traced as its tools/export_torchscript.py does. Both are YOLOX by their head's shape (layout yolox, its
input conventions). Checks (FAIL lines, exit 1), TF32 off: the same detections on the device as on the CPU (and as
ONNX Runtime's for the real weights; boxes within 0.5 px, scores within 1e-3); for YOLOX's own source one whole
captured frame program per frame size. Writes the TorchScripts to --out.
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


def torchscript(onnx_path: Path, out: Path, extra: dict[str, str] | None = None) -> Path:
    """The ONNX model as TorchScript (onnx2torch, traced at batch 2 from its dynamic-batch rewrite), with its input
    shape and `extra` (input conventions, labels) as extra files."""
    from onnx2torch import convert

    module = convert(str(dynamic_batch_model(onnx_path))).eval()
    example = torch.rand(2, 3, 416, 416) * 255
    with torch.no_grad():
        traced = torch.jit.trace(module, example)
    path = out / f"{onnx_path.stem}.ts"
    torch.jit.save(traced, str(path), _extra_files={"input_shape": "-1,3,416,416", **(extra or {})})
    return path


SCORE_SPREAD = 0.02


def source_torchscript(source: Path, out: Path) -> Path:
    """YOLOX-nano built from YOLOX's own source (random weights), traced as its tools/export_torchscript.py does
    (raw head: decode_in_inference off)."""
    sys.path.insert(0, str(source))
    from yolox.models import YOLOPAFPN, YOLOX, YOLOXHead

    torch.manual_seed(0)
    channels = [256, 512, 1024]
    backbone = YOLOPAFPN(0.33, 0.25, in_channels=channels, act="silu", depthwise=True)
    model = YOLOX(backbone, YOLOXHead(80, 0.25, in_channels=channels, act="silu", depthwise=True)).eval()
    model.head.decode_in_inference = False
    for conv in model.modules():  # He init keeps activations alive through the net
        if isinstance(conv, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(conv.weight)
    with torch.no_grad():  # and small output layers keep the scores apart (no ties at 0 or 1)
        for conv in (*model.head.cls_preds, *model.head.obj_preds):
            conv.weight.mul_(SCORE_SPREAD)
    with torch.no_grad():
        traced = torch.jit.trace(model, torch.rand(1, 3, 416, 416))
    path = out / "yolox_nano_source.ts"
    torch.jit.save(traced, str(path), _extra_files={"input_shape": "-1,3,416,416"})
    return path


def same(name: str, a, b, failures: list[str]) -> None:
    """Whether two detections agree (same count; boxes within 0.5 px, scores within 1e-3, same classes)."""
    ok, boxes, scores = len(a) == len(b), 0.0, 0.0
    if ok and len(a):
        order_a, order_b = np.lexsort(a.boxes.T[::-1]), np.lexsort(b.boxes.T[::-1])
        boxes = float(np.abs(a.boxes[order_a] - b.boxes[order_b]).max())
        scores = float(np.abs(a.scores[order_a] - b.scores[order_b]).max())
        ok = boxes <= 0.5 and scores <= 1e-3 and bool((a.class_ids[order_a] == b.class_ids[order_b]).all())
    print(
        f"equality {name}: {len(a)} vs {len(b)} detections, boxes within {boxes:.3g} px, scores within "
        f"{scores:.3g}: {'ok' if ok else 'FAIL'}"
    )
    if not ok:
        failures.append(name)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--photos", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--yolox-source", type=Path, help="YOLOX's source (the folder holding yolox/)")
    parser.add_argument("--out", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # equality of the pipeline, not of TF32 convolutions (H100 cuDNN's default for fp32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    settings = dict(tile_size=(416, 416), overlap=0.2, conf_threshold=0.25)
    paths = sorted(args.photos.glob("*")) if args.photos else []
    frames = [(p.name, read_image(p).image) for p in paths if p.suffix in {".jpg", ".jpeg", ".png"}]
    frames += [(f"synthetic {w}x{h}", make_scene(1, w, h).image) for w, h in ((1920, 1080), (3840, 2160))]
    failures: list[str] = []
    models = [("real weights (onnx2torch)", torchscript(args.onnx, args.out), args.onnx)]
    if args.yolox_source:
        models.append(("YOLOX source, random weights", source_torchscript(args.yolox_source, args.out), None))
    for what, ts, onnx_file in models:
        print(f"{what}: {ts}")
        # random weights: the 20 best of each view above 0.5
        chosen = settings if onnx_file else {**settings, "conf_threshold": 0.5, "top_k": 20}
        gpu = TiledDetector(ts, backend="torch", device=args.device, **chosen)
        cpu = TiledDetector(ts, backend="torch", device="cpu", **chosen)
        ort = TiledDetector(onnx_file, backend="onnxruntime", device="cpu", **chosen) if onnx_file else None
        print(f"input format: {gpu.input_format}; layout {gpu._layout.value}; labels {gpu.labels[:3]}...")
        for name, image in frames:
            gpu.detect(image)  # the capture (and a replay next)
            on_cpu = cpu.detect(image)
            same(f"{what}: {name} {args.device} == torch cpu", gpu.detect(image), on_cpu, failures)
            if ort is not None:
                same(f"{what}: {name} torch cpu == onnxruntime cpu", on_cpu, ort.detect(image), failures)
        runner = gpu._runner
        captured = len(runner._captured)
        sizes = len({image.shape[:2] for _, image in frames})
        whole = runner.captures and not runner.split
        print(f"{what}: captured {captured} frame programs for {sizes} frame sizes, whole graph: {whole}")
        # onnx2torch's modules read shapes on the host (not capturable): the engine runs between captured parts
        # (a frame size captures again when its sync-free limits grow for a candidate flood)
        if onnx_file is None and args.device.startswith("cuda") and (not whole or captured < sizes):
            failures.append(f"{what}: one whole captured graph per frame size")
    print("ALL OK" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
