"""A pose model's keypoints as our own messages (`tiled_detector_msgs`, vendor/tiled_detector_msgs: vision_msgs has
none): a frame's `KeypointsArray` (the header of its Detection2DArray; per detection its `Detection2D.id` and its
index in that array, its joints x, y, score and, with depth, their 3D positions) and the model's `KeypointInfo`
(the joints' names and the skeleton, once per configuration on a transient-local topic, as LabelInfo)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def keypoints_to_msg(
    keypoints: np.ndarray, header: Any, track_ids: Any = None, positions: np.ndarray | None = None
) -> Any:
    """(N, K, 3) keypoints x, y, score (image pixels) -> KeypointsArray with `header`; entry k is detection k of
    the Detection2DArray of the same header (`index` k, `id` its track id or empty, as `detections_to_msg` sets
    Detection2D.id); `positions` (N, K, 3) metres, NaN where unknown (None: every position NaN)."""
    from geometry_msgs.msg import Point
    from tiled_detector_msgs.msg import Keypoint, Keypoints, KeypointsArray

    points = np.asarray(keypoints, np.float64).reshape(len(keypoints), -1, 3)
    tags = (
        [""] * len(points) if track_ids is None else [str(int(t)) for t in np.asarray(track_ids).reshape(-1)]
    )
    if len(tags) != len(points):
        raise ValueError(f"need one track id per detection, got {len(tags)} for {len(points)}")
    where = None if positions is None else np.asarray(positions, np.float64).reshape(points.shape)
    nan = Point(x=math.nan, y=math.nan, z=math.nan)
    entries = []
    for k, (joints, tag) in enumerate(zip(points.tolist(), tags, strict=True)):
        located = (
            [nan] * len(joints) if where is None else [Point(x=x, y=y, z=z) for x, y, z in where[k].tolist()]
        )
        entries.append(
            Keypoints(
                id=tag,
                index=k,
                joints=[
                    Keypoint(x=x, y=y, score=float(s), position=p)
                    for (x, y, s), p in zip(joints, located, strict=True)
                ],
            )
        )
    return KeypointsArray(header=header, keypoints=entries)


def msg_to_keypoints(msg: Any) -> tuple[np.ndarray, np.ndarray]:
    """A KeypointsArray -> (N, K, 3) float32 x, y, score and (N, K, 3) float32 positions (NaN where none), in the
    order of its entries' `index`."""
    entries = sorted(msg.keypoints, key=lambda e: e.index)
    joints = [[(j.x, j.y, j.score) for j in e.joints] for e in entries]
    where = [[(j.position.x, j.position.y, j.position.z) for j in e.joints] for e in entries]
    count = len(entries[0].joints) if entries else 0
    shape = (len(entries), count, 3)
    return np.asarray(joints, np.float32).reshape(shape), np.asarray(where, np.float32).reshape(shape)


def keypoint_info(names: Sequence[str], skeleton: Sequence[tuple[int, int]], header: Any) -> Any:
    """The KeypointInfo of a pose model: its joints' names and the skeleton to draw (pairs, flattened)."""
    from tiled_detector_msgs.msg import KeypointInfo

    return KeypointInfo(
        header=header, names=list(names), skeleton=[int(i) for pair in skeleton for i in pair]
    )
