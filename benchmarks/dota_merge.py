"""The merge on real aerial truth: ideal per-tile detections of DOTA scenes through `merge_detections`, merged as
rotated boxes and as their axis-aligned hulls.

Each image is cut into `--tile` px tiles (overlap `--overlap`, `plan_tiles`); every true polygon of its DOTA
labelTxt is clipped to every tile, and each part with an area becomes one detection in frame pixels: the part's
minimum-area rectangle, the object's class, score = the part's share of the object's area (a whole object scores
1, a sliver little). The detections of an image go through `merge_detections` with the default settings
(nms, ios, 0.5, class-aware) twice: as rotated boxes (N, 5), and as their axis-aligned hulls (N, 4: what SAHI
and supervision match on), the hull merge's kept detections scored by their rotated boxes. Scores: DOTA's AP50
(`tools.scoring.dota_ap50`: polygon IoU against the true polygons, difficult objects ignored), per scene and over
all of them.

    .venv/bin/python benchmarks/dota_merge.py --labels DOTA/labelTxt --images DOTA/images [--tile 256] [--json]

An image's size is read from `--images` (same stem); a label file without its image takes the extent of its
polygons (marked `size_from: labels`). Public DOTA samples: CAPTAIN-WHU/DOTA_devkit's `example/` (P0706 is a
harbour of 531 ships).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cv2
import numpy as np
import torch

from tiled_detector.pipeline.merge import merge_detections
from tiled_detector.pipeline.rotated import obb_hulls
from tiled_detector.pipeline.tiling import plan_tiles
from tiled_detector.tools.frames import IMAGE_SUFFIXES
from tiled_detector.tools.scores.rotated_truth import LabelFolder, min_area_boxes, read_dota
from tiled_detector.tools.scoring import dota_ap50


def class_names(labels: Path) -> list[str]:
    """Every class named in a folder of DOTA labelTxt files."""
    names = set()
    for path in labels.glob("*.txt"):
        names |= {line.split()[8] for line in path.read_text().splitlines() if len(line.split()) >= 9}
    return sorted(names)


def image_size(images: Path | None, stem: str, corners: np.ndarray) -> tuple[int, int, str]:
    """(width, height, where from) of an image: its file, else the extent of its polygons."""
    for suffix in sorted(IMAGE_SUFFIXES):
        path = images / f"{stem}{suffix}" if images else None
        if path is not None and path.is_file() and path.stat().st_size:
            image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            if image is not None:
                return image.shape[1], image.shape[0], "image"
    extent = np.ceil(corners.reshape(-1, 2).max(axis=0)) if len(corners) else (1, 1)
    return int(extent[0]), int(extent[1]), "labels"


def tile_parts(
    corners: np.ndarray, class_ids: np.ndarray, tiles: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ideal per-tile detections: each polygon clipped to each tile (module docstring) -> rotated boxes (N, 5),
    scores (N,), class ids (N,)."""
    polygons, scores, classes = [], [], []
    for polygon, cls in zip(corners.astype(np.float32), class_ids.tolist(), strict=True):
        hull = cv2.convexHull(polygon)
        area = cv2.contourArea(hull)
        lo, hi = polygon.min(axis=0), polygon.max(axis=0)
        near = (tiles[:, 0] < hi[0]) & (tiles[:, 2] > lo[0]) & (tiles[:, 1] < hi[1]) & (tiles[:, 3] > lo[1])
        for x1, y1, x2, y2 in tiles[near].astype(np.float32):
            rectangle = np.array([(x1, y1), (x2, y1), (x2, y2), (x1, y2)], np.float32)
            inside, part = cv2.intersectConvexConvex(hull, rectangle)
            if part is None or inside <= 0 or area <= 0:
                continue
            polygons.append(part.reshape(-1, 2))
            scores.append(min(inside / area, 1.0))
            classes.append(cls)
    return min_area_boxes(polygons), np.array(scores, np.float32), np.array(classes, np.int64)


def kept_rows(inputs: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Indices of the `kept` rows among `inputs` (nms keeps rows unchanged; equal rows are taken in turn)."""
    used = np.zeros(len(inputs), bool)
    found = []
    for row in kept:
        same = np.flatnonzero(~used & np.all(inputs == row, axis=1))
        used[same[0]] = True
        found.append(same[0])
    return np.array(found, np.int64)


def merges(obb: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> dict[str, tuple]:
    """The detections merged by `merge_detections` (default settings) as rotated boxes and as their hulls (the
    hull merge's kept rows, as rotated boxes)."""
    rotated = merge_detections(obb, scores, classes)
    hulls = obb_hulls(torch.from_numpy(obb)).numpy().reshape(-1, 4)
    rows = np.concatenate([hulls, scores[:, None], classes[:, None]], axis=1)
    merged = merge_detections(hulls, scores, classes)
    kept = kept_rows(rows, np.concatenate([merged[0], merged[1][:, None], merged[2][:, None]], axis=1))
    return {"rotated": rotated, "axis_aligned": (obb[kept], scores[kept], classes[kept])}


def scene(
    truth: LabelFolder, index: int, size: tuple[int, int], tile: int, overlap: float, names: list[str]
) -> tuple[dict, dict]:
    """One image's scores (every object; the objects that fit in a tile, their parts only) and, per subset, its
    merged detections and truth for the scores over every scene."""
    width, height = size
    # (the count of objects wholly outside the image: none in DOTA's labels)
    corners, class_ids, difficult, _ = truth.in_frame(index, width, height)
    fits = np.ptp(corners, axis=1).max(axis=1, initial=0.0) <= tile
    tiles = plan_tiles(height, width, tile, tile, overlap)
    found: dict = {
        "objects": int((~difficult).sum()),
        "difficult": int(difficult.sum()),
        "larger_than_tile": int((~fits).sum()),
        "tiles": len(tiles),
    }
    kept = {}
    for subset, mask in {"all": np.ones(len(corners), bool), "fits_tile": fits}.items():
        obb, scores, classes = tile_parts(corners[mask], class_ids[mask], tiles)
        reference = (corners[mask], class_ids[mask], difficult[mask])
        results = merges(obb, scores, classes)
        found[subset] = {"detections": len(obb)} | {
            merge: {"kept": len(r[0]), **_scores([r], [reference], names)} for merge, r in results.items()
        }
        kept[subset] = (results, reference)
    return found, kept


def _scores(predictions: list, truth: list, names: list[str]) -> dict:
    found = dota_ap50(predictions, truth)
    return {
        **{key: found[key] for key in ("mAP50", "recall", "true_positives", "false_positives")},
        "per_class": {names[int(k)]: v for k, v in found["per_class"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--labels", type=Path, required=True, help="a folder of DOTA labelTxt files")
    parser.add_argument("--images", type=Path, default=None, help="their images (for the sizes)")
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="STEM", help="these images only (default all)"
    )
    parser.add_argument("--tile", type=int, default=256, help="tile size in pixels (default 256)")
    parser.add_argument("--overlap", type=float, default=0.2, help="tile overlap ratio (default 0.2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    stems = args.only or sorted(p.stem for p in args.labels.glob("*.txt"))
    names = class_names(args.labels)
    truth = read_dota(args.labels, [f"{s}.png" for s in stems], names)
    results: dict = {}
    pooled: dict = {
        subset: {"rotated": ([], []), "axis_aligned": ([], [])} for subset in ("all", "fits_tile")
    }
    for index, stem in enumerate(stems):
        width, height, source = image_size(args.images, stem, truth.corners[truth.frame == index])
        found, kept = scene(truth, index, (width, height), args.tile, args.overlap, names)
        for subset, (merged, reference) in kept.items():
            for merge, detections in merged.items():
                pooled[subset][merge][0].append(detections)
                pooled[subset][merge][1].append(reference)
        results[stem] = {"size": f"{width}x{height}", "size_from": source, **found}
        print(
            f"{stem} {width}x{height} ({source}): {found['objects']} objects ({found['larger_than_tile']} larger "
            f"than a tile); AP50 rotated / hulls: every object {found['all']['rotated']['mAP50']:.3f} / "
            f"{found['all']['axis_aligned']['mAP50']:.3f}, those that fit a tile "
            f"{found['fits_tile']['rotated']['mAP50']:.3f} / {found['fits_tile']['axis_aligned']['mAP50']:.3f}",
            flush=True,
        )
    overall = {
        subset: {merge: _scores(*pair, names) for merge, pair in merged.items()}
        for subset, merged in pooled.items()
    }
    for subset, merged in overall.items():
        print(
            f"all scenes, {subset}: AP50 rotated {merged['rotated']['mAP50']:.3f}, "
            f"hulls {merged['axis_aligned']['mAP50']:.3f}; per class rotated "
            + ", ".join(f"{k} {v:.3f}" for k, v in merged["rotated"]["per_class"].items())
            + "; hulls "
            + ", ".join(f"{k} {v:.3f}" for k, v in merged["axis_aligned"]["per_class"].items())
        )
    if args.json:
        print(json.dumps({"tile": args.tile, "overlap": args.overlap, "scenes": results, "all": overall}))


if __name__ == "__main__":
    main()
