"""ultralytics OBB models with trained weights against our full-frame view: YOLOv8n-OBB, YOLO11n-OBB and
YOLO26n-OBB trained by ultralytics' own trainer on our synthetic rotated scenes, exported as ultralytics writes them
(ONNX, YOLO26's end-to-end ONNX, TorchScript), and ultralytics' own prediction of each file on real aerial images
compared with ours (the target: boxes within 1 px, angles within 0.01 rad modulo pi, scores within 0.01).

Three steps; ultralytics is no dependency of this project, so `train` runs where ultralytics is installed:

1. `dataset` (any venv that imports tiled_detector): an ultralytics OBB dataset of `rotated_scenes` crops,
   DIR/images/{train,val}/*.png, DIR/labels/{train,val}/*.txt (class, then the four corners normalised), DIR/data.yaml.

       .venv/bin/python benchmarks/obb_reference.py dataset --out /tmp/obbref/data --train 2000 --val 200

2. `train` (with ultralytics; offline: YOLO_OFFLINE=1): each model from its yaml (no pretrained weights), trained on
   the dataset (imgsz 640, amp off: no download for its check, plots off), exported (ONNX, not simplified
   unless --simplify: onnxslim may not be installed; YOLO26 also end-to-end, `nms=False`; TorchScript), and ultralytics' prediction of each export on each aerial image
   (`YOLO(file, task="obb").predict`, imgsz 640, --conf, iou 0.7) saved as reference.json: xywhr, score, class
   per detection, in image pixels.

       YOLO_OFFLINE=1 YOLO_CONFIG_DIR=/tmp/obbref/cfg /work/venvs/ultra/bin/python benchmarks/obb_reference.py \
           train --data /tmp/obbref/data --images AERIAL_DIR --out /tmp/obbref --device 0 --epochs 30

3. `check` (the project venv): our `TiledDetector` on each file with no layout flag, the full-frame view only (one
   tile the size of the image, letterboxed to 640), against reference.json: rows paired one to one (same class,
   nearest centre), with the differences' maxima. Judged (PASS when every row pairs within the target) with NMS
   at overlap 1.0 on both sides: every candidate, so decoding, letterbox, mapping and scores are compared, not the
   suppression rule; reported (NMS lines) at ultralytics' default 0.7, where ultralytics suppresses by ProbIoU and
   we by polygon IoU (our merge: nms, iou 0.7), so a pair near the threshold may be kept by one side only; the
   end-to-end file has no NMS. Exit 1 on a FAIL.

       .venv/bin/python benchmarks/obb_reference.py check --out /tmp/obbref --images AERIAL_DIR

AERIAL_DIR: real aerial images (DOTA samples: CAPTAIN-WHU/DOTA_devkit's example/images, open-mmlab/mmrotate's
demo/*.jpg and tests/data/images), fetched, never committed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODELS = ("yolov8n-obb", "yolo11n-obb", "yolo26n-obb")
# NMS overlaps of both predictions: 1.0 keeps every candidate (decoding, letterbox and scores compared: the
# target), 0.7 is ultralytics' default (reported: ultralytics suppresses by ProbIoU, we by polygon IoU, so pairs
# near the threshold may be kept by one and not the other)
IOUS = (1.0, 0.7)
MAX_DETECTIONS = 300  # ultralytics' max_det
MAX_CANDIDATES = 8400  # every anchor of a 640 x 640 input (ultralytics: up to 30000)
BOX_PX, ANGLE_RAD, SCORE = 1.0, 0.01, 0.01  # the target
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


def images_in(folder: Path) -> list[Path]:
    """The images of a folder (by name)."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.stat().st_size)


# ----------------------------------------------------------------------------------------------------------
# 1. the dataset


def write_dataset(
    out: Path,
    counts: tuple[int, int],
    size: int,
    seed: int,
    crop: Callable[[int, int], Any],
    rows: Callable[[Any], list[str]],
    names: Sequence[str],
    extra: str = "",
) -> None:
    """An ultralytics dataset of synthetic crops (`crop(seed, size)`): OUT/images/{train,val}/*.png, their label
    lines (`rows(scene)`) in OUT/labels/{train,val}/*.txt, OUT/data.yaml (class `names`, then the `extra` lines);
    `counts`: the train and val crops (also `pose_reference.py`'s)."""
    import cv2

    for split, count, offset in (("train", counts[0], 0), ("val", counts[1], 10**6)):
        (out / "images" / split).mkdir(parents=True, exist_ok=True)
        (out / "labels" / split).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            scene = crop(seed * 10**7 + offset + index, size)
            name = f"{split}_{index:05d}"
            cv2.imwrite(str(out / "images" / split / f"{name}.png"), scene.image[..., ::-1])
            (out / "labels" / split / f"{name}.txt").write_text("".join(f"{r}\n" for r in rows(scene)))
    listed = "\n".join(f"  {k}: {name}" for k, name in enumerate(names))
    (out / "data.yaml").write_text(
        f"path: {out.resolve()}\ntrain: images/train\nval: images/val\nnames:\n{listed}\n{extra}"
    )
    print(f"dataset: {counts[0]} + {counts[1]} crops of {size} px in {out}")


def dataset(out: Path, train: int, val: int, size: int, seed: int) -> None:
    from tiled_detector.geometry.polygons import corners
    from tiled_detector.tools.worlds.rotated_scenes import CLASSES, make_rotated_crop

    def rows(scene: Any) -> list[str]:
        """Class, then the four corners normalised."""
        points = corners(scene.obb.astype(np.float64)).reshape(-1, 8) / size
        return [
            f"{c} " + " ".join(f"{v:.6f}" for v in p) for c, p in zip(scene.class_ids, points, strict=True)
        ]

    write_dataset(out, (train, val), size, seed, make_rotated_crop, rows, CLASSES)


# ----------------------------------------------------------------------------------------------------------
# 2. training, export, ultralytics' predictions (needs ultralytics)


def exports(model_name: str, simplify: bool) -> dict[str, dict]:
    """The exports of a model: file tag -> YOLO.export arguments (ONNX `simplify` needs onnxslim, which ultralytics
    would otherwise try to download)."""
    found = {"onnx": {"format": "onnx", "simplify": simplify}, "torchscript": {"format": "torchscript"}}
    if model_name.startswith("yolo26"):  # the NMS-free one-to-one head
        found["end2end.onnx"] = {"format": "onnx", "simplify": simplify, "nms": False}
    return found


def train(args: argparse.Namespace) -> None:
    import shutil

    import ultralytics
    from ultralytics import YOLO

    out = args.out.resolve()
    reference: dict = {"ultralytics": ultralytics.__version__, "conf": args.conf, "files": {}}
    images = images_in(args.images)
    for model_name in args.models:
        weights = out / "runs" / model_name / "weights"
        best = next((weights / n for n in ("best.pt", "last.pt") if (weights / n).is_file()), None)
        if best is None or args.retrain:
            best = fit(model_name, args, out)
        trained = YOLO(str(best), task="obb")
        for tag, options in exports(model_name, args.simplify).items():
            written = Path(trained.export(imgsz=640, **options))
            target = out / f"{model_name}.{tag}"
            shutil.copyfile(written, target)
            reference["files"][target.name] = predictions(target, images, args.conf)
            counts = [len(r["score"]) for r in reference["files"][target.name].values()]
            print(f"{target.name}: ultralytics found {counts} objects on {len(images)} images", flush=True)
    (out / "reference.json").write_text(json.dumps(reference))
    print(f"wrote {out / 'reference.json'}")


def fit(model_name: str, args: argparse.Namespace, out: Path) -> Path:
    """Train `model_name` from its yaml on the dataset; the path of its best weights."""
    from ultralytics import YOLO

    model = YOLO(f"{model_name}.yaml", task="obb")
    model.train(
        data=str(args.data.resolve() / "data.yaml"),
        epochs=args.epochs,
        imgsz=640,
        batch=args.batch,
        device=args.device,
        workers=args.workers,
        pretrained=False,
        amp=False,
        plots=False,
        project=str(out / "runs"),
        name=model_name,
        exist_ok=True,
        seed=0,
        fraction=args.fraction,
    )
    return Path(model.trainer.best if Path(model.trainer.best).is_file() else model.trainer.last)


def predictions(model_file: Path, images: list[Path], conf: float) -> dict[str, dict]:
    """ultralytics' own prediction of `model_file` on each image at each NMS overlap of `IOUS`: xywhr, score, class
    per detection (keys "IOU/IMAGE")."""
    from ultralytics import YOLO

    model = YOLO(str(model_file), task="obb")
    found = {}
    for iou, image in ((iou, image) for iou in IOUS for image in images):
        result = model.predict(
            str(image), imgsz=640, conf=conf, iou=iou, max_det=MAX_DETECTIONS, verbose=False
        )[0]
        found[f"{iou}/{image.name}"] = {
            "xywhr": result.obb.xywhr.cpu().numpy().tolist(),
            "score": result.obb.conf.cpu().numpy().tolist(),
            "class": result.obb.cls.cpu().numpy().astype(int).tolist(),
        }
    return found


# ----------------------------------------------------------------------------------------------------------
# 3. the comparison (the project venv)


def angle_gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| modulo pi, in [0, pi/2]."""
    gap = np.mod(a - b, math.pi)
    return np.minimum(gap, math.pi - gap)


def same_form(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """`ours` (N, 5) written in the form of `theirs` (same w / h assignment: a quarter turn swaps them)."""
    swap = angle_gap(ours[:, 4], theirs[:, 4]) > math.pi / 4
    found = ours.copy()
    found[swap, 2], found[swap, 3] = ours[swap, 3], ours[swap, 2]
    found[swap, 4] = ours[swap, 4] + math.pi / 2
    return found


def paired(ours: tuple, theirs: dict) -> tuple[int, int, int, dict[str, float]]:
    """Pair ultralytics' rows with ours one to one (same class, nearest centre): (pairs, ours unpaired, theirs
    unpaired, maxima of |d box| px, |d angle| rad modulo pi, |d score|)."""
    from scipy.optimize import linear_sum_assignment

    obb, scores, classes = ours
    ref = np.asarray(theirs["xywhr"], np.float64).reshape(-1, 5)
    ref_scores, ref_classes = np.asarray(theirs["score"]), np.asarray(theirs["class"])
    distance = np.linalg.norm(obb[:, None, :2] - ref[None, :, :2], axis=2)
    distance[classes[:, None] != ref_classes[None, :]] = 1e9
    rows, cols = linear_sum_assignment(distance) if distance.size else (np.zeros(0, int), np.zeros(0, int))
    keep = distance[rows, cols] < 5 * BOX_PX
    rows, cols = rows[keep], cols[keep]
    ours_in_form = same_form(obb[rows], ref[cols])
    worst = {
        "box_px": float(np.abs(ours_in_form[:, :4] - ref[cols, :4]).max(initial=0.0)),
        "angle_rad": float(angle_gap(ours_in_form[:, 4], ref[cols, 4]).max(initial=0.0)),
        "score": float(np.abs(scores[rows] - ref_scores[cols]).max(initial=0.0)),
    }
    return len(rows), len(obb) - len(rows), len(ref) - len(rows), worst


def check(args: argparse.Namespace) -> bool:
    from tiled_detector import TiledDetector
    from tiled_detector.tools.frames import read_image

    reference = json.loads((args.out / "reference.json").read_text())
    print(f"ultralytics {reference['ultralytics']}, conf {reference['conf']}")
    ok = True
    for file, per_image in reference["files"].items():
        if args.files and file not in args.files:
            continue
        detectors: dict = {}
        for key, theirs in per_image.items():
            iou, image_name = key.split("/", 1)
            if args.ious and float(iou) not in args.ious:
                continue
            frame = read_image(args.images / image_name).image
            height, width = frame.shape[:2]
            if (
                width,
                height,
                iou,
            ) not in detectors:  # the full-frame view only: one tile the size of the frame
                detectors[(width, height, iou)] = TiledDetector(
                    args.out / file,
                    device=args.device if file.endswith("torchscript") else "cpu",  # ONNX: ONNX Runtime's CPU
                    tile_size=(width, height),
                    full_frame=False,
                    conf_threshold=reference["conf"],
                    merge="nms",
                    match_metric="iou",
                    merge_threshold=float(iou),
                    top_k=MAX_CANDIDATES,  # ultralytics keeps up to 30000 candidates for its NMS, then max_det
                    max_detections=MAX_DETECTIONS,
                )
            found = detectors[(width, height, iou)].detect(frame)
            ours = (np.asarray(found.obb, np.float64), np.asarray(found.scores), np.asarray(found.class_ids))
            pairs, ours_left, theirs_left, worst = paired(ours, theirs)
            good = (
                ours_left == 0
                and theirs_left == 0
                and worst["box_px"] <= BOX_PX
                and worst["angle_rad"] <= ANGLE_RAD
                and worst["score"] <= SCORE
            )
            verdict = "PASS" if good else "FAIL"
            if float(iou) < 1.0:  # NMS by ProbIoU (theirs) and polygon IoU (ours): reported, not judged
                verdict = "NMS "
            else:
                ok &= good
            print(
                f"{verdict}  {file} iou {iou} {image_name} ({width}x{height}): {pairs} pairs, unpaired "
                f"ours {ours_left} / ultralytics {theirs_left}; max |d| box {worst['box_px']:.3f} px, angle "
                f"{worst['angle_rad']:.4f} rad, score {worst['score']:.4f}",
                flush=True,
            )
    print("PASS" if ok else "FAIL")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    steps = parser.add_subparsers(dest="step", required=True)
    data = steps.add_parser("dataset", help="write the ultralytics OBB dataset of synthetic rotated crops")
    data.add_argument("--out", type=Path, required=True)
    data.add_argument("--train", type=int, default=2000)
    data.add_argument("--val", type=int, default=200)
    data.add_argument("--size", type=int, default=640)
    data.add_argument("--seed", type=int, default=0)
    fit = steps.add_parser("train", help="train, export and predict with ultralytics (where it is installed)")
    fit.add_argument("--data", type=Path, required=True, help="the dataset folder (step 1)")
    fit.add_argument("--images", type=Path, required=True, help="real aerial images to predict")
    fit.add_argument("--out", type=Path, required=True)
    fit.add_argument("--models", nargs="+", default=list(MODELS))
    fit.add_argument("--epochs", type=int, default=30)
    fit.add_argument("--batch", type=int, default=32)
    fit.add_argument("--fraction", type=float, default=1.0, help="share of the training images used")
    fit.add_argument("--workers", type=int, default=8)
    fit.add_argument("--device", default="cpu", help="cpu, or a CUDA index (0)")
    fit.add_argument("--conf", type=float, default=0.05, help="score threshold of both predictions")
    fit.add_argument("--simplify", action="store_true", help="ONNX simplified by onnxslim (installed)")
    fit.add_argument("--retrain", action="store_true", help="train again where OUT/runs holds weights")
    test = steps.add_parser("check", help="our full-frame view against ultralytics' predictions")
    test.add_argument(
        "--out", type=Path, required=True, help="the train step's folder (reference.json, models)"
    )
    test.add_argument("--images", type=Path, required=True)
    test.add_argument(
        "--device", default="cpu", help="the TorchScript files' device (ONNX: ONNX Runtime, CPU)"
    )
    test.add_argument("--files", nargs="+", default=None, metavar="NAME", help="only these model files")
    test.add_argument(
        "--ious", nargs="+", type=float, default=None, help="only these NMS overlaps (1.0, 0.7)"
    )
    args = parser.parse_args()
    if args.step == "dataset":
        dataset(args.out, args.train, args.val, args.size, args.seed)
    elif args.step == "train":
        args.out.mkdir(parents=True, exist_ok=True)
        train(args)
    else:
        return 0 if check(args) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
