"""Instance masks in COCO's forms (pycocotools): a detection's mask as run-length encoding in frame pixels (`detect
--json`, mask AP), and ground-truth segmentations (polygons or RLE, as COCO files hold them) checked and encoded.

COCO's RLE runs down the columns of the whole image (column-major), starting with a run of zeros; pycocotools'
`mask.encode` compresses the counts into a string. A detection's mask is known only inside its box, so its runs are
made from the box's columns (the zeros above, inside and below it) and handed to pycocotools to compress: no
full-frame image per detection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tiled_detector.types import InstanceMasks


def frame_crop(masks: InstanceMasks, k: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Detection k's mask in frame pixels: its crop (h, w) bool and the crop's top-left (x, y). A mask made at
    `mask_scale` below 1 is resampled to the frame's pixels (nearest: frame pixel X is label pixel floor(X x
    scale))."""
    crop = masks.crop(k)
    x0, y0, x1, y1 = (int(v) for v in masks.boxes[k])
    if masks.scale == 1.0 or crop.size == 0:
        return crop, (x0, y0)
    height, width = masks.frame_hw
    scale = masks.scale
    xs = np.arange(int(np.floor(x0 / scale)), min(int(np.ceil(x1 / scale)), width))
    ys = np.arange(int(np.floor(y0 / scale)), min(int(np.ceil(y1 / scale)), height))
    cols, rows = np.floor(xs * scale).astype(np.int64) - x0, np.floor(ys * scale).astype(np.int64) - y0
    xs, cols = xs[(cols >= 0) & (cols < crop.shape[1])], cols[(cols >= 0) & (cols < crop.shape[1])]
    ys, rows = ys[(rows >= 0) & (rows < crop.shape[0])], rows[(rows >= 0) & (rows < crop.shape[0])]
    if not len(xs) or not len(ys):
        return np.zeros((0, 0), bool), (0, 0)
    return crop[np.ix_(rows, cols)], (int(xs[0]), int(ys[0]))


def crop_rle(crop: np.ndarray, at: tuple[int, int], frame_hw: tuple[int, int]) -> dict[str, Any]:
    """COCO's compressed RLE ({"size": [height, width], "counts": str}, as pycocotools' `mask.encode` writes it)
    of a frame that is 0 except `crop` (bool) placed with its top-left at `at` (x, y)."""
    from pycocotools import mask as coco_mask

    height, width = frame_hw
    x, y = at
    wide = crop.shape[1]
    columns = np.zeros((wide, height), np.uint8)  # the crop's columns, whole height, column-major order
    if crop.size:
        columns[:, y : y + crop.shape[0]] = crop.T
    flat = columns.reshape(-1)
    counts: list[int] = []
    if flat.size:
        change = np.flatnonzero(np.diff(flat)) + 1
        edges = np.concatenate([[0], change, [flat.size]])
        runs = np.diff(edges).tolist()
        if flat[0]:
            runs = [0, *runs]
        counts = runs
    before, after = x * height, (width - x - wide) * height
    if not counts:
        counts = [before + after]
    else:
        counts[0] += before
        if len(counts) % 2:  # the last run is zeros
            counts[-1] += after
        elif after:
            counts.append(after)
    encoded = coco_mask.frPyObjects({"size": [height, width], "counts": counts}, height, width)
    return {"size": [height, width], "counts": encoded["counts"].decode("ascii")}


def detection_rle(masks: InstanceMasks, k: int) -> dict[str, Any]:
    """Detection k's mask as COCO RLE in frame pixels."""
    crop, at = frame_crop(masks, k)
    return crop_rle(crop, at, masks.frame_hw)


def detection_rles(masks: InstanceMasks | None, count: int) -> list[dict[str, Any] | None]:
    """Every detection's RLE (None without masks)."""
    return [None] * count if masks is None else [detection_rle(masks, k) for k in range(count)]


class SegmentationError(ValueError):
    """A ground-truth segmentation that is not one COCO accepts; the text names where and why."""


def truth_rle(segmentation: Any, frame_hw: tuple[int, int], where: str) -> dict[str, Any]:
    """A COCO annotation's `segmentation` (polygons [[x, y, ...], ...], uncompressed RLE {"size", "counts": [...]}
    or compressed RLE {"size", "counts": str}) as compressed RLE of a `frame_hw` frame; SegmentationError naming
    `where` (file, annotation) for a polygon of fewer than 3 points, an odd or non-numeric coordinate list, or an
    RLE of another size or whose counts do not add up to it."""
    from pycocotools import mask as coco_mask

    height, width = frame_hw
    if isinstance(segmentation, list):
        polygons = segmentation
        if not polygons:
            raise SegmentationError(f"{where}: an empty polygon list")
        for number, polygon in enumerate(polygons, start=1):
            if not isinstance(polygon, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) for v in polygon
            ):
                raise SegmentationError(f"{where}: polygon {number} is not a list of numbers")
            if len(polygon) % 2 or len(polygon) < 6:
                raise SegmentationError(
                    f"{where}: polygon {number} has {len(polygon)} coordinates; a polygon needs x, y pairs of at "
                    "least 3 points"
                )
        merged = coco_mask.merge(coco_mask.frPyObjects(polygons, height, width))
        return {"size": [height, width], "counts": merged["counts"].decode("ascii")}
    if isinstance(segmentation, dict) and "counts" in segmentation and "size" in segmentation:
        size = list(segmentation["size"])
        if size != [height, width]:
            raise SegmentationError(f"{where}: an RLE of size {size}, but the image is {[height, width]}")
        counts = segmentation["counts"]
        if isinstance(counts, list):
            if not all(isinstance(c, int) and c >= 0 for c in counts) or sum(counts) != height * width:
                raise SegmentationError(
                    f"{where}: uncompressed RLE counts must be non-negative integers adding up to {height * width}"
                )
            counts = coco_mask.frPyObjects(segmentation, height, width)["counts"]
        elif isinstance(counts, str):
            counts = counts.encode("ascii")
        else:
            raise SegmentationError(f"{where}: RLE counts must be a string or a list of integers")
        rle = {"size": [height, width], "counts": counts}
        try:
            if int(coco_mask.area(rle)) > height * width:
                raise ValueError("area beyond the image")
            coco_mask.decode(rle)
        except Exception as error:
            raise SegmentationError(f"{where}: a compressed RLE that does not decode ({error})") from None
        return {"size": [height, width], "counts": rle["counts"].decode("ascii")}
    raise SegmentationError(
        f"{where}: a segmentation must be polygons or RLE, got {type(segmentation).__name__}"
    )


def rle_masks(rles: Sequence[dict[str, Any]]) -> np.ndarray:
    """Compressed RLEs (of one frame size) decoded: (N, h, w) bool."""
    from pycocotools import mask as coco_mask

    if not rles:
        return np.zeros((0, 0, 0), bool)
    decoded = coco_mask.decode([{"size": r["size"], "counts": r["counts"].encode("ascii")} for r in rles])
    return np.moveaxis(decoded, 2, 0).astype(bool)
