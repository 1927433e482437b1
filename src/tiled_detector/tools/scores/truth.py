"""Ground truth of a user's own recording, read from the files annotation tools write: MOTChallenge `gt.txt` and
COCO JSON, matched to the recording's frames (a folder of images or a video) for `make-bag --truth`.

MOTChallenge (motchallenge.net's format; Milan et al., "MOT16", 2016): one comma-separated row per box,
`frame, id, left, top, width, height, consider, class, visibility` (MOT16 / MOT17 / MOT20: 9 columns) or
`frame, id, left, top, width, height, consider, x, y, z` (2D MOT 2015: 10 columns; x, y, z are world coordinates,
-1 in 2D, and every row is a pedestrian). Frame numbers count from 1: frame n is the n-th image of the folder in
natural order of the names (numbers as numbers: frame2 before frame10; the order `make-bag --images` writes them
in) or the n-th frame of the video; a folder's names must carry their frame numbers one to one (the last number in
each name: one number per image, counting up by one from any start), else it is refused naming two examples. Pixel coordinates count from 1
too: (left, top) is the box's top-left pixel, the image's first pixel being (1, 1). In our coordinates, pixel
edges from 0 (an image spans [0, W] x [0, H]), that box is x1 = left - 1, y1 = top - 1, x2 = x1 + width,
y2 = y1 + height. Left out: rows whose consider flag is 0 and, in 9 columns, classes other than pedestrian (1;
-1, unlabelled, is kept). A row's id is the object's identity across frames.

COCO (cocodataset.org's detection format): `images`, `annotations` with `bbox` [x, y, width, height] in pixel
edges from 0 (x1 = x, x2 = x + width: no shift), `categories`. The annotations of the category named
`truth_class` are kept, crowd regions (`iscrowd` 1) left out. With a folder, each image is matched to the COCO
image of its file name (`file_name`'s last part; COCO images not in the folder are ignored); with a video, the COCO
images are its frames in the order of `frame_index` (TAO) or `frame_id` (BDD100K) where every image has one,
else of their ids, and they must all be of one video (`video_id`). An annotation's `track_id` (TAO),
`instance_id` (BDD100K) or `attributes.track_id` (CVAT) is its identity; when any kept annotation has none, the
truth has no identities (boxes only: AP50 can be scored, not IDF1). An annotation's `segmentation` (polygons or
RLE) is kept, as compressed RLE of its image's size (`width` / `height` of the COCO image; mask AP is scored
where the truth has them); a broken one (a polygon of fewer than 3 points, an odd coordinate count, an RLE of
another size) is refused before anything is written. Person keypoints (COCO's keypoint format: the category's
`keypoints` names its K joints, `skeleton` its bones; an annotation's `keypoints` holds x, y, visibility for each,
in the same pixels as its box, visibility 0 where the joint is not labelled) are kept with the object's `area`
(its segmentation's, which OKS scales by); an annotation without them has none labelled. Keypoints whose joint count
differs from the category's names (or, `joints`, from the model's) are refused in one line naming both counts.

Boxes reaching past the frame's border (normal in MOT17) are clipped to it; a box with no area inside its frame is
left out and counted (`TruthFrames.outside`); a frame the recording does not have, a wrong column count or a
repeated identity in one frame are refused (`TruthError`, one line naming the file and the problem).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.settings.options import Option
from tiled_detector.tools.frames import Frame, image_folder_frames, image_paths, video_frames
from tiled_detector.tools.scoring import BOX_AREA_SHARE
from tiled_detector.tools.segmentation import SegmentationError, truth_rle

MOT_COLUMNS = {9: "MOT16 / MOT17 / MOT20", 10: "MOT15"}
PEDESTRIAN = 1  # the MOT16+ class kept
UNLABELLED = -1  # a MOT class column without a class
TRACK_KEYS = ("track_id", "instance_id")  # an annotation's identity (also attributes.track_id)
FRAME_KEYS = ("frame_index", "frame_id")  # a video frame's position (TAO, BDD100K)


class TruthError(ValueError):
    """A truth file that cannot be matched to the recording; the text names the file (or flag) and the problem."""


class TruthFormat(Option):
    """How a truth file is written."""

    MOT = "mot"
    COCO = "coco"
    DOTA = "dota"  # a folder of DOTA labelTxt files (`rotated_truth`)
    YOLO_OBB = "yolo-obb"  # a folder of ultralytics OBB label files (`rotated_truth`)

    @property
    def rotated(self) -> bool:
        """Whether the truth is rotated boxes in a folder of label files, one per image."""
        return self in (TruthFormat.DOTA, TruthFormat.YOLO_OBB)

    @classmethod
    def of(cls, path: str | Path, given: str | None = None) -> TruthFormat:
        """`given` (`--truth-format`), else from the file's suffix: .txt is MOTChallenge, .json COCO."""
        if given is not None:
            try:
                return cls.from_value(given)
            except ValueError as error:
                raise TruthError(f"--truth-format: {error}") from None
        if Path(path).is_dir():
            raise TruthError(
                f"--truth {path} is a folder: give --truth-format dota (DOTA labelTxt) or yolo-obb (ultralytics OBB "
                "labels)"
            )
        suffix = Path(path).suffix.lower()
        if suffix in SUFFIXES:
            return SUFFIXES[suffix]
        raise TruthError(
            f"--truth {path}: cannot tell its format from the suffix {suffix or '(none)'!r} "
            "(.txt: MOTChallenge gt.txt, .json: COCO): give --truth-format mot or coco"
        )


SUFFIXES = {".txt": TruthFormat.MOT, ".json": TruthFormat.COCO}


@dataclass(frozen=True)
class Truth:
    """A recording's ground truth: one row per object per frame (`frame`: 0-based frame index, `boxes`: x1, y1,
    x2, y2 in pixel edges from 0 as the file gives them, not yet clipped; `ids`: identities, None when the file
    gives none), `frames` (the frames the file covers: MOT's last frame number, COCO's image count; `exact`: the
    recording must have exactly that many, as a COCO file lists every frame), `left_out` (rows or annotations
    not taken) and `path` for messages."""

    path: Path
    frame: np.ndarray
    boxes: np.ndarray
    ids: np.ndarray | None
    frames: int
    exact: bool = False
    left_out: int = 0
    segments: tuple[dict[str, Any] | None, ...] | None = None  # per row its mask (COCO RLE), None: none given
    keypoints: np.ndarray | None = None  # (rows, K, 3) x, y, visibility per joint; None: the file has none
    areas: np.ndarray | None = None  # (rows,) each object's area (COCO's `area`, for OKS), with keypoints
    joints: tuple[str, ...] = ()  # the keypoints' joint names (the category's), with keypoints
    skeleton: tuple[
        tuple[int, int], ...
    ] = ()  # the category's bones (0-based joint pairs), where it gives them

    def __post_init__(self) -> None:
        if self.ids is not None:
            pairs = np.stack([self.frame, self.ids], axis=1)
            unique, counts = np.unique(pairs, axis=0, return_counts=True)
            if len(pairs) and counts.max() > 1:
                frame, identity = unique[int(np.argmax(counts))].tolist()
                raise TruthError(f"--truth {self.path}: id {identity} appears twice in frame {frame + 1}")

    @property
    def identities(self) -> bool:
        return self.ids is not None

    def in_frame(self, index: int, width: int, height: int) -> tuple[np.ndarray, np.ndarray | None, int]:
        """Frame `index`'s boxes clipped to a `width` x `height` frame, their ids, and how many boxes were left out
        for having no area inside the frame."""
        rows = self.frame == index
        clipped = np.clip(self.boxes[rows], 0.0, [width, height, width, height]).astype(np.float32)
        inside = (clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])
        ids = None if self.ids is None else self.ids[rows][inside]
        return clipped[inside], ids, int(np.count_nonzero(~inside))

    def masks_in_frame(self, index: int, width: int, height: int) -> tuple[dict[str, Any] | None, ...] | None:
        """Frame `index`'s masks (COCO RLE, one per box of `in_frame`), None when the truth has none; TruthError
        for a mask of another size than the frame."""
        if self.segments is None:
            return None
        rows = np.flatnonzero(self.frame == index)
        clipped = np.clip(self.boxes[rows], 0.0, [width, height, width, height])
        inside = (clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])  # `in_frame`'s boxes
        found = tuple(self.segments[k] for k in rows[inside])
        for rle in found:
            if rle is not None and list(rle["size"]) != [height, width]:
                raise TruthError(
                    f"--truth {self.path}: frame {index + 1} has a segmentation of size {rle['size']} (its COCO "
                    f"image's), but the frame is {width}x{height}"
                )
        return found

    def keypoints_in_frame(self, index: int, width: int, height: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Frame `index`'s keypoints (n, K, 3) and areas (n,), one per box of `in_frame`; None without keypoints."""
        if self.keypoints is None or self.areas is None:
            return None
        rows = np.flatnonzero(self.frame == index)
        clipped = np.clip(self.boxes[rows], 0.0, [width, height, width, height])
        inside = rows[(clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])]  # `in_frame`'s boxes
        return self.keypoints[inside].astype(np.float32), self.areas[inside].astype(np.float32)

    def check_count(self, available: int, what: str, cut: bool = False) -> None:
        """TruthError when the truth does not fit `available` frames of `what` (`cut`: the recording was cut
        short on purpose, `--frames`: the truth's later frames are dropped with it)."""
        if self.frames > available and not cut:
            raise TruthError(
                f"--truth {self.path}: holds frame {self.frames} but {what} has {available} frames"
            )
        if self.exact and self.frames < available:
            raise TruthError(
                f"--truth {self.path}: lists {self.frames} images but {what} has {available} frames"
            )


def read_mot(path: str | Path) -> Truth:
    """A MOTChallenge gt.txt (module docstring): the pedestrians to consider, with their identities."""
    path = Path(path)
    rows = [line.strip().rstrip(",") for line in _text(path).splitlines()]
    rows = [row for row in rows if row]
    if not rows:
        raise TruthError(f"--truth {path}: no rows (a MOTChallenge gt.txt has one row per box)")
    cells = [row.split(",") for row in rows]
    width = len(cells[0])
    for number, row in enumerate(cells, start=1):
        if len(row) != width or width not in MOT_COLUMNS:
            expected = " or ".join(f"{n} ({what})" for n, what in MOT_COLUMNS.items())
            raise TruthError(
                f"--truth {path}: row {number} has {len(row)} columns; a MOTChallenge gt.txt has {expected} "
                "in every row"
            )
    try:
        table = np.array(cells, np.float64)
    except ValueError as error:
        raise TruthError(f"--truth {path}: not a MOTChallenge gt.txt of numbers ({error})") from None
    frame, ids = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
    if frame.min() < 1:
        raise TruthError(
            f"--truth {path}: frame {frame.min()} in row {int(np.argmin(frame)) + 1}; "
            "MOTChallenge frames count from 1"
        )
    if (ids < 0).all():
        raise TruthError(
            f"--truth {path}: every id is -1: a detections file (det.txt), not ground truth (gt.txt)"
        )
    keep = table[:, 6] != 0
    if width == 9:
        keep &= np.isin(table[:, 7], (PEDESTRIAN, UNLABELLED))
    left, top, w, h = (table[:, k] for k in (2, 3, 4, 5))
    boxes = np.stack([left - 1.0, top - 1.0, left - 1.0 + w, top - 1.0 + h], axis=1)
    return Truth(path, frame[keep] - 1, boxes[keep], ids[keep], int(frame.max()), left_out=int((~keep).sum()))


def read_coco(
    path: str | Path, truth_class: str, names: Sequence[str] | None = None, joints: int | None = None
) -> Truth:
    """A COCO file's annotations of category `truth_class`, for a folder's images (`names`: their file names, in
    the recording's order) or, without `names`, a video's frames (module docstring); `joints`: the model's joint
    count its keypoints must have (None: any)."""
    path = Path(path)
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as error:
        raise TruthError(f"--truth {path}: not JSON ({error})") from None
    if not isinstance(data, dict) or not {"images", "annotations", "categories"} <= set(data):
        raise TruthError(f"--truth {path}: not a COCO file (it needs images, annotations and categories)")
    categories = {c["id"] for c in data["categories"] if c.get("name") == truth_class}
    if not categories:
        known = ", ".join(sorted({str(c.get("name")) for c in data["categories"]}))
        raise TruthError(
            f"--truth-class {truth_class}: {path} has no category of that name (it has: {known})"
        )
    order = _coco_order(path, data["images"], names)
    kept = [a for a in data["annotations"] if a.get("category_id") in categories and not a.get("iscrowd", 0)]
    taken = [a for a in kept if a.get("image_id") in order]
    left_out = len(data["annotations"]) - len(kept)
    frame = np.array([order[a["image_id"]] for a in taken], np.int64)
    boxes = np.array([a["bbox"] for a in taken], np.float64).reshape(-1, 4)
    boxes[:, 2:] += boxes[:, :2]
    tracks = [_track_id(a) for a in taken]
    ids = None if None in tracks else _as_ints(tracks)
    segments = _segments(path, data["images"], taken)
    found = _keypoints(path, [c for c in data["categories"] if c["id"] in categories], taken, joints)
    return Truth(
        path, frame, boxes, ids, len(order), exact=True, left_out=left_out, segments=segments, **found
    )


def _keypoints(
    path: Path, categories: list[dict[str, Any]], taken: list[dict[str, Any]], joints: int | None
) -> dict[str, Any]:
    """The taken annotations' keypoints (rows, K, 3), areas, joint names and skeleton as `Truth` fields (none where
    neither the category names joints nor an annotation has keypoints); TruthError where an annotation's joint count
    is not its category's or the model's (`joints`)."""
    named = [c for c in categories if c.get("keypoints")]
    if not named and not any(a.get("keypoints") for a in taken):
        return {}
    names = tuple(str(n) for n in named[0]["keypoints"]) if named else ()
    count = len(names) or len(next(a["keypoints"] for a in taken if a.get("keypoints"))) // 3
    where = f"--truth {path}"
    if joints is not None and count != joints:
        raise TruthError(
            f"{where}: its keypoints have {count} joints but the model's have {joints}: give the pose model the "
            "bag will be replayed with, or truth of its joints"
        )
    table = np.zeros((len(taken), count, 3))
    for row, annotation in enumerate(taken):
        values = annotation.get("keypoints") or []
        if len(values) % 3 or (values and len(values) // 3 != count):
            found = f"{len(values)} values" if len(values) % 3 else f"{len(values) // 3} joints"
            raise TruthError(
                f"{where}: annotation {annotation.get('id', '?')} (image {annotation['image_id']}) has keypoints of "
                f"{found} but its category has {count} joints (x, y, visibility each)"
            )
        if values:
            table[row] = np.asarray(values, np.float64).reshape(count, 3)
    sides = np.array([a["bbox"][2:] for a in taken], np.float64).reshape(-1, 2)
    areas = np.array(
        [a.get("area") or w * h * BOX_AREA_SHARE for a, (w, h) in zip(taken, sides.tolist(), strict=True)]
    )
    bones = named[0].get("skeleton") or [] if named else []
    return {
        "keypoints": table,
        "areas": areas.reshape(-1),
        "joints": names or tuple(f"joint_{k}" for k in range(count)),
        "skeleton": tuple((int(a) - 1, int(b) - 1) for a, b in bones),  # COCO's skeleton counts joints from 1
    }


def _segments(
    path: Path, images: list[dict[str, Any]], taken: list[dict[str, Any]]
) -> tuple[dict[str, Any] | None, ...] | None:
    """The taken annotations' segmentations as compressed RLE of their image's size (None where an annotation
    has none; None when none has one); TruthError naming the annotation of a broken one."""
    if not any(a.get("segmentation") for a in taken):
        return None
    sizes = {image["id"]: (image.get("height"), image.get("width")) for image in images}
    found: list[dict[str, Any] | None] = []
    for annotation in taken:
        segmentation = annotation.get("segmentation")
        where = f"--truth {path}: annotation {annotation.get('id', '?')} (image {annotation['image_id']})"
        if not segmentation:
            found.append(None)
            continue
        height, width = sizes.get(annotation["image_id"], (None, None))
        if not isinstance(height, int) or not isinstance(width, int) or height < 1 or width < 1:
            raise TruthError(f"{where}: a segmentation needs its COCO image's width and height")
        try:
            found.append(truth_rle(segmentation, (height, width), where))
        except SegmentationError as error:
            raise TruthError(str(error)) from None
    return tuple(found)


def _coco_order(path: Path, images: list[dict[str, Any]], names: Sequence[str] | None) -> dict[Any, int]:
    """COCO image id -> frame index: by file name for a folder's images (`names`), else in frame order."""
    if names is not None:
        by_name: dict[str, Any] = {}
        for image in images:
            name = Path(str(image.get("file_name", ""))).name
            if name in by_name:
                raise TruthError(
                    f"--truth {path}: two images are named {name}: cannot match them to --images"
                )
            by_name[name] = image["id"]
        missing = [name for name in names if name not in by_name]
        if missing:
            raise TruthError(
                f"--truth {path}: has no image named {missing[0]} "
                f"({len(missing)} of the {len(names)} images of --images are not in it)"
            )
        return {by_name[name]: index for index, name in enumerate(names)}
    videos = {image.get("video_id") for image in images}
    if len(videos) > 1:
        raise TruthError(
            f"--truth {path}: holds images of {len(videos)} videos (video_id): "
            "a --video needs the COCO file of that one video"
        )
    key = next((k for k in FRAME_KEYS if all(k in image for image in images)), "id")
    positions = [image[key] for image in images]
    if len(set(positions)) != len(positions):
        raise TruthError(f"--truth {path}: two images have the same {key}: cannot order the video's frames")
    ordered = sorted(images, key=lambda image: image[key])
    return {image["id"]: index for index, image in enumerate(ordered)}


def _track_id(annotation: dict[str, Any]) -> Any:
    """An annotation's identity (module docstring), or None."""
    for key in TRACK_KEYS:
        if annotation.get(key) is not None:
            return annotation[key]
    return (annotation.get("attributes") or {}).get("track_id")


def _as_ints(tracks: list[Any]) -> np.ndarray:
    """Identities as integers: whole numbers as they are, anything else (names) numbered from 1 in order."""
    if all(isinstance(t, int) or (isinstance(t, float) and t.is_integer()) for t in tracks):
        return np.array(tracks, np.int64).reshape(-1)
    numbers: dict[Any, int] = {}
    return np.array([numbers.setdefault(t, len(numbers) + 1) for t in tracks], np.int64).reshape(-1)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise TruthError(f"--truth {path}: cannot read it ({error})") from None


def read_truth(
    path: str | Path,
    truth_format: TruthFormat,
    truth_class: str,
    names: Sequence[str] | None = None,
    joints: int | None = None,
) -> Truth:
    """The truth file at `path` (for a folder's images `names`, else a video's frames; `joints`: the model's
    keypoint count, which COCO keypoints must have)."""
    if truth_format is TruthFormat.MOT:
        return read_mot(path)
    return read_coco(path, truth_class, names, joints)


class TruthFrames:
    """`frames` carrying `truth` (class id 0, boxes clipped to each frame, identities where the truth has them;
    a frame without rows carries no objects; their masks where the truth has them), iterated once; `outside`: the boxes left out so far for having no
    area inside their frame. TruthError, raised while the frames are read, when they do not match
    (`Truth.check_count`; `cut`: the most frames the recording was limited to)."""

    def __init__(self, frames: Iterable[Frame], truth: Truth, what: str, cut: int | None = None) -> None:
        self._frames, self._truth, self._what, self._cut = frames, truth, what, cut
        self.outside = 0

    def __iter__(self) -> Iterator[Frame]:
        count = 0
        for index, frame in enumerate(self._frames):
            height, width = frame.image.shape[:2]
            boxes, ids, outside = self._truth.in_frame(index, width, height)
            masks = self._truth.masks_in_frame(index, width, height)
            points = self._truth.keypoints_in_frame(index, width, height)
            self.outside += outside
            yield dataclasses.replace(
                frame,
                boxes=boxes,
                class_ids=np.zeros(len(boxes), np.int64),
                ids=ids,
                masks=masks,
                keypoints=None if points is None else points[0],
                areas=None if points is None else points[1],
            )
            count += 1
        self._truth.check_count(count, self._what, cut=self._cut is not None and count == self._cut)


def check_numbers(folder: Path, names: Sequence[str]) -> None:
    """TruthError unless the images `names` (in natural order) carry the frame numbers of a MOTChallenge file one
    to one: the last number in each name, one per image, counting up by one (from any start: 0 or 1)."""
    numbers = [re.findall(r"\d+", Path(name).stem) for name in names]
    bare = [name for name, found in zip(names, numbers, strict=True) if not found]
    problem = None
    if len(bare) > 1:
        problem = f"{bare[0]} and {bare[1]} carry no frame number"
    elif bare and len(names) > 1:
        problem = f"{bare[0]} carries no frame number ({next(n for n in names if n != bare[0])} does)"
    elif not bare:
        values = [int(found[-1]) for found in numbers]
        for k in range(1, len(names)):
            if values[k] == values[k - 1]:
                problem = f"{names[k - 1]} and {names[k]} both number frame {values[k]}"
            elif values[k] != values[k - 1] + 1:
                problem = f"{names[k - 1]} is followed by {names[k]} (frame numbers skipped)"
            if problem:
                break
    if problem is not None:
        raise TruthError(
            f"--images {folder}: {problem}: a MOTChallenge --truth's frame n is the n-th image in natural order, "
            "so the names must number the frames one to one, counting up by one"
        )


def recording_frames(
    images: Path | None,
    video: Path | None,
    limit: int | None,
    truth_path: Path,
    truth_format: str | None,
    truth_class: str,
    joints: int | None = None,
) -> tuple[TruthFrames, Truth]:
    """The frames of a folder of `images` or a `video` (at most `limit`) carrying the truth file's boxes (and
    keypoints, of `joints` joints where given), and the truth; a folder's frame count (and, for a MOTChallenge file,
    its names' frame numbers) is checked before any image is read, a video's as it is read."""
    if images is None and video is None:
        raise TruthError("--truth needs --images or --video: the frames its boxes are on")
    kind = TruthFormat.of(truth_path, truth_format)
    names = None if images is None else [p.name for p in image_paths(images)]
    truth = read_truth(truth_path, kind, truth_class, names, joints)
    if not len(truth.frame):
        raise TruthError(
            f"--truth {truth_path}: no {truth_class} to score ({truth.left_out} rows or annotations "
            "left out: consider 0, other classes, crowds)"
        )
    if names is not None:
        if kind is TruthFormat.MOT:
            check_numbers(images, names)  # type: ignore[arg-type]
        truth.check_count(len(names), f"--images {images}")
        return TruthFrames(image_folder_frames(images), truth, f"--images {images}"), truth
    return TruthFrames(video_frames(video, limit), truth, f"--video {video}", cut=limit), truth
