"""Synthetic scenes: determinism, exact ground truth, class balance, seam crossings, COCO export."""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tiled_detector.pipeline.tiling import plan_tiles
from tiled_detector.tools.worlds.synthetic import (
    CLASSES,
    Scene,
    SceneStyle,
    coco_ground_truth,
    make_crop,
    make_scene,
    tile_seams,
    to_coco,
)


@pytest.fixture(scope="module")
def frames() -> list[Scene]:
    return [make_scene(seed) for seed in range(3)]


def test_same_seed_same_scene() -> None:
    a, b = make_scene(11, 640, 480), make_scene(11, 640, 480)
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.boxes, b.boxes)
    np.testing.assert_array_equal(a.class_ids, b.class_ids)


def test_independent_of_global_random_state() -> None:
    np.random.seed(1)
    a = make_crop(5, 320)
    np.random.seed(2)
    np.random.random(100)
    b = make_crop(5, 320)
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.boxes, b.boxes)


def test_different_seeds_differ() -> None:
    a, b = make_scene(1, 640, 480), make_scene(2, 640, 480)
    assert not np.array_equal(a.image, b.image)
    assert a.boxes.shape != b.boxes.shape or not np.array_equal(a.boxes, b.boxes)


def test_frame_shapes_and_dtypes(frames: list[Scene]) -> None:
    for scene in frames:
        assert scene.image.shape == (1080, 1920, 3) and scene.image.dtype == np.uint8
        assert scene.boxes.dtype == np.float32 and scene.class_ids.dtype == np.int64
        assert len(scene.boxes) >= 30  # a cluttered frame holds dozens of objects


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), size=st.integers(64, 400))
@example(seed=641, size=269)
def test_boxes_inside_frame_and_sized(seed: int, size: int) -> None:
    scene = make_crop(seed, size)
    b = scene.boxes
    assert np.all(b[:, 0] >= 0) and np.all(b[:, 1] >= 0)
    assert np.all(b[:, 2] <= size) and np.all(b[:, 3] <= size)
    assert np.all(b[:, 2] - b[:, 0] >= 4) and np.all(b[:, 3] - b[:, 1] >= 4)
    # objects are at most 48 px across; a rotated cross's arm corners lie at r * sqrt(1 + 1/9) (e.g. seed 641,
    # size 269: 51 px), plus a pixel of rasterisation on each side
    assert np.all(b[:, 2:] - b[:, :2] <= math.ceil(48 * math.hypot(1, 1 / 3)) + 2)
    assert np.all((scene.class_ids >= 0) & (scene.class_ids < len(CLASSES)))


def test_boxes_are_tight_around_coloured_pixels() -> None:
    """Without blur, noise or lighting, each box edge row/column holds object-coloured pixels and the row and
    column just outside the box hold fewer (the box is not loose)."""
    scene = make_scene(3, 800, 600, SceneStyle(distractors_per_mpix=0.0, occluded_fraction=0.0))
    hsv_sat = scene.image.max(axis=2).astype(int) - scene.image.min(axis=2).astype(int)
    tight = 0
    for x1, y1, x2, y2 in scene.boxes.astype(int):
        inside = hsv_sat[y1:y2, x1:x2]
        assert inside.max() > 60  # saturated object pixels inside the box
        if x1 > 2 and y1 > 2 and x2 < 797 and y2 < 597:
            ring = np.concatenate(
                [
                    hsv_sat[y1 - 2, x1:x2],
                    hsv_sat[y2 + 1, x1:x2],
                    hsv_sat[y1:y2, x1 - 2],
                    hsv_sat[y1:y2, x2 + 1],
                ]
            )
            edge = np.concatenate(
                [hsv_sat[y1, x1:x2], hsv_sat[y2 - 1, x1:x2], hsv_sat[y1:y2, x1], hsv_sat[y1:y2, x2 - 1]]
            )
            tight += int(edge.max() > ring.mean())
    assert tight >= 0.8 * len(scene.boxes)


def test_class_balance(frames: list[Scene]) -> None:
    counts = np.bincount(np.concatenate([s.class_ids for s in frames]), minlength=len(CLASSES))
    assert len(CLASSES) >= 4
    assert counts.min() >= 0.5 * counts.mean()


def test_objects_cross_tile_seams(frames: list[Scene]) -> None:
    seam_x, seam_y = tile_seams(1920, 1080, 640, 0.2)
    tiles = plan_tiles(1080, 1920, 640, 640, 0.2)
    assert set(seam_x.tolist()) == {
        float(v) for v in np.concatenate([tiles[:, 0], tiles[:, 2]]) if 0 < v < 1920
    }
    assert set(seam_y.tolist()) == {
        float(v) for v in np.concatenate([tiles[:, 1], tiles[:, 3]]) if 0 < v < 1080
    }
    crossing = 0
    for scene in frames:
        b = scene.boxes
        on_x = ((b[:, 0, None] < seam_x) & (b[:, 2, None] > seam_x)).any(axis=1)
        on_y = ((b[:, 1, None] < seam_y) & (b[:, 3, None] > seam_y)).any(axis=1)
        crossing += int((on_x | on_y).sum())
    assert crossing >= 0.2 * sum(len(s.boxes) for s in frames)


def test_crop_statistics_match_frames() -> None:
    crops = [make_crop(seed, 640) for seed in range(6)]
    per_crop = np.mean([len(c.boxes) for c in crops])
    assert 4 <= per_crop <= 25  # 640^2 at the frame density of ~30 objects per megapixel
    sizes = np.concatenate([c.boxes[:, 2:] - c.boxes[:, :2] for c in crops]).max(axis=1)
    assert sizes.min() >= 4 and sizes.max() <= 50


def test_coco_export_loads_in_pycocotools(frames: list[Scene]) -> None:
    from pycocotools.coco import COCO

    data = to_coco(frames)
    assert [c["name"] for c in data["categories"]] == list(CLASSES)
    assert len(data["images"]) == 3 and data["images"][0]["width"] == 1920
    assert len(data["annotations"]) == sum(len(s.boxes) for s in frames)
    first = data["annotations"][0]
    x1, y1, x2, y2 = frames[0].boxes[0].tolist()
    assert first["bbox"] == pytest.approx([x1, y1, x2 - x1, y2 - y1])
    assert first["area"] == pytest.approx((x2 - x1) * (y2 - y1)) and first["iscrowd"] == 0
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = data
        coco.createIndex()
    assert len(coco.getAnnIds()) == len(data["annotations"])
    assert sorted(coco.getCatIds()) == [1, 2, 3, 4]


def test_coco_ground_truth_from_labels() -> None:
    data = coco_ground_truth([(np.array([[0, 0, 10, 20]], np.float32), np.array([2]))], [(100, 50)])
    assert data["images"] == [{"id": 1, "width": 100, "height": 50, "file_name": "000001.png"}]
    assert data["annotations"][0]["category_id"] == 3 and data["annotations"][0]["area"] == 200


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"min_size": 10, "max_size": 5}, "min_size"), ({"seam_fraction": 2.0}, "seam_fraction")],
)
def test_style_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SceneStyle(**kwargs)


def test_scene_validation() -> None:
    with pytest.raises(ValueError, match="uint8"):
        Scene(np.zeros((4, 4), np.uint8), np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="at least 16"):
        make_scene(0, 8, 8)
