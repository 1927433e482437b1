"""Recording frame sources into image bags: synthetic scenes with ground truth, image folders, video files."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tiled_detector.harness.bags import (
    COMPRESSED_IMAGE,
    DETECTIONS,
    GROUND_TRUTH_TOPIC,
    IMAGE,
    START_NS,
    BagWriter,
    Storage,
    detections_message,
    image_message,
)


@dataclass(frozen=True)
class Frame:
    """One camera frame: HxWx3 uint8 RGB, and ground truth (boxes x1y1x2y2, class ids) when known."""

    image: np.ndarray
    boxes: np.ndarray | None = None
    class_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        if (self.boxes is None) != (self.class_ids is None):
            raise ValueError("ground truth needs both boxes and class_ids, or neither")


def frame_stamp(index: int, rate: float) -> int:
    """Stamp (ns) of frame `index` at `rate` Hz from `START_NS`."""
    return START_NS + round(index * 1e9 / rate)


def write_image_bag(
    path: str | Path,
    frames: Iterable[Frame],
    *,
    rate: float = 30.0,
    storage: Storage | str = Storage.SQLITE3,
    compressed: bool = False,
    topic: str = "/camera/image_raw",
    frame_id: str = "camera",
    labels: Sequence[str] = (),
    force: bool = False,
    custom_data: Mapping[str, str] | None = None,
) -> Path:
    """Write `frames` as Image (or CompressedImage) messages stamped at `rate` Hz, with ground truth as
    Detection2DArray on `GROUND_TRUTH_TOPIC` (class_id = label name, score 1.0) for frames that carry it."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 Hz, got {rate}")
    msgtype = COMPRESSED_IMAGE if compressed else IMAGE
    count = 0
    with BagWriter(path, storage, force, {"rate_hz": str(rate), **(custom_data or {})}) as writer:
        for index, frame in enumerate(frames):
            stamp = frame_stamp(index, rate)
            writer.write(topic, msgtype, stamp, image_message(frame.image, stamp, frame_id, compressed))
            if frame.boxes is not None and frame.class_ids is not None:
                scores = np.ones(len(frame.class_ids), np.float32)
                truth = detections_message(frame.boxes, scores, frame.class_ids, stamp, frame_id, labels)
                writer.write(GROUND_TRUTH_TOPIC, DETECTIONS, stamp, truth)
            count += 1
        if count == 0:
            raise ValueError("no frames to write")
    return Path(path)


def synthetic_frames(frames: int, seed: int, width: int, height: int) -> Iterator[Frame]:
    """Frames of `tiled_detector.synthetic` (frame i uses seed + i) with their ground truth."""
    from tiled_detector.synthetic import make_scene

    for index in range(frames):
        scene = make_scene(seed + index, width, height)
        yield Frame(scene.image, scene.boxes, scene.class_ids)


def image_folder_frames(folder: str | Path) -> Iterator[Frame]:
    """The images of a folder (png, jpg, jpeg, bmp, tif, tiff), by name, without ground truth."""
    import cv2

    suffixes = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff"}
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in suffixes)
    if not paths:
        raise FileNotFoundError(f"no images ({', '.join(sorted(suffixes))}) in {folder}")
    for path in paths:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise ValueError(f"cannot read image {path}")
        yield Frame(np.ascontiguousarray(image[..., ::-1]))


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


def make_synthetic_bag(
    out: str | Path,
    frames: int = 30,
    seed: int = 0,
    width: int = 1920,
    height: int = 1080,
    rate: float = 30.0,
    storage: Storage | str = Storage.SQLITE3,
    compressed: bool = False,
    *,
    topic: str = "/camera/image_raw",
    frame_id: str = "camera",
    force: bool = False,
) -> Path:
    """A deterministic bag of synthetic frames with ground truth (the sample of `tiled-detector demo`)."""
    from tiled_detector.synthetic import CLASSES

    if frames < 1:
        raise ValueError(f"frames must be at least 1, got {frames}")
    return write_image_bag(
        out,
        synthetic_frames(frames, seed, width, height),
        rate=rate,
        storage=storage,
        compressed=compressed,
        topic=topic,
        frame_id=frame_id,
        labels=CLASSES,
        force=force,
        custom_data={"source": "synthetic", "seed": str(seed), "size": f"{width}x{height}"},
    )
