"""The pictures in the README and docs/ (`docs/images/`), each made by one entry of `PICTURES` from the project's own
code: make-bag's synthetic generator, the rotated scenes, `TiledDetector.detect`, `tools.annotate` and
`tiled-detector bench`.

    .venv/bin/python benchmarks/doc_images.py                 # every picture, into docs/images/
    .venv/bin/python benchmarks/doc_images.py tiles           # one of them (names: --help)

- `tiles` (tiles_vs_whole.jpg): a synthetic 4K frame through the bundled model, the whole frame letterboxed vs tiles
  + the full-frame view (overview and a crop at full size, "N of M objects found").
- `speed` (speed.png): `tiled-detector bench --peer sahi`'s plot, ours vs the model alone vs SAHI.
- `rotated` (rotated_boxes.jpg): the same comparison on a synthetic 4K rotated scene with the bundled rotated-box
  model, its rotated rectangles drawn, found as DOTA counts a true positive.
- `masks` (masks.jpg): the same comparison with a real segmentation model (`--seg-model`, YOLOv8n-seg int8 of
  ../shared/models) on a 4K mosaic of scikit-image's public-domain / CC0 photos, each detection's mask tinted.

Every picture is deterministic (a fixed seed, a fixed model; `speed` is a measurement and moves with the machine
and its load), written atomically, and refused when it is over `MAX_BYTES` (400 KB). `speed` times SAHI as well, so
it needs SAHI and ultralytics importable beside the project's venv (see `speed`); `masks` needs scikit-image
importable (see `masks`): neither is a project dependency.

Adding a picture is one more function returning the encoded image (its command-line options as keyword arguments,
named in `Picture.options`) and one more `Picture` entry in `PICTURES`; the README or a docs page then links
`docs/images/<file>`, and `test/test_docs.py` checks the link and the size.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import cv2
import numpy as np

from tiled_detector.detector import TiledDetector
from tiled_detector.engines.cache import atomic_write
from tiled_detector.parameters import build_detector
from tiled_detector.pipeline.tiling import TilePlan
from tiled_detector.tools.annotate import annotate
from tiled_detector.tools.frames import synthetic_frames
from tiled_detector.tools.scores.evaluation import config_changes
from tiled_detector.tools.scoring import dota_ap50, matched
from tiled_detector.types import Detections

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 400_000
SEED = 52  # the 4K frame: the first of `tiled-detector make-bag OUT --frames 1 --seed 52 --width 3840 --height 2160`
WIDTH, HEIGHT = 3840, 2160
PANEL = (790, 444)  # one panel of the tiles picture (width, height)
ROTATED_SEED, ROTATED_CROP = (
    7,
    (1800, 320),
)  # make_rotated_scene(7, 3840, 2160); the crop: rows of cars on a seam
SEG_MODEL = (
    ROOT.parent / "shared" / "models" / "yolov8n-seg_int8.onnx"
)  # the masks picture's model (--seg-model)
PICTURED = (
    ("astronaut", "person"),
    ("chelsea", "cat"),
    ("coffee", "cup"),
)  # skimage.data photo, its COCO object
MOSAIC_SEED, MASK_CROP = 54, (2420, 260)  # the masks picture's mosaic, and its crop
GAP, BAR = 20, 34  # pixels between panels, and the caption bar above each


@dataclass(frozen=True)
class Picture:
    """One picture: its name on the command line, its file under docs/images/, what it shows, the function that
    makes it, and the command-line options it takes (as keyword arguments of that name)."""

    name: str
    file: str
    shows: str
    make: Callable[..., bytes]
    options: tuple[str, ...] = ()


def _scaled(detections: Detections, scale: float) -> Detections:
    """The detections (boxes, rotated boxes; masks as they are: `annotate` resizes them) in a picture `scale` times
    the frame's size."""
    obb = None if detections.obb is None else detections.obb * np.array([scale] * 4 + [1.0], np.float32)
    return replace(detections, boxes=detections.boxes * scale, obb=obb)


def _panel(image: np.ndarray, caption: str) -> np.ndarray:
    """`image` (RGB) under a dark caption bar."""
    bar = np.full((BAR, image.shape[1], 3), 24, np.uint8)
    cv2.putText(bar, caption, (8, BAR - 11), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (235, 235, 235), 1, cv2.LINE_AA)
    return np.concatenate([bar, image])


def _views(plan: TilePlan) -> str:
    """What the plan runs, in words: the whole frame letterboxed into the model, or its tiles (and full view)."""
    if len(plan.tiles) == 1 and not plan.full_frame:
        return "whole frame, letterboxed to {}x{}".format(*plan.input_hw[::-1])
    return f"{len(plan.tiles)} tiles" + (" + the full-frame view" if plan.full_frame else "")


def _whole_vs_tiles(
    image: np.ndarray,
    detector: TiledDetector,
    crop: tuple[int, int],
    found: Callable[[Detections], int],
    total: str,
    encoding: str = "rgb8",
) -> bytes:
    """The JPEG of a frame (RGB, `encoding`) through `detector` twice: the whole frame letterboxed into the model's
    input (left) and the tiles + the full-frame view (right, the tiles drawn), each captioned "<views>: N of
    <total> found" with N = `found(detections)`; above, the whole frame with every detection (no captions); below,
    the crop of one panel's size at `crop` (x, y; outlined in white above) at full resolution, as `detect --out`
    draws it."""
    frame_height, frame_width = image.shape[:2]
    labels = detector.labels
    detections, plans = {}, {}
    for name in ("full", "tiles+full"):  # `tiled-detector eval`'s configurations
        variant = detector.with_config(**config_changes(name, frame_width, frame_height))
        detections[name] = variant.detect(image, encoding=encoding)
        plans[name] = variant.plan_for(frame_height, frame_width)
    width, height = PANEL
    scale = width / frame_width
    small = cv2.resize(image, (width, round(frame_height * scale)), interpolation=cv2.INTER_AREA)
    x0, y0 = crop
    rows: list[list[np.ndarray]] = [[], []]
    for name, plan in plans.items():
        dets = detections[name]
        tiled = len(plan.tiles) > 1
        overview = annotate(
            small, _scaled(dets, scale), labels, tiles=plan.tiles * scale if tiled else None, captions=False
        )
        cx, cy = round(x0 * scale), round(y0 * scale)
        cv2.rectangle(
            overview, (cx, cy), (cx + round(width * scale), cy + round(height * scale)), (255, 255, 255), 2
        )
        rows[0].append(_panel(overview[:height], f"{_views(plan)}: {found(dets)} of {total} found"))
        drawn = annotate(image, dets, labels, plan=plan if tiled else None)
        rows[1].append(_panel(drawn[y0 : y0 + height, x0 : x0 + width], "the white box at full size"))
    gap = np.full((rows[0][0].shape[0], GAP, 3), 255, np.uint8)
    picture = np.concatenate(
        [np.concatenate([row[0], gap, row[1]], axis=1) for row in rows[:1]]
        + [np.full((GAP, 2 * width + GAP, 3), 255, np.uint8)]
        + [np.concatenate([row[0], gap, row[1]], axis=1) for row in rows[1:]]
    )
    ok, encoded = cv2.imencode(
        ".jpg", cv2.cvtColor(picture, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 82]
    )
    if not ok:
        raise RuntimeError("OpenCV could not encode the picture as JPEG")
    return encoded.tobytes()


def tiles_vs_whole() -> bytes:
    """A synthetic 4K frame through the bundled model twice (`_whole_vs_tiles`), its objects found as `eval` counts
    them (same class, IoU >= 0.5, one to one)."""
    frame = next(synthetic_frames(1, SEED, WIDTH, HEIGHT))

    def found(dets: Detections) -> int:
        return int(
            (matched((dets.boxes, dets.scores, dets.class_ids), (frame.boxes, frame.class_ids)) >= 0).sum()
        )

    crop = (1480, 1050)  # a patch with objects on a tile seam
    total = f"{len(frame.boxes)} objects"
    return _whole_vs_tiles(frame.image, build_detector({}), crop, found, total, frame.encoding)


def rotated(seed: int = ROTATED_SEED, crop: tuple[int, int] = ROTATED_CROP) -> bytes:
    """A synthetic 4K rotated scene (`tools.rotated_scenes`: boats, cars and trucks at any angle, in dense rows and
    scattered) through the bundled rotated-box model twice (`_whole_vs_tiles`), its rotated rectangles drawn; an
    object is found as DOTA's devkit counts a true positive (`tools.scoring.dota_ap50`: same class, rotated IoU
    above 0.5, one to one)."""
    from tiled_detector.models import obb_model_path
    from tiled_detector.tools.worlds.rotated_scenes import make_rotated_scene

    scene = make_rotated_scene(seed, WIDTH, HEIGHT)

    def found(dets: Detections) -> int:
        obb = np.zeros((0, 5), np.float32) if dets.obb is None else dets.obb
        score = dota_ap50([(obb, dets.scores, dets.class_ids)], [(scene.obb, scene.class_ids)])
        return int(score["true_positives"])

    detector = build_detector({"model": str(obb_model_path())})
    return _whole_vs_tiles(scene.image, detector, crop, found, f"{len(scene.obb)} objects")


def _pictured(detector: TiledDetector) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """`PICTURED`'s images (RGB) from scikit-image, and in each its object's box and class: the model's own most
    confident detection of that class in the whole image at its own size."""
    try:
        from skimage import data
    except ImportError as error:
        raise RuntimeError(
            "the masks picture needs scikit-image importable (not a project dependency): see doc_images.masks"
        ) from error
    images, boxes, classes = [], [], []
    for name, label in PICTURED:
        image = getattr(data, name)()
        height, width = image.shape[:2]
        own = detector.with_config(**config_changes("full", width, height)).detect(image)
        cls = detector.labels.index(label)
        scores = np.where(own.class_ids == cls, own.scores, -1.0)
        if not len(scores) or scores.max() < 0:
            raise RuntimeError(f"{detector.config.model} finds no {label} in skimage.data.{name}()")
        images.append(image)
        boxes.append(own.boxes[int(np.argmax(scores))])
        classes.append(cls)
    return images, np.array(boxes, np.float64), np.array(classes, np.int64)


def masks(seg_model: Path = SEG_MODEL) -> bytes:
    """Instance masks through tiles: a real segmentation model (`--seg-model`, by default the YOLOv8n-seg int8 ONNX
    file of ../shared/models, COCO classes; masks on, as `masks: true` sets them; 640-px tiles, `tile_width` /
    `tile_height` 640: the file's input is 320 x 320, so each tile is halved into it, 32 tiles where 320-px ones
    would be 135) on a 4K mosaic of public-domain photos twice (`_whole_vs_tiles`), each detection's mask tinted.
    The mosaic: copies of scikit-image's bundled astronaut (NASA, public domain), Chelsea the cat and the coffee cup
    (both CC0 by their photographers), their longer side 180-260 px, one per cell of a 7 x 4 grid at a random place
    in it (seed `MOSAIC_SEED`), over scikit-image's gravel texture (CC0) dimmed to grey. A pictured object is found
    when a detection of its class (person, cat, cup) has box IoU >= 0.5 with its box, one to one; its box is the
    model's own most confident detection of that class in the photo at its own size, scaled and moved with the copy
    (an estimate: the photos carry no truth).

    scikit-image is no project dependency: install it (it reads its bundled photos through imageio and tifffile)
    into a folder of its own and put that on the path, e.g.

        python -m pip install --target /tmp/site --no-deps scikit-image lazy_loader imageio tifffile
        PYTHONPATH=/tmp/site .venv/bin/python benchmarks/doc_images.py masks
    """
    detector = build_detector({"model": str(seg_model), "masks": True, "tile_width": 640, "tile_height": 640})
    images, boxes, classes = _pictured(detector)
    from skimage import data

    gravel = data.gravel().astype(np.float32)
    texture = np.tile(gravel, (-(-HEIGHT // gravel.shape[0]), -(-WIDTH // gravel.shape[1])))[:HEIGHT, :WIDTH]
    grey = np.clip(128 + (texture - gravel.mean()) * 0.35, 0, 255).astype(np.uint8)
    frame = np.repeat(grey[..., None], 3, axis=2)
    rng = np.random.default_rng(MOSAIC_SEED)
    columns, rows = 7, 4
    cell_width, cell_height = WIDTH // columns, HEIGHT // rows
    truth_boxes, truth_classes = [], []
    for cell in range(columns * rows):
        which = cell % len(images)
        image = images[which]
        scale = rng.uniform(180, 260) / max(image.shape[:2])
        copy = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
        height, width = copy.shape[:2]
        x = (cell % columns) * cell_width + int(rng.integers(0, cell_width - width + 1))
        y = (cell // columns) * cell_height + int(rng.integers(0, cell_height - height + 1))
        frame[y : y + height, x : x + width] = copy
        sx, sy = width / image.shape[1], height / image.shape[0]
        truth_boxes.append(boxes[which] * (sx, sy, sx, sy) + (x, y, x, y))
        truth_classes.append(classes[which])
    truth = (np.array(truth_boxes), np.array(truth_classes))

    def found(dets: Detections) -> int:
        return int((matched((dets.boxes, dets.scores, dets.class_ids), truth) >= 0).sum())

    return _whole_vs_tiles(frame, detector, MASK_CROP, found, f"{len(truth_boxes)} pictured objects")


def speed() -> bytes:
    """`tiled-detector bench --peer sahi` on this machine with the bundled model (ONNX Runtime fp32, 1080p and 4K):
    the plot it writes, ours per stage against the model alone and SAHI's default on the same model and frames.

    SAHI runs the bundled model through its ultralytics model, so this needs `sahi` and `ultralytics` importable
    beside the project's requirements. ultralytics imports torchvision, and PyPI's torchvision for torch 2.13 does
    not load with the project's CPU build of torch (its operators fail to register), so the project's `.venv` cannot
    hold it: run this with the Python of a venv that has SAHI, ultralytics, its torch and torchvision, with
    `PYTHONPATH=src` (plus a folder holding what that venv lacks of the project's requirements, e.g. scipy). On a
    machine shared with other jobs set `OMP_NUM_THREADS=1`: torch's OpenMP threads otherwise wait on each other.
    Both run the bundled ONNX with its batch fixed at 1 (as ultralytics exports by default), a copy
    in a temporary folder: ultralytics reads the bundled file's symbolic batch as a dynamic input and letterboxes the
    whole frame to a rectangle, which the file's fixed 640 x 640 refuses; ours rewrites the copy back to a dynamic
    batch (proven equal to it) as it does any batch-1 export."""
    import onnx

    from tiled_detector.cli import main
    from tiled_detector.models import default_model_path

    with tempfile.TemporaryDirectory(prefix="doc_images_") as folder:
        model = onnx.load(default_model_path())
        for value in [*model.graph.input, *model.graph.output]:
            value.type.tensor_type.shape.dim[0].dim_value = 1
        copy = Path(folder) / "default.onnx"
        onnx.save(model, copy)
        settings = "--backend onnxruntime --precision fp32 --size 1920x1080 3840x2160 --runs 10 --warmup 2"
        status = main(["bench", "--model", str(copy), *settings.split(), "--peer", "sahi", "--out", folder])
        if status != 0:
            raise RuntimeError(f"tiled-detector bench exited {status}")
        return (Path(folder) / "bench.png").read_bytes()


PICTURES: tuple[Picture, ...] = (
    Picture(
        "tiles",
        "tiles_vs_whole.jpg",
        "a synthetic 4K frame: the whole frame vs tiles + the full-frame view",
        tiles_vs_whole,
    ),
    Picture(
        "speed",
        "speed.png",
        "bench: ours per stage vs the model alone vs SAHI, bundled model, this machine",
        speed,
    ),
    Picture(
        "rotated",
        "rotated_boxes.jpg",
        "a synthetic 4K rotated scene, bundled rotated-box model: the whole frame vs tiles + the full-frame view",
        rotated,
    ),
    Picture(
        "masks",
        "masks.jpg",
        "public-domain photos in a 4K mosaic, YOLOv8n-seg: the whole frame vs tiles + the full-frame view, masks",
        masks,
        ("seg_model",),
    ),
)


def main(argv: list[str] | None = None) -> int:
    """Make the pictures named (all by default) into --out; 1 when one is over MAX_BYTES."""
    names = {p.name: p for p in PICTURES}
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="pictures: " + "; ".join(f"{n} ({p.file}): {p.shows}" for n, p in names.items()),
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"pictures to make: {', '.join(names)} (all)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="folder (docs/images)")
    parser.add_argument(
        "--seg-model",
        type=Path,
        default=SEG_MODEL,
        help="the segmentation model of the masks picture (../shared/models/yolov8n-seg_int8.onnx)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(names))
    if unknown:
        parser.error(f"no picture named {', '.join(unknown)}: one of {', '.join(names)}")
    args.out.mkdir(parents=True, exist_ok=True)
    status = 0
    for name in args.names or names:
        picture = names[name]
        data = picture.make(**{option: getattr(args, option) for option in picture.options})
        if len(data) > MAX_BYTES:
            print(f"{picture.file}: {len(data)} bytes, over {MAX_BYTES}: not written", file=sys.stderr)
            status = 1
            continue
        atomic_write(args.out / picture.file, data)
        print(f"wrote {args.out / picture.file} ({len(data) // 1000} KB): {picture.shows}")
    return status


if __name__ == "__main__":
    sys.exit(main())
