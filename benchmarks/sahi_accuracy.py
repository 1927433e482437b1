"""AP50 of our full-frame view and of our tiles + full frame against SAHI's standard and sliced prediction, with the
same YOLOX weights (SAHI through `tools.peers.sahi_model`: YOLOX's own pre/post-processing on the same
engine), on real photos with COCO ground truth.

    PYTHONPATH=<sahi's site> .venv/bin/python benchmarks/sahi_accuracy.py --model yolox_nano.onnx \
        --photos DIR [--map human=person] [--tile 416] [--nms-rounds 1 2] [--out out/sahi_accuracy.json]

DIR holds images and COCO files `<image stem>_coco.json` (category names are COCO's or mapped by --map). Prints one
row per method and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tiled_detector import TiledDetector
from tiled_detector.models import coco_labels
from tiled_detector.tools.frames import read_image
from tiled_detector.tools.peers import sahi_model
from tiled_detector.tools.scoring import coco_ground_truth, coco_stats


def photos(folder: Path, mapping: dict[str, str]) -> list[tuple[Path, np.ndarray, np.ndarray]]:
    """(image, boxes xyxy, COCO class ids) of every image in `folder` with a `<stem>_coco.json`."""
    names = coco_labels()
    found = []
    for truth in sorted(folder.glob("*_coco.json")):
        data = json.loads(truth.read_text())
        categories = {c["id"]: names.index(mapping.get(c["name"], c["name"])) for c in data["categories"]}
        for image in data["images"]:
            rows = [a for a in data["annotations"] if a["image_id"] == image["id"]]
            boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in rows)], np.float32)
            found.append(
                (folder / image["file_name"], boxes, np.array([categories[a["category_id"]] for a in rows]))
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--map", nargs="*", default=["human=person"], help="ground-truth name=COCO name")
    parser.add_argument("--tile", type=int, default=416)
    parser.add_argument("--overlap", type=float, default=0.2)
    parser.add_argument(
        "--conf", type=float, default=0.01, help="score threshold (low: AP needs the ranking)"
    )
    parser.add_argument(
        "--nms-rounds",
        type=int,
        nargs="*",
        default=[],
        help="also ours with these nms_rounds (results change)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from sahi.predict import get_prediction, get_sliced_prediction

    mapping = dict(item.split("=", 1) for item in args.map)
    images = photos(args.photos, mapping)
    truth = coco_ground_truth([(b, c) for _, b, c in images], names=coco_labels())
    frames = [read_image(path) for path, _, _ in images]
    sahi = sahi_model(args.model, "yolox", coco_labels(), "cpu", args.conf)
    tiled = TiledDetector(
        args.model, tile_size=(args.tile, args.tile), overlap=args.overlap, conf_threshold=args.conf
    )

    def ours(full_only: bool, **changes: int) -> list[tuple[np.ndarray, ...]]:
        found = []
        for frame in frames:
            height, width = frame.image.shape[:2]
            detector = tiled.with_config(**changes)
            if full_only:
                detector = detector.with_config(tile_size=(width, height), full_frame=False)
            d = detector.detect(frame.image, frame.encoding)
            found.append((d.boxes, d.scores, d.class_ids))
        return found

    def peer(sliced: bool) -> list[tuple[np.ndarray, ...]]:
        found = []
        for frame in frames:
            rgb = np.ascontiguousarray(frame.image[..., ::-1]) if frame.encoding == "bgr8" else frame.image
            result = (
                get_sliced_prediction(rgb, sahi, args.tile, args.tile, args.overlap, args.overlap, verbose=0)
                if sliced
                else get_prediction(rgb, sahi)
            )
            preds = result.object_prediction_list
            found.append(
                (
                    np.array([p.bbox.to_xyxy() for p in preds], np.float32).reshape(-1, 4),
                    np.array([p.score.value for p in preds], np.float32),
                    np.array([p.category.id for p in preds], np.int64),
                )
            )
        return found

    methods = {
        "ours full frame": ours(True),
        "SAHI standard prediction": peer(False),
        "ours tiles + full frame": ours(False),
        "SAHI sliced prediction": peer(True),
        **{f"ours tiles + full frame, nms_rounds {r}": ours(False, nms_rounds=r) for r in args.nms_rounds},
    }
    report = {
        "model": str(args.model),
        "photos": [str(p) for p, _, _ in images],
        "objects": int(sum(len(b) for _, b, _ in images)),
        "tile": args.tile,
        "overlap": args.overlap,
    }
    for name, predictions in methods.items():
        stats = coco_stats(truth, predictions)
        report[name] = {
            "AP50": None if stats is None else round(float(stats[1]), 4),
            "AP": None if stats is None else round(float(stats[0]), 4),
        }
        print(f"{name:<44} AP50 {report[name]['AP50']}  AP {report[name]['AP']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
