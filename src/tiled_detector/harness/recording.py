"""Recording frame sources into image bags: synthetic scenes with ground truth, image folders, video files."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tiled_detector.harness.bags import (
    CAMERA_MOTION,
    CAMERA_MOTION_TOPIC,
    COMPRESSED_IMAGE,
    DETECTIONS,
    GROUND_TRUTH_KEYPOINTS_TOPIC,
    GROUND_TRUTH_MASKS_TOPIC,
    GROUND_TRUTH_TOPIC,
    IMAGE,
    START_NS,
    TEXT,
    BagWriter,
    Storage,
    camera_motion_message,
    detections_message,
    image_message,
    text_message,
)
from tiled_detector.tools.frames import Frame, motion_frames, pose_frames, rotated_frames, synthetic_frames

if TYPE_CHECKING:
    from tiled_detector.tools.worlds.synthetic import MotionStyle

# bag metadata key: "true" when the ground truth's Detection2D.id is each object's identity across frames
IDENTITIES = "ground_truth_ids"
# bag metadata key: "true" when the ground truth is rotated boxes (center.theta), scored by polygon IoU; a
# difficult object (DOTA's) has score 0: detections of it are neither right nor wrong
ROTATED = "ground_truth_rotated"
# bag metadata keys of keypoint truth: its joint names and bones (0-based pairs), as JSON lists
JOINTS = "ground_truth_joints"
SKELETON = "ground_truth_skeleton"


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
    extra: Callable[[int, int], Iterable[tuple[str, str, Any]]] | None = None,
) -> Path:
    """Write `frames` as Image (or CompressedImage) messages stamped at `rate` Hz, with ground truth as
    Detection2DArray on `GROUND_TRUTH_TOPIC` (class_id = label name, score 1.0, 0.0 for a difficult object;
    Detection2D.id = the object's identity for frames that carry one, as `IDENTITIES` in the bag's metadata says;
    rotated boxes where frames carry them, as `ROTATED` says) for frames that carry it (and their masks, one COCO RLE
    per box as JSON, on `GROUND_TRUTH_MASKS_TOPIC` where the frame has them; their keypoints and areas as JSON on
    `GROUND_TRUTH_KEYPOINTS_TOPIC` where it has them, the joints named in the bag's metadata, `JOINTS`), and
    the true camera motion on `CAMERA_MOTION_TOPIC` for frames that carry one. `extra(index, stamp)` gives more
    (topic, type, message) of each frame, written just before its image (a depth image, its camera info)."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 Hz, got {rate}")
    msgtype = COMPRESSED_IMAGE if compressed else IMAGE
    count = 0
    with BagWriter(path, storage, force, {"rate_hz": str(rate), **(custom_data or {})}) as writer:
        for index, frame in enumerate(frames):
            stamp = frame_stamp(index, rate)
            for other, other_type, message in extra(index, stamp) if extra is not None else ():
                writer.write(other, other_type, stamp - 1, message)  # before the image in bag time
            writer.write(topic, msgtype, stamp, image_message(frame.image, stamp, frame_id, compressed))
            if frame.boxes is not None and frame.class_ids is not None:
                scores = np.ones(len(frame.class_ids), np.float32)
                if frame.difficult is not None:
                    scores[frame.difficult] = 0.0
                truth = detections_message(
                    frame.boxes,
                    scores,
                    frame.class_ids,
                    stamp,
                    frame_id,
                    labels,
                    track_ids=frame.ids,
                    obb=frame.obb,
                )
                writer.write(GROUND_TRUTH_TOPIC, DETECTIONS, stamp, truth)
                if frame.masks is not None:
                    writer.write(GROUND_TRUTH_MASKS_TOPIC, TEXT, stamp, text_message(json.dumps(frame.masks)))
                if frame.keypoints is not None:
                    points = {
                        "keypoints": np.asarray(frame.keypoints, float).tolist(),
                        "areas": _areas(frame),
                    }
                    writer.write(GROUND_TRUTH_KEYPOINTS_TOPIC, TEXT, stamp, text_message(json.dumps(points)))
            if frame.camera is not None:
                writer.write(CAMERA_MOTION_TOPIC, CAMERA_MOTION, stamp, camera_motion_message(frame.camera))
            count += 1
        if count == 0:
            raise ValueError("no frames to write")
    return Path(path)


def _areas(frame: Frame) -> list[float]:
    """The areas OKS scales a frame's truth objects by: given, else `scoring.BOX_AREA_SHARE` of their boxes."""
    from tiled_detector.tools.scoring import BOX_AREA_SHARE

    if frame.areas is not None:
        return np.asarray(frame.areas, float).tolist()
    sides = np.asarray(frame.boxes, float).reshape(-1, 4)
    return ((sides[:, 2] - sides[:, 0]) * (sides[:, 3] - sides[:, 1]) * BOX_AREA_SHARE).tolist()


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
    camera: MotionStyle | None = None,
    rotated: bool = False,
    pose: bool = False,
) -> Path:
    """A deterministic bag of synthetic frames with ground truth (the sample of `tiled-detector demo`); with
    `camera`, one moving scene (objects and the camera moving as it says) whose ground truth carries identities
    and the true camera motion of each frame (`CAMERA_MOTION_TOPIC`). `rotated`: the rotated world
    (`rotated_scenes`) with rotated truth; with `camera` (still: the rotated world's camera does not move) its
    objects drive and turn. `pose`: the pose world (`pose_scenes`: still scenes of figures) with keypoint truth."""
    from tiled_detector.tools.worlds import pose_scenes, rotated_scenes, synthetic

    if frames < 1:
        raise ValueError(f"frames must be at least 1, got {frames}")
    world = pose_scenes if pose else rotated_scenes if rotated else synthetic
    if pose:
        if rotated or camera is not None:
            raise ValueError(
                "the pose world's scenes are still scenes of upright boxes: not rotated, no motion"
            )
        source = pose_frames(frames, seed, width, height)
        extra = {JOINTS: json.dumps(pose_scenes.JOINTS), SKELETON: json.dumps(pose_scenes.SKELETON)}
    elif rotated:
        source = rotated_frames(frames, seed, width, height, moving=camera is not None)
        extra = {ROTATED: "true", **({IDENTITIES: "true"} if camera is not None else {})}
    else:
        source = (
            motion_frames(frames, seed, width, height, camera)
            if camera is not None
            else synthetic_frames(frames, seed, width, height)
        )
        extra = (
            {}
            if camera is None
            else {
                IDENTITIES: "true",
                **{k: str(getattr(camera, k)) for k in ("pan", "rotate", "zoom", "shake")},
            }
        )
    return write_image_bag(
        out,
        source,
        rate=rate,
        storage=storage,
        compressed=compressed,
        topic=topic,
        frame_id=frame_id,
        labels=world.CLASSES,
        force=force,
        custom_data={"source": "synthetic", "seed": str(seed), "size": f"{width}x{height}", **extra},
    )
