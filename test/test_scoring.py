"""Scores (`tools.scoring`): the MOT metrics against hand-counted numbers; rotated IoU against box IoU, DOTA's AP50
against its devkit's rules; keypoint AP against a hand-computed OKS."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.tools.scoring import (
    COCO_SIGMAS,
    box_iou,
    coco_keypoint_stats,
    dota_ap50,
    keypoint_sigmas,
    mot_metrics,
    rotated_iou,
    voc07_ap,
)


def _box(cx: float, cy: float, size: float = 20.0) -> list[float]:
    return [cx - size / 2, cy - size / 2, cx + size / 2, cy + size / 2]


def test_mot_metrics_equal_the_hand_counted_numbers():
    # 2 objects over 3 frames; the prediction swaps their ids in frame 3 (2 switches) and misses one in frame 2
    a, b = _box(10, 10), _box(100, 10)
    truth = [(np.array([a, b]), np.array([1, 2]))] * 3
    predicted = [
        (np.array([a, b]), np.array([7, 8])),
        (np.array([a]), np.array([7])),
        (np.array([a, b]), np.array([8, 7])),
    ]
    found = mot_metrics(truth, predicted)
    # MOTA = 1 - (FN 1 + FP 0 + IDSW 2) / GT 6; IDF1 = 2 IDTP / (GT + predictions) with the best one-to-one
    # identity mapping (1->7, 2->8): IDTP = 2 + 1 = 3 (frames 1 and 2) -> 2 * 3 / (6 + 5)
    assert found == {"IDF1": pytest.approx(6 / 11), "MOTA": pytest.approx(0.5), "id_switches": 2}


def _rbox(cx: float, cy: float, w: float = 20.0, h: float = 10.0, angle: float = 0.0) -> list[float]:
    return [cx, cy, w, h, angle]


@settings(max_examples=40, deadline=None)
@given(
    x=st.floats(0, 50),
    y=st.floats(0, 50),
    w=st.floats(2, 40),
    h=st.floats(2, 40),
    dx=st.floats(-30, 30),
    dy=st.floats(-30, 30),
)
def test_rotated_iou_of_upright_boxes_is_box_iou_and_ignores_turns_of_pi(x, y, w, h, dx, dy) -> None:
    a = np.array([_rbox(x, y, w, h)])
    b = np.array([_rbox(x + dx, y + dy, h, w)])
    expected = box_iou(
        np.c_[a[:, :2] - a[:, 2:4] / 2, a[:, :2] + a[:, 2:4] / 2],
        np.c_[b[:, :2] - b[:, 2:4] / 2, b[:, :2] + b[:, 2:4] / 2],
    )
    np.testing.assert_allclose(rotated_iou(a, b), expected, atol=1e-4)
    turned = b + np.array([0, 0, 0, 0, math.pi])
    swapped = np.array([[x + dx, y + dy, w, h, math.pi / 2]])  # w and h swapped, turned a quarter
    np.testing.assert_allclose(rotated_iou(a, turned), expected, atol=1e-4)
    np.testing.assert_allclose(rotated_iou(a, swapped), expected, atol=1e-4)


def test_voc07_ap_is_the_mean_of_eleven_precisions() -> None:
    recall = np.array([0.1, 0.2, 0.4, 0.4, 0.65])
    precision = np.array([1.0, 1.0, 0.67, 0.5, 0.6])
    # at 0 and 0.1: 1; 0.2: 1; 0.3, 0.4: max(0.67, 0.5, 0.6) = 0.67; 0.5, 0.6: 0.6; 0.7 .. 1: 0
    assert voc07_ap(recall, precision) == pytest.approx((3 * 1.0 + 2 * 0.67 + 2 * 0.6) / 11)


def test_dota_ap50_follows_the_devkit_rules() -> None:
    """Difficult objects neither count nor punish; a second detection of an object is a false positive; IoU must
    be above 0.5, not equal; quadrilateral truth against rotated detections; classes without an object that is
    not difficult are not averaged."""
    truth_a = (
        np.array([[[0, 0], [20, 0], [20, 10], [0, 10]], [[100, 0], [120, 0], [120, 10], [100, 10]]], float),
        np.array([0, 0]),
        np.array([False, True]),  # the second object is difficult
    )
    truth_b = (np.array([[[0, 0], [10, 0], [10, 10], [0, 10]]], float), np.array([1]), np.array([True]))
    predictions = [
        (
            np.array([_rbox(10, 5), _rbox(10.5, 5), _rbox(110, 5), _rbox(300, 300)]),
            np.array([0.9, 0.8, 0.95, 0.3]),
            np.array([0, 0, 0, 0]),
        ),
        (np.array([_rbox(5, 5, 10, 10)]), np.array([0.7]), np.array([1])),  # on a difficult object: ignored
    ]
    found = dota_ap50(predictions, [truth_a, truth_b])
    # class 0: detections by score: 0.95 on the difficult one (ignored), 0.9 TP, 0.8 duplicate FP, 0.3 FP
    assert found["true_positives"] == 1 and found["false_positives"] == 2 and found["objects"] == 1
    assert found["per_class"] == {"0": pytest.approx(1.0)} and found["mAP50"] == pytest.approx(1.0)
    half = [(np.array([_rbox(10, 10, 20, 20)]), np.array([0.9]), np.array([0]))]  # IoU exactly 0.5
    assert dota_ap50(half, [truth_a[:2]])["true_positives"] == 0
    tilted = [(np.array([_rbox(10, 5, 20, 10, 0.2)]), np.array([0.9]), np.array([0]))]
    assert dota_ap50(tilted, [truth_a])["mAP50"] == pytest.approx(1.0)
    assert dota_ap50([(np.zeros((0, 5)), np.zeros(0), np.zeros(0, int))], [truth_a])["mAP50"] == 0.0


def _person(x: float, y: float) -> tuple[np.ndarray, np.ndarray]:
    """A 20 x 40 box at (x, y) and its two joints (top and bottom centre), both labelled."""
    return np.array([x, y, x + 20, y + 40.0]), np.array([[x + 10, y, 2], [x + 10, y + 40, 2.0]])


def test_keypoint_ap_follows_the_oks_of_a_hand_computed_case() -> None:
    box, joints = _person(0, 0)
    truth = [(box[None], np.array([0]), joints[None], np.array([400.0]))]
    moved = joints.copy()
    moved[1, 0] += (
        20.0  # 20 px off: e = d^2 / (2 sigma)^2 / area / 2 = 400 / 1 / 400 / 2 = 0.5 (sigma 1/2 for K=2)
    )
    oks = (1.0 + math.exp(-0.5)) / 2  # 0.803: matched at OKS thresholds 0.50 ... 0.80, 7 of the 10
    found = coco_keypoint_stats(truth, [(box[None], np.array([0.9]), np.array([0]), moved[None])])
    assert oks == pytest.approx(0.8033, abs=1e-4)
    assert found["kp_AP"] == pytest.approx(0.7) and found["kp_AP50"] == pytest.approx(1.0)
    assert found["kp_AP75"] == pytest.approx(1.0) and found["kp_recall"] == pytest.approx(0.7)
    exact = coco_keypoint_stats(truth, [(box[None], np.array([0.9]), np.array([0]), joints[None])])
    assert exact["kp_AP"] == pytest.approx(1.0)
    # the area scales the tolerance: the same 20 px on an object of 4x the area is OKS (1 + e^-0.125) / 2 = 0.94
    big = [(box[None], np.array([0]), joints[None], np.array([1600.0]))]
    assert coco_keypoint_stats(big, [(box[None], np.array([0.9]), np.array([0]), moved[None])])["kp_AP"] == (
        pytest.approx(0.9)
    )
    nothing = coco_keypoint_stats(truth, [(np.zeros((0, 4)), np.zeros(0), np.zeros(0), np.zeros((0, 2, 3)))])
    assert nothing["kp_AP"] == 0.0


def test_keypoint_sigmas_are_cocos_for_17_joints_and_one_over_k_otherwise() -> None:
    np.testing.assert_array_equal(keypoint_sigmas(17), COCO_SIGMAS)
    assert COCO_SIGMAS[0] == pytest.approx(0.026) and COCO_SIGMAS[11] == pytest.approx(0.107)
    np.testing.assert_allclose(keypoint_sigmas(13), np.full(13, 1 / 13))


def test_ignored_objects_and_unlabelled_joints_count_neither_way() -> None:
    (a, ja), (b, jb) = _person(0, 0), _person(100, 0)
    boxes, classes, joints = np.stack([a, b]), np.array([0, 0]), np.stack([ja, jb])
    only_a = [(a[None], np.array([0.9]), np.array([0]), ja[None])]
    missed = coco_keypoint_stats([(boxes, classes, joints, None)], only_a)
    assert missed["kp_recall"] == pytest.approx(0.5)
    ignored = coco_keypoint_stats([(boxes, classes, joints, None, np.array([False, True]))], only_a)
    assert ignored["kp_AP"] == pytest.approx(1.0) and ignored["kp_recall"] == pytest.approx(1.0)
    # a joint not labelled (visibility 0) is not measured: a wild guess there costs nothing
    half = joints.copy()
    half[0, 1] = 0.0
    wild = ja.copy()
    wild[1, :2] = (500.0, 500.0)
    found = coco_keypoint_stats(
        [(a[None], np.array([0]), half[:1], None)], [(a[None], np.array([0.9]), np.array([0]), wild[None])]
    )
    assert found["kp_AP"] == pytest.approx(1.0)


def test_keypoints_of_another_joint_count_are_refused_naming_both() -> None:
    box, joints = _person(0, 0)
    with pytest.raises(ValueError, match=r"keypoints of \[3\] joints scored against truth of \[2\] joints"):
        coco_keypoint_stats(
            [(box[None], np.array([0]), joints[None])],
            [(box[None], np.ones(1), np.zeros(1), np.zeros((1, 3, 3)))],
        )
