"""Keypoints through the stream, per camera: each reported box gets the keypoints of the detection it is in this
frame (found again as for positions: `positions.found_again`), or, carried from an earlier frame (a track reported
from its prediction, a box in tiles not run under `tile_budget`), the keypoints it was last reported with, moved
with its box (each joint keeps its place relative to the box: shifted with its centre, scaled with its size), their
scores as they were; their 3D positions (depth) likewise, a carried box's where it was last seen (as `positions`). State: the camera's previous report (bounded by its boxes); a frame of a model without
keypoints leaves its boxes without them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tiled_detector.tracking.positions import carried_at, detected_again
from tiled_detector.types import Detections


@dataclass(frozen=True)
class _Report:
    """A camera's reported boxes with their keypoints."""

    boxes: np.ndarray
    class_ids: np.ndarray
    track_ids: np.ndarray | None
    seen_ns: np.ndarray
    keypoints: np.ndarray
    positions: np.ndarray | None  # each joint's 3D position (NaN: none), None: a frame without depth


def moved(keypoints: np.ndarray, before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """(N, K, 3) keypoints of boxes `before` (N, 4) carried to boxes `after`: each joint's offset from the box's
    centre scaled by the change of its width and height; scores kept."""
    centre_before = (before[:, None, :2] + before[:, None, 2:]) / 2
    centre_after = (after[:, None, :2] + after[:, None, 2:]) / 2
    size_before = np.maximum(before[:, None, 2:] - before[:, None, :2], 1e-6)
    size_after = after[:, None, 2:] - after[:, None, :2]
    xy = (keypoints[..., :2] - centre_before) * (size_after / size_before) + centre_after
    return np.concatenate([xy, keypoints[..., 2:]], -1).astype(np.float32)


class CarriedKeypoints:
    """Keypoints carried with one camera's reported boxes (module docstring), beside its `Positions`: the same
    `attach` protocol, one per camera in the stream, started over with the camera's other state."""

    _last: _Report | None = None  # the camera's last report (set per instance by `attach`)

    def attach(
        self,
        measured: Detections,
        reported: Detections,
        track_ids: np.ndarray | None,
        seen_ns: np.ndarray,
        fresh: np.ndarray,
    ) -> Detections:
        """`reported` with keypoints: a box detected in this frame (`fresh`) has its detection's (in `measured`), a
        carried one those it was last reported with, moved with its box (zeros where it has none); as it is when the
        frame's detections have no keypoints."""
        if measured.keypoints is None:
            self._last = None
            return reported
        joints = measured.keypoints.shape[1]
        found = np.zeros((len(reported), joints, 3), np.float32)
        located = measured.keypoint_positions
        where = None if located is None else np.full((len(reported), joints, 3), np.nan, np.float32)
        if fresh.any():
            at = detected_again(reported, measured, fresh)
            found[fresh] = _taken(measured.keypoints, at, joints)
            if where is not None and located is not None:
                where[fresh] = _taken(located, at, joints, np.nan)
        last = self._last
        if last is not None and len(last.boxes) and (~fresh).any() and last.keypoints.shape[1] == joints:
            at = carried_at(last, reported, track_ids, seen_ns, ~fresh)
            carried = moved(
                last.keypoints[np.maximum(at, 0)], last.boxes[np.maximum(at, 0)], reported.boxes[~fresh]
            )
            found[~fresh] = np.where((at >= 0)[:, None, None], carried, 0.0)
            if where is not None and last.positions is not None:  # where it was last seen, as `positions`
                where[~fresh] = _taken(last.positions, at, joints, np.nan)
        self._last = _Report(reported.boxes, reported.class_ids, track_ids, seen_ns, found, where)
        return dataclasses.replace(reported, keypoints=found, keypoint_positions=where)


def _taken(values: np.ndarray, at: np.ndarray, joints: int, missing: float = 0.0) -> np.ndarray:
    """values[at] with rows of `missing` where `at` is -1."""
    if not len(values):
        return np.full((len(at), joints, 3), missing, np.float32)
    return np.where((at >= 0)[:, None, None], values[np.maximum(at, 0)], missing).astype(np.float32)
