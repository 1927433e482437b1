"""Instance masks of a segmentation head through tiles (`pipeline/masks.py`): known answers with `SquareSegmenter`
(every square's mask is the square), the same masks on the exact and the fixed-size (captured) paths, a merge
group's mask the union of its members', the label image's order, and the bad inputs refused at start."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from support.exports import ultralytics_onnx
from support.networks import SquareSegmenter, save_onnx
from test_detector import _scene
from test_program import _replaying_capture
from tiled_detector import TiledDetector
from tiled_detector.pipeline import labels as label_images
from tiled_detector.pipeline import masks
from tiled_detector.pipeline.decode import PaddedDecoded, Prototypes
from tiled_detector.pipeline.depth import DepthImage
from tiled_detector.pipeline.tiling import batch_plan, make_plan
from tiled_detector.types import InstanceMasks

SEG_HW = (64, 64)


@pytest.fixture(scope="module")
def segmenter(tmp_path_factory: pytest.TempPathFactory):
    """SquareSegmenter as ultralytics exports a segmentation model: batch 1, names, `task: segment`."""
    path = tmp_path_factory.mktemp("seg") / "squares-seg.onnx"
    return ultralytics_onnx(path, SquareSegmenter(SEG_HW, 8), outputs=2, task="segment")


def _detector(model, **more) -> TiledDetector:
    options = dict(tile_size=SEG_HW, overlap=0.25, conf_threshold=0.5, backend="onnxruntime")
    return TiledDetector(model, **{**options, **more})


def _filled(boxes: np.ndarray, shape: tuple[int, int], scale: float = 1.0) -> list[np.ndarray]:
    """Each box (frame pixels, cell-aligned) as a filled mask of a label image of `shape`."""
    found = []
    for x1, y1, x2, y2 in boxes:
        mask = np.zeros(shape, bool)
        mask[
            int(np.ceil(y1 * scale)) : int(np.ceil(y2 * scale)),
            int(np.ceil(x1 * scale)) : int(np.ceil(x2 * scale)),
        ] = True
        found.append(mask)
    return found


def test_segmentation_export_is_read_with_its_masks(segmenter):
    detector = _detector(segmenter)
    assert detector.resolved.task == "segment" and detector.resolved.masks == 2
    assert detector.resolved.num_classes == 2 and detector.labels == ("red", "blue")
    assert "2 mask coefficients" in detector.resolved.head
    assert detector.detect(np.zeros((64, 64, 3), np.uint8)).masks is not None
    assert _detector(segmenter, masks=False).detect(np.zeros((64, 64, 3), np.uint8)).masks is None


@pytest.mark.parametrize("seed", [0, 1])
def test_every_square_has_its_square_as_mask_and_the_label_image_follows_the_array(segmenter, seed):
    frame, _, _ = _scene(seed, 152, 208, 6)
    found = _detector(segmenter).detect(frame)
    assert len(found) == 6 and found.masks is not None
    shown = found.masks
    assert shown.labels.shape == frame.shape[:2] and shown.labels.dtype == np.uint16
    for k, want in enumerate(_filled(found.boxes, frame.shape[:2])):
        np.testing.assert_array_equal(shown.mask(k), want)
        assert (shown.labels[want] == k + 1).all()  # the squares do not touch: each label is its own
    assert (shown.labels > 0).sum() == 6 * 64


def test_mask_scale_makes_the_label_image_smaller(segmenter):
    frame, _, _ = _scene(2, 152, 208, 6)
    found = _detector(segmenter, mask_scale=0.5).detect(frame)
    shown = found.masks
    assert shown.labels.shape == (76, 104) and shown.scale == 0.5
    for k, want in enumerate(_filled(found.boxes, (76, 104), 0.5)):
        np.testing.assert_array_equal(shown.mask(k), want)


@pytest.mark.parametrize("merge", ["nms", "greedy_nmm", "nmm"])
def test_fixed_size_and_captured_masks_equal_the_exact_ones(segmenter, merge):
    """The sync-free path (fixed mask pixels, grown from a too small start) and a captured program give the exact
    path's masks, label images and rows."""
    exact = _detector(segmenter, merge=merge)
    log: list[str] = []
    fast = TiledDetector.from_config(
        exact.config.replace(cuda_graph=True), engine=exact.engine, capture=_replaying_capture(log)
    )
    fast._sync_free = True
    fast._limits = fast._limits.__class__(mask_pixels=64)  # too few: the first frame grows them
    for seed in (3, 4, 5):
        frame, _, _ = _scene(seed, 152, 208, 6)
        a, b = exact.detect(frame), fast.detect(frame)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.masks.labels, b.masks.labels)
        np.testing.assert_array_equal(a.masks.boxes, b.masks.boxes)
        np.testing.assert_array_equal(a.masks.bits, b.masks.bits)
    assert fast._limits.mask_pixels >= 6 * 64 and "replay" in log


def test_overlapping_masks_go_to_the_higher_score_and_selection_composes_again():
    # two detections' masks overlap: the label image gives the overlap to the first (higher score); selecting the
    # second alone gives it back its whole mask
    frame_hw = (20, 20)
    plan = batch_plan([make_plan(frame_hw, frame_hw, 0.0, (16, 16), False)])
    prototypes = torch.zeros(1, 1, 4, 4)
    prototypes[0, 0] = 1.0  # everything on
    found = PaddedDecoded(
        torch.tensor([[0.0, 0, 10, 10], [4, 4, 16, 16]]),
        torch.tensor([0.9, 0.8]),
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
        torch.ones(2, dtype=torch.bool),
        torch.ones(2, 1),
        Prototypes(prototypes),
    )
    scale = 20 / 16
    packed = torch.tensor(
        [
            [0.0, 0, 10 * scale, 10 * scale, 0.9, 0, 1, 0],
            [5, 5, 20, 20, 0.8, 0, 1, 0],
            [0, 0, 0, 0, 0, 0, 0, 0],
        ]
    )
    built = masks.build(packed, torch.tensor([[0], [1]]), found, plan, 1.0, None)
    shown = InstanceMasks(frame_hw, built.boxes.numpy(), built.bits.numpy(), 1.0, frame_hw)
    labels = shown.labels
    assert (labels[:13, :13] == 1).all() and (labels[13:, 13:] == 2).all() and labels[5:13, 5:13].max() == 1
    second = shown.select(np.array([1]))
    assert (second.labels[5:20, 5:20] == 1).all() and second.labels.sum() == 15 * 15


def _reference_labels(shape, boxes, bits, rank) -> np.ndarray:
    """The label image pixel by pixel: each pixel the detection of the lowest rank whose mask covers it."""
    labels = np.zeros(shape, np.uint16)
    best = np.full(shape, np.iinfo(np.int64).max)
    start = 0
    for k, (x0, y0, x1, y1) in enumerate(boxes.tolist()):
        wide, high = max(x1 - x0, 0), max(y1 - y0, 0)
        for at in range(wide * high):
            y, x = y0 + at // wide, x0 + at % wide
            if bits[start + at] and rank[k] < best[y, x]:
                best[y, x], labels[y, x] = rank[k], k + 1
        start += wide * high
    return labels


@pytest.mark.parametrize("seed", range(4))
def test_the_host_label_image_equals_a_pixel_by_pixel_reference(seed):
    """`InstanceMasks.labels` (composed on the host from boxes and bits) against a straightforward reference, on
    random masks piled on each other (overlaps decided by rank, empty boxes, boxes at the borders), and again
    after a selection that reorders them (the ranks travel with the detections)."""
    rng = np.random.default_rng(seed)
    shape = (37, 53)
    count = 12
    x0, y0 = rng.integers(-3, shape[1], count).clip(0), rng.integers(-3, shape[0], count).clip(0)
    boxes = np.stack(
        [
            x0,
            y0,
            (x0 + rng.integers(0, 30, count)).clip(max=shape[1]),
            (y0 + rng.integers(0, 25, count)).clip(max=shape[0]),
        ],
        1,
    )
    boxes[3] = [5, 5, 5, 9]  # an empty box
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    bits = rng.random(int(areas.sum())) < 0.7
    shown = InstanceMasks(shape, boxes, bits, 1.0, shape)
    want = _reference_labels(shape, boxes, bits, np.arange(count))
    assert len(np.unique(want)) > 5 and (want > 0).sum() < (bits.sum())  # masks overlap: the rank decided
    np.testing.assert_array_equal(shown.labels, want)
    index = rng.permutation(count)
    index[:2] = -1  # two reported boxes without a mask
    chosen = shown.select(index)
    picked = boxes[np.maximum(index, 0)] * (index >= 0)[:, None]
    rank = np.where(index >= 0, index, count)
    np.testing.assert_array_equal(chosen.labels, _reference_labels(shape, picked, chosen.bits, rank))
    for k, old in enumerate(index):
        if old >= 0:
            np.testing.assert_array_equal(chosen.mask(k), shown.mask(old))


@pytest.mark.parametrize("seed", range(4))
def test_the_device_label_image_follows_the_same_rank_rule(seed):
    """`labels.compose` (the label images on the device: one scatter of (rank, row) keys per frame) equals the
    pixel-by-pixel reference and the host's `InstanceMasks.labels` on random piled masks with random ranks, two
    frames of different sizes in one call, and spare bits past the rows' (the fixed-size path's capacity)."""
    rng = np.random.default_rng(seed)
    shapes = [(37, 53), (20, 31)]
    images, parts = [], []
    for frame, shape in enumerate(shapes):
        count = 9
        x0, y0 = rng.integers(0, shape[1], count), rng.integers(0, shape[0], count)
        boxes = np.stack(
            [
                x0,
                y0,
                (x0 + rng.integers(0, 25, count)).clip(max=shape[1]),
                (y0 + rng.integers(0, 20, count)).clip(max=shape[0]),
            ],
            1,
        )
        areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        bits = rng.random(int(areas.sum())) < 0.7
        rank = rng.permutation(count)
        want = _reference_labels(shape, boxes, bits, rank)
        np.testing.assert_array_equal(InstanceMasks(shape, boxes, bits, 1.0, shape, rank).labels, want)
        images.append(want)
        parts.append((boxes, bits, rank, np.full(count, frame)))
    boxes, bits, rank, frame = (np.concatenate(p) for p in zip(*parts, strict=True))
    values = np.concatenate([np.arange(len(p[0])) + 1 for p in parts])
    spare = np.concatenate([bits, rng.random(40) < 0.5])  # bits past the rows' are never read
    got = label_images.compose(
        torch.from_numpy(boxes),
        torch.from_numpy(rank),
        torch.from_numpy(values),
        torch.from_numpy(spare),
        torch.from_numpy(frame),
        shapes,
    )
    split = shapes[0][0] * shapes[0][1]
    np.testing.assert_array_equal(got[:split].numpy().reshape(shapes[0]), images[0])
    np.testing.assert_array_equal(got[split:].numpy().reshape(shapes[1]), images[1])


def test_label_images_composed_on_the_device_equal_the_hosts(segmenter):
    """With `label_images` (the node: while `masks` has a subscriber) the fixed-size path composes each frame's
    label image on the device, in its own capture, downloaded with the masks: the host's image, pixel for pixel;
    turned off, the label image is composed on the host again."""
    exact = _detector(segmenter)
    log: list[str] = []
    fast = TiledDetector.from_config(
        exact.config.replace(cuda_graph=True), engine=exact.engine, capture=_replaying_capture(log)
    )
    fast._sync_free = True
    fast.label_images = True
    for seed in (3, 4):
        frame, _, _ = _scene(seed, 152, 208, 6)
        for _ in range(2):  # the capture, then its replay
            a, b = exact.detect(frame), fast.detect(frame)
            assert a.masks.image is None and b.masks.image is not None
            np.testing.assert_array_equal(b.masks.labels, a.masks.labels)
            assert b.masks.labels.dtype == np.uint16 and b.masks.labels.shape == a.masks.labels.shape
    captures = len(fast._runner._captured)
    fast.label_images = False
    frame, _, _ = _scene(3, 152, 208, 6)
    c = fast.detect(frame)
    assert c.masks.image is None and len(fast._runner._captured) == captures + 1
    np.testing.assert_array_equal(c.masks.labels, exact.detect(frame).masks.labels)


def test_the_masks_download_carries_8_bits_a_byte():
    """`pack`: the rows' boxes, the pixels needed and the bits packed 8 to a byte (no label image): about 1/8 of
    the bits' count in bytes; `unpack` gives them back."""
    rng = np.random.default_rng(5)
    boxes = torch.tensor([[0, 0, 30, 20], [10, 5, 40, 45], [0, 0, 0, 0]], dtype=torch.int32)
    count = 30 * 20 + 30 * 40
    for capacity in (count, count + 5):  # the exact path; the fixed size (padded to whole bytes)
        bits = torch.from_numpy(rng.random(capacity) < 0.5)
        data = masks.pack(masks.MaskRows(boxes, bits, torch.tensor(count)))
        assert data.dtype == torch.uint8 and len(data) == 3 * 16 + 8 + -(-capacity // 8)
        host = masks.unpack(data.numpy(), 3)
        np.testing.assert_array_equal(host.boxes, boxes.numpy())
        assert host.needed == count and len(host.bits) == -(-capacity // 8) * 8
        np.testing.assert_array_equal(host.bits[:capacity], bits.numpy())
        assert not host.bits[capacity:].any()


def test_a_merge_group_mask_is_the_union_of_its_members_each_from_its_own_view():
    frame_hw = (32, 48)
    plan = batch_plan([make_plan(frame_hw, (32, 32), 0.5, (32, 32), False)])  # tiles at x = 0 and x = 16
    assert plan.plans[0].num_tiles == 2
    prototypes = torch.full((2, 2, 8, 8), -1.0)  # logits -1 (off), +1 (on): the edges half way between cells
    prototypes[0, 0, :, 4:] = 1.0  # view 0: prototype 0 on in its right half (frame x 16..32)
    prototypes[1, 1, :, :4] = 1.0  # view 1: prototype 1 on in its left half (frame x 16..32)
    prototypes[1, 1, :2, :] = 1.0  # and in its top rows (frame y 0..8, x 16..48)
    boxes = torch.tensor([[8.0, 0, 32, 32], [0, 0, 32, 32]])  # model-input pixels of views 0 and 1
    found = PaddedDecoded(
        boxes,
        torch.tensor([0.9, 0.8]),
        torch.zeros(2, dtype=torch.int64),
        torch.tensor([0, 1]),
        torch.ones(2, dtype=torch.bool),
        torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        Prototypes(prototypes),
    )
    group = torch.tensor([[8.0, 0, 48, 32, 0.9, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0]])

    def mask(members: list[int]) -> np.ndarray:
        packed = group.clone()
        built = masks.build(packed, torch.tensor([members]), found, plan, 1.0, None)
        return InstanceMasks(frame_hw, built.boxes.numpy(), built.bits.numpy(), 1.0, frame_hw).labels > 0

    union, first, second = mask([0, 1]), mask([0, -1]), mask([1, -1])
    np.testing.assert_array_equal(union, first | second)
    assert first[:, 16:32].all() and not first[:, 32:].any() and not first[:, :16].any()
    assert (
        second[:8, 16:].all() and second[:, 16:32].all() and not second[9:, 33:].any()
    )  # (a bilinear corner)


def test_a_candidate_owns_only_the_pixels_of_its_view():
    """A tile's candidate whose box reaches past the tile's edge (YOLO boxes routinely do) has no mask pixel outside
    its tile: the tile never saw them (its prototypes, sampled there, would repeat their border column)."""
    frame_hw = (32, 64)
    plan = batch_plan([make_plan(frame_hw, (32, 32), 0.0, (32, 32), False)])  # tiles at x = 0 and x = 32
    prototypes = torch.ones(2, 1, 8, 8)  # every cell on: the crop alone bounds the mask
    found = PaddedDecoded(
        torch.tensor([[8.0, 4, 44, 28]]),  # view 0's box, past its right edge (x = 32) by 12 px
        torch.tensor([0.9]),
        torch.zeros(1, dtype=torch.int64),
        torch.tensor([0]),
        torch.ones(1, dtype=torch.bool),
        torch.ones(1, 1),
        Prototypes(prototypes),
    )
    packed = torch.tensor([[8.0, 4, 44, 28, 0.9, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
    built = masks.build(packed, torch.tensor([[0]]), found, plan, 1.0, None)
    mask = InstanceMasks(frame_hw, built.boxes.numpy(), built.bits.numpy(), 1.0, frame_hw).mask(0)
    assert mask[4:28, 8:32].all()  # its view's part of its box
    assert mask[:, 32:].sum() == 0  # outside its view: nothing (was 12 x 24 pixels)
    assert mask.sum() == 24 * 24


class _SpillingSegmenter(torch.nn.Module):
    """`SquareSegmenter` whose boxes are 3x its cells (centred on them): a square cut by a tile's edge gives a box
    reaching past that edge, as a trained model's boxes of a cut object often do."""

    def __init__(self) -> None:
        super().__init__()
        self.net = SquareSegmenter(SEG_HW, 8)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, prototypes = self.net(images)
        return torch.cat([rows[:, :2], rows[:, 2:4] * 3, rows[:, 4:]], 1), prototypes


def test_a_detection_cut_by_a_tile_edge_keeps_its_mask_inside_its_tile(tmp_path):
    """Default merge (nms), no full-frame view: a square cut by the edge between two tiles is found by each, boxes
    reaching past the edge; the kept detection's mask lies inside the one tile that produced it (0 pixels
    outside), however far its box reaches."""
    model = ultralytics_onnx(tmp_path / "spill-seg.onnx", _SpillingSegmenter(), outputs=2, task="segment")
    detector = _detector(model, overlap=0.0, full_frame=False, conf_threshold=0.25)
    frame = np.zeros((64, 128, 3), np.uint8)
    frame[24:32, 60:68] = (255, 0, 0)  # a red square across x = 64, the edge between the two tiles
    plan = detector.plan_for(64, 128)
    assert plan.tiles.tolist() == [[0, 0, 64, 64], [64, 0, 128, 64]]
    found = detector.detect(frame)
    assert (
        len(found) >= 1 and found.boxes[0, 0] < 60 and found.boxes[0, 2] > 68
    )  # the box reaches past the edge
    for k in range(len(found)):
        xs = np.nonzero(found.masks.mask(k))[1]
        assert len(xs), "each detection has mask pixels"
        inside = [(xs >= x0).all() and (xs < x1).all() for x0, _, x1, _ in plan.tiles.tolist()]
        assert any(inside), f"detection {k}'s mask spans x {xs.min()}..{xs.max()}, outside every single tile"


@pytest.mark.parametrize("merge", ["greedy_nmm", "nmm"])
def test_a_frame_in_parts_keeps_the_whole_frames_masks(tmp_path, merge):
    """A frame run one tile a part (`view_cap` 1) against the same frame run whole: the same detections, and each
    merged group's mask the union of its members' from both parts (was: one part's half), so the same masks and
    label image. The square across the seam is seen in part by each tile (5 and 3 of its 8 columns); the blue
    square lies in the second tile alone."""
    from tiled_detector.stream import Job, Stream

    model = ultralytics_onnx(tmp_path / "spill-seg.onnx", _SpillingSegmenter(), outputs=2, task="segment")
    detector = _detector(model, overlap=0.0, full_frame=False, conf_threshold=0.25, merge=merge)
    frame = np.zeros((64, 128, 3), np.uint8)
    frame[24:32, 59:67] = (255, 0, 0)  # across x = 64, the edge between the two tiles
    frame[40:48, 96:104] = (0, 0, 200)
    whole = detector.detect(frame)
    stream, job, steps = Stream(detector), Job("camera", frame, 0, sequence=1), []
    while not steps or steps[-1].result is None:
        steps.append(stream.run([job], view_cap=1)[0])
    parts = steps[-1].result.detections
    assert len(steps) == 2 and len(whole) == 2
    np.testing.assert_array_equal(parts.boxes, whole.boxes)
    np.testing.assert_array_equal(parts.scores, whole.scores)
    red = whole.masks.mask(int(np.flatnonzero(whole.class_ids == 0)[0]))
    assert red[24:32, 59:67].all() and red[:, :64].any() and red[:, 64:].any()  # one mask, from both tiles
    for k in range(len(whole)):
        np.testing.assert_array_equal(parts.masks.mask(k), whole.masks.mask(k))
    np.testing.assert_array_equal(parts.masks.labels, whole.masks.labels)


def _filled_masks(boxes: list[list[int]], shape: tuple[int, int]) -> InstanceMasks:
    """Masks that fill their boxes (label pixels = frame pixels)."""
    areas = [(x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in boxes]
    return InstanceMasks(shape, np.array(boxes), np.ones(sum(areas), bool), 1.0, shape)


def test_a_frame_in_parts_ranks_overlapping_masks_by_score_as_a_whole_frame(segmenter, monkeypatch):
    """Two parts' detections whose masks overlap (other classes: not merged), the lower score found first: the
    label image gives the overlap to the higher score, as the frame run whole (its rows by score) does (was: to
    the earlier part)."""
    from tiled_detector.stream import Job, Stream
    from tiled_detector.types import Detections

    shape = (64, 128)
    detector = _detector(segmenter, overlap=0.0, full_frame=False)
    low, high = [10, 10, 40, 40], [30, 20, 60, 50]  # overlapping on x 30..40, y 20..40
    found = iter(
        [
            Detections(
                np.array([low]), np.array([0.6]), np.array([0]), {}, masks=_filled_masks([low], shape)
            ),
            Detections(
                np.array([high]), np.array([0.9]), np.array([1]), {}, masks=_filled_masks([high], shape)
            ),
        ]
    )
    monkeypatch.setattr(detector, "detect_many", lambda *args, **kwargs: [next(found)])
    stream, job, result = (
        Stream(detector),
        Job("camera", np.zeros((*shape, 3), np.uint8), 0, sequence=1),
        None,
    )
    while result is None:
        result = stream.run([job], view_cap=1)[0].result
    parts = result.detections
    whole = Detections(  # the frame run whole: its rows by score
        np.array([high, low]), np.array([0.9, 0.6]), np.array([1, 0]), masks=_filled_masks([high, low], shape)
    )
    np.testing.assert_array_equal(parts.boxes, whole.boxes)
    assert (whole.masks.labels[20:40, 30:40] == 1).all()  # the higher score's
    np.testing.assert_array_equal(parts.masks.labels, whole.masks.labels)


def test_masks_true_on_a_model_without_masks_is_refused(square_onnx):
    with pytest.raises(ValueError, match=r"masks: true, but .* has no mask prototypes"):
        TiledDetector(square_onnx, masks=True)
    detector = TiledDetector(square_onnx)
    assert detector.detect(np.zeros((64, 64, 3), np.uint8)).masks is None
    with pytest.raises(ValueError, match="masks: true"):
        detector.update(masks=True)


@pytest.mark.parametrize("scale", [0.0, -0.5, 1.5])
def test_mask_scale_out_of_its_range_is_refused(segmenter, scale):
    with pytest.raises(ValueError, match=r"mask_scale must be in \(0, 1\]"):
        _detector(segmenter, mask_scale=scale)


class _Mismatched(torch.nn.Module):
    """A segmentation head whose rows carry 2 coefficients beside 3 prototypes."""

    def __init__(self) -> None:
        super().__init__()
        self.net = SquareSegmenter(SEG_HW, 8)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, prototypes = self.net(images)
        return rows, torch.cat([prototypes, prototypes[:, :1]], 1)


def test_prototype_count_unequal_to_the_coefficient_count_is_refused(tmp_path):
    model = ultralytics_onnx(tmp_path / "bad-seg.onnx", _Mismatched(), outputs=2, task="segment")
    with pytest.raises(ValueError, match=r"bad-seg\.onnx.*3 mask prototypes: the prototype count must equal"):
        _detector(model)
    # without names the rows cannot be split: the class count read is then not the names'
    plain = save_onnx(_Mismatched(), tmp_path / "plain.onnx", SEG_HW, outputs=2)
    assert _detector(plain).resolved.num_classes == 1  # 8 rows - 4 - 3 coefficients: what the shapes say


def test_a_wrong_class_count_of_a_segmentation_file_is_blamed_on_labels(segmenter):
    """The labels setting's 3 names against the 2 classes the file's rows carry beside its 2 mask coefficients: one
    line naming labels and both counts (was: blamed on the prototypes)."""
    with pytest.raises(ValueError) as error:
        _detector(segmenter, labels=("a", "b", "c"))
    text = str(error.value)
    assert (
        text.startswith("labels: ") and "carries 2 classes" in text and "gives 3" in text and "\n" not in text
    )


def test_a_layout_that_contradicts_a_segmentation_files_task_is_refused(segmenter):
    for layout in ("obb", "yolov5"):
        with pytest.raises(ValueError, match=f"layout {layout} contradicts .*own task segment"):
            _detector(segmenter, layout=layout)


def test_segment_task_without_prototypes_is_refused(tmp_path):
    model = ultralytics_onnx(tmp_path / "no-protos.onnx", task="segment")
    with pytest.raises(ValueError, match=r"no-protos\.onnx: its metadata says task segment, but it has no"):
        _detector(model)


def test_inspect_shows_the_task_and_its_masks(segmenter, capsys):
    import json

    from tiled_detector.cli import main

    assert main(["inspect", str(segmenter), "--json"]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert found["task"] == "segment" and found["masks"] == 2 and "2 mask coefficients" in found["head"]
    assert main(["inspect", str(segmenter)]) == 0
    assert "task       segment: instance masks (2 prototypes)" in capsys.readouterr().out


def test_tracked_detections_keep_their_masks_and_carried_ones_have_none(segmenter):
    """With the tracker each reported box seen in the frame has its detection's mask (the label image follows the
    array's order); under a tile budget a box carried from an earlier frame has no mask (none is made up)."""
    from tiled_detector.stream import Stream

    frame, _, _ = _scene(7, 152, 208, 6)
    tracked = Stream(_detector(segmenter, tracker="bytetrack"))
    for index in range(3):
        result = tracked.process([frame], [index * 33_000_000], ["cam"])[0]
        found = result.detections
        assert found.masks is not None and len(found.masks) == len(found) == 6
        for k, want in enumerate(_filled(found.boxes, frame.shape[:2])):
            np.testing.assert_array_equal(found.masks.mask(k), want)
            assert (found.masks.labels[want] == k + 1).all()
    budget = Stream(_detector(segmenter, tile_budget=1, max_tile_age=8, motion_compensation="none"))
    carried = 0
    for index in range(4):
        result = budget.process([frame], [index * 33_000_000], ["cam"])[0]
        found = result.detections
        old = result.seen_ns != result.stamp_ns
        assert found.masks is not None and len(found.masks) == len(found)
        assert (found.masks.areas[old] == 0).all() and (found.masks.areas[~old] > 0).all()
        assert set(np.unique(found.masks.labels)) <= {0, *(np.flatnonzero(~old) + 1).tolist()}
        carried += int(old.sum())
    assert carried > 0  # the budget carried some boxes over


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_masks_are_one_captured_graph_per_frame_and_equal_the_cpus(tmp_path, precision):
    """The torch backend on CUDA: the frame program with its masks is one captured graph (not split), replayed
    frame after frame with no new capture, and its masks, label images and rows equal the CPU's exact path."""
    from support.networks import save_torchscript

    model = save_torchscript(SquareSegmenter(SEG_HW, 8), tmp_path / "squares-seg.ts", SEG_HW, ("red", "blue"))
    options = dict(tile_size=SEG_HW, overlap=0.25, conf_threshold=0.5, backend="torch")
    cpu = TiledDetector(model, device="cpu", **options)
    gpu = TiledDetector(model, device="cuda", precision=precision, **options)
    frames = [_scene(seed, 1080, 1920, 40)[0] for seed in range(4)]
    for frame in frames[:2]:  # the limits settle (a grown limit is a new capture)
        gpu.detect(frame)
    captures = len(gpu._runner._captured)
    for frame in frames:
        a, b = cpu.detect(frame), gpu.detect(frame)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.masks.labels, b.masks.labels)
        np.testing.assert_array_equal(a.masks.bits, b.masks.bits)
    assert gpu._runner.captures and not gpu._runner.split
    assert len(gpu._runner._captured) == captures  # replayed, never captured again


def test_a_thin_objects_depth_comes_from_its_mask():
    """A thin diagonal object 5 m away before a wall 10 m away: its box's inner part is mostly wall (the box gives
    10 m); its mask's pixels give 5 m."""
    from tiled_detector.pipeline.depth import Intrinsics, RowMasks, locate

    depth = np.full((100, 100), 10.0, np.float32)
    mask = np.zeros((60, 60), bool)
    for k in range(60):
        mask[k, max(k - 1, 0) : k + 2] = True  # a 3 px wide diagonal
    depth[20:80, 20:80][mask] = 5.0
    rows = torch.tensor([[20.0, 20, 80, 80, 0.9, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
    camera = Intrinsics(100.0, 100.0, 49.5, 49.5)
    image = DepthImage(torch.from_numpy(depth), camera)
    boxed = locate(rows, [(100, 100)], [image], 0.001, 0.1, 65.0)
    masks = RowMasks(
        torch.tensor([[20, 20, 80, 80]]), torch.tensor([0]), torch.from_numpy(mask.reshape(-1)), 1.0
    )
    masked = locate(rows, [(100, 100)], [image], 0.001, 0.1, 65.0, masks=masks)
    assert boxed[0, 2] == pytest.approx(10.0, rel=0.01) and masked[0, 2] == pytest.approx(5.0, rel=0.01)
    assert masked[0, 6] == 1


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--masks"], "masks: true, but .* has no mask prototypes"),
        (["--mask-scale", "1.5"], r"mask_scale must be in \(0, 1\], got 1.5"),
    ],
)
def test_bad_mask_settings_are_one_line_and_exit_1(tmp_path, capsys, flags, problem):
    import cv2

    from tiled_detector.cli import main

    cv2.imwrite(str(tmp_path / "frame.png"), np.zeros((64, 64, 3), np.uint8))
    assert main(["detect", str(tmp_path / "frame.png"), *flags, "--out", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and re.search(problem, error[0]), error
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_masks_parameter_takes_a_bool_or_auto():
    """The node's `masks` parameter is dynamically typed: a params file's `masks: true` is a bool, `auto` (the
    default) a string; anything else is refused naming it."""
    from tiled_detector.parameters import DETECTOR_PARAMETERS, config_changes
    from tiled_detector.settings.kinds import Switch

    param = next(p for p in DETECTOR_PARAMETERS if p.name == "masks")
    assert isinstance(param.kind, Switch) and param.dynamic and param.default == "auto"
    assert param.check(True) is None and param.check("auto") is None and param.check("false") is None
    assert "masks must be true, false or auto" in param.check(3)
    from tiled_detector.config import DetectorConfig

    values = [DetectorConfig(**config_changes({"masks": v})).masks for v in (True, "false", "auto")]
    assert values == [True, False, None]
