"""The pictures in the README and docs/ (`docs/images/`), each made by one entry of `PICTURES` from the project's own
code: make-bag's synthetic generator, `TiledDetector.detect`, `tools.annotate` and `tiled-detector bench`.

    .venv/bin/python benchmarks/doc_images.py                 # every picture, into docs/images/
    .venv/bin/python benchmarks/doc_images.py tiles           # one of them (names: --help)

Every picture is deterministic (a fixed seed, the bundled model; `speed` is a measurement and moves with the
machine and its load), written atomically, and refused when it is over `MAX_BYTES` (400 KB). `speed` times
SAHI as well, so it needs SAHI and ultralytics importable beside the project's venv (see `speed`).

Adding a picture (a rotated-box scene once rotated boxes land, issue 49; masks over tiles once instance masks
land, issue 50) is one more function `() -> bytes` returning the encoded image and one more `Picture` entry in `PICTURES`;
the README or a docs page then links `docs/images/<file>`, and `test/test_docs.py` checks the link and the size.
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
from tiled_detector.tools.evaluation import config_changes
from tiled_detector.tools.frames import synthetic_frames
from tiled_detector.tools.scoring import matched
from tiled_detector.types import Detections

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 400_000
SEED = 52  # the 4K frame: the first of `tiled-detector make-bag OUT --frames 1 --seed 52 --width 3840 --height 2160`
WIDTH, HEIGHT = 3840, 2160
PANEL = (790, 444)  # one panel of the tiles picture (width, height)
GAP, BAR = 20, 34  # pixels between panels, and the caption bar above each


@dataclass(frozen=True)
class Picture:
    """One picture: its name on the command line, its file under docs/images/, what it shows, and the function that
    makes it."""

    name: str
    file: str
    shows: str
    make: Callable[[], bytes]


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
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(names))
    if unknown:
        parser.error(f"no picture named {', '.join(unknown)}: one of {', '.join(names)}")
    args.out.mkdir(parents=True, exist_ok=True)
    status = 0
    for name in args.names or names:
        picture = names[name]
        data = picture.make()
        if len(data) > MAX_BYTES:
            print(f"{picture.file}: {len(data)} bytes, over {MAX_BYTES}: not written", file=sys.stderr)
            status = 1
            continue
        atomic_write(args.out / picture.file, data)
        print(f"wrote {args.out / picture.file} ({len(data) // 1000} KB): {picture.shows}")
    return status


if __name__ == "__main__":
    sys.exit(main())
