"""Deterministic synthetic scenes of rotated objects, with their exact rotated ground truth: the world of the
bundled rotated-box model and of `eval --obb`.

Aerial-like: elongated objects seen from above at any angle (`CLASSES`: boats, cars, trucks, each with a darker
part that shows which way it faces), scattered and in dense rows of the same angle (moored boats, parked cars:
where the axis-aligned boxes of neighbours overlap although the objects do not), among distractors (the same
shapes in other colours; discs, rings and squares in the class colours), over the backgrounds, lighting, blur and
noise of `synthetic`. Objects do not overlap in still scenes; some cross the seams of the 640-px tiles (overlap
0.2) that the detector cuts a frame into.

Truth is a rotated rectangle per object in ultralytics' xywhr: centre, length (w, along the object), width (h) and
the angle of the length axis in radians, turning +x toward +y in pixel coordinates (the drawn object fills that
rectangle exactly). An object cut by the frame's border is labelled when at least 35 % of its area is inside,
with the minimum-area rectangle of its part inside (as ultralytics labels crops); in moving sequences an object
hidden for more than 65 % by others is not labelled. Every scene is a pure function of its arguments.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import cv2
import numpy as np

from tiled_detector.tools.worlds.synthetic import background, finish, rgb, tile_seams

CLASSES: tuple[str, ...] = ("red_boat", "blue_car", "yellow_truck")

_CLASS_HUES = (0.0, 225.0, 55.0)
_DISTRACTOR_HUES = (90.0, 180.0, 285.0, 320.0)
# the class shapes in class order, then shapes that are never a class
_SHAPES = ("boat", "car", "truck", "disc", "ring", "square")
_ASPECTS = ((2.6, 3.6), (1.8, 2.4), (2.8, 3.6))  # length / width of the class shapes
_SHIFT = 4  # sub-pixel bits for cv2 drawing
_MIN_VISIBLE = 0.35  # an object is labelled when at least this fraction of it is visible ...
_MIN_SIDE = 3.0  # ... and both sides of its rectangle are at least this many pixels


@dataclass(frozen=True)
class RotatedScene:
    """One rendered frame: image (H, W, 3) uint8 RGB; obb (N, 5) float32 cx, cy, w, h, angle (radians, xywhr);
    class_ids (N,) int64; ids (N,) int64: each object's identity (the same in every frame of a sequence)."""

    image: np.ndarray
    obb: np.ndarray
    class_ids: np.ndarray
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        if self.image.ndim != 3 or self.image.shape[2] != 3 or self.image.dtype != np.uint8:
            raise ValueError(
                f"RotatedScene image must be (H, W, 3) uint8, got {self.image.shape} {self.image.dtype}"
            )
        if self.obb.shape != (len(self.class_ids), 5) or len(self.ids) not in (0, len(self.class_ids)):
            raise ValueError(
                f"RotatedScene needs one (5,) rotated box (and id) per class id, got obb {self.obb.shape}, "
                f"{len(self.ids)} ids and {len(self.class_ids)} class ids"
            )


@dataclass(frozen=True)
class RotatedStyle:
    """Statistics of a rotated scene; counts are per megapixel so crops and frames share the same density."""

    objects_per_mpix: float = 24.0  # scattered objects
    rows_per_mpix: float = 8.0  # rows of 3-10 objects of one class side by side at one angle
    distractors_per_mpix: float = 16.0
    min_length: float = 14.0
    max_length: float = 64.0
    seam_fraction: float = 0.25  # of the scattered objects, placed across a tile seam (frames only)
    tile: int = 640
    overlap: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.min_length <= self.max_length:
            raise ValueError(
                f"need 0 < min_length <= max_length, got {self.min_length} and {self.max_length}"
            )
        if not 0 <= self.seam_fraction <= 1:
            raise ValueError(f"seam_fraction must be in [0, 1], got {self.seam_fraction}")


@dataclass(frozen=True)
class Turning:
    """How the objects of a sequence move: forward along their length at a speed (pixels per frame, log-uniform)
    while turning at a rate (degrees per frame, uniform in +-max_turn): the rectangle turns with the object."""

    min_speed: float = 0.5
    max_speed: float = 4.0
    max_turn: float = 2.5


@dataclass(frozen=True)
class _Object:
    """One object to draw: centre, length, width, angle, shape index, RGB colour, class (-1: distractor)."""

    cx: float
    cy: float
    length: float
    width: float
    angle: float
    shape: int
    colour: tuple[float, float, float]
    label: int

    @property
    def rectangle(self) -> np.ndarray:
        return np.array([self.cx, self.cy, self.length, self.width, self.angle], np.float64)


def _box(x0: float, x1: float, y0: float, y1: float) -> np.ndarray:
    return np.array([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])


def _rectangle(length: float, width: float) -> np.ndarray:
    """The corners of a length x width rectangle in its own frame."""
    return _box(-length / 2, length / 2, -width / 2, width / 2)


def _parts(shape: str, length: float, width: float) -> list[tuple[np.ndarray, float]]:
    """The shape's filled polygons in its own frame (x along its length, centred), each with a brightness factor;
    together they span exactly [-length/2, length/2] x [-width/2, width/2]."""
    hl, hw = length / 2.0, width / 2.0
    if shape == "boat":
        hull = np.array([(-hl, -hw), (0.45 * hl, -hw), (hl, 0.0), (0.45 * hl, hw), (-hl, hw)])
        return [(hull, 1.0), (_box(-0.6 * hl, -0.05 * hl, -0.55 * hw, 0.55 * hw), 0.55)]
    if shape == "car":
        return [(_box(-hl, hl, -hw, hw), 1.0), (_box(0.2 * hl, 0.5 * hl, -0.8 * hw, 0.8 * hw), 0.3)]
    if shape == "truck":
        return [(_box(-hl, 0.38 * hl, -hw, hw), 1.0), (_box(0.5 * hl, hl, -0.9 * hw, 0.9 * hw), 0.7)]
    turns = np.linspace(0, 2 * math.pi, 24, endpoint=False)
    circle = np.stack([np.cos(turns), np.sin(turns)], 1)
    if shape == "disc":
        return [(circle * hl, 1.0)]
    if shape == "ring":
        return [(circle * hl, 1.0), (circle * 0.55 * hl, 0.35)]
    return [(_box(-hl, hl, -hl, hl), 1.0)]  # square


def _placed(points: np.ndarray, cx: float, cy: float, angle: float) -> np.ndarray:
    """Points of an object's own frame in frame pixels: rotated by `angle` (+x toward +y), then moved to the
    centre."""
    c, s = math.cos(angle), math.sin(angle)
    return np.stack([cx + points[:, 0] * c - points[:, 1] * s, cy + points[:, 0] * s + points[:, 1] * c], 1)


def _paint(
    rng: np.random.Generator, image: np.ndarray, owner: np.ndarray | None, index: int, thing: _Object
) -> int:
    """Draw `thing` into `image` (and mark its pixels `index` in `owner`); returns its area in pixels."""
    height, width = image.shape[:2]
    pad = int(math.hypot(thing.length, thing.width) / 2 + 2)
    x0, y0 = int(thing.cx) - pad, int(thing.cy) - pad
    patch = np.zeros((2 * pad + 2, 2 * pad + 2), np.uint8)
    parts = _parts(_SHAPES[thing.shape], thing.length, thing.width)
    for level, (points, _) in enumerate(parts, start=1):
        # OpenCV puts pixel centres at whole coordinates, ours (edges from 0) half a pixel further
        placed = _placed(points, thing.cx - x0 - 0.5, thing.cy - y0 - 0.5, thing.angle)
        cv2.fillPoly(patch, [(placed * (1 << _SHIFT)).round().astype(np.int32)], level, cv2.LINE_8, _SHIFT)
    area = int(np.count_nonzero(patch))
    px0, py0 = max(0, -x0), max(0, -y0)
    fx0, fy0 = max(0, x0), max(0, y0)
    fx1, fy1 = min(width, x0 + patch.shape[1]), min(height, y0 + patch.shape[0])
    if fx1 <= fx0 or fy1 <= fy0:
        return area
    sub = patch[py0 : py0 + fy1 - fy0, px0 : px0 + fx1 - fx0]
    factors = np.array([0.0] + [factor for _, factor in parts], np.float32)
    shade = 1.0 + rng.uniform(-0.12, 0.12) * np.linspace(-1, 1, sub.shape[1], dtype=np.float32)
    colour = np.asarray(thing.colour, np.float32)
    pixels = np.minimum(colour * factors[sub][..., None] * shade[None, :, None], 255).astype(np.uint8)
    drawn = sub > 0
    image[fy0:fy1, fx0:fx1][drawn] = pixels[drawn]
    if owner is not None:
        owner[fy0:fy1, fx0:fx1][drawn] = index
    return area


def _truth(thing: _Object, width: int, height: int) -> np.ndarray | None:
    """The labelled rectangle of `thing` in a width x height frame (the part inside, module docstring), or None."""
    corners = _placed(_rectangle(thing.length, thing.width), thing.cx, thing.cy, thing.angle)
    inside = corners.min() >= 0 and (corners[:, 0] <= width).all() and (corners[:, 1] <= height).all()
    if inside:
        return thing.rectangle
    frame = np.array([(0, 0), (width, 0), (width, height), (0, height)], np.float32)
    area, polygon = cv2.intersectConvexConvex(corners.astype(np.float32), frame)
    if polygon is None or area < _MIN_VISIBLE * thing.length * thing.width:
        return None
    (cx, cy), (w, h), degrees = cv2.minAreaRect(polygon.reshape(-1, 2))
    if min(w, h) < _MIN_SIDE:
        return None
    return np.array([cx, cy, w, h, math.radians(degrees)])


def _colour(rng: np.random.Generator, hue: float) -> tuple[float, float, float]:
    return rgb(hue + rng.uniform(-8, 8), rng.uniform(0.6, 1.0), rng.uniform(0.55, 1.0))


def _thing(
    rng: np.random.Generator, style: RotatedStyle, label: int, cx: float, cy: float, angle: float
) -> _Object:
    """An object of class `label` (-1: a distractor, any shape and colour that is not a class's) at (cx, cy)."""
    length = float(math.exp(rng.uniform(math.log(style.min_length), math.log(style.max_length))))
    if label >= 0:
        shape, hue = label, _CLASS_HUES[label]
    elif rng.random() < 0.5:  # a class shape in a colour that is not the class colour
        shape, hue = int(rng.integers(len(CLASSES))), _DISTRACTOR_HUES[rng.integers(len(_DISTRACTOR_HUES))]
    else:  # a non-class shape in any colour
        shape = int(rng.integers(len(CLASSES), len(_SHAPES)))
        hue = (_CLASS_HUES + _DISTRACTOR_HUES)[rng.integers(len(_CLASS_HUES) + len(_DISTRACTOR_HUES))]
        length = min(length, 32.0)
    low, high = _ASPECTS[shape] if shape < len(CLASSES) else (1.0, 1.0)
    return _Object(cx, cy, length, length / rng.uniform(low, high), angle, shape, _colour(rng, hue), label)


def _rows(
    rng: np.random.Generator, style: RotatedStyle, width: int, height: int, either_way: bool = True
) -> tuple[list[_Object], list[int]]:
    """Rows of objects of one class side by side at one angle, 1-4 px apart (each facing either way, or all the
    same way), and each object's row."""
    found, rows = [], []
    for row in range(rng.poisson(style.rows_per_mpix * width * height / 1e6)):
        label = int(rng.integers(len(CLASSES)))
        first = _thing(rng, style, label, 0.0, 0.0, float(rng.uniform(0, 2 * math.pi)))
        across = np.array([-math.sin(first.angle), math.cos(first.angle)])
        start = np.array([rng.uniform(0, width), rng.uniform(0, height)])
        step = first.width + rng.uniform(1.0, 4.0)
        for k in range(int(rng.integers(3, 11))):
            cx, cy = start + across * step * k
            flip = math.pi if rng.random() < 0.5 and either_way else 0.0
            angle = first.angle + flip + rng.uniform(-0.04, 0.04)
            rows.append(row)
            found.append(
                _Object(
                    cx,
                    cy,
                    first.length * rng.uniform(0.93, 1.0),
                    first.width,
                    angle,
                    first.shape,
                    _colour(rng, _CLASS_HUES[label]),
                    label,
                )
            )
    return found, rows


def _scattered(
    rng: np.random.Generator, style: RotatedStyle, width: int, height: int, seams: bool
) -> list[_Object]:
    """Objects and distractors at random places and angles; with `seams`, a fraction of the objects on a tile
    seam."""
    mpix = width * height / 1e6
    count = int(rng.poisson(style.objects_per_mpix * mpix))
    labels = [int(c) for c in rng.integers(0, len(CLASSES), count)]
    labels += [-1] * int(rng.poisson(style.distractors_per_mpix * mpix))
    seam_x, seam_y = tile_seams(width, height, style.tile, style.overlap) if seams else ((), ())
    found = []
    for label in labels:
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        if label >= 0 and (len(seam_x) or len(seam_y)) and rng.random() < style.seam_fraction:
            if rng.random() < len(seam_x) / (len(seam_x) + len(seam_y)):
                cx = float(seam_x[rng.integers(len(seam_x))]) + rng.uniform(-3, 3)
            else:
                cy = float(seam_y[rng.integers(len(seam_y))]) + rng.uniform(-3, 3)
        found.append(_thing(rng, style, label, cx, cy, float(rng.uniform(0, 2 * math.pi))))
    return found


def _free(occupied: np.ndarray, thing: _Object) -> bool:
    """Whether `thing` (grown by 1 px) touches no object already placed; if so, it is marked placed."""
    corners = _placed(_rectangle(thing.length + 2, thing.width + 2), thing.cx, thing.cy, thing.angle)
    x0, y0 = np.floor(corners.min(axis=0)).astype(int) - 1
    x1, y1 = np.ceil(corners.max(axis=0)).astype(int) + 2
    height, width = occupied.shape
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, width), min(y1, height)
    if x1 <= x0 or y1 <= y0:
        return False
    mask = np.zeros((y1 - y0, x1 - x0), np.uint8)
    cv2.fillPoly(
        mask,
        [((corners - (x0 + 0.5, y0 + 0.5)) * (1 << _SHIFT)).round().astype(np.int32)],
        1,
        cv2.LINE_8,
        _SHIFT,
    )
    region = occupied[y0:y1, x0:x1]
    if (region & mask).any():
        return False
    region |= mask
    return True


def _render(
    rng: np.random.Generator, width: int, height: int, style: RotatedStyle, seams: bool
) -> RotatedScene:
    image = background(rng, height, width)
    occupied = np.zeros((height, width), np.uint8)
    placed = [
        t
        for t in _rows(rng, style, width, height)[0] + _scattered(rng, style, width, height, seams)
        if _free(occupied, t)
    ]
    obb, labels = [], []
    for thing in placed:
        _paint(rng, image, None, -1, thing)
        rectangle = _truth(thing, width, height) if thing.label >= 0 else None
        if rectangle is not None:
            obb.append(rectangle)
            labels.append(thing.label)
    return RotatedScene(
        finish(rng, image),
        np.array(obb, np.float32).reshape(-1, 5),
        np.array(labels, np.int64),
        np.arange(1, len(labels) + 1, dtype=np.int64),
    )


def make_rotated_scene(
    seed: int, width: int = 1920, height: int = 1080, style: RotatedStyle | None = None
) -> RotatedScene:
    """A full frame; objects cross the seams of `style.tile` / `style.overlap` tiles."""
    if width < 16 or height < 16:
        raise ValueError(f"scene must be at least 16x16 pixels, got {width}x{height}")
    rng = np.random.default_rng([int(seed), width, height, 10])
    return _render(rng, width, height, style or RotatedStyle(), seams=True)


def make_rotated_crop(seed: int, size: int = 640, style: RotatedStyle | None = None) -> RotatedScene:
    """A tile-sized scene with the statistics of a frame tile: objects may be cut by the crop border."""
    if size < 16:
        raise ValueError(f"crop must be at least 16 pixels, got {size}")
    rng = np.random.default_rng([int(seed), size, size, 11])
    return _render(rng, size, size, style or RotatedStyle(), seams=False)


def make_rotated_sequence(
    seed: int,
    frames: int,
    width: int = 1920,
    height: int = 1080,
    turning: Turning | None = None,
    style: RotatedStyle | None = None,
) -> Iterator[RotatedScene]:
    """A moving scene, frame by frame, from a still camera: the objects and distractors of a
    `make_rotated_scene`-like frame drive forward while turning (`Turning`), so both their places and their angles
    change; rows drive in formation (side by side, one speed and turn), some objects enter or leave the frame, some
    pass over each other. Truth carries each object's identity (>= 1). Deterministic per arguments."""
    turning, style = turning or Turning(), style or RotatedStyle()
    if width < 16 or height < 16 or frames < 1:
        raise ValueError(
            f"a sequence needs at least 16x16 pixels and 1 frame, got {width}x{height}, {frames}"
        )
    rng = np.random.default_rng([int(seed), width, height, 12])
    scenery = background(rng, height, width)
    margin = 60.0  # objects start up to this far outside the frame, so some drive in
    area = (int(width + 2 * margin), int(height + 2 * margin))
    rows, row_of = _rows(rng, style, *area, either_way=False)
    scattered = _scattered(rng, style, *area, seams=False)
    # a row's objects share its speed and turn: they keep side by side; no two objects start on each other
    group_of = [*row_of, *(max(row_of, default=-1) + 1 + np.arange(len(scattered)))]
    occupied = np.zeros(area[::-1], np.uint8)
    kept = [k for k, t in enumerate(rows + scattered) if _free(occupied, t)]
    things = [dataclasses.replace(t, cx=t.cx - margin, cy=t.cy - margin) for t in (rows + scattered)]
    count = len(things)
    group = np.asarray(group_of, np.int64)
    speed = np.exp(rng.uniform(math.log(turning.min_speed), math.log(turning.max_speed), count))[group]
    turn = np.radians(rng.uniform(-turning.max_turn, turning.max_turn, count))[group]
    heading = np.array([t.angle for t in things])
    position = np.array([(t.cx, t.cy) for t in things])
    order = rng.permutation(count)
    order = order[np.isin(order, kept)]  # the objects that start where no other is
    finish_seed = [int(seed), width, height, 13]
    for index in range(frames):
        image = scenery.copy()
        owner = np.full((height, width), -1, np.int32)
        now = [
            dataclasses.replace(t, cx=float(x), cy=float(y), angle=float(a))
            for t, (x, y), a in zip(things, position, heading, strict=True)
        ]
        areas = np.zeros(count, np.int64)
        for k in order:
            shade = np.random.default_rng([int(seed), int(k), 14])  # the same shading in every frame
            areas[k] = _paint(shade, image, owner, int(k), now[k])
        visible = np.bincount(owner[owner >= 0].ravel(), minlength=count)
        obb, labels, ids = [], [], []
        for k in range(count):
            if now[k].label < 0 or visible[k] < _MIN_VISIBLE * max(areas[k], 1):
                continue
            rectangle = _truth(now[k], width, height)
            if rectangle is not None:
                obb.append(rectangle)
                labels.append(now[k].label)
                ids.append(k + 1)
        image = finish(
            np.random.default_rng(finish_seed), image, np.random.default_rng([*finish_seed, index])
        )
        yield RotatedScene(
            image,
            np.array(obb, np.float32).reshape(-1, 5),
            np.array(labels, np.int64),
            np.array(ids, np.int64),
        )
        heading = heading + turn
        position = position + speed[:, None] * np.stack([np.cos(heading), np.sin(heading)], 1)
