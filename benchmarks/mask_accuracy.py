"""Mask AP (pycocotools `segm`) of our full-frame view, our tiles + full view, and SAHI 0.12.8's sliced prediction
(its `UltralyticsDetectionModel` on the same ONNX file: ultralytics' own pre- and post-processing per slice, its
masks turned into polygons, shifted and merged), and the time each takes per frame on this CPU, on photos with mask
truth (a COCO file with segmentations).

    PYTHONPATH=src /work/venvs/ultra/bin/python benchmarks/mask_accuracy.py \
        --model ../shared/models/yolov8n-seg_int8.onnx --photos DIR --truth coco.json \
        --site .venv/lib/python3.11/site-packages [--map sofa=couch ...] [--mosaic 3840x2160] [--json out.json]

`--mosaic WxH` places the photos (each at `--photo-scale`) side by side on a grey frame of that size, their truth
moved with them, one frame per mosaic size: small objects in a large frame, from real photos and real masks.
SAHI and ultralytics are no dependencies: run it with the python of a venv that has them (and torchvision, which
ultralytics' predictor needs, built for its torch), `src` on PYTHONPATH, and the project venv's site-packages given as
`--site`: appended to the path, for what the package needs and that venv lacks (scipy).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

VOC_TO_COCO = {
    "aeroplane": "airplane",
    "diningtable": "dining table",
    "motorbike": "motorcycle",
    "sofa": "couch",
    "tv/monitor": "tv",
    "tvmonitor": "tv",
}


def truth_photos(folder: Path, truth: Path, mapping: dict[str, str]) -> list[dict[str, Any]]:
    """Each COCO image of `truth` found in `folder`: its pixels (RGB) and objects (box, COCO class, RLE)."""
    from tiled_detector.models import coco_labels
    from tiled_detector.tools.segmentation import truth_rle

    data = json.loads(truth.read_text())
    names = coco_labels()
    categories = {
        c["id"]: mapping.get(c["name"], VOC_TO_COCO.get(c["name"], c["name"])) for c in data["categories"]
    }
    photos = []
    for image in data["images"]:
        path = folder / Path(image["file_name"]).name
        pixels = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
        objects = []
        for a in data["annotations"]:
            if a["image_id"] != image["id"] or a.get("iscrowd") or categories[a["category_id"]] not in names:
                continue
            rle = truth_rle(a["segmentation"], pixels.shape[:2], f"{truth}: annotation {a['id']}")
            x, y, w, h = a["bbox"]
            objects.append(([x, y, x + w, y + h], names.index(categories[a["category_id"]]), rle))
        photos.append({"name": path.name, "image": pixels, "objects": objects})
    return photos


def mosaic(photos: list[dict[str, Any]], size: tuple[int, int], scale: float) -> dict[str, Any]:
    """The photos at `scale` side by side (rows, 16 px apart) on a grey (width, height) frame, truth moved along."""
    from tiled_detector.tools.segmentation import crop_rle, rle_masks

    width, height = size
    frame = np.full((height, width, 3), 114, np.uint8)
    objects, x, y, row = [], 16, 16, 0
    for photo in photos:
        h, w = (round(v * scale) for v in photo["image"].shape[:2])
        if x + w > width:
            x, y, row = 16, y + row + 16, 0
        if y + h > height:
            raise ValueError(f"the photos at scale {scale} do not fit a {width}x{height} mosaic")
        frame[y : y + h, x : x + w] = cv2.resize(photo["image"], (w, h), interpolation=cv2.INTER_AREA)
        for box, cls, rle in photo["objects"]:
            small = (
                cv2.resize(rle_masks([rle])[0].astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST) > 0
            )
            moved = [box[0] * scale + x, box[1] * scale + y, box[2] * scale + x, box[3] * scale + y]
            objects.append((moved, cls, crop_rle(small, (x, y), (height, width))))
        x, row = x + w + 16, max(row, h)
    return {"name": f"mosaic {width}x{height}", "image": frame, "objects": objects}


def sahi_masks(predictions: list[Any], frame_hw: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """SAHI's object predictions as (boxes, scores, class ids, RLEs) in frame pixels."""
    from tiled_detector.tools.segmentation import crop_rle

    boxes, scores, classes, rles = [], [], [], []
    for p in predictions:
        boxes.append(p.bbox.to_xyxy())
        scores.append(p.score.value)
        classes.append(p.category.id)
        if p.mask is not None:
            mask = np.asarray(p.mask.bool_mask, bool)
            full = np.zeros(frame_hw, bool)
            full[: mask.shape[0], : mask.shape[1]] = mask[: frame_hw[0], : frame_hw[1]]
            ys, xs = np.nonzero(full)
            at = (int(xs.min()), int(ys.min())) if len(xs) else (0, 0)
            crop = full[at[1] : int(ys.max()) + 1, at[0] : int(xs.max()) + 1] if len(xs) else full[:0, :0]
            rles.append(crop_rle(crop, at, frame_hw))
        else:
            rles.append(crop_rle(np.zeros((0, 0), bool), (0, 0), frame_hw))
    return np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores), np.asarray(classes), rles


def main() -> None:
    from tiled_detector.runtime.threads import short_spin

    short_spin()  # as the CLI: idle torch threads yield soon (before torch loads)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--truth", type=Path, required=True, help="COCO file with segmentations")
    parser.add_argument("--site", type=Path, help="site-packages appended to the path (the project venv's)")
    parser.add_argument("--map", nargs="*", default=[], help="truth category=COCO name")
    parser.add_argument("--mosaic", nargs="*", default=[], help="WxH frames composed of the photos")
    parser.add_argument("--photo-scale", type=float, default=1.0)
    parser.add_argument("--tile", type=int, default=320)
    parser.add_argument("--overlap", type=float, default=0.2)
    parser.add_argument(
        "--conf", type=float, default=0.05, help="score threshold (low: AP needs the ranking)"
    )
    parser.add_argument("--runs", type=int, default=2, help="timed runs per frame (the first is a warm-up)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.site:
        sys.path.append(str(args.site))
    from sahi import AutoDetectionModel
    from sahi.predict import get_sliced_prediction

    from tiled_detector import TiledDetector
    from tiled_detector.tools.scoring import coco_mask_stats
    from tiled_detector.tools.segmentation import detection_rles

    mapping = dict(item.split("=", 1) for item in args.map)
    photos = truth_photos(args.photos, args.truth, mapping)
    frames = (
        [mosaic(photos, tuple(int(v) for v in m.split("x")), args.photo_scale) for m in args.mosaic]
        if args.mosaic
        else photos
    )
    tiled = TiledDetector(
        args.model, tile_size=(args.tile, args.tile), overlap=args.overlap, conf_threshold=args.conf
    )
    sahi = AutoDetectionModel.from_pretrained(
        model_type="ultralytics",
        model_path=str(args.model),
        confidence_threshold=args.conf,
        device="cpu",
        image_size=args.tile,
    )
    truth = [
        (
            np.array([o[0] for o in f["objects"]], np.float64).reshape(-1, 4),
            np.array([o[1] for o in f["objects"]], np.int64),
            [o[2] for o in f["objects"]],
            f["image"].shape[:2],
        )
        for f in frames
    ]

    def sliced(image: np.ndarray) -> list[Any]:
        return get_sliced_prediction(
            image,
            sahi,
            slice_height=args.tile,
            slice_width=args.tile,
            overlap_height_ratio=args.overlap,
            overlap_width_ratio=args.overlap,
            verbose=0,
        ).object_prediction_list

    results: dict[str, list[Any]] = {"full view": [], "tiles + full view": [], "SAHI sliced": []}
    times: dict[str, list[float]] = {name: [] for name in results}
    for frame in frames:
        image = frame["image"]
        height, width = image.shape[:2]
        full = tiled.with_config(tile_size=(width, height), full_frame=False)
        runs = {
            "full view": lambda f=full, i=image: f.detect(i),
            "tiles + full view": lambda i=image: tiled.detect(i),
            "SAHI sliced": lambda i=image: sliced(i),
        }
        for name, run in runs.items():
            for attempt in range(args.runs):
                start = time.perf_counter()
                found = run()
                if attempt:
                    times[name].append(time.perf_counter() - start)
            if name == "SAHI sliced":
                results[name].append(sahi_masks(found, (height, width)))
            else:
                results[name].append(
                    (found.boxes, found.scores, found.class_ids, detection_rles(found.masks, len(found)))
                )
        print(
            f"{frame['name']}: {len(frame['objects'])} objects; "
            + ", ".join(f"{n} {len(r[-1][0])} detections, {times[n][-1]:.2f} s" for n, r in results.items())
        )
    summary = {}
    for name, found in results.items():
        stats = coco_mask_stats(truth, found)
        summary[name] = {
            "mask_AP": None if stats is None else float(stats[0]),
            "mask_AP50": None if stats is None else float(stats[1]),
            "seconds_per_frame": float(np.mean(times[name])),
        }
        s = summary[name]
        ap = "n/a" if s["mask_AP"] is None else f"{s['mask_AP']:.3f}, AP50 {s['mask_AP50']:.3f}"
        print(f"{name}: mask AP {ap}, {s['seconds_per_frame']:.2f} s a frame")
    ratio = summary["tiles + full view"]["seconds_per_frame"] / summary["SAHI sliced"]["seconds_per_frame"]
    print(f"tiles + full view take {ratio:.2f} of SAHI's time")
    if args.json:
        args.json.write_text(
            json.dumps({"frames": len(frames), "objects": sum(len(t[1]) for t in truth), **summary})
        )


if __name__ == "__main__":
    main()
