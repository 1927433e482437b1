"""ultralytics pose models with trained weights against our decoding: YOLOv8n-pose, YOLO11n-pose and YOLO26n-pose
trained by ultralytics' own trainer on our synthetic figures (`pose_scenes`), exported as ultralytics writes them
(ONNX, YOLO26's end-to-end ONNX, TorchScript), and ultralytics' own prediction of each file compared with ours on
the same letterboxed tensor of real photos (the target: boxes within 1 px, keypoints within 1 px, scores within
0.01; every photo with at least one detection at conf 0.01).

Four steps; ultralytics is no dependency of this project, so `fit` and `predict` run where it is installed:

1. `dataset` (any venv that imports tiled_detector): an ultralytics pose dataset of `pose_scenes` crops,
   DIR/images/{train,val}/*.png, DIR/labels/{train,val}/*.txt (class, box centre and size, then x, y, visibility
   per joint, normalised), DIR/data.yaml (kpt_shape, kpt_names; no flip_idx: the figures' left limbs are darker, so
   a mirror image is no figure of the same joints, and ultralytics then turns its left-right flip off).

       .venv/bin/python benchmarks/pose_reference.py dataset --out /tmp/poseref/data --train 600 --val 60

2. `fit` (with ultralytics; offline: YOLO_OFFLINE=1): each model from its yaml (no pretrained weights) trained on
   the dataset (imgsz 640, amp off: no download for its check, plots off), its weights copied to
   OUT/weights/NAME.pt.
   Without polars (which ultralytics reads its results.csv with, 54 MB: too big to carry to a GPU machine) the
   trainer's reader is the csv module.

       YOLO_OFFLINE=1 /tmp/ultra58/bin/python benchmarks/pose_reference.py fit --data /tmp/poseref/data \
           --out /tmp/poseref --device 0 --epochs 30 --hours 0.025

3. `predict` (with ultralytics): each OUT/weights/NAME.pt exported (ONNX, not simplified: onnxslim may be missing; YOLO26
   also end-to-end, `nms=False`; TorchScript); each photo of PHOTOS letterboxed once by ultralytics' own
   `LetterBox` to 640 x 640 and saved as OUT/letterboxed/NAME.png, and ultralytics' prediction of each export on
   that image (`YOLO(file, task="pose").predict`, imgsz 640: no further resize or padding, so its tensor is the
   image's) at conf 0.01 and each NMS overlap of `IOUS`, saved as OUT/reference.json: box xyxy, score, class and
   keypoints (x, y, score per joint) per detection, in the letterboxed image's pixels.

       YOLO_OFFLINE=1 /tmp/ultra58/bin/python benchmarks/pose_reference.py predict --out /tmp/poseref \
           --images PHOTOS

4. `check` (the project venv): our `TiledDetector` on each file with no layout flag, one tile the size of the
   letterboxed image (the same tensor: no resize), nms by IoU at the same overlap (none for the end-to-end file, as
   ultralytics), each detection's own joints (`keypoint_fusion: keeper`: what ultralytics' NMS keeps; our default
   fuses the joints of the candidates the kept box covers, `--fusion joints` reports how far that moves them),
   against reference.json: rows paired one to one (same class, nearest box centre), with the differences' maxima.
   Judged at NMS overlap 1.0 (every candidate above conf up to max_det: decoding, joints, letterbox mapping and
   scores compared, not the suppression rule): PASS when every row pairs within the target on every file and photo
   and at least `--min-photos` photos have a detection there; exit 1 on a FAIL. Reported (NMS lines) at
   ultralytics' default 0.7: ultralytics suppresses with the boxes as the head gives them and clips them to the
   image afterwards, we clip first, so two boxes reaching past the image's border may overlap above 0.7 in ours and
   not in theirs: such a row is kept by ultralytics alone.

       .venv/bin/python benchmarks/pose_reference.py check --out /tmp/poseref

PHOTOS: real photos of people, fetched or taken from the packages that ship them, never committed (see
docs/MODELS.md for the ones used and their sources).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from obb_reference import images_in, write_dataset

MODELS = ("yolov8n-pose", "yolo11n-pose", "yolo26n-pose")
IOUS = (0.7, 1.0)  # ultralytics' default NMS overlap, and 1.0: every candidate up to max_det
CONF = 0.01
SIZE = 640
MAX_DETECTIONS = 300  # ultralytics' max_det
MAX_CANDIDATES = 8400  # every anchor of a 640 x 640 input
BOX_PX, KEYPOINT_PX, SCORE = 1.0, 1.0, 0.01  # the target


# ----------------------------------------------------------------------------------------------------------
# 1. the dataset


def dataset(out: Path, train: int, val: int, size: int, seed: int) -> None:
    from tiled_detector.tools.worlds.pose_scenes import CLASSES, JOINTS, make_pose_crop

    def rows(scene: Any) -> list[str]:
        """Class, box centre and size, then x, y, visibility per joint, normalised."""
        centre = (scene.boxes[:, :2] + scene.boxes[:, 2:]) / 2 / size
        sides = (scene.boxes[:, 2:] - scene.boxes[:, :2]) / size
        points = scene.keypoints.copy()
        points[..., :2] /= size
        numbers = np.concatenate([centre, sides, points.reshape(len(points), -1)], axis=1)
        return [
            f"{c} " + " ".join(f"{v:.6f}" for v in row)
            for c, row in zip(scene.class_ids, numbers, strict=True)
        ]

    joints = "\n".join(f"    - {name}" for name in JOINTS)
    extra = f"kpt_shape: [{len(JOINTS)}, 3]\nkpt_names:\n  0:\n{joints}\n"
    write_dataset(out, (train, val), size, seed, make_pose_crop, rows, CLASSES, extra)


# ----------------------------------------------------------------------------------------------------------
# 2. training (needs ultralytics)


def _csv_results(trainer: object) -> dict:
    """ultralytics' `read_results_csv` without polars: results.csv as {column: [values]}."""
    try:
        with open(trainer.csv, newline="") as handle:  # type: ignore[attr-defined]
            rows = list(csv.DictReader(handle))
    except OSError:
        return {}
    return {key.strip(): [float(row[key]) for row in rows] for key in (rows[0] if rows else {})}


def fit(args: argparse.Namespace) -> None:
    from ultralytics import YOLO
    from ultralytics.engine.trainer import BaseTrainer

    try:
        import polars  # noqa: F401
    except ImportError:
        BaseTrainer.read_results_csv = _csv_results  # type: ignore[method-assign]
    out = args.out.resolve()
    for model_name in args.models:
        model = YOLO(f"{model_name}.yaml", task="pose")
        model.train(
            data=str(args.data.resolve() / "data.yaml"),
            epochs=args.epochs,
            time=args.hours or None,  # ultralytics' time limit: epochs fitted to it after the first
            imgsz=SIZE,
            batch=args.batch,
            device=args.device,
            workers=args.workers,
            pretrained=False,
            amp=False,
            plots=False,
            val=False,  # the last epoch is validated all the same
            project=str(out / "runs"),
            name=model_name,
            exist_ok=True,
            seed=0,
        )
        best = Path(model.trainer.best if Path(model.trainer.best).is_file() else model.trainer.last)
        (out / "weights").mkdir(exist_ok=True)
        shutil.copyfile(best, out / "weights" / f"{model_name}.pt")
        print(f"{model_name}: trained, {out / 'weights' / f'{model_name}.pt'}", flush=True)


# ----------------------------------------------------------------------------------------------------------
# 3. exports and ultralytics' predictions (needs ultralytics)


def exports(model_name: str) -> dict[str, dict]:
    """The exports of a model: file tag -> YOLO.export arguments (the defaults, ONNX not simplified)."""
    found = {"onnx": {"format": "onnx", "simplify": False}, "torchscript": {"format": "torchscript"}}
    if model_name.startswith("yolo26"):  # the NMS-free one-to-one head
        found["end2end.onnx"] = {"format": "onnx", "simplify": False, "nms": False}
    return found


def letterboxed(images: list[Path], out: Path) -> list[Path]:
    """Each photo letterboxed once by ultralytics' own `LetterBox` to SIZE x SIZE, saved losslessly."""
    import cv2
    from ultralytics.data.augment import LetterBox

    out.mkdir(parents=True, exist_ok=True)
    found = []
    for image in images:
        boxed = LetterBox(new_shape=(SIZE, SIZE), auto=False)(image=cv2.imread(str(image)))
        path = out / f"{image.stem}.png"
        cv2.imwrite(str(path), boxed)
        found.append(path)
    return found


def predict(args: argparse.Namespace) -> None:
    import ultralytics
    from ultralytics import YOLO

    out = args.out.resolve()
    inputs = letterboxed(images_in(args.images), out / "letterboxed")
    reference: dict = {"ultralytics": ultralytics.__version__, "conf": CONF, "photos": {}, "files": {}}
    for image in images_in(args.images):
        reference["photos"][f"{image.stem}.png"] = image.name
    for model_name in args.models:
        trained = YOLO(
            str(out / "weights" / f"{model_name}.pt"), task="pose"
        )  # exports are written beside it
        for tag, options in exports(model_name).items():
            written = Path(trained.export(imgsz=SIZE, **options))
            target = out / f"{model_name}.{tag}"
            shutil.copyfile(written, target)
            model = YOLO(str(target), task="pose")
            found = {}
            for iou in IOUS:
                for image in inputs:
                    result = model.predict(
                        str(image), imgsz=SIZE, conf=CONF, iou=iou, max_det=MAX_DETECTIONS, verbose=False
                    )[0]
                    found[f"{iou}/{image.name}"] = {
                        "xyxy": result.boxes.xyxy.cpu().numpy().tolist(),
                        "score": result.boxes.conf.cpu().numpy().tolist(),
                        "class": result.boxes.cls.cpu().numpy().astype(int).tolist(),
                        "keypoints": result.keypoints.data.cpu().numpy().tolist(),
                    }
            reference["files"][target.name] = found
            counts = [len(r["score"]) for k, r in found.items() if k.startswith(f"{IOUS[0]}/")]
            print(f"{target.name}: ultralytics found {counts} on {len(inputs)} photos", flush=True)
    (out / "reference.json").write_text(json.dumps(reference))
    print(f"wrote {out / 'reference.json'}")


# ----------------------------------------------------------------------------------------------------------
# 4. the comparison (the project venv)


def paired(ours: tuple, theirs: dict) -> tuple[int, int, int, dict[str, float]]:
    """Pair ultralytics' rows with ours one to one (same class, nearest box centre): (pairs, ours unpaired,
    theirs unpaired, maxima of |d box| px, |d keypoint| px (x and y), |d score|, |d keypoint score|)."""
    from scipy.optimize import linear_sum_assignment

    boxes, scores, classes, points = ours
    ref = np.asarray(theirs["xyxy"], np.float64).reshape(-1, 4)
    ref_scores, ref_classes = np.asarray(theirs["score"]), np.asarray(theirs["class"])
    ref_points = np.asarray(theirs["keypoints"], np.float64).reshape(len(ref), *points.shape[1:])
    centres, ref_centres = (boxes[:, :2] + boxes[:, 2:]) / 2, (ref[:, :2] + ref[:, 2:]) / 2
    distance = np.linalg.norm(centres[:, None] - ref_centres[None], axis=2)
    distance[classes[:, None] != ref_classes[None, :]] = 1e9
    rows, cols = linear_sum_assignment(distance) if distance.size else (np.zeros(0, int), np.zeros(0, int))
    keep = distance[rows, cols] < 5 * BOX_PX
    rows, cols = rows[keep], cols[keep]
    worst = {
        "box_px": float(np.abs(boxes[rows] - ref[cols]).max(initial=0.0)),
        "keypoint_px": float(np.abs(points[rows, :, :2] - ref_points[cols, :, :2]).max(initial=0.0)),
        "score": float(np.abs(scores[rows] - ref_scores[cols]).max(initial=0.0)),
        "keypoint_score": float(np.abs(points[rows, :, 2] - ref_points[cols, :, 2]).max(initial=0.0)),
    }
    return len(rows), len(boxes) - len(rows), len(ref) - len(rows), worst


def check(args: argparse.Namespace) -> bool:
    from tiled_detector import TiledDetector
    from tiled_detector.tools.frames import read_image

    reference = json.loads((args.out / "reference.json").read_text())
    print(f"ultralytics {reference['ultralytics']}, conf {reference['conf']}")
    ok, seen = True, set()
    for file, per_image in reference["files"].items():
        detectors: dict = {}
        for key, theirs in per_image.items():
            iou, image_name = key.split("/", 1)
            frame = read_image(args.out / "letterboxed" / image_name).image
            if iou not in detectors:  # one tile the size of the letterboxed image: its tensor as it is
                detectors[iou] = TiledDetector(
                    args.out / file,
                    device=args.device if file.endswith("torchscript") else "cpu",  # ONNX: ONNX Runtime's CPU
                    tile_size=(SIZE, SIZE),
                    full_frame=False,
                    conf_threshold=reference["conf"],
                    merge="nms",
                    match_metric="iou",
                    # ultralytics suppresses nothing in end-to-end rows (its NMS-free head)
                    merge_threshold=1.0 if "end2end" in file else float(iou),
                    keypoint_fusion=args.fusion,  # keeper: ultralytics' NMS keeps each kept box's own joints
                    top_k=MAX_CANDIDATES,
                    max_detections=MAX_DETECTIONS,
                )
            found = detectors[iou].detect(frame)
            if found.keypoints is None:
                print(f"FAIL  {file}: no keypoints decoded")
                ok = False
                break
            ours = (
                np.asarray(found.boxes, np.float64),
                np.asarray(found.scores),
                np.asarray(found.class_ids),
                np.asarray(found.keypoints, np.float64),
            )
            pairs, ours_left, theirs_left, worst = paired(ours, theirs)
            good = (
                ours_left == 0
                and theirs_left == 0
                and worst["box_px"] <= BOX_PX
                and worst["keypoint_px"] <= KEYPOINT_PX
                and worst["score"] <= SCORE
                and worst["keypoint_score"] <= SCORE
            )
            verdict = "PASS" if good else "FAIL"
            if (
                float(iou) < 1.0
            ):  # reported: ultralytics suppresses before it clips boxes to the image, we after
                verdict = "NMS "
            else:
                ok &= good
                seen.update([image_name] if len(theirs["score"]) else [])
            print(
                f"{verdict}  {file} iou {iou} {reference['photos'][image_name]}: {pairs} pairs, "
                f"unpaired ours {ours_left} / ultralytics {theirs_left}; max |d| box {worst['box_px']:.4f} px, "
                f"keypoints {worst['keypoint_px']:.4f} px, score {worst['score']:.5f}, keypoint score "
                f"{worst['keypoint_score']:.5f}",
                flush=True,
            )
    enough = len(seen) >= args.min_photos
    print(f"photos with a detection at conf {reference['conf']}: {len(seen)} of {len(reference['photos'])}")
    print("PASS" if ok and enough else "FAIL")
    return ok and enough


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    steps = parser.add_subparsers(dest="step", required=True)
    data = steps.add_parser("dataset", help="write the ultralytics pose dataset of synthetic figures")
    data.add_argument("--out", type=Path, required=True)
    data.add_argument("--train", type=int, default=600)
    data.add_argument("--val", type=int, default=60)
    data.add_argument("--size", type=int, default=SIZE)
    data.add_argument("--seed", type=int, default=0)
    train = steps.add_parser("fit", help="train with ultralytics (where it is installed)")
    train.add_argument("--data", type=Path, required=True, help="the dataset folder (step 1)")
    train.add_argument("--out", type=Path, required=True)
    train.add_argument("--models", nargs="+", default=list(MODELS))
    train.add_argument("--epochs", type=int, default=30)
    train.add_argument("--hours", type=float, default=0.0, help="ultralytics' time limit per model (0: none)")
    train.add_argument("--batch", type=int, default=32)
    train.add_argument("--workers", type=int, default=4)
    train.add_argument("--device", default="cpu", help="cpu, or a CUDA index (0)")
    run = steps.add_parser("predict", help="export and predict with ultralytics (where it is installed)")
    run.add_argument("--out", type=Path, required=True, help="the fit step's folder (weights/NAME.pt)")
    run.add_argument("--images", type=Path, required=True, help="real photos")
    run.add_argument("--models", nargs="+", default=list(MODELS))
    test = steps.add_parser("check", help="our decoding against ultralytics' predictions")
    test.add_argument("--out", type=Path, required=True, help="the predict step's folder")
    test.add_argument(
        "--device", default="cpu", help="the TorchScript files' device (ONNX: ONNX Runtime, CPU)"
    )
    test.add_argument("--min-photos", type=int, default=5, help="photos that need a detection (default 5)")
    test.add_argument(
        "--fusion",
        default="keeper",
        help="our keypoint_fusion (default keeper: ultralytics' rule; joints: ours)",
    )
    args = parser.parse_args()
    if args.step == "dataset":
        dataset(args.out, args.train, args.val, args.size, args.seed)
    elif args.step == "fit":
        args.out.mkdir(parents=True, exist_ok=True)
        fit(args)
    elif args.step == "predict":
        predict(args)
    else:
        return 0 if check(args) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
