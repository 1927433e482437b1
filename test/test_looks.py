"""What a frame's views looked at (`tracking.looks`): boxes held by the tiles run, resolved by the full-frame view,
cut by a tile's edge, and the seam rule across the parts of a frame."""

from __future__ import annotations

import numpy as np

from tiled_detector.tracking.looks import FULL_VIEW_MIN_PX, Looks, across_parts

# two tiles side by side that overlap by 128 px; the left one's right edge and the right one's left edge are seams
TILES = np.array([[0.0, 0.0, 640.0, 640.0], [512.0, 0.0, 1152.0, 640.0]])
INNER = np.array([[False, False, True, True], [True, False, True, True]])


def test_the_tiles_run_hold_a_box_in_their_union_less_the_seam_margin() -> None:
    both, left = Looks(TILES, INNER, 4.0), Looks(TILES[:1], INNER[:1], 4.0)
    across = [560.0, 100.0, 700.0, 300.0]  # over the seam between the two tiles: no single tile holds it
    at_seam = [600.0, 100.0, 638.0, 300.0]  # in the left tile, within the margin of its right seam
    outside = [-20.0, 100.0, 40.0, 300.0]  # reaching out of the frame on its left edge: no margin there
    boxes = np.array([across, at_seam, outside])
    assert both.held(boxes).tolist() == [True, True, True]
    assert left.held(boxes).tolist() == [False, False, True]


def test_the_full_frame_view_resolves_large_boxes_but_not_a_tiles_cut_piece() -> None:
    scale = 416 / 1920  # a 1080p frame in a 416 input
    looks = Looks(TILES[:1], INNER[:1], 4.0, full_view_scale=scale)
    side = FULL_VIEW_MIN_PX / scale
    person = [700.0, 100.0, 700.0 + side * 0.6, 100.0 + side * 1.8]  # out of the tile run, large enough
    small = [700.0, 100.0, 730.0, 160.0]
    piece = [560.0, 100.0, 639.0, 100.0 + side * 2.5]  # inside the tile run, ending at its seam: cut
    boxes = np.array([person, small, piece])
    assert looks.resolved(boxes).tolist() == [True, False, True]
    assert looks.cut(boxes).tolist() == [False, False, True]
    assert looks.seen(boxes).tolist() == [True, False, False]
    assert not Looks(TILES[:1], INNER[:1], 4.0).seen(boxes[:1]).any()  # no full-frame view


def test_a_box_its_part_did_not_see_whole_yields_to_one_another_part_saw_whole() -> None:
    boxes = np.array(
        [[600.0, 100.0, 639.0, 140.0], [600.0, 100.0, 660.0, 140.0], [600.0, 100.0, 639.0, 140.0]]
    )
    scores = np.array([0.9, 0.6, 0.9])
    whole = np.array([False, True, False])
    keep = across_parts(boxes, scores, np.array([0, 0, 1]), whole, np.array([0, 1, 1]))
    # the first (part 0) yields; the third is of another class; the whole one stays
    assert keep.tolist() == [False, True, True]
    weak = across_parts(boxes, np.array([0.9, 0.3, 0.9]), np.zeros(3, int), whole, np.array([0, 1, 1]))
    assert weak.tolist() == [True, True, True]  # the whole box scores under half the cut one's: no rule
    same_part = across_parts(boxes[:2], scores[:2], np.zeros(2, int), whole[:2], np.array([0, 0]))
    assert same_part.tolist() == [True, True]  # within a part the frame program's seam rule has run
