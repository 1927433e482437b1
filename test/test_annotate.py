"""Drawing boxes and tiles (`tools.annotate`)."""

from __future__ import annotations

import numpy as np


def test_the_debug_image_draws_each_box_in_its_tracks_colour_with_its_id():
    from tiled_detector.tools.annotate import _PALETTE, annotate
    from tiled_detector.types import Detections

    image = np.zeros((120, 200, 3), np.uint8)
    found = Detections(np.array([[40, 50, 90, 100]], np.float32), np.array([0.9]), np.array([0]))
    plain = annotate(image, found, ["red_disc"])
    tracked = annotate(image, found, ["red_disc"], track_ids=np.array([17]))
    assert tuple(plain[75, 40]) == tuple(_PALETTE[0])  # by class without a tracker
    assert tuple(tracked[75, 40]) == tuple(_PALETTE[17 % len(_PALETTE)])  # by track with one
    label = (slice(30, 48), slice(40, 200))  # the text above the box: "#17 red_disc 0.90" is longer
    assert (tracked[label].any(axis=2).sum(axis=0) > 0).sum() > (
        plain[label].any(axis=2).sum(axis=0) > 0
    ).sum()
