"""COCO's forms of instance masks (`tools/segmentation.py`): a detection's RLE made from its box's columns equals
pycocotools' own encoding of the whole frame; masks at a smaller `mask_scale` come back in frame pixels; truth
polygons and RLE are checked (broken ones refused naming where) and scored as mask AP."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as coco_mask

from tiled_detector.tools.scoring import coco_mask_stats
from tiled_detector.tools.segmentation import (
    SegmentationError,
    crop_rle,
    detection_rle,
    frame_crop,
    rle_masks,
    truth_rle,
)
from tiled_detector.types import InstanceMasks


def _encode(mask: np.ndarray) -> str:
    return coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode("ascii")


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 30),
    st.integers(1, 30),
    st.integers(0, 29),
    st.integers(0, 29),
    st.integers(0, 12),
    st.integers(0, 12),
    st.integers(0, 2**31 - 1),
)
def test_a_crops_rle_is_pycocotools_encoding_of_the_whole_frame(height, width, x, y, h, w, seed):
    x, y = min(x, width - 1), min(y, height - 1)
    h, w = min(h, height - y), min(w, width - x)
    crop = np.random.default_rng(seed).random((h, w)) < 0.5
    frame = np.zeros((height, width), bool)
    frame[y : y + h, x : x + w] = crop
    rle = crop_rle(crop, (x, y), (height, width))
    assert rle == {"size": [height, width], "counts": _encode(frame)}
    np.testing.assert_array_equal(rle_masks([rle])[0], frame)


def _masks(scale: float) -> InstanceMasks:
    frame_hw = (40, 60)
    h, w = round(40 * scale), round(60 * scale)
    labels = np.zeros((h, w), np.uint16)
    box = np.array([[2, 3, 2 + round(20 * scale), 3 + round(10 * scale)]], np.int32)
    crop = np.zeros((box[0, 3] - box[0, 1], box[0, 2] - box[0, 0]), bool)
    crop[1:-1, 1:-1] = True
    labels[box[0, 1] : box[0, 3], box[0, 0] : box[0, 2]][crop] = 1
    masks = InstanceMasks((h, w), box, crop.reshape(-1), scale, frame_hw)
    np.testing.assert_array_equal(masks.labels, labels)
    return masks


def test_a_mask_at_half_scale_comes_back_in_frame_pixels():
    full, half = _masks(1.0), _masks(0.5)
    crop, at = frame_crop(half, 0)
    assert at == (4, 6) and crop.shape == (10, 20)
    # each label pixel covers 2 x 2 frame pixels: the crop is the label crop repeated
    np.testing.assert_array_equal(crop, half.crop(0).repeat(2, 0).repeat(2, 1))
    assert detection_rle(full, 0)["size"] == detection_rle(half, 0)["size"] == [40, 60]


@pytest.mark.parametrize(
    ("segmentation", "problem"),
    [
        (
            [[1.0, 2.0, 3.0, 4.0]],
            "polygon 1 has 4 coordinates; a polygon needs x, y pairs of at least 3 points",
        ),
        ([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]], "polygon 1 has 7 coordinates"),
        ([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1, "a", 3, 4, 5, 6]], "polygon 2 is not a list of numbers"),
        ([], "an empty polygon list"),
        (
            {"size": [20, 20], "counts": [5, 5]},
            "uncompressed RLE counts must be non-negative integers adding up to 400",
        ),
        ({"size": [10, 20], "counts": "abc"}, r"an RLE of size \[10, 20\], but the image is \[20, 20\]"),
        ("nonsense", "a segmentation must be polygons or RLE"),
    ],
)
def test_broken_truth_segmentations_are_refused_naming_where(segmentation, problem):
    with pytest.raises(SegmentationError, match=f"coco.json: annotation 7: {problem}"):
        truth_rle(segmentation, (20, 20), "coco.json: annotation 7")


def test_truth_polygons_and_rle_decode_to_the_same_mask():
    square = [[2.0, 2.0, 12.0, 2.0, 12.0, 12.0, 2.0, 12.0]]
    polygon = truth_rle(square, (20, 20), "here")
    mask = rle_masks([polygon])[0]
    assert 90 <= mask.sum() <= 121 and mask[5, 5] and not mask[15, 15]
    assert truth_rle(polygon, (20, 20), "here") == polygon  # compressed RLE as it is
    fortran = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
    uncompressed = {"size": [20, 20], "counts": _runs(mask)}
    assert truth_rle(uncompressed, (20, 20), "here")["counts"] == fortran["counts"].decode("ascii")


def _runs(mask: np.ndarray) -> list[int]:
    flat = mask.T.reshape(-1).astype(np.uint8)
    change = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], change, [flat.size]])).tolist()
    return [0, *runs] if flat[0] else runs


def test_mask_ap_is_one_for_the_truth_and_lower_for_a_shifted_mask():
    truth = np.zeros((30, 30), bool)
    truth[5:20, 5:20] = True
    shifted = np.roll(truth, 6, axis=1)
    rle = crop_rle(truth, (0, 0), (30, 30))
    boxes, classes = np.array([[5.0, 5, 20, 20]]), np.array([0])
    frames = [(boxes, classes, [rle], (30, 30))]
    perfect = coco_mask_stats(frames, [(boxes, np.array([0.9]), classes, [rle])])
    moved = coco_mask_stats(
        frames, [(boxes, np.array([0.9]), classes, [crop_rle(shifted, (0, 0), (30, 30))])]
    )
    assert perfect[0] == pytest.approx(1.0) and moved[1] < 1.0  # IoU 9/21: below 0.5
