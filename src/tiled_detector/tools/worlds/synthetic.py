"""Deterministic synthetic scenes: small coloured shapes on cluttered backgrounds, with exact ground truth.

Every scene is a pure function of its seed (a private `numpy.random.Generator`; no global state). Objects of
`CLASSES` are 8-48 px, drawn with colour, lighting, blur and noise variation, partly occluded, among distractors
(class shapes in other colours, other shapes in class colours), and some are placed across the seams of the
640-px tiles (overlap 0.2) that the detector cuts a frame into. Ground-truth boxes are tight around the visible
pixels of each object (before blur). `make_crop` renders a tile-sized scene with the same statistics, for training.
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np

from tiled_detector.pipeline.tiling import plan_tiles
from tiled_detector.tools import scoring
from tiled_detector.tracking.geometry import move_points

CLASSES: tuple[str, ...] = ("red_disc", "blue_square", "yellow_triangle", "green_cross")

# Hue (degrees) of each class, and hues that never belong to a class (distractors), far from the class hues.
_CLASS_HUES = (0.0, 225.0, 55.0, 125.0)
_DISTRACTOR_HUES = (90.0, 180.0, 285.0, 320.0)
# Shapes: the class shapes in class order, then shapes that are never a class.
_SHAPES = ("disc", "square", "triangle", "cross", "ring", "bar", "diamond_outline")
_SHIFT = 4  # sub-pixel bits for cv2 drawing
_MIN_VISIBLE = 0.35  # an object is labelled when at least this fraction of it is visible ...
_MIN_SIDE = 4  # ... and its visible box is at least this many pixels on each side


@dataclass(frozen=True)
class Scene:
    """One rendered frame: image (H, W, 3) uint8 RGB, boxes (N, 4) float32 x1, y1, x2, y2, class_ids (N,) int64."""

    image: np.ndarray
    boxes: np.ndarray
    class_ids: np.ndarray

    def __post_init__(self) -> None:
        if self.image.ndim != 3 or self.image.shape[2] != 3 or self.image.dtype != np.uint8:
            raise ValueError(
                f"Scene image must be (H, W, 3) uint8, got {self.image.shape} {self.image.dtype}"
            )
        if self.boxes.shape != (len(self.class_ids), 4):
            raise ValueError(
                f"Scene needs one (4,) box per class id, got boxes {self.boxes.shape} and "
                f"{len(self.class_ids)} class ids"
            )


@dataclass(frozen=True)
class SceneStyle:
    """Statistics of a scene; object counts are per megapixel so crops and frames share the same density."""

    objects_per_mpix: float = 30.0
    distractors_per_mpix: float = 24.0
    min_size: float = 8.0
    max_size: float = 48.0
    seam_fraction: float = 0.25  # of the objects, placed across a tile seam (frames only)
    occluded_fraction: float = 0.2
    tile: int = 640
    overlap: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.min_size <= self.max_size:
            raise ValueError(f"need 0 < min_size <= max_size, got {self.min_size} and {self.max_size}")
        for name in ("seam_fraction", "occluded_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


def tile_seams(width: int, height: int, tile: int, overlap: float) -> tuple[np.ndarray, np.ndarray]:
    """Inner tile edges (x positions, y positions) of the detector's tiling of a width x height frame."""
    tiles = plan_tiles(height, width, tile, tile, overlap)
    xs = np.unique(np.concatenate([tiles[:, 0], tiles[:, 2]]))
    ys = np.unique(np.concatenate([tiles[:, 1], tiles[:, 3]]))
    return xs[(xs > 0) & (xs < width)].astype(np.float32), ys[(ys > 0) & (ys < height)].astype(np.float32)


def rgb(hue: float, sat: float, val: float) -> tuple[float, float, float]:
    """An RGB colour (0-255) of a hue in degrees and a saturation and value in [0, 1]."""
    r, g, b = colorsys.hsv_to_rgb((hue % 360.0) / 360.0, sat, val)
    return (r * 255.0, g * 255.0, b * 255.0)


def _poly(cx: float, cy: float, radius: float, angles: Sequence[float]) -> np.ndarray:
    pts = [(cx + radius * math.cos(a), cy + radius * math.sin(a)) for a in angles]
    return (np.array(pts) * (1 << _SHIFT)).round().astype(np.int32)


def _draw_shape(mask: np.ndarray, shape: str, cx: float, cy: float, size: float, angle: float) -> None:
    """Fill `shape` of outer diameter `size` centred at (cx, cy) into the uint8 `mask` (value 1)."""
    r = size / 2.0
    if shape == "disc":
        centre = (round(cx * (1 << _SHIFT)), round(cy * (1 << _SHIFT)))
        cv2.circle(mask, centre, round(r * (1 << _SHIFT)), 1, -1, cv2.LINE_8, _SHIFT)
    elif shape == "ring":
        centre = (round(cx * (1 << _SHIFT)), round(cy * (1 << _SHIFT)))
        thickness = max(2, round(size / 6))
        cv2.circle(mask, centre, round((r - thickness / 2) * (1 << _SHIFT)), 1, thickness, cv2.LINE_8, _SHIFT)
    elif shape == "square":
        cv2.fillPoly(
            mask, [_poly(cx, cy, r, [angle + k * math.pi / 2 for k in range(4)])], 1, cv2.LINE_8, _SHIFT
        )
    elif shape == "triangle":
        pts = _poly(cx, cy, r, [angle + k * 2 * math.pi / 3 for k in range(3)])
        cv2.fillPoly(mask, [pts], 1, cv2.LINE_8, _SHIFT)
    elif shape == "diamond_outline":
        pts = _poly(cx, cy, r, [angle + k * math.pi / 2 for k in range(4)])
        cv2.polylines(mask, [pts], True, 1, max(2, round(size / 7)), cv2.LINE_8, _SHIFT)
    else:  # cross (plus sign) and bar: rotated rectangles
        arms = [(r, r / 5.0)] if shape == "bar" else [(r, r / 3.0), (r / 3.0, r)]
        c, s = math.cos(angle), math.sin(angle)
        for hw, hh in arms:
            corners = [(-hw, -hh), (hw, -hh), (hw, hh), (-hw, hh)]
            pts = [(cx + x * c - y * s, cy + x * s + y * c) for x, y in corners]
            cv2.fillPoly(
                mask, [(np.array(pts) * (1 << _SHIFT)).round().astype(np.int32)], 1, cv2.LINE_8, _SHIFT
            )


def background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Low-saturation gradients, mid-frequency texture, lines and blobs."""
    coarse = rng.uniform(40, 200, (rng.integers(2, 6), rng.integers(3, 8), 3)).astype(np.float32)
    grey = coarse.mean(axis=2, keepdims=True)
    coarse = grey + (coarse - grey) * rng.uniform(0.1, 0.45)  # keep the background desaturated
    cell = int(rng.integers(6, 24))
    grid = (width // cell + 2, height // cell + 2)
    texture = rng.normal(0, rng.uniform(6, 22), (grid[1], grid[0], 1)).astype(np.float32)
    small = np.clip(cv2.resize(coarse, grid, interpolation=cv2.INTER_CUBIC) + texture, 0, 255).astype(
        np.uint8
    )
    image = cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR)
    mpix = height * width / 1e6
    for _ in range(rng.poisson(30 * mpix)):  # blobs
        colour = rgb(rng.uniform(0, 360), rng.uniform(0, 0.35), rng.uniform(0.2, 0.9))
        centre = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        axes = (int(rng.integers(6, 90)), int(rng.integers(6, 90)))
        cv2.ellipse(image, centre, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1, cv2.LINE_AA)
    for _ in range(rng.poisson(40 * mpix)):  # lines
        colour = rgb(rng.uniform(0, 360), rng.uniform(0, 0.4), rng.uniform(0.1, 1.0))
        p1 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        length, theta = rng.uniform(20, 400), rng.uniform(0, 2 * math.pi)
        p2 = (int(p1[0] + length * math.cos(theta)), int(p1[1] + length * math.sin(theta)))
        cv2.line(image, p1, p2, colour, int(rng.integers(1, 4)), cv2.LINE_AA)
    return image


def finish(
    rng: np.random.Generator, image: np.ndarray, noise: np.random.Generator | None = None
) -> np.ndarray:
    """Global lighting field, blur and sensor noise (drawn from `noise` where given: a sequence's frames share their
    lighting, blur and noise level, not their noise)."""
    height, width = image.shape[:2]
    light = rng.uniform(0.55, 1.25, (rng.integers(2, 5), rng.integers(2, 5))).astype(np.float32)
    light = cv2.resize(light, (width, height), interpolation=cv2.INTER_CUBIC)
    light = cv2.cvtColor(np.minimum(light * 128.0, 255.0).astype(np.uint8), cv2.COLOR_GRAY2RGB)  # light > 0
    image = cv2.multiply(image, light, scale=1.0 / 128.0)
    sigma = float(rng.uniform(0.3, 1.3))
    image = cv2.GaussianBlur(image, (0, 0), sigma)
    amplitude = int(rng.integers(4, 24))
    noise = np.frombuffer((noise or rng).bytes(height * width), np.uint8).reshape(height, width) % amplitude
    noise = cv2.cvtColor(noise, cv2.COLOR_GRAY2RGB)
    shift = np.clip(np.arange(256) - amplitude // 2, 0, 255).astype(np.uint8)
    return cv2.LUT(cv2.add(image, noise), shift)


def _sample_size(rng: np.random.Generator, style: SceneStyle) -> float:
    """Object diameter, log-uniform so that small objects dominate."""
    return float(math.exp(rng.uniform(math.log(style.min_size), math.log(style.max_size))))


def _centres(
    rng: np.random.Generator, count: int, width: int, height: int, style: SceneStyle, seams: bool
) -> np.ndarray:
    """Object centres; with `seams`, a fraction of them sit on a tile edge so the object crosses it."""
    margin = -style.max_size / 2 if not seams else style.max_size / 2  # crops: objects may leave the frame
    xs = rng.uniform(margin, width - margin, count)
    ys = rng.uniform(margin, height - margin, count)
    seam_x, seam_y = tile_seams(width, height, style.tile, style.overlap)
    if seams and (len(seam_x) or len(seam_y)):
        on_seam = rng.random(count) < style.seam_fraction
        vertical = rng.random(count) < len(seam_x) / (len(seam_x) + len(seam_y))
        jitter = rng.uniform(-0.3, 0.3, count) * style.min_size
        if len(seam_x):
            pick = seam_x[rng.integers(0, len(seam_x), count)]
            xs = np.where(on_seam & vertical, pick + jitter, xs)
        if len(seam_y):
            pick = seam_y[rng.integers(0, len(seam_y), count)]
            ys = np.where(on_seam & ~vertical, pick + jitter, ys)
    return np.stack([xs, ys], axis=1)


def _appearance(
    rng: np.random.Generator, k: int, n_obj: int, class_ids: np.ndarray, style: SceneStyle
) -> tuple[float, float, str, np.ndarray]:
    """Size, angle, shape and colour of object k (k < n_obj: a labelled object of its class; else a distractor)."""
    size = _sample_size(rng, style)
    angle = float(rng.uniform(0, 2 * math.pi))
    if k < n_obj:
        shape, hue = _SHAPES[class_ids[k]], _CLASS_HUES[class_ids[k]] + rng.uniform(-8, 8)
    elif rng.random() < 0.5:  # a class shape in a colour that is not the class colour
        shape = _SHAPES[rng.integers(0, len(CLASSES))]
        hue = _DISTRACTOR_HUES[rng.integers(0, len(_DISTRACTOR_HUES))] + rng.uniform(-8, 8)
    else:  # a non-class shape in any colour
        shape = _SHAPES[rng.integers(len(CLASSES), len(_SHAPES))]
        hue = (_CLASS_HUES + _DISTRACTOR_HUES)[rng.integers(0, 8)] + rng.uniform(-8, 8)
    sat = rng.uniform(0.25, 0.6) if rng.random() < 0.15 and k >= n_obj else rng.uniform(0.6, 1.0)
    return size, angle, shape, np.array(rgb(hue, sat, rng.uniform(0.55, 1.0)), np.float32)


def _paint(
    rng: np.random.Generator,
    image: np.ndarray,
    owner: np.ndarray,
    label: int,
    look: tuple,
    cx: float,
    cy: float,
) -> tuple[int, tuple[int, int, int, int] | None]:
    """Draw one object (`look`: `_appearance`) centred at (cx, cy), marking its pixels `label` in `owner` (-1 for a
    distractor): its full area in pixels and the frame region it was drawn in (None: outside the frame)."""
    size, angle, shape, colour = look
    height, width = owner.shape
    pad = int(size / 2 + 2)
    x0, y0 = int(cx) - pad, int(cy) - pad
    patch = np.zeros((2 * pad + 2, 2 * pad + 2), np.uint8)
    _draw_shape(patch, shape, cx - x0, cy - y0, size, angle)
    area = int(patch.sum())
    px0, py0 = max(0, -x0), max(0, -y0)  # the patch clipped to the frame
    fx0, fy0 = max(0, x0), max(0, y0)
    fx1, fy1 = min(width, x0 + patch.shape[1]), min(height, y0 + patch.shape[0])
    if fx1 <= fx0 or fy1 <= fy0:
        return area, None
    sub = patch[py0 : py0 + fy1 - fy0, px0 : px0 + fx1 - fx0].astype(bool)
    shade = 1.0 + rng.uniform(-0.15, 0.15) * np.linspace(-1, 1, sub.shape[1], dtype=np.float32)
    pixels = np.minimum(colour[None, None, :] * shade[None, :, None], 255).astype(np.uint8)
    image[fy0:fy1, fx0:fx1][sub] = np.broadcast_to(pixels, (*sub.shape, 3))[sub]
    owner[fy0:fy1, fx0:fx1][sub] = label
    return area, (fx0, fy0, fx1, fy1)


def _render(rng: np.random.Generator, width: int, height: int, style: SceneStyle, seams: bool) -> Scene:
    image = background(rng, height, width)
    owner = np.full((height, width), -1, np.int16)  # index of the object that owns each pixel, -1 = none
    mpix = width * height / 1e6
    n_obj = int(rng.poisson(style.objects_per_mpix * mpix))
    n_dis = int(rng.poisson(style.distractors_per_mpix * mpix))
    centres = _centres(rng, n_obj + n_dis, width, height, style, seams)
    # Draw order is random so distractors and objects occlude each other; occluders come last.
    order = rng.permutation(n_obj + n_dis)
    class_ids = rng.integers(0, len(CLASSES), n_obj)
    full_area = np.zeros(n_obj, np.int64)
    regions: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * n_obj
    for k in order:
        look = _appearance(rng, k, n_obj, class_ids, style)
        area, region = _paint(rng, image, owner, k if k < n_obj else -1, look, *centres[k])
        if k < n_obj:
            full_area[k] = area
            regions[k] = region or (0, 0, 0, 0)
    boxes, labels = _visible_boxes(owner, regions, full_area, class_ids, style)
    occluded = _occlude(rng, image, owner, regions, boxes, labels, style)
    if occluded:
        boxes, labels = _visible_boxes(owner, regions, full_area, class_ids, style)
    return Scene(finish(rng, image), boxes, labels)


def _occlude(
    rng: np.random.Generator,
    image: np.ndarray,
    owner: np.ndarray,
    regions: list[tuple[int, int, int, int]],
    boxes: np.ndarray,
    labels: np.ndarray,
    style: SceneStyle,
) -> bool:
    """Cover part of some labelled objects with a background-coloured blob; returns whether any was drawn."""
    drawn = False
    for box in boxes[rng.random(len(boxes)) < style.occluded_fraction]:
        x1, y1, x2, y2 = box
        w, h = x2 - x1, y2 - y1
        side = int(rng.integers(0, 4))
        cx = [x1, x2, (x1 + x2) / 2, (x1 + x2) / 2][side] + rng.uniform(-0.1, 0.1) * w
        cy = [(y1 + y2) / 2, (y1 + y2) / 2, y1, y2][side] + rng.uniform(-0.1, 0.1) * h
        axes = (max(2, int(w * rng.uniform(0.3, 0.6))), max(2, int(h * rng.uniform(0.3, 0.6))))
        colour = rgb(rng.uniform(0, 360), rng.uniform(0, 0.3), rng.uniform(0.2, 0.9))
        x_lo, y_lo = max(0, int(cx) - axes[0] - 1), max(0, int(cy) - axes[1] - 1)
        x_hi, y_hi = min(owner.shape[1], int(cx) + axes[0] + 2), min(owner.shape[0], int(cy) + axes[1] + 2)
        if x_hi <= x_lo or y_hi <= y_lo:
            continue
        local = np.zeros((y_hi - y_lo, x_hi - x_lo), np.uint8)
        cv2.ellipse(local, (int(cx) - x_lo, int(cy) - y_lo), axes, 0, 0, 360, 1, -1, cv2.LINE_8)
        sel = local.astype(bool)
        image[y_lo:y_hi, x_lo:x_hi][sel] = np.array(colour, np.uint8)
        owner[y_lo:y_hi, x_lo:x_hi][sel] = -1
        drawn = True
    return drawn


def _visible_boxes(
    owner: np.ndarray,
    regions: list[tuple[int, int, int, int]],
    full_area: np.ndarray,
    class_ids: np.ndarray,
    style: SceneStyle,
    with_ids: bool = False,
) -> tuple[np.ndarray, ...]:
    """Tight boxes of the visible pixels of each object that is visible enough to be labelled, their classes (and
    with `with_ids` the objects' indices)."""
    boxes, labels, ids = [], [], []
    for k, (x0, y0, x1, y1) in enumerate(regions):
        if x1 <= x0 or full_area[k] == 0:
            continue
        ys, xs = np.nonzero(owner[y0:y1, x0:x1] == k)
        if len(xs) < _MIN_VISIBLE * full_area[k]:
            continue
        box = (x0 + xs.min(), y0 + ys.min(), x0 + xs.max() + 1, y0 + ys.max() + 1)
        if box[2] - box[0] < _MIN_SIDE or box[3] - box[1] < _MIN_SIDE:
            continue
        boxes.append(box)
        labels.append(class_ids[k])
        ids.append(k)
    found = (np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int64))
    return (*found, np.array(ids, np.int64)) if with_ids else found


def make_scene(seed: int, width: int = 1920, height: int = 1080, style: SceneStyle | None = None) -> Scene:
    """A full frame; objects cross the tile seams of `style.tile` / `style.overlap`."""
    if width < 16 or height < 16:
        raise ValueError(f"scene must be at least 16x16 pixels, got {width}x{height}")
    rng = np.random.default_rng([int(seed), width, height, 0])
    return _render(rng, width, height, style or SceneStyle(), seams=True)


def make_crop(seed: int, size: int = 640, style: SceneStyle | None = None) -> Scene:
    """A tile-sized scene with the statistics of a frame tile: objects may be cut by the crop border."""
    if size < 16:
        raise ValueError(f"crop must be at least 16 pixels, got {size}")
    rng = np.random.default_rng([int(seed), size, size, 1])
    return _render(rng, size, size, style or SceneStyle(), seams=False)


@dataclass(frozen=True)
class TrackedScene(Scene):
    """A frame of a moving sequence: `Scene` plus `ids` (N,) int64, each labelled object's identity (>= 1, the
    same in every frame of the sequence) and `camera`, the true camera motion."""

    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # the camera's motion since the previous frame, (2, 3) its pixels -> this frame's (`frame_motion`)
    camera: np.ndarray = field(default_factory=lambda: np.eye(3)[:2])


@dataclass(frozen=True)
class MotionStyle:
    """How a sequence moves: object speeds (pixels per frame, log-uniform), pairs of objects set on crossing
    paths, static occluders objects pass behind, objects that enter the frame mid-sequence (per megapixel: from
    outside one of its edges, between 15 % and 70 % of the sequence), and the camera's motion, as a robot's camera
    moves: `pan` (pixels per frame, to the right), `rotate` (degrees per frame about the view's centre), `zoom`
    (scale per frame about the centre; above 1: driving forward) and `shake` (each frame's view offset by a uniform
    random jitter of this many pixels at most, per axis)."""

    min_speed: float = 0.5
    max_speed: float = 6.0
    crossing_pairs: int = 4
    occluders: int = 4
    arrivals_per_mpix: float = 2.0
    pan: float = 0.0
    rotate: float = 0.0
    zoom: float = 1.0
    shake: float = 0.0

    def __post_init__(self) -> None:
        problem = camera_motion_problem(self.rotate, self.zoom, self.shake)
        if problem:
            raise ValueError(problem)

    @property
    def pan_only(self) -> bool:
        """Whether the camera only pans (by whole pixels a frame: each view is a crop of the world)."""
        return not self.rotate and self.zoom == 1.0 and not self.shake


MAX_ROTATE, ZOOM_RANGE = 5.0, (0.8, 1.25)  # per frame: degrees, scale


def camera_motion_problem(rotate: float, zoom: float, shake: float) -> str | None:
    """Why a camera motion cannot be rendered (naming the setting), or None."""
    if not abs(rotate) <= MAX_ROTATE:
        return f"--rotate must be within +-{MAX_ROTATE} degrees per frame, got {rotate}"
    if not ZOOM_RANGE[0] <= zoom <= ZOOM_RANGE[1]:
        return f"--zoom must be a scale per frame in [{ZOOM_RANGE[0]}, {ZOOM_RANGE[1]}] (1: none), got {zoom}"
    if not 0 <= shake <= 100:
        return f"--shake must be an amplitude in pixels in [0, 100], got {shake}"
    return None


def camera_views(motion: MotionStyle, frames: int, width: int, height: int, seed: int) -> np.ndarray:
    """(frames, 3, 3): each frame's world -> view transform. The world is frame 0's view extended; frame t's view
    is the world translated by the pan (and the frame's jitter), rotated by `rotate` x t and scaled by `zoom` ** t
    about the view's centre."""
    jitter = np.random.default_rng([int(seed), width, height, 6]).uniform(-1, 1, (frames, 2)) * motion.shake
    centre = np.array([width / 2, height / 2])
    views = np.empty((frames, 3, 3))
    for t in range(frames):
        shift = np.array([round(motion.pan * t) if motion.pan_only else motion.pan * t, 0.0]) + jitter[t]
        angle, scale = math.radians(motion.rotate * t), motion.zoom**t
        rotation = scale * np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        views[t] = np.eye(3)
        views[t, :2, :2] = rotation
        views[t, :2, 2] = centre - rotation @ (centre + shift)
    return views


def frame_motion(views: np.ndarray) -> np.ndarray:
    """(frames, 2, 3): the camera motion of each frame, previous view's pixels -> this view's (identity first)."""
    steps = np.repeat(np.eye(3)[None], len(views), axis=0)
    steps[1:] = views[1:] @ np.linalg.inv(views[:-1])
    return steps[:, :2]


def make_sequence(
    seed: int,
    frames: int,
    width: int = 1920,
    height: int = 1080,
    motion: MotionStyle | None = None,
    style: SceneStyle | None = None,
) -> Iterator[TrackedScene]:
    """A moving scene, frame by frame: the objects of a `make_scene`-like frame (same classes, sizes, colours and
    distractors, over a background as wide as the pan needs) move at their own velocities; some pairs cross, some
    objects pass behind static occluders for a few frames, some enter and leave the frame; ground truth boxes are
    the visible pixels of each object as in `make_scene`, with each object's id. Deterministic per arguments."""
    motion, style = motion or MotionStyle(), style or SceneStyle()
    if width < 16 or height < 16 or frames < 1:
        raise ValueError(
            f"a sequence needs at least 16x16 pixels and 1 frame, got {width}x{height}, {frames}"
        )
    rng = np.random.default_rng([int(seed), width, height, 2])
    views = camera_views(motion, frames, width, height, seed)
    corners = np.array([[0.0, 0.0], [width, 0.0], [0.0, height], [width, height]])
    # every view's footprint
    seen = np.concatenate([move_points(np.linalg.inv(view)[:2], corners) for view in views])
    lo = np.minimum(np.floor(seen.min(axis=0)), 0).astype(int)  # the world's extent
    hi = np.maximum(np.ceil(seen.max(axis=0)), (width + math.ceil(abs(motion.pan) * frames), height)).astype(
        int
    )
    scenery = background(rng, int(hi[1] - lo[1]), int(hi[0] - lo[0]))
    mpix = width * height / 1e6
    n_obj = int(rng.poisson(style.objects_per_mpix * mpix)) + 2 * motion.crossing_pairs
    n_dis = int(rng.poisson(style.distractors_per_mpix * mpix))
    class_ids = rng.integers(0, len(CLASSES), n_obj)
    looks = [_appearance(rng, k, n_obj, class_ids, style) for k in range(n_obj + n_dis)]
    speed = np.exp(rng.uniform(math.log(motion.min_speed), math.log(motion.max_speed), n_obj + n_dis))
    heading = rng.uniform(0, 2 * math.pi, n_obj + n_dis)
    velocity = np.stack([speed * np.cos(heading), speed * np.sin(heading)], axis=1)
    start = np.stack(
        [rng.uniform(lo[0], hi[0], n_obj + n_dis), rng.uniform(0, height, n_obj + n_dis)], axis=1
    )
    middle = frames / 2
    for pair in range(motion.crossing_pairs):  # two objects at the same point half way through
        seen_at = np.array([[rng.uniform(0.2, 0.8) * width, rng.uniform(0.2, 0.8) * height]])
        meet = move_points(np.linalg.inv(views[min(int(middle), frames - 1)])[:2], seen_at)[0]
        for k in (2 * pair, 2 * pair + 1):
            start[k] = meet - velocity[k] * middle
        velocity[2 * pair + 1] = -velocity[2 * pair]  # head on
        start[2 * pair + 1] = meet - velocity[2 * pair + 1] * middle
    _arrive(
        np.random.default_rng([int(seed), width, height, 5]),
        start,
        velocity,
        views,
        frames,
        (width, height),
        range(2 * motion.crossing_pairs, n_obj),
        motion.arrivals_per_mpix,
    )
    order = rng.permutation(n_obj + n_dis)
    occluders = [
        (rng.uniform(lo[0], hi[0]), rng.uniform(0, height), rng.uniform(20, 60), rng.uniform(20, 60))
        for _ in range(motion.occluders)
    ]
    finish_seed = [int(seed), width, height, 3]
    steps = frame_motion(views)
    for t, view in enumerate(views):
        if motion.pan_only:  # a crop of the world
            x0 = int(-view[0, 2]) - lo[0]
            image = scenery[:, x0 : x0 + width].copy()
        else:
            from_background = view @ np.array([[1.0, 0.0, lo[0]], [0.0, 1.0, lo[1]], [0.0, 0.0, 1.0]])
            image = cv2.warpAffine(
                scenery,
                from_background[:2],
                (width, height),
                flags=cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_REFLECT,
            )
        scale, turn = math.sqrt(abs(np.linalg.det(view[:2, :2]))), math.atan2(view[1, 0], view[0, 0])
        owner = np.full((height, width), -1, np.int16)
        full_area = np.zeros(n_obj, np.int64)
        regions: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * n_obj
        centres = move_points(view[:2], start + velocity * t)
        for k in order:
            size, angle, shape, colour = looks[k]
            shade = np.random.default_rng([int(seed), int(k), 4])  # the same shading in every frame
            look = (size * scale, angle + turn, shape, colour)
            area, region = _paint(shade, image, owner, k if k < n_obj else -1, look, *centres[k])
            if k < n_obj:
                full_area[k], regions[k] = area, region or (0, 0, 0, 0)
        for ox, oy, ax, ay in occluders:  # background-coloured blobs in front of everything
            centre = tuple(int(c) for c in move_points(view[:2], np.array([[ox, oy]]))[0])
            axes = (int(ax * scale), int(ay * scale))
            colour = tuple(
                int(c) for c in scenery[int(oy - lo[1]), min(int(ox - lo[0]), scenery.shape[1] - 1)]
            )
            cv2.ellipse(image, centre, axes, math.degrees(turn), 0, 360, colour, -1, cv2.LINE_8)
            cv2.ellipse(owner, centre, axes, math.degrees(turn), 0, 360, -1, -1, cv2.LINE_8)
        boxes, labels, ids = _visible_boxes(owner, regions, full_area, class_ids, style, with_ids=True)
        image = finish(np.random.default_rng(finish_seed), image, np.random.default_rng([*finish_seed, t]))
        yield TrackedScene(image, boxes, labels, ids + 1, steps[t])


def _arrive(
    rng: np.random.Generator,
    start: np.ndarray,
    velocity: np.ndarray,
    views: np.ndarray,
    frames: int,
    size: tuple[int, int],
    candidates: range,
    arrivals_per_mpix: float,
) -> None:
    """Turn some of the `candidates` objects into arrivals (`MotionStyle.arrivals_per_mpix`): each starts outside a
    random edge and crosses it, heading inwards, at a random frame (its path set in `start` / `velocity`)."""
    width, height = size
    count = min(len(candidates), int(rng.poisson(arrivals_per_mpix * width * height / 1e6)))
    for k in rng.choice(np.asarray(candidates, np.int64), count, replace=False) if count else ():
        enter = rng.uniform(0.15, 0.7) * frames
        edge = int(rng.integers(4))  # left, top, right, bottom
        along = rng.uniform(0.1, 0.9)
        point = [
            (-40.0, along * height),
            (along * width, -40.0),
            (width + 40.0, along * height),
            (along * width, height + 40.0),
        ][edge]
        inward = [0.0, 0.5 * math.pi, math.pi, 1.5 * math.pi][edge] + rng.uniform(-0.8, 0.8)
        speed = max(float(np.hypot(*velocity[k])), 60.0 / max(frames, 1), 1.5)
        velocity[k] = speed * np.array([math.cos(inward), math.sin(inward)])
        # in the world
        at = move_points(np.linalg.inv(views[min(int(enter), frames - 1)])[:2], np.array([point]))[0]
        start[k] = at - velocity[k] * enter


def coco_ground_truth(
    labels: Iterable[tuple[np.ndarray, np.ndarray]], sizes: Iterable[tuple[int, int]], first_image_id: int = 1
) -> dict:
    """COCO detection ground truth of synthetic labels: `scoring.coco_ground_truth` with the scene classes."""
    return scoring.coco_ground_truth(labels, sizes, CLASSES, first_image_id)


def to_coco(scenes: Sequence[Scene], first_image_id: int = 1) -> dict:
    """COCO detection ground truth of scenes (images, annotations with xywh bbox / area / iscrowd, categories);
    category id = class id + 1."""
    return coco_ground_truth(
        [(s.boxes, s.class_ids) for s in scenes],
        [(s.image.shape[1], s.image.shape[0]) for s in scenes],
        first_image_id,
    )
