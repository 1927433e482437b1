"""Tests for tiling.py: tile placement (against SAHI), letterbox parameters and the mapping back to the frame."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.pipeline.tiling import Letterbox, make_plan, plan_tiles

sahi_slicing = pytest.importorskip("sahi.slicing")

sizes = st.integers(1, 700)
tile_sizes = st.integers(1, 160)
overlaps = st.floats(0.0, 0.95, allow_nan=False)


@pytest.mark.parametrize(
    ("frame_hw", "tile_hw", "overlap", "expected"),
    [
        ((100, 100), (100, 100), 0.2, [[0, 0, 100, 100]]),
        ((100, 180), (100, 100), 0.2, [[0, 0, 100, 100], [80, 0, 180, 100]]),
        ((100, 190), (100, 100), 0.2, [[0, 0, 100, 100], [80, 0, 180, 100], [90, 0, 190, 100]]),
        ((150, 100), (100, 100), 0.0, [[0, 0, 100, 100], [0, 50, 100, 150]]),
        (
            (50, 300),
            (100, 100),
            0.5,
            [[0, 0, 100, 100], [50, 0, 150, 100], [100, 0, 200, 100], [150, 0, 250, 100], [200, 0, 300, 100]],
        ),
        ((40, 30), (64, 64), 0.2, [[0, 0, 64, 64]]),
    ],
)
def test_plan_tiles_exact_tables(frame_hw, tile_hw, overlap, expected):
    tiles = plan_tiles(*frame_hw, *tile_hw, overlap)
    assert tiles.dtype == np.int64
    np.testing.assert_array_equal(tiles, np.array(expected))


@pytest.mark.parametrize(("frame_hw", "count"), [((1080, 1920), 8), ((2160, 3840), 32)])
def test_plan_tiles_peer_counts(frame_hw, count):
    assert len(plan_tiles(*frame_hw, 640, 640, 0.2)) == count


@settings(max_examples=120, deadline=None)
@given(h=sizes, w=sizes, th=tile_sizes, tw=tile_sizes, overlap=overlaps)
def test_plan_tiles_equals_sahi_and_covers_frame(h, w, th, tw, overlap):
    tiles = plan_tiles(h, w, th, tw, overlap)
    # full-size tiles starting inside the frame
    np.testing.assert_array_equal(tiles[:, 2] - tiles[:, 0], tw)
    np.testing.assert_array_equal(tiles[:, 3] - tiles[:, 1], th)
    assert (tiles[:, :2] >= 0).all()
    if h >= th and w >= tw:
        expected = sahi_slicing.get_slice_bboxes(
            h, w, th, tw, overlap_height_ratio=overlap, overlap_width_ratio=overlap
        )
        np.testing.assert_array_equal(tiles, np.array(expected))
        assert (tiles[:, 2] <= w).all() and (tiles[:, 3] <= h).all()
    else:
        # a dimension smaller than the tile: one tile from 0 along it, extending past the border
        if w < tw:
            assert (tiles[:, 0] == 0).all()
        if h < th:
            assert (tiles[:, 1] == 0).all()
    # every pixel covered
    covered = np.zeros((h, w), bool)
    for x1, y1, x2, y2 in tiles:
        covered[y1:y2, x1:x2] = True
    assert covered.all()
    # neighbours overlap by at least the requested amount
    for starts, tile, size in ((np.unique(tiles[:, 0]), tw, w), (np.unique(tiles[:, 1]), th, h)):
        if size >= tile and len(starts) > 1:
            assert (tile - np.diff(starts) >= int(overlap * tile)).all()
            assert (np.diff(starts) > 0).all()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 10, 5, 5, 0.2), "height"),
        ((10, 10, 5, -1, 0.2), "tile_width"),
        ((10, 10, 5, 5, 1.0), "overlap"),
        ((10, 10, 5, 5, -0.1), "overlap"),
        ((10.5, 10, 5, 5, 0.1), "height"),
    ],
)
def test_plan_tiles_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        plan_tiles(*args)


def test_letterbox_fit():
    lb = Letterbox.fit((1080, 1920), (640, 640))
    assert lb.scale == pytest.approx(1 / 3)
    assert lb.resized_hw == (360, 640)
    assert (lb.pad_x, lb.pad_y) == (0, 140)
    same = Letterbox.fit((640, 640), (640, 640))
    assert (same.scale, same.pad_x, same.pad_y, same.resized_hw) == (1.0, 0, 0, (640, 640))
    thin = Letterbox.fit((1, 30000), (640, 640))  # never a zero-sized resize
    assert thin.resized_hw == (1, 640) and thin.pad_y == 319


def test_make_plan_fields_and_cache():
    plan = make_plan((1080, 1920), (640, 640), 0.2, (640, 640), True)
    assert plan is make_plan([1080, 1920], (640, 640), 0.2, (640, 640), True)  # cached per normalised tuple
    assert plan.num_tiles == 8 and plan.batch_size == 9
    np.testing.assert_array_equal(plan.views[-1], [0, 0, 1920, 1080])
    assert (plan.scale, plan.pad_x, plan.pad_y) == (pytest.approx(1 / 3), 0, 140)
    np.testing.assert_allclose(plan.scales, [1.0] * 8 + [3.0])
    np.testing.assert_allclose(plan.offsets[:8], plan.tiles[:, :2])
    np.testing.assert_allclose(plan.offsets[8], [0.0, -420.0])
    assert plan.scales.dtype == np.float32 and plan.offsets.dtype == np.float32
    # first tile: right and bottom edges are seams; full frame has none
    np.testing.assert_array_equal(plan.inner_edges[0], [False, False, True, True])
    np.testing.assert_array_equal(plan.inner_edges[7], [True, True, False, False])
    assert not plan.inner_edges[8].any()
    with pytest.raises(ValueError):
        plan.tiles[0, 0] = 5  # read-only


def test_make_plan_without_full_frame_and_resized_tiles():
    plan = make_plan((480, 640), (320, 320), 0.25, (160, 160), False)
    assert plan.batch_size == plan.num_tiles == len(plan_tiles(480, 640, 320, 320, 0.25))
    np.testing.assert_allclose(plan.scales, 2.0)


def test_make_plan_rejects_bad_sizes():
    with pytest.raises(ValueError, match="input width"):
        make_plan((100, 100), (64, 64), 0.2, (64, 0), False)


def test_to_frame_maps_tiles_and_full_frame():
    plan = make_plan((1080, 1920), (640, 640), 0.2, (640, 640), True)
    boxes = torch.tensor(
        [
            [10.0, 20.0, 30.0, 40.0],
            [10.0, 20.0, 30.0, 40.0],
            [0.0, 140.0, 640.0, 500.0],
            [600.0, 600.0, 700.0, 700.0],
        ]
    )
    index = torch.tensor([0, 5, 8, 7])
    out = plan.to_frame(boxes, index)
    x1, y1 = plan.tiles[5, :2]
    expected = [
        [10, 20, 30, 40],
        [10 + x1, 20 + y1, 30 + x1, 40 + y1],
        [0, 0, 1920, 1080],
        [1280 + 600, 440 + 600, 1920, 1080],  # clipped to the frame
    ]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float32))
    assert out.dtype == torch.float32


def test_to_frame_round_trip_through_letterbox():
    plan = make_plan((700, 1000), (256, 256), 0.1, (128, 128), True)
    frame_box = np.array([240.0, 250.0, 400.0, 300.0], np.float32)
    # full frame: model = frame * the resize's scale (resized over frame size, per axis) + pad
    model_box = frame_box * np.tile(plan.frame_letterbox.scales, 2) + np.array([plan.pad_x, plan.pad_y] * 2)
    # a tile containing the box: model = (frame - origin) * tile_scale + tile_pad
    inside = (plan.tiles[:, :2] <= frame_box[:2]).all(1) & (plan.tiles[:, 2:] >= frame_box[2:]).all(1)
    tile = int(np.flatnonzero(inside)[0])
    lb = plan.tile_letterbox
    tile_box = (frame_box - np.tile(plan.tiles[tile, :2], 2)) * lb.scale + np.array([lb.pad_x, lb.pad_y] * 2)
    boxes = torch.tensor(np.stack([model_box, tile_box]), dtype=torch.float64)
    out = plan.to_frame(boxes, torch.tensor([plan.num_tiles, tile]))
    torch.testing.assert_close(out, torch.tensor(np.stack([frame_box, frame_box])), rtol=0, atol=1e-3)


@settings(max_examples=60, deadline=None)
@given(
    frame=st.tuples(st.integers(1, 5000), st.integers(1, 5000)),
    model=st.tuples(st.integers(16, 1280), st.integers(16, 1280)),
    point=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    anchor=st.sampled_from(["center", "top_left", "stretch"]),
)
def test_every_letterbox_maps_the_resized_pixels_back_exactly(frame, model, point, anchor):
    """A point of the frame, where the resize puts it in the model input (its own per-axis scale, a rounded size
    included), maps back to itself; stretched, the view fills the input with no padding."""
    box = Letterbox.fit(frame, model, anchor)
    sx, sy = box.scales
    assert box.resized_hw == (round(frame[0] * sy), round(frame[1] * sx))
    if anchor == "stretch":
        assert box.resized_hw == model and (box.pad_x, box.pad_y) == (0, 0)
    plan = make_plan(frame, frame, 0.2, model, True, letterbox=anchor)
    x, y = point[0] * frame[1], point[1] * frame[0]
    in_model = torch.tensor([[x * sx + box.pad_x, y * sy + box.pad_y] * 2])
    back = plan.to_frame(in_model, torch.tensor([plan.batch_size - 1]))[0].numpy()
    np.testing.assert_allclose(back, [x, y, x, y], rtol=1e-5, atol=1e-3 * max(1.0, 1 / min(sx, sy)))


def test_tensors_are_cached_per_device():
    plan = make_plan((300, 300), (128, 128), 0.2, (128, 128), True)
    first = plan.tensors("cpu")
    assert plan.tensors(torch.device("cpu")) is first
    assert first.to_frame.shape == (plan.batch_size, 3, 4) and first.inner_edges.dtype == torch.bool
