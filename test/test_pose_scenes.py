"""The pose world (`tools.pose_scenes`): deterministic scenes of figures whose joint truth lies on the drawn figure,
figures across tile seams, truth cut by the frame's border, and the seam test of the evaluation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.tools.worlds.pose_scenes import (
    FLIP,
    JOINTS,
    SKELETON,
    PoseScene,
    PoseStyle,
    cut_by_seams,
    make_pose_crop,
    make_pose_scene,
)
from tiled_detector.tools.worlds.synthetic import tile_seams


@pytest.fixture(scope="module")
def scene() -> PoseScene:
    return make_pose_scene(3, 1920, 1080)


def test_same_seed_same_scene_and_another_seed_another(scene: PoseScene) -> None:
    again = make_pose_scene(3, 1920, 1080)
    np.testing.assert_array_equal(again.image, scene.image)
    np.testing.assert_array_equal(again.keypoints, scene.keypoints)
    other = make_pose_scene(4, 1920, 1080)
    assert other.image.shape == scene.image.shape and not np.array_equal(other.image, scene.image)
    np.random.seed(1)  # no global state
    np.testing.assert_array_equal(make_pose_crop(5, 320).image, make_pose_crop(5, 320).image)


def test_joint_names_skeleton_and_mirror_agree() -> None:
    assert len(JOINTS) == 13 == len(FLIP) and len(set(JOINTS)) == 13
    assert all(0 <= a < 13 and 0 <= b < 13 and a != b for a, b in SKELETON)
    for k, mirror in enumerate(FLIP):
        assert FLIP[mirror] == k
        assert JOINTS[mirror] == JOINTS[k].replace("left", "@").replace("right", "left").replace("@", "right")


def test_truth_shapes_and_visible_joints_inside_frame_and_near_their_box(scene: PoseScene) -> None:
    n = len(scene.boxes)
    assert n > 20 and scene.keypoints.shape == (n, 13, 3) and scene.keypoints.dtype == np.float32
    assert set(np.unique(scene.keypoints[..., 2])) <= {0.0, 2.0}
    visible = scene.keypoints[..., 2] > 0
    xy = scene.keypoints[..., :2]
    assert (xy[visible] >= 0).all() and (xy[visible][:, 0] < 1920).all() and (xy[visible][:, 1] < 1080).all()
    assert (scene.keypoints[~visible] == 0).all()  # COCO's form: not labelled, x = y = 0
    # joints sit on the figure: within a few pixels of its drawn box (the head's centre, a wrist at a line's end)
    margin = 3.0
    lower = np.repeat(scene.boxes[:, None, :2] - margin, 13, axis=1)
    upper = np.repeat(scene.boxes[:, None, 2:] + margin, 13, axis=1)
    assert ((xy >= lower) & (xy <= upper))[visible].all()
    heights = scene.boxes[:, 3] - scene.boxes[:, 1]
    assert heights.max() <= 1.3 * PoseStyle().max_height
    np.testing.assert_allclose(scene.areas, np.prod(scene.boxes[:, 2:] - scene.boxes[:, :2], axis=1) * 0.53)


def test_the_left_limbs_are_darker_than_the_right_ones() -> None:
    crop = make_pose_crop(11, 640, PoseStyle(figures_per_mpix=10, distractors_per_mpix=0, min_height=90))
    darker = []
    for points in crop.keypoints:
        if (points[[3, 4, 9, 10], 2] > 0).all():  # both elbows and knees in the crop
            grey = crop.image.astype(float).sum(axis=2)
            at = [grey[int(y), int(x)] for x, y, _ in points[[3, 9, 4, 10]]]
            darker.append(at[0] + at[1] < at[2] + at[3])
    assert darker and np.mean(darker) >= 0.75


def test_figures_cross_tile_seams_and_crops_cut_figures() -> None:
    scene = make_pose_scene(1, 3840, 2160)
    seam_x, seam_y = tile_seams(3840, 2160, 640, 0.2)
    on_seam = ((scene.boxes[:, None, 0] < seam_x) & (seam_x < scene.boxes[:, None, 2])).any(axis=1) | (
        (scene.boxes[:, None, 1] < seam_y) & (seam_y < scene.boxes[:, None, 3])
    ).any(axis=1)
    assert on_seam.mean() > 0.3
    cut = [make_pose_crop(seed, 320) for seed in range(20)]
    outside = sum(int(((c.keypoints[..., 2] == 0).any(axis=1)).sum()) for c in cut)
    assert outside > 0  # figures cut by a crop's border lose the joints outside it


@settings(max_examples=40, deadline=None)
@given(
    x=st.floats(0, 1800),
    y=st.floats(0, 1000),
    w=st.floats(1, 120),
    h=st.floats(1, 80),
)
def test_cut_by_seams_is_whether_an_inner_tile_edge_passes_through_the_box(x, y, w, h) -> None:
    tiles = np.array([[0, 0, 1000, 1080], [920, 0, 1920, 1080]])  # one inner edge each way: x = 920 and 1000
    box = np.array([[x, y, x + w, y + h]])
    expected = (x < 920 < x + w) or (x < 1000 < x + w)
    assert bool(cut_by_seams(box, tiles, 1920, 1080)[0]) == expected


def test_bad_styles_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="min_height"):
        PoseStyle(min_height=50, max_height=40)
    with pytest.raises(ValueError, match="16x16"):
        make_pose_scene(0, 10, 10)
    with pytest.raises(ValueError, match="keypoint array"):
        PoseScene(
            np.zeros((4, 4, 3), np.uint8), np.zeros((1, 4)), np.zeros((1, 12, 3)), np.zeros(1, np.int64)
        )
