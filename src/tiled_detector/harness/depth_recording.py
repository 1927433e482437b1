"""Synthetic RGB-D bags (`make-bag --depth`): per frame the colour image, its aligned depth image (16UC1,
millimetres, as RealSense and ZED drivers publish it), the colour camera's CameraInfo, and the ground truth in 2D
(`/ground_truth`) and in 3D (`GROUND_TRUTH_3D_TOPIC`: every labelled object's true position and size, in the order
and with the ids of the 2D ground truth).

Topics beside the image topic T (its namespace N): `N/aligned_depth_to_color/image_raw` and `N/camera_info`, named
in the bag's metadata (`bags.DEPTH_TOPIC_KEY`, `CAMERA_INFO_KEY`) so that `replay` plays them into the node's
`depth_image` and `camera_info`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.harness.bags import (
    DEPTH_TOPIC_KEY,
    IMAGE,
    detections_3d_message,
    header,
    new_message,
)
from tiled_detector.harness.recording import write_image_bag
from tiled_detector.pipeline.depth import Intrinsics
from tiled_detector.tools.frames import Frame

CAMERA_INFO = "sensor_msgs/msg/CameraInfo"
DETECTIONS_3D = "vision_msgs/msg/Detection3DArray"
GROUND_TRUTH_3D_TOPIC = "/ground_truth/detections_3d"
CAMERA_INFO_KEY = "camera_info_topic"  # bag metadata: the colour camera's CameraInfo topic


def depth_topics(image_topic: str) -> tuple[str, str]:
    """The depth image and camera info topics beside an image topic (module docstring)."""
    namespace = image_topic.rstrip("/").rpartition("/")[0]
    return f"{namespace}/aligned_depth_to_color/image_raw", f"{namespace}/camera_info"


def depth_message(depth_mm: np.ndarray, stamp: int, frame_id: str) -> Any:
    """An (H, W) uint16 depth image in millimetres -> sensor_msgs/Image 16UC1 (rosbags type)."""
    height, width = depth_mm.shape
    data = np.ascontiguousarray(depth_mm.astype("<u2")).view(np.uint8).reshape(-1)
    return new_message(
        IMAGE,
        header=header(stamp, frame_id),
        height=height,
        width=width,
        encoding="16UC1",
        step=width * 2,
        data=data,
    )


def camera_info_message(camera: Intrinsics, stamp: int, frame_id: str) -> Any:
    """sensor_msgs/CameraInfo of an undistorted pinhole camera (K = P's left 3 x 3, no distortion; rosbags type)."""
    k = np.array([camera.fx, 0.0, camera.cx, 0.0, camera.fy, camera.cy, 0.0, 0.0, 1.0])
    p = np.array([camera.fx, 0.0, camera.cx, 0.0, 0.0, camera.fy, camera.cy, 0.0, 0.0, 0.0, 1.0, 0.0])
    return new_message(
        CAMERA_INFO,
        header=header(stamp, frame_id),
        width=camera.width,
        height=camera.height,
        distortion_model="plumb_bob",
        d=np.zeros(5),
        k=k,
        r=np.eye(3).reshape(-1),
        p=p,
    )


def make_depth_bag(
    out: str | Path, frames: int = 30, seed: int = 0, width: int = 1920, height: int = 1080, **options: Any
) -> Path:
    """A deterministic RGB-D bag of `tools.depth_scenes` frames (frame i: seed + i) with 2D and 3D ground truth
    (module docstring); `options`: `write_image_bag`'s (rate, storage, compressed, topic, frame_id, force)."""
    from tiled_detector.tools.worlds.depth_scenes import make_depth_scene
    from tiled_detector.tools.worlds.synthetic import CLASSES

    if frames < 1:
        raise ValueError(f"frames must be at least 1, got {frames}")
    topic, frame_id = (
        options.setdefault("topic", "/camera/image_raw"),
        options.setdefault("frame_id", "camera"),
    )
    depth_topic, info_topic = depth_topics(topic)
    scenes: dict[int, Any] = {}

    def source() -> Iterator[Frame]:
        for index in range(frames):
            scene = scenes[index] = make_depth_scene(seed + index, width, height)
            yield Frame(scene.scene.image, scene.scene.boxes, scene.scene.class_ids)

    def extra(index: int, stamp: int) -> list[tuple[str, str, Any]]:
        scene = scenes.pop(index)
        ones = np.ones(len(scene.positions))
        truth = detections_3d_message(
            scene.positions, scene.sizes, ones, scene.scene.class_ids, stamp, frame_id, CLASSES
        )
        return [
            (info_topic, CAMERA_INFO, camera_info_message(scene.camera, stamp, frame_id)),
            (depth_topic, IMAGE, depth_message(scene.depth_mm(), stamp, frame_id)),
            (GROUND_TRUTH_3D_TOPIC, DETECTIONS_3D, truth),
        ]

    metadata = {
        "source": "synthetic depth",
        "seed": str(seed),
        "size": f"{width}x{height}",
        DEPTH_TOPIC_KEY: depth_topic,
        CAMERA_INFO_KEY: info_topic,
    }
    return write_image_bag(out, source(), labels=CLASSES, custom_data=metadata, extra=extra, **options)
