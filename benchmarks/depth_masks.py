"""How much an instance mask improves a detection's 3D position, on the synthetic depth scenes (`tools/depth_scenes`):
the positions stage (`pipeline/depth.locate`) given each object's true box, once from the box's inner part and once
from its mask (its visible pixels), against its true position; objects drawn as discs filling their box (the
scenes of `eval --depth`) and as thin bars along the box's diagonal (a pole, a cable, a branch: the box mostly the
ground behind).

    .venv/bin/python benchmarks/depth_masks.py --scenes 20 [--size 1920x1080] [--min-size 12] [--json out.json]

Prints, per shape and way, the objects located and the median / 95th percentile of |p - p_true| / |p_true|
(objects of at least `--min-size` px, the longer side of the box). The masks are the truth's: this measures the
positions stage with a mask, not a segmentation model's masks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from tiled_detector.pipeline.depth import DepthImage, RowMasks, locate
from tiled_detector.tools.worlds.depth_scenes import make_depth_scene


def _masks(scene, boxes: np.ndarray) -> RowMasks:
    """Each object's visible pixels within its box (label pixels = frame pixels)."""
    height, width = scene.depth.shape
    label = np.stack(
        [np.ceil(boxes[:, 0]), np.ceil(boxes[:, 1]), np.ceil(boxes[:, 2]), np.ceil(boxes[:, 3])], 1
    ).astype(np.int64)
    label = np.minimum(np.maximum(label, 0), [width, height, width, height])
    bits, starts, at = [], [], 0
    for k, (x0, y0, x1, y1) in enumerate(label.tolist()):
        crop = scene.mask(k)[y0:y1, x0:x1]
        starts.append(at)
        bits.append(crop.reshape(-1))
        at += crop.size
    return RowMasks(
        torch.from_numpy(label), torch.tensor(starts), torch.from_numpy(np.concatenate(bits)), 1.0
    )


def errors(shape: str, scenes: int, size: tuple[int, int], min_size: float) -> dict[str, list[float]]:
    """Relative position errors of the objects of `scenes` scenes of `shape`, by way (box, mask), NaN: none."""
    found: dict[str, list[float]] = {"box": [], "mask": []}
    for seed in range(scenes):
        scene = make_depth_scene(1000 + seed, *size, shape=shape)
        boxes = scene.scene.boxes.astype(np.float32)
        big = (boxes[:, 2:] - boxes[:, :2]).max(axis=1) >= min_size
        rows = torch.zeros((len(boxes), 8))
        rows[:, :4], rows[:, 6] = torch.from_numpy(boxes), 1.0
        image = DepthImage(torch.from_numpy(scene.depth), scene.camera)
        for way, masks in (("box", None), ("mask", _masks(scene, boxes))):
            located = locate(rows, [size[::-1]], [image], 0.001, 0.1, 65.0, masks=masks).numpy()
            error = np.linalg.norm(located[:, :3] - scene.positions, axis=1) / np.linalg.norm(
                scene.positions, axis=1
            )
            found[way] += np.where(located[:, 6] > 0, error, np.nan)[big].tolist()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenes", type=int, default=20)
    parser.add_argument("--size", default="1920x1080")
    parser.add_argument("--min-size", type=float, default=12.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    summary = {}
    for shape in ("disc", "bar"):
        for way, listed in errors(shape, args.scenes, size, args.min_size).items():
            values = np.asarray(listed)
            ok = values[np.isfinite(values)]
            row = {
                "objects": len(values),
                "located": len(ok),
                "median": float(np.median(ok)) if len(ok) else None,
                "p95": float(np.percentile(ok, 95)) if len(ok) else None,
                "within_5_percent": float(np.mean(values < 0.05)) if len(values) else None,
            }
            summary[f"{shape} {way}"] = row
            print(
                f"{shape:4} from the {way:4}: {row['located']}/{row['objects']} located, error median "
                f"{row['median']:.4f}, p95 {row['p95']:.4f}, {100 * row['within_5_percent']:.1f} % within 5 %"
            )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
