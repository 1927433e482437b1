"""Scores (`tools.scoring`): the MOT metrics against hand-counted numbers."""

from __future__ import annotations

import numpy as np
import pytest

from tiled_detector.tools.scoring import mot_metrics


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
