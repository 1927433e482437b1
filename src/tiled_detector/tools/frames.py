"""Camera frames from files: synthetic scenes (with ground truth: boxes, rotated boxes, keypoints), a folder of
images, a video, or the image
topics of a rosbag2 bag (decoded as the node decodes its messages). The sources of `make-bag` and of INT8
calibration."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tiled_detector.tools.worlds.synthetic import MotionStyle

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff"})


@dataclass(frozen=True)
class Frame:
    """One camera frame: (H, W, C) pixels in `encoding` (rgb8 unless a bag says otherwise), and ground truth
    (boxes x1y1x2y2, class ids; and the objects' identities across frames, for moving scenes) when known; rotated
    truth adds `obb` (N, 5: cx, cy, w, h, angle; `boxes` are their axis-aligned hulls) and `difficult` (N,) bool:
    objects DOTA's scores ignore; keypoint truth `keypoints` and `areas`."""

    image: np.ndarray
    boxes: np.ndarray | None = None
    class_ids: np.ndarray | None = None
    encoding: str = "rgb8"
    ids: np.ndarray | None = None
    camera: np.ndarray | None = None  # moving scenes: the true camera motion since the previous frame (2, 3)
    masks: tuple[dict[str, Any] | None, ...] | None = None  # the boxes' masks (COCO RLE; None: not given)
    obb: np.ndarray | None = None
    difficult: np.ndarray | None = None
    keypoints: np.ndarray | None = None  # (N, K, 3) x, y, visibility per joint (0: not labelled)
    areas: np.ndarray | None = None  # (N,) the objects' areas OKS scales by, with keypoints

    def __post_init__(self) -> None:
        if (self.boxes is None) != (self.class_ids is None):
            raise ValueError("ground truth needs both boxes and class_ids, or neither")


def synthetic_frames(frames: int, seed: int, width: int, height: int) -> Iterator[Frame]:
    """Frames of `tiled_detector.tools.worlds.synthetic` (frame i uses seed + i) with their ground truth."""
    from tiled_detector.tools.worlds.synthetic import make_scene

    for index in range(frames):
        scene = make_scene(seed + index, width, height)
        yield Frame(scene.image, scene.boxes, scene.class_ids)


def motion_frames(
    frames: int, seed: int, width: int, height: int, camera: MotionStyle | None = None
) -> Iterator[Frame]:
    """Frames of a moving synthetic scene (`synthetic.make_sequence`, the camera moving as `camera` says) with
    ground truth, object identities and the true camera motion."""
    from tiled_detector.tools.worlds.synthetic import make_sequence

    for scene in make_sequence(seed, frames, width, height, camera):
        yield Frame(scene.image, scene.boxes, scene.class_ids, ids=scene.ids, camera=scene.camera)


def natural_key(name: str) -> tuple[tuple[str | int, ...], str]:
    """A name's key in natural order: its runs of digits compared as numbers (frame2 before frame10), the name
    itself breaking ties (frame01 and frame1)."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(part) if k % 2 else part for k, part in enumerate(parts)), name


def rotated_frames(frames: int, seed: int, width: int, height: int, moving: bool = False) -> Iterator[Frame]:
    """Frames of the rotated world (`rotated_scenes`: frame i of `make_rotated_scene` uses seed + i; `moving`: one
    `make_rotated_sequence` whose objects drive and turn, with their identities) with rotated truth and its
    axis-aligned hulls."""
    from tiled_detector.geometry import polygons
    from tiled_detector.tools.worlds.rotated_scenes import make_rotated_scene, make_rotated_sequence

    scenes = (
        make_rotated_sequence(seed, frames, width, height)
        if moving
        else (make_rotated_scene(seed + index, width, height) for index in range(frames))
    )
    for scene in scenes:
        hulls = (
            polygons.hulls(polygons.corners(scene.obb.astype(np.float64))).astype(np.float32).reshape(-1, 4)
        )
        hulls = np.clip(hulls, 0.0, [width, height, width, height])
        yield Frame(scene.image, hulls, scene.class_ids, ids=scene.ids if moving else None, obb=scene.obb)


def pose_frames(frames: int, seed: int, width: int, height: int) -> Iterator[Frame]:
    """Frames of the pose world (`pose_scenes`: frame i of `make_pose_scene` uses seed + i) with their figures' boxes,
    keypoints and the areas OKS scales by."""
    from tiled_detector.tools.worlds.pose_scenes import make_pose_scene

    for index in range(frames):
        scene = make_pose_scene(seed + index, width, height)
        yield Frame(scene.image, scene.boxes, scene.class_ids, keypoints=scene.keypoints, areas=scene.areas)


def image_paths(folder: str | Path) -> list[Path]:
    """The image files of a folder (png, jpg, jpeg, bmp, tif, tiff) in natural order of their names (`natural_key`);
    FileNotFoundError when none."""
    paths = sorted(
        (p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES),
        key=lambda p: natural_key(p.name),
    )
    if not paths:
        raise FileNotFoundError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {folder}")
    return paths


def read_image(path: Path) -> Frame:
    """One image file as an rgb8 frame; ValueError when OpenCV cannot decode it."""
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"cannot read image {path}")
    return Frame(np.ascontiguousarray(image[..., ::-1]))


def image_folder_frames(folder: str | Path) -> Iterator[Frame]:
    """The images of a folder (png, jpg, jpeg, bmp, tif, tiff), in natural order of their names, without ground
    truth."""
    return (read_image(path) for path in image_paths(folder))


def video_frames(path: str | Path, limit: int | None = None) -> Iterator[Frame]:
    """The frames of a video file (cv2.VideoCapture), at most `limit`, without ground truth."""
    import cv2

    if not Path(path).is_file():
        raise FileNotFoundError(f"no video file {path}")
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise ValueError(f"OpenCV cannot open video {path}")
        count = 0
        while limit is None or count < limit:
            ok, image = capture.read()
            if not ok:
                return
            yield Frame(np.ascontiguousarray(image[..., ::-1]))
            count += 1
    finally:
        capture.release()


def is_bag(source: Path) -> bool:
    """A rosbag2 bag: a .mcap / .db3 file, or a folder with metadata.yaml."""
    return source.suffix in {".mcap", ".db3"} or (source.is_dir() and (source / "metadata.yaml").exists())


IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")


def bag_messages(bag: Path, keep: Callable[[int], bool] | None = None) -> Iterator[tuple[str, bytes, Any]]:
    """(message type, serialized bytes, reader) of the image messages of a bag (those whose index `keep` takes);
    ValueError when the bag has no sensor_msgs Image / CompressedImage topic."""
    from rosbags.highlevel import AnyReader

    with AnyReader([bag]) as reader:
        connections = [c for c in reader.connections if c.msgtype in IMAGE_TYPES]
        if not connections:
            raise ValueError(f"no sensor_msgs Image / CompressedImage topic in {bag}")
        for index, (connection, _, raw) in enumerate(reader.messages(connections=connections)):
            if keep is None or keep(index):
                yield connection.msgtype, raw, reader


def bag_image_count(bag: Path) -> int:
    """How many image messages a bag holds (from its index, without reading them)."""
    from rosbags.highlevel import AnyReader

    with AnyReader([bag]) as reader:
        return sum(c.msgcount for c in reader.connections if c.msgtype in IMAGE_TYPES)


def bag_frames(bag: Path, keep: Callable[[int], bool] | None = None) -> Iterator[Frame]:
    """The frames of every sensor_msgs Image / CompressedImage topic of a bag (those whose message index `keep`
    takes), in their encodings."""
    from tiled_detector.messages.images import compressed_to_array, imgmsg_to_array

    convert = {IMAGE_TYPES[0]: imgmsg_to_array, IMAGE_TYPES[1]: compressed_to_array}
    for msgtype, raw, reader in bag_messages(bag, keep):
        image, encoding = convert[msgtype](reader.deserialize(raw, msgtype))
        yield Frame(image, encoding=encoding)


def file_frames(source: str | Path) -> Iterator[Frame]:
    """The frames of a folder of images or of a bag's image topics."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    return bag_frames(source) if is_bag(source) else image_folder_frames(source)
