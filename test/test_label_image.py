"""The label image's rank rule (docs/MASKS.md): `label_image` (the host, numpy) and `pipeline.labels.compose` (a
device's fixed shapes, torch) give the same image as a pixel-by-pixel reference; ranks from scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_masks import _reference_labels
from tiled_detector.geometry.label_image import label_image, score_ranks
from tiled_detector.pipeline.labels import compose


def _masks(seed: int, shape: tuple[int, int] = (37, 53), count: int = 12):
    """Random boxes inside `shape` (some empty, some at the borders), random bits and scores with ties."""
    rng = np.random.default_rng(seed)
    x0, y0 = rng.integers(-3, shape[1], count).clip(0), rng.integers(-3, shape[0], count).clip(0)
    boxes = np.stack(
        [
            x0,
            y0,
            (x0 + rng.integers(0, 30, count)).clip(max=shape[1]),
            (y0 + rng.integers(0, 25, count)).clip(max=shape[0]),
        ],
        1,
    ).astype(np.int32)
    boxes[3] = [5, 5, 5, 9]  # an empty box
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    bits = rng.random(int(areas.sum())) < 0.7
    scores = rng.choice([0.3, 0.5, 0.5, 0.7, 0.9], count).astype(np.float32)  # ties: their order decides
    return boxes, bits, scores


def test_ranks_follow_the_scores_and_ties_their_order():
    scores = np.array([0.5, 0.9, 0.5, 0.1, 0.9], np.float32)
    np.testing.assert_array_equal(score_ranks(scores), [2, 0, 3, 4, 1])
    assert len(score_ranks(np.zeros(0, np.float32))) == 0


@pytest.mark.parametrize("seed", range(6))
def test_numpy_and_torch_give_the_reference_label_image(seed):
    """Overlaps go to the better-ranked mask (the higher score; equal scores: the earlier), from numpy and from
    torch alike, and torch takes padded bits (a device's fixed capacity) as they come."""
    shape = (37, 53)
    boxes, bits, scores = _masks(seed, shape)
    rank = score_ranks(scores)
    want = _reference_labels(shape, boxes, bits, rank)
    assert len(np.unique(want)) > 5 and (want > 0).sum() < bits.sum()  # masks overlap: the rank decided
    host = label_image(shape, boxes, bits, rank)
    assert host.dtype == np.uint16
    np.testing.assert_array_equal(host, want)
    padded = torch.from_numpy(np.concatenate([bits, np.ones(17, bool)]))  # capacity past the bits needed
    ranks, rows = torch.from_numpy(rank), torch.arange(len(boxes))
    device = compose(torch.from_numpy(boxes), ranks, rows + 1, padded, torch.zeros_like(rows), [shape])
    assert device.dtype == torch.int32
    np.testing.assert_array_equal(device.reshape(shape).numpy(), want)


def test_no_masks_give_an_empty_image():
    empty = np.zeros((0, 4), np.int32)
    assert not label_image((4, 5), empty, np.zeros(0, bool), np.zeros(0, np.int64)).any()
    nothing = torch.zeros(0, dtype=torch.int64)
    found = compose(
        torch.from_numpy(empty), nothing, nothing, torch.zeros(0, dtype=torch.bool), nothing, [(4, 5)]
    )
    assert found.shape == (20,) and not found.any()
