"""Drawing detections, tile outlines, the region of interest and the ignored area onto a frame (debug images, the
demo's snapshot, `detect --out`)."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from tiled_detector.geometry.polygons import corners
from tiled_detector.model_files.pose_model import skeleton_for
from tiled_detector.pipeline.tiling import FULL_FRAME_ROI, TilePlan, region_pixels
from tiled_detector.types import Detections

_PALETTE = np.array(
    [
        (230, 25, 75),
        (60, 180, 75),
        (255, 225, 25),
        (0, 130, 200),
        (245, 130, 48),
        (145, 30, 180),
        (70, 240, 240),
    ],
    dtype=np.uint8,
)
_TILE_COLOUR = (160, 160, 160)
_ROI_COLOUR = (255, 255, 255)
_IGNORED_TINT = np.array((255, 0, 255), np.float32)  # magenta, blended at 40 %
JOINT_SCORE = 0.25  # a joint is drawn where its score is above this (ultralytics' `Annotator.kpts` default)


def annotate(
    image: np.ndarray,
    detections: Detections,
    labels: Sequence[str] | None = None,
    tiles: np.ndarray | None = None,
    plan: TilePlan | None = None,
    track_ids: np.ndarray | None = None,
    captions: bool = True,
    skeleton: Sequence[tuple[int, int]] | None = None,
) -> np.ndarray:
    """A copy of an RGB (or mono) uint8 image with labelled boxes drawn on it (rotated ones, `detections.obb`, as
    their rectangles; with `track_ids`: each box's "#id" first, coloured by its track; `captions=False`: the boxes
    alone, for a frame drawn small), their instance masks tinted in the box's colour (where the detections have
    them), their keypoints (joints scoring above `JOINT_SCORE`, joined by the `skeleton`: the model's, else COCO's
    for 17 joints), and the tile outlines (`tiles`, or the `plan`'s); with a `plan`, its ignored area tinted and
    its region of interest outlined."""
    canvas = np.ascontiguousarray(image if image.ndim == 3 and image.shape[2] == 3 else _to_rgb(image))
    canvas = canvas.copy() if canvas is image else canvas
    if plan is not None:
        tiles = plan.tiles if tiles is None else tiles
        if plan.ignored is not None and plan.ignored.ignored.shape == canvas.shape[:2]:
            tinted = canvas[plan.ignored.ignored].astype(np.float32) * 0.6 + _IGNORED_TINT * 0.4
            canvas[plan.ignored.ignored] = tinted.astype(np.uint8)
    if tiles is not None:
        for x1, y1, x2, y2 in np.asarray(tiles, dtype=np.int64).tolist():
            cv2.rectangle(canvas, (x1, y1), (x2 - 1, y2 - 1), _TILE_COLOUR, 1, cv2.LINE_4)
    if plan is not None and plan.roi != FULL_FRAME_ROI:
        x1, y1, x2, y2 = region_pixels(plan.roi, canvas.shape[:2])
        cv2.rectangle(canvas, (x1, y1), (x2 - 1, y2 - 1), _ROI_COLOUR, 2, cv2.LINE_4)
    ids = [None] * len(detections.scores) if track_ids is None else np.asarray(track_ids).tolist()
    if detections.masks is not None and len(detections):
        _tint_masks(canvas, detections, ids)
    if detections.keypoints is not None and len(detections):
        _skeletons(canvas, detections, ids, skeleton_for(detections.keypoints.shape[1], skeleton))
    outlines = (
        [None] * len(ids) if detections.obb is None else np.rint(corners(detections.obb)).astype(np.int32)
    )
    for (x1, y1, x2, y2), outline, score, cls, track in zip(
        np.rint(detections.boxes).astype(np.int64).tolist(),
        outlines,
        detections.scores.tolist(),
        detections.class_ids.tolist(),
        ids,
        strict=True,
    ):
        colour = tuple(int(c) for c in _PALETTE[(cls if track is None else track) % len(_PALETTE)])
        name = labels[cls] if labels is not None and 0 <= cls < len(labels) else str(cls)
        name = name if track is None else f"#{track} {name}"
        if outline is None:
            cv2.rectangle(canvas, (x1, y1), (x2, y2), colour, 2)
        else:
            cv2.polylines(canvas, [outline.reshape(-1, 1, 2)], True, colour, 2)
        if not captions:
            continue
        cv2.putText(
            canvas, f"{name} {score:.2f}", (x1, max(y1 - 4, 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.45, colour, 1
        )
    return canvas


def _tint_masks(canvas: np.ndarray, detections: Detections, ids: list) -> None:
    """Blend each detection's mask (its label image, resized to the canvas) at 50 % with the box's colour."""
    assert detections.masks is not None
    labels = detections.masks.labels
    if labels.shape != canvas.shape[:2]:
        labels = cv2.resize(labels, canvas.shape[1::-1], interpolation=cv2.INTER_NEAREST)
    keys = [c if t is None else t for c, t in zip(detections.class_ids.tolist(), ids, strict=True)]
    colours = np.concatenate(
        [np.zeros((1, 3), np.uint8), _PALETTE[np.asarray(keys, np.int64) % len(_PALETTE)]]
    )
    on = labels > 0
    tinted = (
        canvas[on].astype(np.float32) * 0.5 + colours[labels[on].astype(np.int64)].astype(np.float32) * 0.5
    )
    canvas[on] = tinted.astype(np.uint8)


def _skeletons(
    canvas: np.ndarray, detections: Detections, ids: list, skeleton: Sequence[tuple[int, int]]
) -> None:
    """Each detection's joints (filled circles) and skeleton (lines between joints both seen) in its box's colour."""
    assert detections.keypoints is not None
    radius = max(2, round(min(canvas.shape[:2]) / 400))
    keys = [c if t is None else t for c, t in zip(detections.class_ids.tolist(), ids, strict=True)]
    for points, key in zip(detections.keypoints, keys, strict=True):
        colour = tuple(int(c) for c in _PALETTE[key % len(_PALETTE)])
        seen = points[:, 2] > JOINT_SCORE
        xy = np.rint(points[:, :2]).astype(np.int64).tolist()
        for a, b in skeleton:
            if seen[a] and seen[b]:
                cv2.line(canvas, tuple(xy[a]), tuple(xy[b]), colour, max(1, radius // 2), cv2.LINE_AA)
        for k in np.flatnonzero(seen).tolist():
            cv2.circle(canvas, tuple(xy[k]), radius, colour, -1, cv2.LINE_AA)


def annotated_encoding(encoding: str) -> str:
    """Encoding of `annotate`'s output for an input of `encoding` (alpha dropped, mono expanded to RGB)."""
    return "bgr8" if encoding in ("bgr8", "bgra8") else "rgb8"


def _to_rgb(image: np.ndarray) -> np.ndarray:
    """Mono8/mono16 to RGB, 4 channels to their first 3 (channel order kept), uint8 for drawing."""
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    if image.ndim == 2 or image.shape[2] == 1:
        return cv2.cvtColor(image.reshape(image.shape[:2]), cv2.COLOR_GRAY2RGB)
    return np.ascontiguousarray(image[..., :3])
