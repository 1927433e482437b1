"""GFL heads (PP-PicoDet's and NanoDet's layouts) through the torch backend on a GPU: small GFL networks with random
weights (`networks.GflLike`), traced to TorchScript in each export layout, decoded on the device inside the
frame program, captured as one CUDA graph per frame size and equal to the CPU path.

    PYTHONPATH=src python3 benchmarks/gfl_check.py [--device cuda] [--out DIR] [--photos DIR]

Four TorchScripts (written to --out, for `tiled-detector bench`; `--models` picks some): `picodet_like.ts` (strides
8-64, class scores then box distributions per stride, PP-PicoDet's input conventions as extra files),
`picodet32_like.ts` (the same with 32 classes and 8 bins: every output 32 columns wide), `nanodet_like.ts` (strides
8-32, NanoDet 0.x's) and `nanodet_plus_like.ts` (one joined tensor over strides 8-64, NanoDet-Plus', 80 names).
Checks (FAIL lines, exit 1), TF32 off: the layout read is gfl with the stated conventions; on synthetic 1080p and
4K frames (and the photos of --photos) the device's detections equal the CPU's (boxes within 0.5 px, scores within
1e-3, same classes); one whole captured frame program per frame size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from networks import GflLike
from tiled_detector import TiledDetector
from tiled_detector.models import coco_labels
from tiled_detector.tools.frames import read_image
from tiled_detector.tools.worlds.synthetic import make_scene
from yolox_check import same

INPUT_HW = (416, 416)
SCORE_SPREAD = 1.5  # random class logits this spread over the cells around -4: some anchors score above 0.5
# the families' own input conventions (config.FAMILY_INPUTS), stated in the files: a TorchScript names no exporter
PICODET = {
    "channel_order": "rgb",
    "input_scale": "1.0",
    "input_mean": "[123.675, 116.28, 103.53]",
    "input_std": "[58.395, 57.12, 57.375]",
    "letterbox": "stretch",
}
NANODET = {
    **PICODET,
    "channel_order": "bgr",
    "input_mean": "[103.53, 116.28, 123.675]",
    "input_std": "[57.375, 57.12, 58.395]",
    "letterbox": "center",
    "pad_value": "0",
}
MODELS = {  # name: (classes, levels, joined, conventions, class names stored)
    "picodet_like": (80, 4, False, PICODET, False),
    "picodet32_like": (32, 4, False, PICODET, False),
    "nanodet_like": (80, 3, False, NANODET, False),
    "nanodet_plus_like": (80, 4, True, NANODET, True),
}


def traced(name: str, out: Path) -> Path:
    """A GflLike network of `MODELS[name]`, random weights (the class scores' layer set so that the scores spread
    rather than all sit at one value), traced with its input shape and conventions as extra files."""
    classes, levels, joined, conventions, named = MODELS[name]
    torch.manual_seed(0)
    model = GflLike(classes=classes, bins=8, levels=levels, width=32, joined=joined).eval()
    scene = torch.from_numpy(make_scene(2, *INPUT_HW[::-1]).image).permute(2, 0, 1)[None].float()
    example = (scene - 117.0) / 58.0  # about what either family's normalisation gives
    with torch.no_grad():
        x = model.stem(example)
        for stage, head in zip(model.stages, model.heads, strict=True):
            x = stage(x)
            spread = head(x)[:, :classes].std(dim=(2, 3)).mean()  # over the cells, per class
            head[-1].weight[:classes] *= (
                SCORE_SPREAD / spread
            )  # class logits varying SCORE_SPREAD over the cells
            head[-1].bias[:classes] -= (
                head(x)[0, :classes].mean(dim=(1, 2)) + 4.0
            )  # around -4 for every class
        module = torch.jit.trace(model, example)
    extra = {"input_shape": f"-1,3,{INPUT_HW[0]},{INPUT_HW[1]}", **conventions}
    if named:
        extra["labels"] = "\n".join(coco_labels())
    path = out / f"{name}.ts"
    torch.jit.save(module, str(path), _extra_files=extra)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--photos", type=Path)
    parser.add_argument(
        "--size", nargs="+", default=["1920x1080", "3840x2160"], help="synthetic frame sizes WxH"
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/gfl"))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    paths = sorted(args.photos.glob("*")) if args.photos else []
    frames = [(p.name, read_image(p).image) for p in paths if p.suffix.lower() in {".jpg", ".jpeg", ".png"}]
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.size]
    frames += [(f"synthetic {w}x{h}", make_scene(1, w, h).image) for w, h in sizes]
    failures: list[str] = []
    settings = dict(conf_threshold=0.5, top_k=20, backend="torch")
    for name in args.models:
        path = traced(name, args.out)
        gpu = TiledDetector(path, device=args.device, **settings)
        cpu = TiledDetector(path, device="cpu", **settings)
        resolved = gpu.resolved
        print(
            f"{name}: {path}; layout {resolved.layout.value} ({resolved.head}); input {gpu.input_format}; tiles {gpu.tile_size}"
        )
        if resolved.layout.value != "gfl" or gpu.tile_size != INPUT_HW[::-1]:
            failures.append(f"{name}: layout {resolved.layout.value}, tiles {gpu.tile_size}")
        for label, image in frames:
            gpu.detect(image)  # the capture (and a replay next)
            same(f"{name}: {label} {args.device} == cpu", gpu.detect(image), cpu.detect(image), failures)
        runner = gpu._runner
        sizes = len({image.shape[:2] for _, image in frames})
        whole = runner.captures and not runner.split
        print(
            f"{name}: captured {len(runner._captured)} frame programs for {sizes} frame sizes, whole graph: {whole}"
        )
        if args.device.startswith("cuda") and (not whole or len(runner._captured) < sizes):
            failures.append(f"{name}: one whole captured graph per frame size")
        print(f"{name}: {np.mean([len(gpu.detect(image)) for _, image in frames]):.1f} detections per frame")
    print("ALL OK" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
