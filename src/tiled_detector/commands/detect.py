"""`tiled-detector detect IMAGE...`: tiled detection on image files, one line per image (and optional JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tiled_detector.commands.settings import add_settings, parameter_values

if TYPE_CHECKING:
    import numpy as np

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
    add_settings(parser)


def run(args: argparse.Namespace) -> int:
    """Detect in every image; returns 1 when an image could not be read, else 0."""
    from tiled_detector.parameters import build_detector

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
        dets = detector.detect(image, encoding="bgr8")
        names = [labels[c] if labels and c < len(labels) else str(c) for c in dets.class_ids.tolist()]
        counts = {n: names.count(n) for n in sorted(set(names))}
        summary = ", ".join(f"{n} {k}" for n, k in counts.items()) or "nothing"
        print(f"{path}: {len(dets)} detections ({summary}) in {dets.timings['total']:.1f} ms")
        if args.out:
            _save_annotated(image, dets, labels, detector.plan_for(*image.shape[:2]), args.out / path.name)
        results.append(
            {
                "image": str(path),
                "truncated": problem is not None,
                "width": image.shape[1],
                "height": image.shape[0],
                "detections": [
                    {
                        "box": [round(float(v), 2) for v in box],
                        "score": round(float(s), 4),
                        "class_id": c,
                        "label": n,
                    }
                    for box, s, c, n in zip(
                        dets.boxes, dets.scores, dets.class_ids.tolist(), names, strict=True
                    )
                ],
                "timings_ms": {k: round(v, 3) for k, v in dets.timings.items()},
            }
        )
    if args.json:
        notes = [BUDGET_NOTE] if detector.config.tile_budget else []
        print(json.dumps({"model": str(detector.config.model), "images": results, "notes": notes}))
    elif detector.config.tile_budget:
        print(f"note: {BUDGET_NOTE}", file=sys.stderr)
    return status


def read_image(path: Path) -> tuple[np.ndarray | None, str | None]:
    """A colour (BGR) image and what is wrong with its file: (None, why) when nothing decodes, (image, why) when
    the file is cut short (JPEG without its end-of-image marker, PNG without IEND) but a part decoded."""
    import cv2
    import numpy as np

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


def _save_annotated(
    image_bgr: np.ndarray, dets: Detections, labels: Sequence[str] | None, plan: TilePlan, target: Path
) -> None:
    """Draw the tiles, region of interest, ignored area and boxes (annotate works in RGB) and write the image next
    to the others."""
    import cv2

    from tiled_detector.tools.annotate import annotate

    drawn = annotate(cv2.cvtColor(image_bgr, cv2.COLOR_BGR2RGB), dets, labels, plan=plan)
    cv2.imwrite(str(target), cv2.cvtColor(drawn, cv2.COLOR_RGB2BGR))
