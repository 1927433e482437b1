"""Drawing boxes and tiles (`tools.annotate`)."""

from __future__ import annotations

import numpy as np


def test_the_debug_image_draws_each_box_in_its_tracks_colour_with_its_id():
    from tiled_detector.tools.annotate import annotate
    from tiled_detector.types import Detections

    image = np.zeros((120, 520, 3), np.uint8)
    lefts = (40, 200, 360)  # three boxes, far enough apart for their labels
    boxes = np.array([[x, 50, x + 50, 100] for x in lefts], np.float32)
    found = Detections(boxes, np.full(3, 0.9), np.array([0, 0, 1]))
    labels = ["red_disc", "blue_square"]
    plain = annotate(image, found, labels)
    tracked = annotate(image, found, labels, track_ids=np.array([17, 5, 17]))
    plain_colours = [tuple(plain[75, x]) for x in lefts]
    tracked_colours = [tuple(tracked[75, x]) for x in lefts]
    assert plain_colours[0] == plain_colours[1] != plain_colours[2]  # by class without a tracker
    assert tracked_colours[0] == tracked_colours[2] != tracked_colours[1]  # by track with one
    assert all(any(colour) for colour in plain_colours + tracked_colours)  # the edges are drawn
    label = (slice(30, 48), slice(lefts[0], lefts[1]))  # the text above the first box: "#17 red_disc 0.90"
    tracked_width = (tracked[label].any(axis=2).sum(axis=0) > 0).sum()
    plain_width = (plain[label].any(axis=2).sum(axis=0) > 0).sum()
    assert tracked_width > plain_width


def test_without_captions_only_the_boxes_are_drawn():
    from tiled_detector.tools.annotate import annotate
    from tiled_detector.types import Detections

    image = np.zeros((120, 200, 3), np.uint8)
    found = Detections(np.array([[40, 50, 90, 100]], np.float32), np.array([0.9]), np.array([0]))
    captioned = annotate(image, found, ["red_disc"])
    bare = annotate(image, found, ["red_disc"], captions=False)
    above = (slice(30, 48), slice(40, 200))  # where the label "red_disc 0.90" goes
    assert captioned[above].any() and not bare[above].any()
    assert (bare[50:101, 40:91] == captioned[50:101, 40:91]).all()  # the box itself is the same


def test_rotated_boxes_are_drawn_as_their_rectangles():
    """A box at 45 degrees: its edges are drawn (the middle of a side), its hull's corners are not."""
    from tiled_detector.geometry.polygons import corners, hulls
    from tiled_detector.tools.annotate import annotate
    from tiled_detector.types import Detections

    obb = np.array([[100.0, 100.0, 80.0, 80.0, np.pi / 4]], np.float32)
    found = Detections(hulls(corners(obb)), [0.9], [0], obb=obb)
    drawn = annotate(np.zeros((200, 200, 3), np.uint8), found)
    side = corners(obb[0]).astype(float)[:2].mean(0)  # the middle of the first side
    assert drawn[round(float(side[1])), round(float(side[0]))].any()
    x1, y1, _, _ = np.rint(found.boxes[0]).astype(int)
    assert not drawn[y1 + 2, x1 + 2].any()  # inside the hull's corner, outside the rectangle
