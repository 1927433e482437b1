"""Our full-frame view's instance masks against ultralytics' own mask post-processing of the same view: for each
kept detection, its coefficients and the view's prototypes (our engine's outputs) through ultralytics'
`ops.process_mask` + `ops.scale_masks` (its default `predict` path: masks at the input's size, then to the frame)
and `ops.process_mask_native` (`retina_masks=True`), compared with our mask by IoU, per object of at least
`--min-size` px (the shorter side of its box).

    PYTHONPATH=src /work/venvs/ultra/bin/python benchmarks/mask_reference.py \
        --model ../shared/models/yolov8n-seg_int8.onnx --site .venv/lib/python3.11/site-packages \
        --photos IMAGE... [--json out.json]

ultralytics is no dependency: run it with the python of a venv that has it, `src` on PYTHONPATH and the project
venv's site-packages as `--site` (appended to the path, for what the package needs and that venv lacks: scipy).
Prints, per photo and in all, the objects compared and the smallest / median / mean IoU against each reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def compare(detector: Any, image: np.ndarray, encoding: str, min_size: float) -> dict[str, list[float]]:
    """IoU of each kept detection's mask (of at least `min_size` px) with ultralytics' two post-processings."""
    from ultralytics.utils import ops

    from tiled_detector.pipeline.encodings import Encoding
    from tiled_detector.pipeline.postprocess import postprocess_rows
    from tiled_detector.pipeline.tiling import batch_plan

    found = detector.detect(image, encoding)
    height, width = image.shape[:2]
    plan = batch_plan([detector.plan_for(height, width)])
    tensor = torch.from_numpy(np.ascontiguousarray(image))
    candidates = detector._program.candidates(
        [tensor], [Encoding.from_value(encoding)], plan, detector.frame_settings
    )
    rows = postprocess_rows(candidates, plan, detector.frame_settings, None)
    kept = rows.packed[:-1, 6] > 0
    member = rows.members[kept, 0]
    boxes = rows.packed[:-1][kept, :4]
    assert np.allclose(boxes.numpy(), found.boxes, atol=1e-3), "the rows are not the detector's"
    protos = candidates.prototypes.values[0].float()
    coefficients = candidates.extra[member].float()
    input_boxes = candidates.boxes[member].float()  # model-input pixels of the full view
    input_hw = plan.plans[0].input_hw
    default = ops.process_mask(
        protos, coefficients, input_boxes, input_hw, upsample=True
    )  # (N, h, w) at input
    default = ops.scale_masks(default[None].float(), (height, width))[0] > 0.5
    native = ops.process_mask_native(protos, coefficients, boxes, (height, width)).bool()
    result: dict[str, list[float]] = {"process_mask+scale_masks": [], "process_mask_native": []}
    for k in range(len(found)):
        if (found.boxes[k, 2:] - found.boxes[k, :2]).min() < min_size:
            continue
        mine = found.masks.mask(k)
        result["process_mask+scale_masks"].append(_iou(mine, default[k].numpy()))
        result["process_mask_native"].append(_iou(mine, native[k].numpy()))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--site", type=Path, help="site-packages appended to the path (the project venv's)")
    parser.add_argument("--photos", type=Path, nargs="+", required=True)
    parser.add_argument("--min-size", type=float, default=32.0)
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.site:
        sys.path.append(str(args.site))
    from tiled_detector import TiledDetector
    from tiled_detector.tools.frames import read_image

    everything: dict[str, list[float]] = {}
    for path in args.photos:
        frame = read_image(path)
        height, width = frame.image.shape[:2]
        detector = TiledDetector(
            args.model, tile_size=(width, height), full_frame=False, conf_threshold=args.conf
        )
        found = compare(detector, frame.image, frame.encoding, args.min_size)
        for name, values in found.items():
            everything.setdefault(name, []).extend(values)
            if values:
                print(
                    f"{path.name}: {name}: {len(values)} objects, IoU min {min(values):.3f}, "
                    f"median {np.median(values):.3f}"
                )
    summary = {
        name: {
            "objects": len(v),
            "min": float(min(v)),
            "median": float(np.median(v)),
            "mean": float(np.mean(v)),
            "at_least_0.95": int(np.sum(np.asarray(v) >= 0.95)),
        }
        for name, v in everything.items()
        if v
    }
    for name, s in summary.items():
        print(
            f"all: {name}: {s['objects']} objects of >= {args.min_size:g} px, IoU min {s['min']:.3f}, median "
            f"{s['median']:.3f}, mean {s['mean']:.3f}, {s['at_least_0.95']} at >= 0.95"
        )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
