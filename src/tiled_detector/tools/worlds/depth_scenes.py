"""Synthetic depth for the synthetic scenes: each labelled object at a known distance, standing on a ground plane
seen by a pinhole camera, with a depth sensor's holes and noise, and the objects' true 3D positions.

The camera (`camera_for`: a 69 degree horizontal field of view, square pixels, the principal point at the centre)
looks down at a ground plane whose distance grows from `NEAR` at the bottom row to `FAR` at the top (a plane's
inverse depth is linear in the pixel row). A `make_scene` frame with objects of 8 to 80 px (`DEPTH_STYLE`) gets
its depth: each labelled object is a flat disc filling its box (the ellipse inscribed in it), facing the camera
at the ground's distance below its bottom row (it stands there), nearer objects drawn over farther ones; then
multiplicative noise (`NOISE` of the depth, one standard deviation) and holes (`HOLES` of the pixels, in blobs
and specks: depth 0). An object's true position is its box centre back-projected at its distance; its true size
the box's width and height at that distance, and no depth extent. `shape` "bar" draws each object as a thin bar along
its box's diagonal instead (`BAR` of its shorter side wide): a thin object, whose box is mostly the ground behind it;
each object's visible pixels are its mask (`DepthScene.mask`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from tiled_detector.pipeline.depth import Intrinsics
from tiled_detector.tools.worlds.synthetic import Scene, SceneStyle, make_scene

DEPTH_STYLE = SceneStyle(min_size=8.0, max_size=80.0)
NEAR, FAR = 3.0, 60.0  # metres: the ground at the bottom and the top row
NOISE = 0.01  # depth noise, one standard deviation, as a fraction of the depth
HOLES = 0.05  # fraction of the pixels without depth
FIELD_OF_VIEW = 69.0  # horizontal, degrees
BAR = 0.15  # a thin object's width: this fraction of its box's shorter side


@dataclass(frozen=True)
class DepthScene:
    """A synthetic frame with its aligned depth: `scene` (image, boxes, class ids), `depth` (H, W) float32 metres
    (0: a hole), the camera matrix, and per labelled object its true position and size (N, 3) in metres (optical
    frame)."""

    scene: Scene
    depth: np.ndarray
    camera: Intrinsics
    positions: np.ndarray
    sizes: np.ndarray
    owner: np.ndarray | None = None  # (H, W) int32: the object each pixel shows (-1: the ground)

    def mask(self, k: int) -> np.ndarray:
        """Object k's visible pixels, (H, W) bool."""
        assert self.owner is not None
        return self.owner == k

    def depth_mm(self) -> np.ndarray:
        """The depth as a 16UC1 image in millimetres (0: a hole), as RGB-D drivers publish it."""
        return np.clip(np.round(self.depth * 1000.0), 0, 65535).astype(np.uint16)


def camera_for(width: int, height: int) -> Intrinsics:
    """The synthetic camera's matrix for frames of this size (module docstring)."""
    focal = width / (2 * math.tan(math.radians(FIELD_OF_VIEW) / 2))
    return Intrinsics(focal, focal, (width - 1) / 2, (height - 1) / 2, width, height)


def ground(height: int) -> np.ndarray:
    """(H,) the ground's distance at each pixel row: FAR at the top to NEAR at the bottom, inverse depth linear."""
    rows = np.arange(height, dtype=np.float64) / max(height - 1, 1)
    return (1.0 / (1.0 / FAR + rows * (1.0 / NEAR - 1.0 / FAR))).astype(np.float32)


def true_positions(
    boxes: np.ndarray, distances: np.ndarray, camera: Intrinsics
) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3) positions and sizes of boxes (x1, y1, x2, y2 edges) standing at `distances` (flat: no depth extent)."""
    u = (boxes[:, 0] + boxes[:, 2]) / 2 - 0.5  # box edges -> pixel-centre coordinates
    v = (boxes[:, 1] + boxes[:, 3]) / 2 - 0.5
    x, y = (u - camera.cx) * distances / camera.fx, (v - camera.cy) * distances / camera.fy
    width = (boxes[:, 2] - boxes[:, 0]) * distances / camera.fx
    height = (boxes[:, 3] - boxes[:, 1]) * distances / camera.fy
    positions = np.stack([x, y, distances], axis=1)
    sizes = np.stack([width, height, np.zeros(len(boxes))], axis=1)
    return positions.astype(np.float32), sizes.astype(np.float32)


def _shape(xs: np.ndarray, ys: np.ndarray, box: np.ndarray, shape: str) -> np.ndarray:
    """The object's pixels among pixel columns `xs` and lines `ys` of its box: the inscribed ellipse (disc), or a
    thin bar along the diagonal from its top-left to its bottom-right corner (bar)."""
    x1, y1, x2, y2 = box
    px, py = xs[None] + 0.5, ys[:, None] + 0.5
    if shape == "disc":
        return ((px - (x1 + x2) / 2) / ((x2 - x1) / 2)) ** 2 + (
            (py - (y1 + y2) / 2) / ((y2 - y1) / 2)
        ) ** 2 <= 1.0
    if shape != "bar":
        raise ValueError(f"shape must be disc or bar, got {shape!r}")
    dx, dy = x2 - x1, y2 - y1
    distance = np.abs((px - x1) * dy - (py - y1) * dx) / math.hypot(dx, dy)  # to the diagonal
    return distance <= BAR * min(dx, dy) / 2


def with_depth(scene: Scene, seed: int, shape: str = "disc") -> DepthScene:
    """`scene`'s depth and its objects' true positions and masks (module docstring); deterministic per seed, size
    and shape."""
    height, width = scene.image.shape[:2]
    rng = np.random.default_rng([int(seed), width, height, 7])
    camera = camera_for(width, height)
    floor = ground(height)
    depth = np.repeat(floor[:, None], width, axis=1)
    owner = np.full((height, width), -1, np.int32)
    boxes = scene.boxes.astype(np.float64)
    bottom = np.clip(np.ceil(boxes[:, 3]).astype(np.int64) - 1, 0, height - 1)
    distances = floor[bottom].astype(np.float64)
    for k in np.argsort(-distances, kind="stable"):  # far to near: nearer objects hide farther ones
        x1, y1, x2, y2 = boxes[k]
        xs, ys = np.arange(math.floor(x1), math.ceil(x2)), np.arange(math.floor(y1), math.ceil(y2))
        inside = _shape(xs, ys, boxes[k], shape)
        depth[ys[0] : ys[-1] + 1, xs[0] : xs[-1] + 1][inside] = distances[k]
        owner[ys[0] : ys[-1] + 1, xs[0] : xs[-1] + 1][inside] = k
    depth = depth * (1.0 + NOISE * rng.standard_normal(depth.shape, dtype=np.float32))
    # holes: blobs (a coarse random field upsampled) and specks, HOLES of the pixels in all
    coarse = rng.random((max(height // 16, 2), max(width // 16, 2)), dtype=np.float32)
    field = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_LINEAR)
    field += 0.35 * rng.random((height, width), dtype=np.float32)
    depth[field > np.quantile(field, 1.0 - HOLES)] = 0.0
    positions, sizes = true_positions(boxes, distances, camera)
    return DepthScene(scene, depth.astype(np.float32), camera, positions, sizes, owner)


def make_depth_scene(seed: int, width: int = 1920, height: int = 1080, shape: str = "disc") -> DepthScene:
    """A `make_scene` frame of objects of 8-80 px (`DEPTH_STYLE`) with its depth (`with_depth`)."""
    return with_depth(make_scene(seed, width, height, DEPTH_STYLE), seed, shape)
