"""Tests for policy.py: the region of interest, ignore masks and box size limits against numpy references, tiles
planned over the region and off the masks, mask files, and the policy end to end through `TiledDetector`."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.config import DetectorConfig
from tiled_detector.detector import TiledDetector
from tiled_detector.pipeline.policy import (
    IgnoreMask,
    IgnoreMasks,
    ignored_mostly,
    policy_keep,
    read_mask,
    scaled,
)
from tiled_detector.pipeline.tiling import (
    FULL_FRAME_ROI,
    batch_plan,
    make_plan,
    plan_region,
    plan_tiles,
    region_pixels,
)
from tiled_detector.tools.worlds.synthetic import make_scene

# --- numpy references -------------------------------------------------------------------------------------------


def reference_scaled(mask: np.ndarray, frame_hw: tuple[int, int]) -> np.ndarray:
    """Frame pixel (y, x) takes mask pixel (y * Hm // H, x * Wm // W), one pixel at a time."""
    h, w = frame_hw
    out = np.zeros(frame_hw, bool)
    for y in range(h):
        for x in range(w):
            out[y, x] = mask[y * mask.shape[0] // h, x * mask.shape[1] // w]
    return out


def reference_pixels(lo: float, hi: float, size: int) -> np.ndarray:
    """Pixel indices whose centre lies in [lo, hi); none: the pixel under the middle."""
    centres = np.arange(size) + 0.5
    inside = np.flatnonzero((centres >= lo) & (centres < hi))
    return inside if len(inside) else np.array([min(max(int(np.floor((lo + hi) / 2)), 0), size - 1)])


def reference_ignored_mostly(boxes: np.ndarray, ignored: np.ndarray) -> np.ndarray:
    h, w = ignored.shape
    out = []
    for x1, y1, x2, y2 in boxes:
        cols, rows = reference_pixels(x1, x2, w), reference_pixels(y1, y2, h)
        patch = ignored[np.ix_(rows, cols)]
        out.append(patch.sum() * 2 > patch.size)
    return np.array(out, bool)


def reference_keep(boxes, frames, rois, sizes, min_size, max_size, masks) -> np.ndarray:
    """The policy one box at a time: centre in the frame's roi (pixels), size limits, its frame's mask."""
    keep = []
    for box, k in zip(boxes, frames, strict=True):
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        w, h = sizes[k]
        x0, y0, x1, y1 = np.float32(rois[k]) * np.float32([w, h, w, h])
        ok = x0 <= cx <= x1 and y0 <= cy <= y1
        side = min(box[2] - box[0], box[3] - box[1])
        ok &= (min_size == 0 or side >= min_size) and (max_size == 0 or side <= max_size)
        if masks[k] is not None:
            ok &= not reference_ignored_mostly(box[None], masks[k])[0]
        keep.append(ok)
    return np.array(keep, bool)


# --- strategies -------------------------------------------------------------------------------------------------


@st.composite
def frames_with_boxes(draw, max_side: int = 48):
    h, w = draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(0, 30))
    corners = rng.uniform(0, 1, (n, 4)) * [w, h, w, h]
    # quantised coordinates put box edges on pixel centres and borders often; thin boxes too
    corners = np.round(corners * 4) / 4
    boxes = np.concatenate(
        [np.minimum(corners[:, :2], corners[:, 2:]), np.maximum(corners[:, :2], corners[:, 2:])], axis=1
    ).astype(np.float32)
    mask = rng.uniform(size=(draw(st.integers(1, 20)), draw(st.integers(1, 20)))) < draw(st.floats(0, 1))
    return (h, w), boxes, mask


fractions = st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)).filter(
    lambda r: r[0] < r[2] and r[1] < r[3]
)


# --- the rules against the references ---------------------------------------------------------------------------


def test_mask_scaling_is_nearest_neighbour_as_opencv_does_it():
    rng = np.random.default_rng(0)
    for mask_hw, frame_hw in (((9, 16), (720, 1280)), ((360, 640), (1080, 1920)), ((100, 100), (37, 53))):
        mask = rng.uniform(size=mask_hw) < 0.5
        opencv = cv2.resize(mask.astype(np.uint8), frame_hw[::-1], interpolation=cv2.INTER_NEAREST) > 0
        np.testing.assert_array_equal(scaled(mask, frame_hw), opencv)


@settings(max_examples=150, deadline=None)
@given(case=frames_with_boxes())
def test_ignored_mostly_equals_the_pixel_reference(case):
    frame_hw, boxes, mask = case
    ignored = IgnoreMask.of("m.png", mask, frame_hw)
    np.testing.assert_array_equal(ignored.ignored, reference_scaled(mask, frame_hw))
    got = ignored_mostly(torch.from_numpy(boxes), ignored.device_integral(torch.device("cpu")))
    np.testing.assert_array_equal(got.numpy(), reference_ignored_mostly(boxes, ignored.ignored))


@settings(max_examples=100, deadline=None)
@given(case=frames_with_boxes(), rects=st.lists(st.tuples(*[st.integers(-8, 56)] * 4), max_size=10))
def test_covers_equals_every_pixel_ignored(case, rects):
    frame_hw, _, mask = case
    ignored = IgnoreMask.of("m.png", mask, frame_hw)
    rects = np.array(
        [(min(a, c), min(b, d), max(a, c), max(b, d)) for a, b, c, d in rects], np.int64
    ).reshape(-1, 4)
    want = [
        ignored.ignored[max(y1, 0) : max(y2, 0), max(x1, 0) : max(x2, 0)].all() for x1, y1, x2, y2 in rects
    ]
    np.testing.assert_array_equal(ignored.covers(rects), np.array(want, bool))


@settings(max_examples=100, deadline=None)
@given(
    first=frames_with_boxes(),
    second=frames_with_boxes(),
    rois=st.tuples(fractions, fractions),
    masked=st.tuples(st.booleans(), st.booleans()),
    min_size=st.sampled_from([0.0, 2.0, 5.5]),
    max_size=st.sampled_from([0.0, 6.0, 20.0]),
)
def test_policy_keep_equals_the_reference_on_two_frames(first, second, rois, masked, min_size, max_size):
    cases = (first, second)
    masks = [IgnoreMask.of("m.png", c[2], c[0]) if on else None for c, on in zip(cases, masked, strict=True)]
    plans = [
        make_plan(c[0], (16, 16), 0.2, (32, 32), True, roi, m)
        for c, roi, m in zip(cases, rois, masks, strict=True)
    ]
    boxes = np.concatenate([c[1] for c in cases])
    frames = np.repeat([0, 1], [len(c[1]) for c in cases])
    keep = policy_keep(
        torch.from_numpy(boxes), torch.from_numpy(frames), batch_plan(plans), min_size, max_size
    )
    want = reference_keep(
        boxes,
        frames,
        rois,
        [c[0][::-1] for c in cases],
        min_size,
        max_size,
        [None if m is None else m.ignored for m in masks],
    )
    if keep is None:  # no rule set: everything passes
        assert rois == (FULL_FRAME_ROI, FULL_FRAME_ROI) and not any(masked) and min_size == max_size == 0
        assert want.all()
    else:
        np.testing.assert_array_equal(keep.numpy(), want)


# --- tiles over the region, off the masks ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    h=st.integers(1, 400),
    w=st.integers(1, 400),
    th=st.integers(8, 160),
    tw=st.integers(8, 160),
    overlap=st.floats(0.0, 0.9),
    roi=fractions,
)
def test_tiles_cover_the_region_and_stay_in_the_frame(h, w, th, tw, overlap, roi):
    region = region_pixels(roi, (h, w))
    x1, y1, x2, y2 = region
    assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
    assert x1 <= roi[0] * w and y1 <= roi[1] * h and x2 >= roi[2] * w and y2 >= roi[3] * h
    tiles = plan_region((h, w), (th, tw), overlap, region)
    np.testing.assert_array_equal(tiles[:, 2:] - tiles[:, :2], np.tile([[tw, th]], (len(tiles), 1)))
    assert (tiles[:, :2] >= 0).all()
    if w >= tw:
        assert (tiles[:, 2] <= w).all()
    if h >= th:
        assert (tiles[:, 3] <= h).all()
    covered = np.zeros((h, w), bool)
    for a, b, c, d in tiles:
        covered[b:d, a:c] = True
    assert covered[y1:y2, x1:x2].all()
    if roi == FULL_FRAME_ROI:
        np.testing.assert_array_equal(tiles, plan_tiles(h, w, th, tw, overlap))


def test_a_lower_half_roi_at_4k_runs_about_half_the_views():
    full = make_plan((2160, 3840), (640, 640), 0.2, (640, 640), True)
    half = make_plan((2160, 3840), (640, 640), 0.2, (640, 640), True, (0.0, 0.5, 1.0, 1.0))
    assert (full.batch_size, half.batch_size) == (33, 17)
    assert (half.tiles[:, 1] >= 1080 - 640).all() and (half.tiles[:, 3] == 2160).any()


def test_tiles_wholly_on_ignored_pixels_are_not_planned():
    mask = np.zeros((1080, 1920), bool)
    mask[:, :800] = True  # the left 800 columns: the first column of tiles (x < 640) lies wholly on them
    ignored = IgnoreMask.of("left.png", mask, (1080, 1920))
    plan = make_plan((1080, 1920), (640, 640), 0.2, (640, 640), False, FULL_FRAME_ROI, ignored)
    every = plan_tiles(1080, 1920, 640, 640, 0.2)
    np.testing.assert_array_equal(plan.tiles, every[every[:, 2] > 800])
    everything = IgnoreMask.of("all.png", np.ones((2, 2), bool), (1080, 1920))
    assert (
        make_plan((1080, 1920), (640, 640), 0.2, (640, 640), False, FULL_FRAME_ROI, everything).batch_size
        == 0
    )


# --- mask files ---------------------------------------------------------------------------------------------------


def test_mask_files_any_channels_non_zero_is_ignored(tmp_path: Path):
    grey = np.zeros((4, 6), np.uint8)
    grey[1, 2] = 1
    cv2.imwrite(str(tmp_path / "grey.png"), grey)
    colour = np.zeros((4, 6, 3), np.uint8)
    colour[3, 5] = (0, 0, 255)
    cv2.imwrite(str(tmp_path / "colour.png"), colour)
    deep = np.zeros((4, 6), np.uint16)
    deep[0, 0] = 65535
    cv2.imwrite(str(tmp_path / "deep.png"), deep)
    assert np.argwhere(read_mask(tmp_path / "grey.png")).tolist() == [[1, 2]]
    assert np.argwhere(read_mask(tmp_path / "colour.png")).tolist() == [[3, 5]]
    assert np.argwhere(read_mask(tmp_path / "deep.png")).tolist() == [[0, 0]]


def test_a_mask_file_changed_on_disk_is_read_again(tmp_path: Path):
    path = tmp_path / "m.png"
    cv2.imwrite(str(path), np.zeros((2, 2), np.uint8))
    masks = IgnoreMasks()
    first = masks.get(path, (4, 4))
    assert masks.get(path, (4, 4)) is first and not first.ignored.any()
    cv2.imwrite(str(path), np.full((2, 3), 255, np.uint8))  # another size: a new stamp whatever the clock
    assert masks.get(path, (4, 4)).ignored.all()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "ignore_mask: cannot read .*missing.png: No such file"),
        (b"not a png", "ignore_mask: .*bad.png is not an image OpenCV can read"),
        (b"", "ignore_mask: .*empty.png is not an image"),
    ],
)
def test_bad_mask_files_are_refused_naming_the_setting_and_file(tmp_path: Path, content, message):
    name = {None: "missing.png", b"not a png": "bad.png", b"": "empty.png"}[content]
    if content is not None:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=message):
        DetectorConfig(ignore_mask=[str(tmp_path / name)])


# --- the settings ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"class_thresholds": ["person:0.3"]}, "class_thresholds: unknown class 'person' \\(known: red_disc"),
        ({"class_thresholds": ["7:0.3"]}, "class_thresholds: unknown class id 7 \\(the model has 4 classes"),
        (
            {"class_thresholds": ["red_disc:1.5"]},
            "class_thresholds of red_disc must be in \\[0.0, 1.0\\], got 1.5",
        ),
        ({"class_thresholds": ["red_disc"]}, "class_thresholds entries are 'class:value'"),
        ({"roi": [0.5, 0, 0.5, 1]}, "roi must be \\[x_min, y_min, x_max, y_max\\].*got \\[0.5, 0, 0.5, 1\\]"),
        ({"roi": [0, 0, 1.2, 1]}, "roi must be .* in \\[0, 1\\]"),
        ({"roi": [0, 0, 1]}, "roi must be"),
        ({"min_box_size": -1.0}, "min_box_size must be in \\[0.0, 100000.0\\], got -1.0"),
        ({"max_box_size": -2.0}, "max_box_size must be in"),
        (
            {"min_box_size": 50.0, "max_box_size": 20.0},
            "min_box_size \\(50\\) must not exceed max_box_size \\(20\\)",
        ),
        (
            {"ignore_mask": ["/front/image_raw=/a.png", "/front/image_raw=/b.png"]},
            "two files for camera /front",
        ),
    ],
)
def test_bad_policy_values_are_refused_with_the_setting_and_value(changes, message):
    detector = TiledDetector()
    with pytest.raises(ValueError, match=message):
        detector.update(**changes)
    assert detector.config.class_thresholds == () and detector.config.roi == FULL_FRAME_ROI


def test_mask_entries_per_camera(tmp_path: Path):
    for name in ("all.png", "front.png"):
        cv2.imwrite(str(tmp_path / name), np.zeros((2, 2), np.uint8))
    config = DetectorConfig(
        ignore_mask=[str(tmp_path / "all.png"), f"/front/image_raw={tmp_path / 'front.png'}"]
    )
    assert config.ignore_mask == (("", tmp_path / "all.png"), ("/front/image_raw", tmp_path / "front.png"))
    detector = TiledDetector.from_config(config)
    assert detector.plan_for(100, 200, "/front/image_raw").ignored.path == str(tmp_path / "front.png")
    assert detector.plan_for(100, 200, "/rear/image_raw").ignored.path == str(tmp_path / "all.png")
    assert detector.plan_for(100, 200).ignored.path == str(tmp_path / "all.png")
    single = DetectorConfig(ignore_mask=str(tmp_path / "all.png"))  # one path, as a launch argument gives it
    assert single.ignore_mask == (("", tmp_path / "all.png"),)


# --- end to end -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scene():
    return make_scene(5, 1280, 720)


@pytest.fixture(scope="module")
def detector():
    return TiledDetector(conf_threshold=0.05, max_detections=1000, top_k=1000)


def _rows(d):
    return np.concatenate([d.boxes, d.scores[:, None], d.class_ids[:, None]], axis=1)


def test_class_thresholds_end_to_end_equal_filtering_the_unfiltered_result(detector, scene):
    # class-aware NMS, no seam rule, no cut binding: a class below its threshold affects no other box
    base = detector.with_config(seam_suppression=False)
    thresholds = {0: 0.6, 2: 0.3}
    got = base.with_config(class_thresholds=["red_disc:0.6", "yellow_triangle:0.3"]).detect(scene.image)
    everything = base.detect(scene.image)
    limit = np.array([thresholds.get(c, 0.05) for c in range(4)])
    kept = everything.scores > limit[everything.class_ids]
    assert 0 < len(got.boxes) < len(everything.boxes)
    np.testing.assert_array_equal(_rows(got), _rows(everything)[kept])


def test_size_limits_and_masks_end_to_end_equal_the_reference_filter(detector, scene, tmp_path: Path):
    everything = detector.detect(scene.image)
    sizes = np.minimum(
        everything.boxes[:, 2] - everything.boxes[:, 0], everything.boxes[:, 3] - everything.boxes[:, 1]
    )
    got = detector.with_config(min_box_size=20.0, max_box_size=40.0).detect(scene.image)
    np.testing.assert_array_equal(_rows(got), _rows(everything)[(sizes >= 20) & (sizes <= 40)])
    # a mask of scattered blocks: no tile lies wholly on it, so the same views run and only the rule differs
    mask = np.kron(np.random.default_rng(1).uniform(size=(18, 32)) < 0.5, np.ones((4, 4), np.uint8)).astype(
        np.uint8
    )
    cv2.imwrite(str(tmp_path / "blocks.png"), mask * 255)
    masked = detector.with_config(ignore_mask=[str(tmp_path / "blocks.png")])
    assert masked.plan_for(720, 1280).batch_size == detector.plan_for(720, 1280).batch_size
    got = masked.detect(scene.image)
    dropped = reference_ignored_mostly(everything.boxes, scaled(mask > 0, (720, 1280)))
    assert 0 < dropped.sum() < len(dropped)
    np.testing.assert_array_equal(_rows(got), _rows(everything)[~dropped])


def test_roi_end_to_end_plans_fewer_views_and_keeps_centres_inside(detector, scene):
    lower = detector.with_config(roi=(0.0, 0.5, 1.0, 1.0))
    assert lower.plan_for(720, 1280).num_tiles < detector.plan_for(720, 1280).num_tiles
    got = lower.detect(scene.image)
    centres = (got.boxes[:, 1] + got.boxes[:, 3]) / 2
    assert len(got.boxes) and (centres >= 360).all()
    everything = detector.detect(scene.image)
    lower_half = (everything.boxes[:, 1] + everything.boxes[:, 3]) / 2 >= 360
    assert abs(len(got.boxes) - lower_half.sum()) <= max(2, lower_half.sum() // 5)  # the same objects, mostly


def test_a_frame_with_every_view_ignored_gives_no_detections(tmp_path: Path, scene):
    cv2.imwrite(str(tmp_path / "all.png"), np.full((2, 2), 255, np.uint8))
    detector = TiledDetector(full_frame=False, ignore_mask=[str(tmp_path / "all.png")])
    found = detector.detect(scene.image)
    assert found.boxes.shape == (0, 4) and found.scores.shape == (0,) and found.class_ids.shape == (0,)


def test_detect_json_applies_the_same_policy(tmp_path: Path, capsys):
    import json

    from tiled_detector.cli import main

    scene = make_scene(6, 1280, 720)
    cv2.imwrite(str(tmp_path / "scene.png"), cv2.cvtColor(scene.image, cv2.COLOR_RGB2BGR))
    mask = np.zeros((720, 1280), np.uint8)
    mask[:, 1000:] = 255
    cv2.imwrite(str(tmp_path / "mask.png"), mask)
    policy = {
        "class_thresholds": ["red_disc:0.6"],
        "roi": [0.0, 0.25, 1.0, 1.0],
        "ignore_mask": [str(tmp_path / "mask.png")],
        "min_box_size": 12.0,
        "max_box_size": 80.0,
    }
    argv = [
        "detect",
        str(tmp_path / "scene.png"),
        "--json",
        "--class-thresholds",
        "red_disc:0.6",
        "--roi",
        "0",
        "0.25",
        "1",
        "1",
        "--ignore-mask",
        str(tmp_path / "mask.png"),
        "--min-box-size",
        "12",
        "--max-box-size",
        "80",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    found = report["images"][0]["detections"]
    want = TiledDetector(**policy).detect(scene.image)
    assert len(found) == len(want.boxes) > 0
    np.testing.assert_allclose([d["box"] for d in found], want.boxes, atol=0.01)
    assert [d["class_id"] for d in found] == want.class_ids.tolist()


@pytest.mark.gpu
def test_every_policy_setting_on_cuda_is_one_captured_graph_equal_to_the_cpu(tmp_path: Path):
    from tiled_detector.runtime.devices import cuda_graph

    mask = np.zeros((72, 128), np.uint8)
    mask[:, 96:] = 255
    cv2.imwrite(str(tmp_path / "right.png"), mask)
    policy = dict(
        class_thresholds=["red_disc:0.5"],
        roi=(0.0, 0.25, 1.0, 1.0),
        ignore_mask=[str(tmp_path / "right.png")],
        min_box_size=10.0,
        max_box_size=90.0,
        backend="torch",
        conf_threshold=0.1,
    )
    cpu = TiledDetector(**policy)
    captures: list[int] = []
    gpu = TiledDetector.from_config(
        DetectorConfig(device="cuda", **policy), capture=lambda f: (captures.append(1), cuda_graph(f))[1]
    )
    frames = [make_scene(seed, 1280, 720).image for seed in (11, 12, 13, 14)]
    for rounds in range(2):
        for frame in frames:
            want, got = cpu.detect(frame), gpu.detect(frame)
            assert len(got.boxes) == len(want.boxes) > 0
            g, w = (
                np.lexsort((np.round(d.boxes[:, 1]), np.round(d.boxes[:, 0]), d.class_ids))
                for d in (got, want)
            )
            np.testing.assert_allclose(got.boxes[g], want.boxes[w], atol=0.05)
            np.testing.assert_array_equal(got.class_ids[g], want.class_ids[w])
        if rounds == 0:  # one graph per key: a new one only where the fixed sizes grew (`Limits`) on a frame
            first = len(captures)
            assert 1 <= first <= 3
    assert len(captures) == first  # the same frames again: every one a replay
