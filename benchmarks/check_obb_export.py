"""Check ultralytics' own OBB exports (YOLOv8n-obb, YOLO11n-obb, YOLO26n-obb raw and end-to-end) in our pipeline.

Two steps, in two environments (ultralytics is no dependency of this project):

1. `export`, in a venv with ultralytics (here /work/venvs/ultra; offline):

       YOLO_OFFLINE=1 YOLO_CONFIG_DIR=/tmp/ulcfg /work/venvs/ultra/bin/python benchmarks/check_obb_export.py \\
           export --out /tmp/obbwork

   builds each model from its yaml (random weights, the convs re-initialised variance-preserving as in
   `check_ultralytics_export.py`, so that scores and angles vary per anchor), exports ONNX (batch 1, as written)
   and TorchScript, and saves per model the input image, its PyTorch head output and ultralytics' own OBB
   post-processing of it (`non_max_suppression(..., rotated=True)`: rotated NMS by `batch_probiou` at IoU 0.7,
   then `regularize_rboxes`; end-to-end rows: its confidence filter only).

2. `check`, in the project venv: `.venv/bin/python benchmarks/check_obb_export.py check --out /tmp/obbwork`
   loads every file with no option (the layout from the metadata), runs the engine on the saved image, decodes
   (`decode_padded`), maps to the frame and merges as the frame program does (`postprocess`, nms / iou 0.7 on
   exact polygons, its full-frame view alone) and compares with ultralytics' rows: boxes within 1 px, angles
   within 0.01 rad modulo pi, scores within 0.01. ultralytics suppresses by probabilistic IoU, we by polygon IoU:
   rows kept by one and not the other are counted (they differ only where the two measures fall on either side
   of 0.7); every ultralytics row must have its match among our candidates. Prints PASS / FAIL per check.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

MODELS = (
    "yolov8n-obb",
    "yolo11n-obb",
    "yolo26n-obb-e2e",
    "yolo26n-obb",
)  # (e2e first: both write yolo26n-obb.*)
IOU, CONF, SIZE = 0.7, 0.01, 640


def export(out: Path, seed: int) -> None:
    import torch
    from torch import nn
    from ultralytics import YOLO
    from ultralytics.utils.nms import non_max_suppression
    from ultralytics.utils.ops import regularize_rboxes

    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)
    for name in MODELS:
        torch.manual_seed(seed)
        model = YOLO(name.replace("-e2e", "") + ".yaml", task="obb")
        net = model.model.eval()
        head = net.model[-1]
        dfl = getattr(getattr(head, "dfl", None), "conv", None)
        convs = [m for m in net.modules() if isinstance(m, nn.Conv2d) and m is not dfl]
        class_convs = [seq[-1] for seq in head.cv3]  # their bias prior kept: scores stay low, as untrained

        def unit_std(module: nn.Conv2d, inputs: object, output: torch.Tensor) -> torch.Tensor:
            scale = output.std().clamp_min(1e-6)
            module.weight.data /= scale
            if module.bias is not None:
                module.bias.data /= scale
            return output / scale

        for conv in convs:
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
        hooks = [c.register_forward_hook(unit_std) for c in convs if c not in class_convs]
        with torch.no_grad():
            net(torch.rand(1, 3, SIZE, SIZE))
        for hook in hooks:
            hook.remove()
        end2end = name.endswith("-e2e")
        head.end2end = end2end
        image = torch.rand(1, 3, SIZE, SIZE)
        with torch.no_grad():
            raw = net(image)
            raw = raw[0] if isinstance(raw, (list, tuple)) else raw
        if end2end:  # (1, K, 7) cx, cy, w, h, score, class, angle: its confidence filter
            rows = raw[0][raw[0, :, 4] > CONF]
            rboxes = regularize_rboxes(torch.cat([rows[:, :4], rows[:, 6:7]], 1))
            ref = torch.cat([rboxes, rows[:, 4:6]], 1)
        else:
            kept = non_max_suppression(
                raw.clone(), CONF, IOU, nc=raw.shape[1] - 5, rotated=True, max_det=300
            )[0]
            rboxes = regularize_rboxes(torch.cat([kept[:, :4], kept[:, -1:]], 1))
            ref = torch.cat([rboxes, kept[:, 4:6]], 1)  # cx, cy, w, h, angle, score, class
        np.savez(out / f"{name}.npz", image=image.numpy(), raw=raw.numpy(), ref=ref.numpy())
        for fmt in ("onnx", "torchscript"):
            written = Path(model.export(format=fmt, imgsz=SIZE, batch=1, nms=False if end2end else None))
            written.replace(out / f"{name}.{'onnx' if fmt == 'onnx' else 'torchscript'}")
        print(f"{name}: head {tuple(raw.shape)}, ultralytics rows {len(ref)}")


def _same_box(a: np.ndarray, b: np.ndarray) -> bool:
    """Rotated boxes equal within the targets: centre and sides within 1 px, the angle within 0.01 rad modulo pi
    (w and h swapped with the angle moved by pi/2: the same rectangle)."""
    for w, h, turn in ((b[2], b[3], 0.0), (b[3], b[2], math.pi / 2)):
        d = (a[4] - b[4] - turn) % math.pi
        if (
            np.abs(a[:2] - b[:2]).max() <= 1
            and abs(a[2] - w) <= 1
            and abs(a[3] - h) <= 1
            and min(d, math.pi - d) <= 0.01
        ):
            return True
    return False


def check(out: Path) -> bool:
    import torch

    from tiled_detector.detector import TiledDetector
    from tiled_detector.pipeline.decode import decode_padded
    from tiled_detector.pipeline.postprocess import COLUMNS, OBB_COLUMNS, postprocess
    from tiled_detector.pipeline.tiling import batch_plan, make_plan

    failed = []
    for name in MODELS:
        data = np.load(out / f"{name}.npz")
        ref = data["ref"]
        for ext, backend in (("onnx", "onnxruntime"), ("torchscript", "torch")):
            detector = TiledDetector(
                out / f"{name}.{ext}",
                backend=backend,
                device="cpu",
                conf_threshold=CONF,
                merge_threshold=IOU,
                match_metric="iou",
                top_k=300,
                max_detections=300,
            )
            engine = detector.engine
            outputs = engine.infer(torch.from_numpy(data["image"]).to(engine.input.dtype))
            raw = next(iter(outputs.values())).float()
            head_d = float(np.abs(raw.numpy() - data["raw"]).max())
            plan = batch_plan([make_plan((SIZE, SIZE), (SIZE, SIZE), 0.0, (SIZE, SIZE), True)])
            settings = detector.frame_settings
            found = decode_padded(
                outputs, detector.resolved.layout, CONF, 300, None, detector.resolved.num_classes
            )
            found = found._replace(image_index=torch.full_like(found.image_index, plan.batch_size - 1))
            rows = postprocess(found, plan, settings, None).numpy()[:-1]
            rows = rows[rows[:, 6] > 0]
            ours = np.concatenate([rows[:, COLUMNS : COLUMNS + OBB_COLUMNS], rows[:, 4:6]], 1)
            candidates = decode_padded(
                outputs, detector.resolved.layout, CONF, 8400, None, detector.resolved.num_classes
            )
            cand = candidates.boxes[candidates.valid].numpy()
            found_all = all(any(_same_box(c, r[:5]) for c in cand) for r in ref) if len(ref) else True
            matched = [
                any(_same_box(o[:5], r[:5]) and abs(o[5] - r[5]) <= 0.01 and o[6] == r[6] for o in ours)
                for r in ref
            ]
            ok = found_all and head_d < 1e-2
            print(
                f"{'PASS' if ok else 'FAIL'}  {name}.{ext}: layout {detector.resolved.layout.value} "
                f"({detector.resolved.decided_by}), head vs PyTorch max |d| {head_d:.1e}; ultralytics rows "
                f"{len(ref)}, ours {len(ours)}, equal (1 px, 0.01 rad, 0.01) {sum(matched)}; every ultralytics row "
                f"among our candidates: {found_all}"
            )
            if not ok:
                failed.append(f"{name}.{ext}")
    print("ALL PASS" if not failed else f"FAILED: {failed}")
    return not failed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("step", choices=["export", "check"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/obbwork"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.step == "export":
        export(args.out.resolve(), args.seed)
        return 0
    return 0 if check(args.out.resolve()) else 1


if __name__ == "__main__":
    sys.exit(main())
