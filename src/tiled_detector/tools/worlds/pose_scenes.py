"""Deterministic synthetic scenes of articulated figures with named joints, with their exact keypoint truth: the
world of the bundled pose model and of `eval --pose`.

People-like stick figures (`CLASSES`: one class, person) seen upright from the side of a robot: a head, a torso
and four limbs of two segments each, in random poses (arms down, out or raised, elbows and knees bent, walking,
leaning, turned so that the shoulders narrow), 24-128 px tall, among distractors (polylines of limb-like
segments, poles with crossbars, discs and rings in the same colours), over the backgrounds, lighting, blur and
noise of `synthetic`. A figure's left limbs are drawn darker than its right ones (the far side in shadow), so left
and right can be told apart whichever way it faces. Figures do not overlap one another; some stand across the seams
of the 640-px tiles (overlap 0.2) that the detector cuts a frame into.

Truth per figure: its box (tight around its drawn pixels inside the frame, before blur) and its `JOINTS` (x, y,
visibility in COCO's form: 2 for a joint inside the frame, 0 with x = y = 0 for one outside), in pixel edges from
0; `SKELETON` joins them for drawing. A figure cut by the frame's border is labelled when at least 35 % of its
pixels are inside and its box is at least 4 px on each side. Every scene is a pure function of its arguments.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import cv2
import numpy as np

from tiled_detector.model_files.pose_model import COCO_KEYPOINTS
from tiled_detector.tools.worlds.synthetic import background, finish, rgb, tile_seams

CLASSES: tuple[str, ...] = ("person",)
# COCO's person keypoints with the face (nose, eyes, ears) as one joint, the head's centre
JOINTS: tuple[str, ...] = ("head", *COCO_KEYPOINTS[5:])
# joint pairs drawn as bones (indices into JOINTS)
SKELETON: tuple[tuple[int, int], ...] = (
    (0, 1),
    (0, 2),
    (1, 2),
    (1, 3),
    (3, 5),
    (2, 4),
    (4, 6),
    (1, 7),
    (2, 8),
    (7, 8),
    (7, 9),
    (9, 11),
    (8, 10),
    (10, 12),
)
# each joint's mirror image (left <-> right)
FLIP: tuple[int, ...] = (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11)

_SHIFT = 4  # sub-pixel bits for cv2 drawing
_MIN_VISIBLE = 0.35  # a figure is labelled when at least this fraction of its pixels is inside the frame ...
_MIN_SIDE = 4  # ... and its box is at least this many pixels on each side
_DARK_SIDE = 0.5  # brightness of the left limbs against the right ones
# parts of a figure, as drawn (value in its label patch): left limbs, torso, head, right limbs
_LEFT, _TORSO, _HEAD, _RIGHT = 1, 2, 3, 4


@dataclass(frozen=True)
class PoseScene:
    """One rendered frame: image (H, W, 3) uint8 RGB; boxes (N, 4) float32 x1, y1, x2, y2; keypoints (N, K, 3)
    float32 x, y, visibility (2: inside the frame, 0: outside, x = y = 0); class_ids (N,) int64."""

    image: np.ndarray
    boxes: np.ndarray
    keypoints: np.ndarray
    class_ids: np.ndarray

    def __post_init__(self) -> None:
        if self.image.ndim != 3 or self.image.shape[2] != 3 or self.image.dtype != np.uint8:
            raise ValueError(
                f"PoseScene image must be (H, W, 3) uint8, got {self.image.shape} {self.image.dtype}"
            )
        n = len(self.class_ids)
        if self.boxes.shape != (n, 4) or self.keypoints.shape != (n, len(JOINTS), 3):
            raise ValueError(
                f"PoseScene needs one (4,) box and one ({len(JOINTS)}, 3) keypoint array per class id, got boxes "
                f"{self.boxes.shape}, keypoints {self.keypoints.shape} and {n} class ids"
            )

    @property
    def areas(self) -> np.ndarray:
        """(N,) each figure's area as the keypoint scores take it: 0.53 x its box's area (ultralytics' rule for
        truth without a segmentation: a person fills about half its box)."""
        sides = self.boxes[:, 2:] - self.boxes[:, :2]
        return (sides[:, 0] * sides[:, 1] * 0.53).astype(np.float32)


@dataclass(frozen=True)
class PoseStyle:
    """Statistics of a pose scene; counts are per megapixel so crops and frames share the same density."""

    figures_per_mpix: float = 20.0
    distractors_per_mpix: float = 20.0
    min_height: float = 24.0
    max_height: float = 128.0
    seam_fraction: float = 0.3  # of the figures, placed across a tile seam (frames only)
    tile: int = 640
    overlap: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.min_height <= self.max_height:
            raise ValueError(
                f"need 0 < min_height <= max_height, got {self.min_height} and {self.max_height}"
            )
        if not 0 <= self.seam_fraction <= 1:
            raise ValueError(f"seam_fraction must be in [0, 1], got {self.seam_fraction}")


@dataclass(frozen=True)
class _Figure:
    """One figure to draw: its joints (K, 2) in frame pixels, limb widths, colours."""

    joints: np.ndarray
    height: float
    clothes: tuple[float, float, float]
    skin: tuple[float, float, float]


def _direction(side: float, angle: float) -> np.ndarray:
    """A unit vector `angle` radians from straight down, turned outward to `side` (+1: image right)."""
    return np.array([side * math.sin(angle), math.cos(angle)])


def _pose(rng: np.random.Generator, height: float, x: float, foot: float) -> np.ndarray:
    """Joints (K, 2) of a figure `height` px tall in a random pose, its lowest ankle at y = `foot`, centred on x."""
    facing = (
        1.0 if rng.random() < 0.5 else -1.0
    )  # +1: its left side on the image's right (it faces the camera)
    turn = rng.uniform(0.35, 1.0)  # shoulders and hips narrowed as the figure turns sideways
    h = height
    joints = np.zeros((len(JOINTS), 2))
    hip, shoulder = 0.075 * h * turn, 0.12 * h * turn
    for side, (s, e, w, hp, k, a) in ((facing, (1, 3, 5, 7, 9, 11)), (-facing, (2, 4, 6, 8, 10, 12))):
        joints[hp] = (side * hip, 0.0)
        joints[s] = (side * shoulder, -0.30 * h)
        arm = rng.uniform(-0.3, 2.8) if rng.random() < 0.3 else rng.uniform(-0.2, 0.9)
        joints[e] = joints[s] + 0.16 * h * _direction(side, arm)
        joints[w] = joints[e] + 0.15 * h * _direction(side, arm + rng.uniform(-1.2, 1.6))
        leg = rng.uniform(-0.35, 0.6)
        joints[k] = joints[hp] + 0.25 * h * _direction(side, leg)
        joints[a] = joints[k] + 0.24 * h * _direction(side, leg + rng.uniform(-0.7, 0.5))
    joints[0] = (0.0, -0.43 * h)  # the head's centre
    upper = [0, 1, 2, 3, 4, 5, 6]  # the upper body bends at the hips, the whole figure leans
    bend, lean = rng.normal(0.0, 0.15), rng.normal(0.0, 0.1)
    joints[upper] = joints[upper] @ _rotation(bend).T
    joints = joints @ _rotation(lean).T
    return joints + np.array([x, foot - joints[[11, 12], 1].max()])


def _rotation(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s], [s, c]])


def _figure(rng: np.random.Generator, style: PoseStyle, x: float, y: float) -> _Figure:
    """A figure whose middle (half its height above its feet) is near (x, y)."""
    height = float(math.exp(rng.uniform(math.log(style.min_height), math.log(style.max_height))))
    joints = _pose(rng, height, x, y + height / 2)
    clothes = rgb(rng.uniform(0, 360), rng.uniform(0.35, 1.0), rng.uniform(0.6, 1.0))
    skin = rgb(rng.uniform(15, 35), rng.uniform(0.25, 0.6), rng.uniform(0.45, 1.0))
    return _Figure(joints, height, clothes, skin)


def _label_patch(figure: _Figure, x0: int, y0: int, size: tuple[int, int]) -> np.ndarray:
    """The figure's parts (`_LEFT`, `_TORSO`, `_HEAD`, `_RIGHT`) drawn into a (h, w) uint8 patch whose top-left
    pixel is frame pixel (x0, y0): left limbs behind, then torso, head, right limbs."""
    patch = np.zeros(size, np.uint8)
    h = figure.height
    # OpenCV puts pixel centres at whole coordinates, ours (edges from 0) half a pixel further
    points = ((figure.joints - (x0 + 0.5, y0 + 0.5)) * (1 << _SHIFT)).round().astype(np.int32)
    arm, leg = max(1, round(0.045 * h)), max(1, round(0.065 * h))
    for level, chains in ((_LEFT, ((1, 3, 5), (7, 9, 11))), (_RIGHT, ((2, 4, 6), (8, 10, 12)))):
        if level == _RIGHT:
            cv2.fillPoly(patch, [points[[1, 2, 8, 7]]], _TORSO, cv2.LINE_8, _SHIFT)
            cv2.line(patch, tuple(points[1]), tuple(points[2]), _TORSO, arm, cv2.LINE_8, _SHIFT)
            cv2.line(patch, tuple(points[7]), tuple(points[8]), _TORSO, leg, cv2.LINE_8, _SHIFT)
            centre = tuple(points[0])
            cv2.circle(patch, centre, round(0.075 * h * (1 << _SHIFT)), _HEAD, -1, cv2.LINE_8, _SHIFT)
        for chain, width in zip(chains, (arm, leg), strict=True):
            for a, b in itertools.pairwise(chain):
                cv2.line(patch, tuple(points[a]), tuple(points[b]), level, width, cv2.LINE_8, _SHIFT)
    return patch


def _paint(rng: np.random.Generator, image: np.ndarray, figure: _Figure) -> tuple[int, np.ndarray | None]:
    """Draw `figure` into `image`: its area in pixels and its box inside the frame (None: nothing inside)."""
    height, width = image.shape[:2]
    pad = int(0.1 * figure.height) + 3
    x0, y0 = np.floor(figure.joints.min(axis=0)).astype(int) - pad
    x1, y1 = np.ceil(figure.joints.max(axis=0)).astype(int) + pad
    patch = _label_patch(figure, int(x0), int(y0), (int(y1 - y0), int(x1 - x0)))
    area = int(np.count_nonzero(patch))
    fx0, fy0, fx1, fy1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
    if fx1 <= fx0 or fy1 <= fy0:
        return area, None
    sub = patch[fy0 - y0 : fy1 - y0, fx0 - x0 : fx1 - x0]
    clothes = np.asarray(figure.clothes, np.float32)
    colours = np.stack([np.zeros(3), clothes * _DARK_SIDE, clothes * 0.8, np.asarray(figure.skin), clothes])
    shade = 1.0 + rng.uniform(-0.1, 0.1) * np.linspace(-1, 1, sub.shape[0], dtype=np.float32)
    pixels = np.minimum(colours[sub] * shade[:, None, None], 255).astype(np.uint8)
    drawn = sub > 0
    image[fy0:fy1, fx0:fx1][drawn] = pixels[drawn]
    if not drawn.any() or np.count_nonzero(drawn) < _MIN_VISIBLE * area:
        return area, None
    ys, xs = np.nonzero(drawn)
    return area, np.array(
        [fx0 + xs.min(), fy0 + ys.min(), fx0 + xs.max() + 1, fy0 + ys.max() + 1], np.float32
    )


def _distractor(rng: np.random.Generator, style: PoseStyle, image: np.ndarray, x: float, y: float) -> None:
    """A thing that is no figure: a polyline of 2-4 limb-like segments, a pole with crossbars, a disc or a ring."""
    size = float(math.exp(rng.uniform(math.log(style.min_height), math.log(style.max_height)))) * 0.6
    colour = rgb(rng.uniform(0, 360), rng.uniform(0.3, 1.0), rng.uniform(0.4, 1.0))
    width = max(1, round(size * rng.uniform(0.04, 0.09)))
    kind = rng.random()
    scale = 1 << _SHIFT
    if kind < 0.45:
        points = [np.array([x, y])]
        for _ in range(int(rng.integers(2, 5))):
            points.append(points[-1] + size * 0.35 * _direction(1.0, rng.uniform(0, 2 * math.pi)))
        fixed = (np.array(points) * scale).round().astype(np.int32)
        cv2.polylines(image, [fixed], False, colour, width, cv2.LINE_8, _SHIFT)
    elif kind < 0.7:
        top, bottom = np.array([x, y - size / 2]), np.array([x, y + size / 2])
        cv2.line(
            image,
            tuple((top * scale).astype(int)),
            tuple((bottom * scale).astype(int)),
            colour,
            width,
            8,
            _SHIFT,
        )
        for k in range(int(rng.integers(1, 3))):
            at = y - size / 2 + size * (0.15 + 0.25 * k)
            half = size * rng.uniform(0.15, 0.35)
            left, right = np.array([x - half, at]), np.array([x + half, at])
            cv2.line(
                image,
                tuple((left * scale).astype(int)),
                tuple((right * scale).astype(int)),
                colour,
                width,
                8,
                _SHIFT,
            )
    else:
        radius = round(size * rng.uniform(0.1, 0.3) * scale)
        thickness = -1 if kind < 0.85 else max(1, width)
        cv2.circle(image, (round(x * scale), round(y * scale)), radius, colour, thickness, cv2.LINE_8, _SHIFT)


def _places(
    rng: np.random.Generator, count: int, width: int, height: int, style: PoseStyle, seams: bool
) -> np.ndarray:
    """(count, 2) middles of the figures; with `seams`, a fraction of them on a tile seam (the figure crosses it)."""
    xs, ys = rng.uniform(0, width, count), rng.uniform(0, height, count)
    seam_x, seam_y = tile_seams(width, height, style.tile, style.overlap) if seams else ((), ())
    if len(seam_x) or len(seam_y):
        on_seam = rng.random(count) < style.seam_fraction
        vertical = rng.random(count) < len(seam_x) / (len(seam_x) + len(seam_y))
        jitter = rng.uniform(-6, 6, count)
        if len(seam_x):
            xs = np.where(
                on_seam & vertical, np.asarray(seam_x)[rng.integers(0, len(seam_x), count)] + jitter, xs
            )
        if len(seam_y):
            ys = np.where(
                on_seam & ~vertical, np.asarray(seam_y)[rng.integers(0, len(seam_y), count)] + jitter, ys
            )
    return np.stack([xs, ys], axis=1)


def _free(occupied: list[np.ndarray], joints: np.ndarray, margin: float) -> bool:
    """Whether a figure with these joints keeps `margin` px (plus limb widths) from every figure already placed;
    if so it is marked placed."""
    box = np.concatenate([joints.min(axis=0) - margin, joints.max(axis=0) + margin])
    if any(box[0] < o[2] and o[0] < box[2] and box[1] < o[3] and o[1] < box[3] for o in occupied):
        return False
    occupied.append(box)
    return True


def _render(rng: np.random.Generator, width: int, height: int, style: PoseStyle, seams: bool) -> PoseScene:
    image = background(rng, height, width)
    mpix = width * height / 1e6
    count = int(rng.poisson(style.figures_per_mpix * mpix))
    places = _places(rng, count, width, height, style, seams)
    for _ in range(int(rng.poisson(style.distractors_per_mpix * mpix))):
        _distractor(rng, style, image, rng.uniform(0, width), rng.uniform(0, height))
    occupied: list[np.ndarray] = []
    boxes, keypoints = [], []
    for x, y in places:
        figure = _figure(rng, style, float(x), float(y))
        if not _free(occupied, figure.joints, 0.12 * figure.height + 2):
            continue
        _, box = _paint(rng, image, figure)
        if box is None or (box[2:] - box[:2]).min() < _MIN_SIDE:
            continue
        inside = (
            (figure.joints[:, 0] >= 0)
            & (figure.joints[:, 0] < width)
            & (figure.joints[:, 1] >= 0)
            & (figure.joints[:, 1] < height)
        )
        points = np.concatenate([figure.joints, np.full((len(JOINTS), 1), 2.0)], axis=1)
        points[~inside] = 0.0
        boxes.append(box)
        keypoints.append(points)
    return PoseScene(
        finish(rng, image),
        np.array(boxes, np.float32).reshape(-1, 4),
        np.array(keypoints, np.float32).reshape(-1, len(JOINTS), 3),
        np.zeros(len(boxes), np.int64),
    )


def make_pose_scene(
    seed: int, width: int = 1920, height: int = 1080, style: PoseStyle | None = None
) -> PoseScene:
    """A full frame; figures cross the seams of `style.tile` / `style.overlap` tiles."""
    return _seeded(seed, width, height, style, seams=True)


def make_pose_crop(seed: int, size: int = 640, style: PoseStyle | None = None) -> PoseScene:
    """A tile-sized scene with the statistics of a frame tile: figures may be cut by the crop border."""
    return _seeded(seed, size, size, style, seams=False)


def _seeded(seed: int, width: int, height: int, style: PoseStyle | None, seams: bool) -> PoseScene:
    """The scene of `seed` (frames and crops draw from streams of their own)."""
    if width < 16 or height < 16:
        raise ValueError(f"a pose scene must be at least 16x16 pixels, got {width}x{height}")
    rng = np.random.default_rng([int(seed), width, height, 20 if seams else 21])
    return _render(rng, width, height, style or PoseStyle(), seams)


def cut_by_seams(boxes: np.ndarray, tiles: np.ndarray, width: int, height: int) -> np.ndarray:
    """(N,) bool: which boxes an inner edge of the tiles (x1, y1, x2, y2 each) of a width x height frame crosses."""
    tiles = np.asarray(tiles, np.float64).reshape(-1, 4)
    xs, ys = np.unique(tiles[:, [0, 2]]), np.unique(tiles[:, [1, 3]])
    seam_x, seam_y = xs[(xs > 0) & (xs < width)], ys[(ys > 0) & (ys < height)]
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    across_x = ((boxes[:, None, 0] < seam_x[None, :]) & (seam_x[None, :] < boxes[:, None, 2])).any(axis=1)
    across_y = ((boxes[:, None, 1] < seam_y[None, :]) & (seam_y[None, :] < boxes[:, None, 3])).any(axis=1)
    return across_x | across_y
