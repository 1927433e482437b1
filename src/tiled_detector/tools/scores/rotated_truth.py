"""Rotated ground truth of a folder of images, read from the label files aerial datasets ship, for
`make-bag --images DIR --truth LABELS --truth-format dota | yolo-obb`.

One label file per image, matched by name (`P0706.png` <- `LABELS/P0706.txt`); every image needs one (an image
without objects has an empty file), so a wrong folder is refused instead of read as empty frames.

- DOTA v1.0 / v1.5 / v2.0 `labelTxt` (captain-whu.github.io/DOTA): a line per object, `x1 y1 x2 y2 x3 y3 x4 y4
  class difficult` (the four corners in pixels, clockwise from the object's head; `difficult` 0 or 1, 0 when
  left out), after optional header lines `imagesource:...`, `gsd:...` (and v2.0's `acquisition dates:...`). Class
  names are matched to the model's labels ignoring case and the difference between `-`, `_` and spaces (DOTA's
  `small-vehicle` is ultralytics' DOTAv1 `small vehicle`).
- ultralytics' OBB labels (docs.ultralytics.com/datasets/obb): a line per object, `class x1 y1 x2 y2 x3 y3 x4
  y4`, the class an index into the model's labels and the corners normalised by the image's width and height.

Each object keeps its four corners as written (DOTA's scores use the polygon) and, for the bag's message, its
rotated box: their minimum-area rectangle (`cv2.minAreaRect`, as ultralytics converts DOTA labels), in
ultralytics' xywhr. An object with no area inside its image is left out and counted (`RotatedTruthFrames.outside`).
A problem (a line with fewer than 8 coordinates, a value that is not a number, a difficult flag that is not 0 or
1, an image without a label file, a class index the model does not have) is refused before anything is written
(`TruthError`, one line naming the file, the line and the problem, and how many other problems there are).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from tiled_detector.tools.frames import Frame, image_folder_frames, image_paths
from tiled_detector.tools.scores.truth import TruthError, TruthFormat

COORDINATES = 8
_HEADER = re.compile(r"^[A-Za-z][A-Za-z ]*:")  # imagesource:..., gsd:..., acquisition dates:...


@dataclass(frozen=True)
class LabelFolder:
    """The objects of a folder of label files: per object its frame (the image's index), its corners (N, 4, 2) as
    written (pixels, or normalised to [0, 1] where `normalised`), its class id in the model's labels and whether
    it is difficult; `frames` images, `left_out` objects of classes the model does not have (or not
    `--truth-class`) and their class names."""

    path: Path
    frame: np.ndarray
    corners: np.ndarray
    class_ids: np.ndarray
    difficult: np.ndarray
    frames: int
    normalised: bool = False
    left_out: int = 0
    left_out_classes: tuple[str, ...] = ()

    def in_frame(self, index: int, width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Frame `index`'s objects in a `width` x `height` image: corners (N, 4, 2) in pixels, class ids, difficult,
        and how many objects were left out for having no area inside the image."""
        rows = self.frame == index
        corners = self.corners[rows].astype(np.float64)
        if self.normalised:
            corners = corners * (width, height)
        frame = np.array([(0, 0), (width, 0), (width, height), (0, height)], np.float32)
        inside = np.array(
            [cv2.intersectConvexConvex(cv2.convexHull(p.astype(np.float32)), frame)[0] > 0 for p in corners],
            bool,
        ).reshape(-1)
        return (
            corners[inside],
            self.class_ids[rows][inside],
            self.difficult[rows][inside],
            int((~inside).sum()),
        )


def label_key(name: str) -> str:
    """A class name as matched against the model's labels: lower case, `-` / `_` / spaces alike."""
    return re.sub(r"[-_\s]+", " ", name.strip().lower())


def min_area_boxes(polygons: Iterable[np.ndarray]) -> np.ndarray:
    """(N, 5) cx, cy, w, h, angle (radians) of the minimum-area rectangles of N polygons ((K, 2) points each, e.g.
    (N, 4, 2) corners): ultralytics' `xyxyxyxy2xywhr` (OpenCV's angle, turned to radians)."""
    found = [cv2.minAreaRect(np.asarray(polygon, np.float32).reshape(-1, 2)) for polygon in polygons]
    return np.array(
        [(cx, cy, w, h, math.radians(angle)) for (cx, cy), (w, h), angle in found], np.float32
    ).reshape(-1, 5)


class _Problems:
    """The problems found in a folder of label files: the first one is the message, the others are counted."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, text: str) -> None:
        self.found.append(text)

    def raise_any(self) -> None:
        if self.found:
            more = len(self.found) - 1
            raise TruthError(
                self.found[0] + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")
            )


def _label_files(folder: Path, names: Sequence[str], problems: _Problems) -> list[Path | None]:
    """The label file of each image (by name), None where an image has none (a problem)."""
    if not folder.is_dir():
        raise TruthError(f"--truth {folder}: not a folder of label files (one <image name>.txt per image)")
    found = []
    missing = []
    for name in names:
        path = folder / f"{Path(name).stem}.txt"
        found.append(path if path.is_file() else None)
        if not path.is_file():
            missing.append(name)
    if missing:
        problems.add(
            f"--truth {folder}: no label file for image {missing[0]} ({len(missing)} of the {len(names)} images "
            f"have none; an image without objects needs an empty {Path(missing[0]).stem}.txt)"
        )
    return found


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TruthError(f"--truth {path}: cannot read it ({error})") from None


def _numbers(tokens: Sequence[str], where: str, problems: _Problems) -> list[float] | None:
    try:
        values = [float(t) for t in tokens]
    except ValueError:
        bad = next(t for t in tokens if not _is_number(t))
        problems.add(f"{where}: {bad!r} is not a number")
        return None
    if not all(math.isfinite(v) for v in values):
        problems.add(f"{where}: coordinates must be finite, got {' '.join(tokens)}")
        return None
    return values


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def read_dota(
    folder: str | Path, names: Sequence[str], labels: Sequence[str], truth_class: str | None = None
) -> LabelFolder:
    """The DOTA labelTxt files of the images `names` (module docstring); classes matched to `labels` (only
    `truth_class` where given)."""
    folder = Path(folder)
    problems = _Problems()
    files = _label_files(folder, names, problems)
    ids = {label_key(label): k for k, label in enumerate(labels)}
    wanted = None if truth_class is None else label_key(truth_class)
    frame, corners, class_ids, difficult = [], [], [], []
    left_out: dict[str, int] = {}
    for index, path in enumerate(files):
        for number, line in enumerate(_read_lines(path) if path else [], start=1):
            tokens = line.split()
            if not tokens or _HEADER.match(line.strip()):
                continue
            where = f"--truth {path} line {number}"
            count = next((k for k, t in enumerate(tokens) if not _is_number(t)), len(tokens))
            if count < COORDINATES:
                if (
                    len(tokens) - count > 2
                ):  # a word among the coordinates, not a class and its flag after them
                    _numbers(tokens[:COORDINATES], where, problems)
                else:
                    problems.add(
                        f"{where}: {count} coordinates; a DOTA label has {COORDINATES} (x1 y1 x2 y2 x3 y3 x4 y4), "
                        "then the class and difficult"
                    )
                continue
            if count > COORDINATES or len(tokens) == COORDINATES:
                problems.add(f"{where}: no class name after the {COORDINATES} coordinates")
                continue
            values = _numbers(tokens[:COORDINATES], where, problems)
            flag = tokens[COORDINATES + 1] if len(tokens) > COORDINATES + 1 else "0"
            if flag not in ("0", "1"):
                problems.add(f"{where}: difficult must be 0 or 1, got {flag!r}")
                continue
            if values is None:
                continue
            name = tokens[COORDINATES]
            key = label_key(name)
            if key not in ids or (wanted is not None and key != wanted):
                left_out[name] = left_out.get(name, 0) + 1
                continue
            frame.append(index)
            corners.append(values)
            class_ids.append(ids[key])
            difficult.append(flag == "1")
    problems.raise_any()
    return _folder(folder, frame, corners, class_ids, difficult, len(names), False, left_out)


def read_yolo_obb(
    folder: str | Path, names: Sequence[str], labels: Sequence[str], truth_class: str | None = None
) -> LabelFolder:
    """The ultralytics OBB label files of the images `names` (module docstring); class indices into `labels`
    (only `truth_class`'s where given)."""
    folder = Path(folder)
    problems = _Problems()
    files = _label_files(folder, names, problems)
    wanted = None if truth_class is None else label_key(truth_class)
    frame, corners, class_ids = [], [], []
    left_out: dict[str, int] = {}
    for index, path in enumerate(files):
        for number, line in enumerate(_read_lines(path) if path else [], start=1):
            tokens = line.split()
            if not tokens:
                continue
            where = f"--truth {path} line {number}"
            if len(tokens) != 1 + COORDINATES:
                problems.add(
                    f"{where}: {len(tokens) - 1} coordinates; an ultralytics OBB label is the class index, then "
                    f"{COORDINATES} normalised coordinates (x1 y1 x2 y2 x3 y3 x4 y4)"
                )
                continue
            values = _numbers(tokens, where, problems)
            if values is None:
                continue
            cls = values[0]
            if not cls.is_integer() or not 0 <= cls < len(labels):
                problems.add(
                    f"{where}: class {tokens[0]} is not a class index of the model (0 to {len(labels) - 1})"
                )
                continue
            name = labels[int(cls)]
            if wanted is not None and label_key(name) != wanted:
                left_out[name] = left_out.get(name, 0) + 1
                continue
            frame.append(index)
            corners.append(values[1:])
            class_ids.append(int(cls))
    problems.raise_any()
    return _folder(folder, frame, corners, class_ids, [False] * len(frame), len(names), True, left_out)


def _folder(
    path: Path,
    frame: list[int],
    corners: list[list[float]],
    class_ids: list[int],
    difficult: list[bool],
    frames: int,
    normalised: bool,
    left_out: dict[str, int],
) -> LabelFolder:
    return LabelFolder(
        path,
        np.array(frame, np.int64),
        np.array(corners, np.float64).reshape(-1, 4, 2),
        np.array(class_ids, np.int64),
        np.array(difficult, bool),
        frames,
        normalised,
        sum(left_out.values()),
        tuple(sorted(left_out)),
    )


class RotatedTruthFrames:
    """`frames` carrying `truth`: rotated boxes (the corners' minimum-area rectangles), their axis-aligned hulls
    clipped to the frame, class ids and difficult flags; iterated once; `outside`: the objects left out so far for
    having no area inside their image."""

    def __init__(self, frames: Iterable[Frame], truth: LabelFolder) -> None:
        self._frames, self._truth = frames, truth
        self.outside = 0

    def __iter__(self) -> Iterator[Frame]:
        for index, frame in enumerate(self._frames):
            height, width = frame.image.shape[:2]
            corners, class_ids, difficult, outside = self._truth.in_frame(index, width, height)
            self.outside += outside
            hulls = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1).reshape(-1, 4)
            hulls = np.clip(hulls, 0.0, [width, height, width, height]).astype(np.float32)
            yield dataclasses.replace(
                frame, boxes=hulls, class_ids=class_ids, obb=min_area_boxes(corners), difficult=difficult
            )


READERS = {TruthFormat.DOTA: read_dota, TruthFormat.YOLO_OBB: read_yolo_obb}


def rotated_recording_frames(
    images: Path,
    truth_path: Path,
    truth_format: TruthFormat,
    labels: Sequence[str],
    truth_class: str | None = None,
) -> tuple[RotatedTruthFrames, LabelFolder]:
    """The images of a folder carrying the rotated truth of a folder of label files, and the truth (read and
    checked before any image is)."""
    names = [p.name for p in image_paths(images)]
    truth = READERS[truth_format](truth_path, names, labels, truth_class)
    if not len(truth.frame):
        extra = (
            f" ({truth.left_out} objects of {', '.join(truth.left_out_classes)})" if truth.left_out else ""
        )
        raise TruthError(
            f"--truth {truth_path}: no object of a class of the model (its labels: {', '.join(labels)}){extra}"
        )
    return RotatedTruthFrames(image_folder_frames(images), truth), truth
