"""`tiled-detector detect IMAGE...`: tiled detection on image files, one line per image (and optional JSON: a
segmentation model's detections with their `mask`, COCO RLE in frame pixels); with `--depth DEPTH... --camera-info
INFO.yaml` each detection's 3D position too."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tiled_detector.commands.settings import add_settings, parameter_values
from tiled_detector.config import settings

if TYPE_CHECKING:
    from tiled_detector.pipeline.tiling import TilePlan
    from tiled_detector.types import Detections


# still images have no history to schedule tiles from (replay a bag, or run the node, for a stream)
BUDGET_NOTE = "tile_budget ignored: a still image has no history (every tile ran)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the detect subcommand."""
    parser.add_argument(
        "images", nargs="+", type=Path, metavar="IMAGE", help="image files (anything OpenCV reads)"
    )
    parser.add_argument(
        "--json", action="store_true", help="end with one JSON object holding every detection"
    )
    parser.add_argument("--out", type=Path, help="write annotated copies of the images into this folder")
    parser.add_argument(
        "--depth",
        nargs="+",
        type=Path,
        default=None,
        metavar="DEPTH",
        help="the depth image aligned to each IMAGE (one per image, in order): a 16-bit PNG in units of "
        "--depth-scale (millimetres), a 32-bit float TIFF in metres, or a .npy of either; needs --camera-info. "
        "Each detection gets its position and size in metres in the camera's optical frame",
    )
    parser.add_argument(
        "--camera-info",
        type=Path,
        default=None,
        metavar="INFO.yaml",
        help="the colour camera's calibration, the camera_calibration YAML that camera_info_manager reads",
    )
    add_settings(parser, only=[n for n in settings() if n != "depth"])  # --depth here names the files


def run(args: argparse.Namespace) -> int:
    """Detect in every image; returns 1 when an image could not be read, else 0."""
    from tiled_detector.geometry.polygons import ANGLE
    from tiled_detector.parameters import build_detector
    from tiled_detector.tools.segmentation import detection_rles

    depths, camera = _depth_arguments(args)
    detector = build_detector(parameter_values(args))
    labels = detector.labels
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    results, status = [], 0
    for path in args.images:
        image, problem = read_image(path)
        if image is None:
            print(f"{path}: cannot read image: {problem}", file=sys.stderr)
            status = 1
            continue
        if problem:
            print(f"{path}: warning: {problem}; detections are on the part that decoded", file=sys.stderr)
        depth = None
        if depths is not None:
            depth = _depth(depths[path], camera, image.shape[:2])
            if depth is None:
                status = 1
                continue
        dets = detector.detect(image, encoding="bgr8", depth=depth)
        names = [labels[c] if labels and c < len(labels) else str(c) for c in dets.class_ids.tolist()]
        counts = {n: names.count(n) for n in sorted(set(names))}
        summary = ", ".join(f"{n} {k}" for n, k in counts.items()) or "nothing"
        print(f"{path}: {len(dets)} detections ({summary}) in {dets.timings['total']:.1f} ms")
        if dets.positions is not None and not args.json:
            print(_positions_text(dets, names))
        if args.out:
            plan = detector.plan_for(*image.shape[:2])
            _save_annotated(image, dets, labels, plan, args.out / path.name, detector.resolved.skeleton)
        rles = detection_rles(dets.masks, len(dets))
        results.append(
            {
                "image": str(path),
                "truncated": problem is not None,
                "width": image.shape[1],
                "height": image.shape[0],
                "detections": [
                    {
                        "box": [round(float(v), 2) for v in box],
                        **_rotated(dets, k),
                        "score": round(float(s), 4),
                        "class_id": c,
                        "label": n,
                        **_located(dets, k),
                        **({} if rles[k] is None else {"mask": rles[k]}),
                        **_joints(dets, k),
                    }
                    for k, (box, s, c, n) in enumerate(
                        zip(dets.boxes, dets.scores, dets.class_ids.tolist(), names, strict=True)
                    )
                ],
                "timings_ms": {k: round(v, 3) for k, v in dets.timings.items()},
            }
        )
    if args.json:
        notes = [BUDGET_NOTE] if detector.config.tile_budget else []
        angle = {"obb_angle": ANGLE} if detector.rotated else {}  # what each detection's obb angle means
        print(json.dumps({"model": str(detector.config.model), **angle, "images": results, "notes": notes}))
    elif detector.config.tile_budget:
        print(f"note: {BUDGET_NOTE}", file=sys.stderr)
    return status


def _depth_arguments(args: argparse.Namespace) -> tuple[dict[Path, Path] | None, Any]:
    """Each image's depth file and the camera matrix (None, None without --depth); ValueError (one line) for
    --depth without --camera-info, a count that does not match the images, or an unreadable calibration."""
    from tiled_detector.messages.depth import read_camera_calibration

    if args.depth is None:
        if args.camera_info is not None:
            raise ValueError("--camera-info is for --depth: give the depth image of each IMAGE with --depth")
        return None, None
    if args.camera_info is None:
        raise ValueError("--depth needs --camera-info INFO.yaml (the colour camera's calibration)")
    if len(args.depth) != len(args.images):
        raise ValueError(
            f"--depth needs one depth image per IMAGE: got {len(args.depth)} for {len(args.images)}"
        )
    return dict(zip(args.images, args.depth, strict=True)), read_camera_calibration(args.camera_info)


def _depth(path: Path, camera: Any, frame_hw: tuple[int, int]) -> Any:
    """The depth image of a frame of `frame_hw` with its camera matrix, or None (said on stderr) when the file
    cannot be read or is not aligned with the frame."""
    from tiled_detector.messages.depth import read_depth_file
    from tiled_detector.pipeline.depth import DepthError, DepthImage, aligned

    try:
        return aligned(DepthImage(read_depth_file(path), camera), frame_hw)
    except DepthError as error:
        print(f"{path}: no depth: {error}", file=sys.stderr)
        return None


def _rotated(dets: Any, k: int) -> dict[str, Any]:
    """A rotated box's JSON keys: `obb` [cx, cy, w, h, angle] (`polygons.ANGLE`, said once as `obb_angle`) and its four
    `corners` [[x, y], ...] (ultralytics' order); nothing for an axis-aligned model (`box` is the hull)."""
    if dets.obb is None:
        return {}
    from tiled_detector.geometry.polygons import corners

    obb = dets.obb[k].astype(np.float64)
    return {
        "obb": [*(round(float(v), 2) for v in obb[:4]), round(float(obb[4]), 5)],
        "corners": [[round(float(x), 2), round(float(y), 2)] for x, y in corners(obb)],
    }


def _located(dets: Detections, k: int) -> dict[str, list[float]]:
    """A detection's position and size (metres, optical frame) for the JSON, {} where it has no valid depth."""
    if dets.positions is None or not np.isfinite(dets.positions[k]).all():
        return {}
    position, size = dets.positions[k].tolist(), dets.sizes[k].tolist()
    return {"position": [round(v, 4) for v in position], "size": [round(v, 4) for v in size]}


def _positions_text(dets: Detections, names: Sequence[str]) -> str:
    """One line per detection with a position (x, y, z and the size, metres), and how many have none."""
    lines = [
        f"  {name} {score:.2f} at x {p[0]:.2f} y {p[1]:.2f} z {p[2]:.2f} m, size {s[0]:.2f} x {s[1]:.2f} x {s[2]:.2f} m"
        for name, score, p, s in zip(names, dets.scores.tolist(), dets.positions, dets.sizes, strict=True)
        if np.isfinite(p).all()
    ]
    missing = len(dets) - len(lines)
    return "\n".join(lines + ([f"  {missing} without a valid depth"] if missing else []))


def read_image(path: Path) -> tuple[np.ndarray | None, str | None]:
    """A colour (BGR) image and what is wrong with its file: (None, why) when nothing decodes, (image, why) when
    the file is cut short (JPEG without its end-of-image marker, PNG without IEND) but a part decoded."""
    import cv2

    try:
        data = path.read_bytes()
    except OSError as error:
        return None, error.strerror or str(error)
    body = data.rstrip(b"\0\r\n\t ")
    cut = None
    if data[:2] == b"\xff\xd8" and not body.endswith(b"\xff\xd9"):
        cut = "truncated JPEG (no end-of-image marker)"
    elif data[:8] == b"\x89PNG\r\n\x1a\n" and b"IEND" not in data[-16:]:
        cut = "truncated PNG (no IEND chunk)"
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) if data else None
    if image is None:
        return None, cut or ("not an image OpenCV can decode" if data else "empty file")
    return image, cut


def _joints(dets: Detections, k: int) -> dict[str, Any]:
    """Detection k's `"keypoints": [[x, y, score], ...]` (frame pixels), or nothing for a model without them."""
    if dets.keypoints is None:
        return {}
    return {
        "keypoints": [
            [round(float(x), 2), round(float(y), 2), round(float(s), 4)] for x, y, s in dets.keypoints[k]
        ]
    }


def _save_annotated(
    image_bgr: np.ndarray,
    dets: Detections,
    labels: Sequence[str] | None,
    plan: TilePlan,
    target: Path,
    skeleton: Sequence[tuple[int, int]] | None = None,
) -> None:
    """Draw the tiles, region of interest, ignored area, boxes and skeletons (annotate works in RGB) and write the
    image next to the others."""
    import cv2

    from tiled_detector.tools.annotate import annotate

    drawn = annotate(cv2.cvtColor(image_bgr, cv2.COLOR_BGR2RGB), dets, labels, plan=plan, skeleton=skeleton)
    cv2.imwrite(str(target), cv2.cvtColor(drawn, cv2.COLOR_RGB2BGR))
