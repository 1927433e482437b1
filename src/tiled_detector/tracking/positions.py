"""3D positions through the stream, per camera: each reported box gets the position measured with it, or, when it
is carried from an earlier frame (a tile not run under `tile_budget`; a track reported from its prediction), the
position it was last reported with, which belongs to the stamp it was seen at (`seen_ns`).

The stream's stages (the tiles looked at, the tracker, the boxes carried without one) report boxes, not the rows
they came from, so a reported box is found again: one seen in this frame among the frame's measured detections
(same class, most overlap, the same score first: the tracker reports a match's own score), one carried among the
camera's previous report (by track id, or without a tracker by class, overlap and the same `seen_ns`). State: the
camera's previous report (bounded by its boxes); a frame without depth reports no positions and leaves its
boxes without one for the frames that carry them. Instance masks follow the boxes seen in the frame the same way
(`with_masks`); a carried box has none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiled_detector.tracking.bytetrack import assign
from tiled_detector.tracking.geometry import overlapping
from tiled_detector.types import Detections, InstanceMasks


@dataclass(frozen=True)
class _Report:
    """A camera's reported boxes with their positions (NaN: none)."""

    boxes: np.ndarray
    class_ids: np.ndarray
    track_ids: np.ndarray | None
    seen_ns: np.ndarray
    positions: np.ndarray
    sizes: np.ndarray


def found_again(
    boxes: np.ndarray,
    classes: np.ndarray,
    keys: np.ndarray,
    among: np.ndarray,
    among_classes: np.ndarray,
    among_keys: np.ndarray,
) -> np.ndarray:
    """For each box, the index of the box `among` it is (-1: none): the same class and overlapping, one to one at
    the least cost, preferring the same key (a score, a stamp)."""
    found = np.full(len(boxes), -1, np.int64)
    i, j, iou = overlapping(boxes.astype(np.float64), among.astype(np.float64), classes, among_classes)
    cost = (1.0 - iou) / 2 + 0.5 * (keys[i] != among_keys[j])
    rows, cols = assign(i, j, cost, 1.0)
    found[rows] = cols
    return found


def detected_again(reported: Detections, measured: Detections, rows: np.ndarray) -> np.ndarray:
    """For the `rows` (bool) of the boxes a stream reports, the index of the frame's detection in `measured` each
    one is (-1: none; `found_again` by class, overlap and score)."""
    return found_again(
        reported.boxes[rows],
        reported.class_ids[rows],
        reported.scores[rows],
        measured.boxes,
        measured.class_ids,
        measured.scores,
    )


def _nan(count: int) -> np.ndarray:
    return np.full((count, 3), np.nan, np.float32)


class Positions:
    """The positions of one camera's reported boxes (module docstring); the stream keeps one per camera and starts
    it over with the camera's other state over time."""

    def __init__(self) -> None:
        self._last: _Report | None = None

    def attach(
        self,
        measured: Detections,
        reported: Detections,
        track_ids: np.ndarray | None,
        seen_ns: np.ndarray,
        fresh: np.ndarray,
    ) -> Detections:
        """`reported` (a frame's boxes as the stream reports them: detected in it, `fresh`, or carried from the
        frame of stamp `seen_ns`) with their positions and sizes, from `measured` (the frame's detections, positions
        included) and the camera's previous report; as it is (no positions) when the frame had no depth."""
        count = len(reported)
        positions, sizes = _nan(count), _nan(count)
        if measured.positions is not None:
            if fresh.any():
                at = detected_again(reported, measured, fresh)
                positions[fresh] = _taken(measured.positions, at)
                sizes[fresh] = _taken(measured.sizes, at)
            last = self._last
            if last is not None and (~fresh).any():
                at = carried_at(last, reported, track_ids, seen_ns, ~fresh)
                positions[~fresh], sizes[~fresh] = _taken(last.positions, at), _taken(last.sizes, at)
        self._last = _Report(reported.boxes, reported.class_ids, track_ids, seen_ns, positions, sizes)
        if measured.positions is None:
            return reported
        return dataclasses.replace(reported, positions=positions, sizes=sizes)  # (rotated boxes, masks kept)


def carried_at(
    last: Any,
    reported: Detections,
    track_ids: np.ndarray | None,
    seen_ns: np.ndarray,
    carried: np.ndarray,
) -> np.ndarray:
    """For each `carried` box of `reported`, the index of the box it was in the `last` report (its `boxes`,
    `class_ids`, `track_ids`, `seen_ns`), -1: none: by track id, else by class, overlap and the same `seen_ns`."""
    if track_ids is not None and last.track_ids is not None:
        if not len(last.track_ids):
            return np.full(int(carried.sum()), -1, np.int64)
        order = np.argsort(last.track_ids, kind="stable")
        known = last.track_ids[order]
        wanted = track_ids[carried]
        at = np.minimum(np.searchsorted(known, wanted), len(known) - 1)
        return np.where(known[at] == wanted, order[at], -1)
    return found_again(
        reported.boxes[carried],
        reported.class_ids[carried],
        seen_ns[carried],
        last.boxes,
        last.class_ids,
        last.seen_ns,
    )


def _taken(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """values[at] with NaN rows where `at` is -1."""
    if not len(values):
        return _nan(len(at))
    return np.where((at >= 0)[:, None], values[np.maximum(at, 0)], np.nan).astype(np.float32)


def joined(found: list[Detections]) -> Detections:
    """Several detections of one frame (its parts) as one, positions, masks and keypoints included where every
    part has them."""
    positions = [f.positions for f in found]
    sizes = [f.sizes for f in found]
    masks = [f.masks for f in found]
    posed = [f.keypoints for f in found]
    joint_positions = [f.keypoint_positions for f in found]
    located = all(p is not None for p in positions)
    return Detections(
        np.concatenate([f.boxes for f in found]),
        np.concatenate([f.scores for f in found]),
        np.concatenate([f.class_ids for f in found]),
        {},
        np.concatenate(positions) if located else None,
        np.concatenate(sizes) if located else None,
        masks=InstanceMasks.joined(masks) if all(m is not None for m in masks) else None,  # type: ignore[arg-type]
        keypoints=np.concatenate(posed) if all(k is not None for k in posed) else None,  # type: ignore[arg-type]
        keypoint_positions=(
            np.concatenate(joint_positions)  # type: ignore[arg-type]
            if all(k is not None for k in posed) and all(w is not None for w in joint_positions)
            else None
        ),
    )


def with_masks(stamp_ns: int, measured: Detections, reported: Detections, seen_ns: np.ndarray) -> Detections:
    """`reported` with the instance masks of the frame's `measured` detections: a box seen in this frame has the
    mask of the detection it is (found again as for positions), a box carried from an earlier frame none (an
    object not looked at has no new mask: none is made up); as it is when the detections have no masks."""
    if measured.masks is None or reported is measured:
        return reported
    at = np.full(len(reported), -1, np.int64)
    fresh = seen_ns == stamp_ns
    if fresh.any():
        at[fresh] = detected_again(reported, measured, fresh)
    return dataclasses.replace(reported, masks=measured.masks.select(at))
