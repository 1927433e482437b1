"""Tracking rotated objects: the same detections of a moving, turning synthetic scene tracked by their rotated boxes
(the tracker as the node runs it for an OBB model: association by polygon IoU, the angle kept) and by their
axis-aligned hulls (what a tracker that knows no angle gets).

The scene is `rotated_scenes.make_rotated_sequence` (boats, cars, trucks driving forward while turning, entering
and leaving, passing over each other; a still camera). Each frame goes once through the detector (tiles + full view,
as configured); its detections feed two `Tracks` (the stream's tracker, 30 Hz stamps): `rotated=True` on their
rotated boxes, `rotated=False` on their hulls. IDF1, MOTA and identity switches (py-motmetrics): the rotated
tracks against the rotated truth by polygon IoU and, like the hull tracks, their hulls against the truth's hulls by
box IoU (the same geometry for both: only the association differs).

    .venv/bin/python benchmarks/obb_tracking.py --frames 60 --size 1920x1080 [--model obb.onnx] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from tiled_detector import TiledDetector, polygons
from tiled_detector.models import obb_model_path
from tiled_detector.tools.scoring import box_iou, dota_ap50, mot_metrics, rotated_iou
from tiled_detector.tools.worlds.rotated_scenes import make_rotated_sequence
from tiled_detector.tracking.tracks import Tracks
from tiled_detector.types import Detections

FRAME_NS = 33_333_333


def hulls(obb: np.ndarray) -> np.ndarray:
    return polygons.hulls(polygons.corners(np.asarray(obb, np.float64).reshape(-1, 5))).reshape(-1, 4)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="a rotated-box model (default: the bundled one)")
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--size", default="1920x1080", help="WIDTHxHEIGHT (default 1920x1080)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="track the true rotated boxes themselves (score 0.9) instead of the model's detections: association alone",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    detector = TiledDetector(args.model or obb_model_path(), conf_threshold=args.conf)
    if not detector.rotated:
        raise SystemExit(f"{detector.config.model} is not a rotated-box model")
    settings = detector.config.tracker_settings()
    by_angle, by_hull = Tracks(settings, rotated=True), Tracks(settings, rotated=False)
    truth, found = [], []
    tracked: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {
        "rotated": [],
        "rotated_hulls": [],
        "hulls": [],
    }
    for index, scene in enumerate(make_rotated_sequence(args.seed, args.frames, width, height)):
        if args.oracle:
            detections = Detections(
                hulls(scene.obb).astype(np.float32),
                np.full(len(scene.obb), 0.9, np.float32),
                scene.class_ids,
                obb=scene.obb,
            )
        else:
            detections = detector.detect(scene.image)
        stamp = index * FRAME_NS
        turned = by_angle.update(stamp, detections)
        upright = by_hull.update(stamp, Detections(detections.boxes, detections.scores, detections.class_ids))
        truth.append((scene.obb, scene.class_ids, scene.ids))
        found.append((detections.obb, detections.scores, detections.class_ids))
        tracked["rotated"].append((turned.obb, turned.track_ids))
        tracked["rotated_hulls"].append((turned.boxes, turned.track_ids))
        tracked["hulls"].append((upright.boxes, upright.track_ids))
        print(
            f"frame {index + 1}/{args.frames}: {len(scene.obb)} objects, {len(detections)} detections",
            flush=True,
        )
    ap50 = dota_ap50(found, [(obb, classes) for obb, classes, _ in truth])["mAP50"]
    results = {
        "rotated tracks (polygon IoU)": mot_metrics(
            [(o, i) for o, _, i in truth], tracked["rotated"], overlap_of=rotated_iou
        ),
        "rotated tracks (their hulls)": mot_metrics(
            [(hulls(o), i) for o, _, i in truth], tracked["rotated_hulls"], overlap_of=box_iou
        ),
        "hull tracks": mot_metrics(
            [(hulls(o), i) for o, _, i in truth], tracked["hulls"], overlap_of=box_iou
        ),
    }
    print(f"detections: DOTA AP50 {ap50:.3f} over {args.frames} frames of {width}x{height}")
    for name, row in results.items():
        print(f"{name}: IDF1 {row['IDF1']:.3f}, MOTA {row['MOTA']:.3f}, id switches {row['id_switches']}")
    if args.json:
        source = "oracle" if args.oracle else str(detector.config.model)
        print(
            json.dumps(
                {
                    "detections": source,
                    "frames": args.frames,
                    "size": args.size,
                    "AP50": ap50,
                    "tracking": results,
                }
            )
        )


if __name__ == "__main__":
    main()
