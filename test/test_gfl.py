"""GFL heads (PP-PicoDet, NanoDet): their structure read from the output shapes, the device decode against the
families' formula, and the real pretrained files (`../shared/models/picodet_s_416_coco.onnx`,
`nanodet_m_416.onnx`) against each family's own post-processing (`tools/peers.py`), on synthetic frames and on
real photos. Photos are read from $TILED_DETECTOR_PHOTOS (default ~/.cache/tiled_detector/photos: e.g.
ultralytics' bus.jpg and zidane.jpg, SAHI's demo_data/small-vehicles1.jpeg and tests/data/coco_utils/terrain1.jpg);
tests that need the models or the photos skip cleanly without them."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from support.networks import GflLike
from tiled_detector import TiledDetector
from tiled_detector.cli import main
from tiled_detector.config import DetectorConfig
from tiled_detector.engines.metadata import ModelMetadata
from tiled_detector.pipeline.decode import decode_outputs, decode_padded
from tiled_detector.pipeline.gfl import AmbiguousHeadError, GflError, gfl_head
from tiled_detector.pipeline.layouts import OutputLayout, detect_layout
from tiled_detector.pipeline.preprocess import Preprocessor
from tiled_detector.pipeline.tiling import make_plan
from tiled_detector.tools.peers import (
    nanodet_postprocess,
    nanodet_preprocess,
    picodet_postprocess,
    picodet_preprocess,
)
from tiled_detector.tools.worlds.synthetic import make_scene

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT.parent / "shared" / "models"
FILES = {"picodet": MODELS / "picodet_s_416_coco.onnx", "nanodet": MODELS / "nanodet_m_416.onnx"}
PHOTOS = Path(os.environ.get("TILED_DETECTOR_PHOTOS", Path.home() / ".cache" / "tiled_detector" / "photos"))
PHOTO_FILES = sorted(p for p in PHOTOS.glob("*") if p.suffix.lower() in {".jpg", ".jpeg", ".png"})
INPUT_HW = (416, 416)


def needs(family: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not FILES[family].is_file(), reason=f"the real {family} model is not at {FILES[family]}"
    )


FAMILY_PARAMS = [pytest.param(f, marks=needs(f)) for f in FILES]


def picodet_shapes(hw: tuple[int, int] = INPUT_HW, classes: int = 80, bins: int = 8) -> dict[str, tuple]:
    """PP-PicoDet's outputs as Paddle2ONNX writes them: class scores for strides 8, 16, 32, 64, then distributions."""
    cells = [math.ceil(hw[0] / s) * math.ceil(hw[1] / s) for s in (8, 16, 32, 64)]
    return {
        **{f"scale_{i}": (1, n, classes) for i, n in enumerate(cells)},
        **{f"scale_{i + 4}": (1, n, 4 * bins) for i, n in enumerate(cells)},
    }


def test_the_families_heads_are_read_from_their_shapes() -> None:
    pico = gfl_head(picodet_shapes(), INPUT_HW)
    assert pico.strides == (8, 16, 32, 64) and pico.grids == ((52, 52), (26, 26), (13, 13), (7, 7))
    assert (pico.classes, pico.bins, pico.centre, pico.anchors, pico.joined) == (80, 8, 0.5, 3598, False)
    nano = {
        "792": (1, 2704, 80),
        "814": (1, 676, 80),
        "836": (1, 169, 80),
        "795": (1, 2704, 32),
        "817": (1, 676, 32),
        "839": (1, 169, 32),
    }
    head = gfl_head(nano, INPUT_HW)
    assert (
        head.strides == (8, 16, 32)
        and head.centre == 0.5
        and [p.name for p in head.boxes] == ["795", "817", "839"]
    )
    # one pair over every stride (PicoDet 2.x without NMS), and NanoDet-Plus' joined columns (the labels split them)
    assert gfl_head({"s": (1, 3598, 80), "b": (1, 3598, 32)}, INPUT_HW).strides == (8, 16, 32, 64)
    plus = gfl_head({"output": (1, 3598, 112)}, INPUT_HW, num_classes=80)
    assert (plus.classes, plus.bins, plus.centre, plus.joined) == (80, 8, 0.0, True)
    per_stride = gfl_head({f"o{i}": (1, n, 13 + 68) for i, n in enumerate((2704, 676, 169))}, INPUT_HW, 13)
    assert (per_stride.bins, per_stride.strides, per_stride.scores[1].columns) == (17, (8, 16, 32), (0, 13))
    # the class count picks the class scores wherever they are listed
    listed_last = gfl_head({"b": (1, 3598, 32), "s": (1, 3598, 80)}, INPUT_HW, num_classes=80)
    assert listed_last.scores[0].name == "s" and listed_last.bins == 8
    assert detect_layout(picodet_shapes(), None, "auto", INPUT_HW) is OutputLayout.GFL
    assert detect_layout({"output": (1, 3598, 112)}, 80, "auto", INPUT_HW) is OutputLayout.GFL


@pytest.mark.parametrize(
    ("shapes", "classes", "message"),
    [
        ({"s": (1, 2704, 80), "b": (1, 2704, 30)}, None, r"30 columns do not divide into 4 sides"),
        ({"s": (1, 3598, 112)}, None, r"split only by the class count: give the class names \(labels\)"),
        ({"s": (1, 3598, 110)}, 80, r"110 columns less 80 classes do not divide"),
        ({"s": (1, 2000, 80), "b": (1, 2000, 32)}, None, r"anchor points \[2000\] .* 2704 \(stride 8\), 676"),
        ({"s0": (1, 2704, 80), "s1": (1, 676, 80), "b0": (1, 2704, 32)}, None, r"do not pair"),
        ({"s": (1, 3598, 80), "b": (1, 3598, 32), "x": (1, 3598, 7)}, None, r"mix 3 column counts"),
        ({"s": (1, 3598, 80), "b": (1, 3598, 32)}, 3, r"no output has 3 columns"),
        ({"s": (1, 3598, 80), "m": (1, 32, 104, 104)}, None, r"are \(batch, anchors, columns\) each"),
    ],
)
def test_outputs_that_are_not_one_gfl_head_say_what_was_expected(shapes, classes, message) -> None:
    with pytest.raises(GflError, match=message):
        gfl_head(shapes, INPUT_HW, classes)


def test_32_classes_with_8_bins_are_read_as_class_and_box_outputs_of_one_width() -> None:
    """C = 4 x bins: every output 32 columns wide; the repeated anchor counts make them class score and box pairs
    (every score output first, or pairs in turn), with or without the labels; a class count that fits neither
    reading names the one it wanted."""
    shapes = picodet_shapes(classes=32, bins=8)
    for num_classes in (None, 32):
        head = gfl_head(shapes, INPUT_HW, num_classes)
        assert (head.strides, head.classes, head.bins, head.centre, head.joined) == (
            (8, 16, 32, 64),
            32,
            8,
            0.5,
            False,
        )
        assert [p.name for p in head.scores] == [f"scale_{i}" for i in range(4)]
        assert [p.name for p in head.boxes] == [f"scale_{i}" for i in range(4, 8)]
    in_turn = dict(sorted(shapes.items(), key=lambda item: (int(item[0][6:]) % 4, item[0])))
    head = gfl_head(in_turn, INPUT_HW)
    assert [p.name for p in head.scores] == ["scale_0", "scale_1", "scale_2", "scale_3"]
    assert [p.name for p in head.boxes] == ["scale_4", "scale_5", "scale_6", "scale_7"]
    assert [list(in_turn)[k] for k in (0, 1)] == ["scale_0", "scale_4"]  # listed in turn
    assert gfl_head({"s": (1, 3598, 32), "b": (1, 3598, 32)}, INPUT_HW).scores[0].name == "s"
    assert detect_layout(shapes, None, "auto", INPUT_HW) is OutputLayout.GFL
    with pytest.raises(GflError, match=r"no output has 31 columns, one per class"):
        gfl_head(shapes, INPUT_HW, 31)
    # 16 classes: joined columns (16 + 4 x 4) per stride, one per output
    joined = gfl_head({f"o{i}": (1, n, 32) for i, n in enumerate((2704, 676, 169))}, INPUT_HW, 16)
    assert (joined.joined, joined.classes, joined.bins) == (True, 16, 4)


def test_a_head_both_readings_fit_is_refused_naming_both_and_the_labels() -> None:
    """At a 16 x 16 input strides 16 and 32 have one cell each: two 32-column outputs of one row are a class score /
    box pair of stride 16, or joined columns of strides 16 and 32; the labels decide."""
    shapes = {"a": (1, 1, 32), "b": (1, 1, 32)}
    with pytest.raises(AmbiguousHeadError) as error:
        gfl_head(shapes, (16, 16))
    message = str(error.value)
    assert (
        "strides 16, 32 classes, 8 bins" in message
        and "strides 16, 32, joined class and box columns" in message
    )
    assert "the class names (labels) decide" in message and len(error.value.readings) == 2
    assert not gfl_head(shapes, (16, 16), 32).joined
    assert gfl_head(shapes, (16, 16), 16).joined


def reference_boxes(scores, dists, hw, centre):
    """The families' decode, written out (PaddleDetection / NanoDet `get_bboxes_single` without the top 1000 cut):
    per stride, cell centres (i + centre) x stride, the softmax's expected bin x stride per side, clipped."""
    boxes = []
    for level, dist in enumerate(dists):
        stride = 8 << level
        ys, xs = np.meshgrid(
            np.arange(math.ceil(hw[0] / stride)), np.arange(math.ceil(hw[1] / stride)), indexing="ij"
        )
        points = (np.stack([xs.ravel(), ys.ravel()], 1) + centre) * stride
        logits = dist.reshape(len(dist), 4, -1).astype(np.float64)
        weights = np.exp(logits) / np.exp(logits).sum(2, keepdims=True)
        distance = (weights * np.arange(logits.shape[2])).sum(2) * stride
        xyxy = np.concatenate([points - distance[:, :2], points + distance[:, 2:]], 1)
        boxes.append(np.clip(xyxy, 0, [hw[1], hw[0]] * 2))
    return np.concatenate(boxes), np.concatenate(scores)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(("joined", "classes", "bins"), [(False, 5, 6), (True, 5, 6), (False, 32, 8)])
def test_the_decode_equals_the_families_formula_on_random_outputs(joined, classes, bins, device) -> None:
    """Including 32 classes and 8 bins: class scores and distributions of one width (32 columns each)."""
    hw = (64, 96)
    rng = np.random.default_rng(1 + joined)
    cells = [math.ceil(hw[0] / s) * math.ceil(hw[1] / s) for s in (8, 16, 32)]
    scores = [rng.random((n, classes)).astype(np.float32) for n in cells]
    dists = [rng.normal(0, 2, (n, 4 * bins)).astype(np.float32) for n in cells]
    if joined:
        outputs = {
            f"o{i}": torch.from_numpy(np.concatenate([s, d], 1))[None]
            for i, (s, d) in enumerate(zip(scores, dists, strict=True))
        }
    else:
        outputs = {
            **{f"s{i}": torch.from_numpy(s)[None] for i, s in enumerate(scores)},
            **{f"b{i}": torch.from_numpy(d)[None] for i, d in enumerate(dists)},
        }
    outputs = {name: tensor.to(device) for name, tensor in outputs.items()}
    boxes, all_scores = reference_boxes(scores, dists, hw, 0.0 if joined else 0.5)
    found = decode_outputs(outputs, "gfl", 0.0, 10_000, num_classes=classes, input_hw=hw)
    assert found.boxes.device.type == device
    found = type(found)(*(t.cpu() for t in found))
    order = np.argsort(-found.scores.numpy())
    want = np.argsort(-all_scores.max(1))
    assert len(found.scores) == sum(cells)
    np.testing.assert_allclose(found.scores.numpy()[order], all_scores.max(1)[want], rtol=1e-6)
    np.testing.assert_array_equal(found.class_ids.numpy()[order], all_scores.argmax(1)[want])
    np.testing.assert_allclose(found.boxes.numpy()[order], boxes[want], atol=1e-3)
    # fixed shapes, any batch, fp16 outputs, a class filter and per-class thresholds on the same anchors
    batch = {n: torch.cat([v, v]).half() for n, v in outputs.items()}
    padded = decode_padded(
        batch,
        "gfl",
        0.5,
        7,
        class_filter=[1, 3],
        num_classes=classes,
        input_hw=hw,
        class_thresholds=[(3, 0.9)],
    )
    assert padded.boxes.shape == (14, 4) and padded.image_index.tolist() == [0] * 7 + [1] * 7
    kept = padded.compact()
    assert kept.boxes.device.type == device
    assert set(kept.class_ids.tolist()) <= {1, 3} and (kept.scores[kept.class_ids == 3] > 0.9).all()


def test_a_32_class_8_bin_model_loads_and_decodes_as_the_families_formula(export_onnx) -> None:
    """A PyTorch-exported GFL detector of 32 classes and 8 bins (every output 32 columns) loads with no option, as
    NanoDet's separate outputs; its own outputs decoded as the detector resolved them equal the numpy reference."""
    hw = (64, 96)
    torch.manual_seed(0)
    path = export_onnx(GflLike(classes=32, bins=8, levels=3, width=8), hw, batch=1)
    detector = TiledDetector(path, conf_threshold=0.0, top_k=5)
    resolved = detector.resolved
    assert (resolved.layout, resolved.family, resolved.num_classes) == (OutputLayout.GFL, "nanodet", 32)
    assert "32 classes, 8 bins per side" in resolved.head
    assert len(detector.detect(make_scene(4, 150, 100).image)) > 0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    image = np.random.default_rng(0).random((1, 3, *hw), dtype=np.float32)
    values = session.run(None, {session.get_inputs()[0].name: image})
    outputs = {o.name: torch.from_numpy(v) for o, v in zip(session.get_outputs(), values, strict=True)}
    found = decode_outputs(outputs, resolved.layout, 0.0, 10_000, num_classes=32, input_hw=hw)
    boxes, scores = reference_boxes([v[0] for v in values[:3]], [v[0] for v in values[3:]], hw, 0.5)
    # the same rows in the same order: by score, ties (a random network saturates its sigmoid) by box
    order = np.lexsort((*found.boxes.numpy().round(2).T[::-1], -found.scores.numpy()))
    want = np.lexsort((*boxes.round(2).T[::-1], -scores.max(1).astype(np.float32)))
    assert len(found.scores) == len(scores) == 8 * 12 + 4 * 6 + 2 * 3
    np.testing.assert_allclose(found.scores.numpy()[order], scores.max(1)[want], rtol=1e-6)
    np.testing.assert_array_equal(found.class_ids.numpy()[order], scores.argmax(1)[want])
    np.testing.assert_allclose(found.boxes.numpy()[order], boxes[want], atol=1e-3)


@pytest.fixture(scope="module")
def sessions() -> dict[str, ort.InferenceSession]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return {
        f: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
        for f, p in FILES.items()
        if p.is_file()
    }


def _best_class_only(outputs: list[np.ndarray]) -> list[np.ndarray]:
    """The class scores (first half) with every class but each anchor's best zeroed: the families' NMS keeps every
    class score above the threshold, the pipeline (like ultralytics and SAHI) each anchor's best class, so the
    family's post-processing is given that candidate set."""
    half = len(outputs) // 2
    best = [np.where(o == o.max(axis=-1, keepdims=True), o, 0.0).astype(o.dtype) for o in outputs[:half]]
    return best + list(outputs[half:])


def family_reference(family, session, detector, image_bgr, threshold):
    """The family's post-processing of the real model's outputs on the pipeline's own full-frame view of
    `image_bgr` (the same input tensor), mapped to the frame by the family's own rule."""
    h, w = image_bgr.shape[:2]
    plan = make_plan((h, w), (h, w), 0.2, INPUT_HW, False, letterbox=detector.input_format.letterbox)
    view = Preprocessor("cpu", torch.float32, INPUT_HW, detector.input_format).run(image_bgr, plan, "bgr8")
    outputs = _best_class_only(session.run(None, {session.get_inputs()[0].name: view.numpy()}))
    box = plan.tile_letterbox
    if family == "picodet":  # stretched: PaddleDetection's scale factor (y, x)
        return picodet_postprocess(outputs, INPUT_HW, box.scales[::-1], threshold)
    effect = (box.pad_x, box.pad_y, box.resized_hw[1], box.resized_hw[0])
    return nanodet_postprocess(outputs, INPUT_HW, effect, (h, w), threshold)


def frames() -> list[tuple[str, np.ndarray]]:
    import cv2

    synthetic = [("synthetic 832x624", make_scene(3, 832, 624).image[..., ::-1].copy())]
    return synthetic + [(p.name, cv2.imread(str(p))) for p in PHOTO_FILES]


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_the_full_frame_view_equals_the_family_post_processing(family, sessions) -> None:
    """Boxes within 1 px, scores within 0.01 (here within float rounding), the same classes, on every frame."""
    threshold = (
        0.3  # (the families' evaluation thresholds, 0.025 and 0.05, fill the 100 places with near-ties)
    )
    detector = TiledDetector(
        FILES[family],
        full_frame=False,
        conf_threshold=threshold,
        top_k=3598,
        max_detections=100,
        merge_threshold=0.6,
        match_metric="iou",
        seam_suppression=False,
    )
    compared = 0
    for name, image in frames():
        h, w = image.shape[:2]
        ours = detector.with_config(tile_size=(w, h)).detect(image, "bgr8")
        boxes, scores, classes = family_reference(family, sessions[family], detector, image, threshold)
        assert len(ours) == len(scores), name
        # pairs: each reference detection and our detection of its class nearest to it
        distance = np.abs(boxes[:, None] - ours.boxes[None]).max(axis=2) + 1e9 * (
            classes[:, None] != ours.class_ids
        )
        pairs = distance.argmin(axis=1)
        assert len(set(pairs.tolist())) == len(scores), name  # one to one
        np.testing.assert_allclose(ours.boxes[pairs], boxes, atol=1.0, err_msg=name)
        np.testing.assert_allclose(ours.scores[pairs], scores, atol=0.01, err_msg=name)
        compared += len(scores)
    assert compared > 0


@pytest.mark.parametrize("family", ["picodet", "nanodet"])
def test_the_family_input_conventions_equal_the_family_pre_processing(family) -> None:
    """On frames that need no resize (the family's interpolation aside), the pipeline's view is the family's input:
    PicoDet RGB with ImageNet's mean / std; NanoDet BGR with its own, centred on black."""
    rng = np.random.default_rng(0)
    fmt = DetectorConfig().input_format(family, ModelMetadata())
    for hw in ((416, 416), (208, 416)) if family == "nanodet" else ((416, 416),):
        image = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
        plan = make_plan(hw, hw, 0.2, INPUT_HW, False, letterbox=fmt.letterbox)
        ours = Preprocessor("cpu", torch.float32, INPUT_HW, fmt).run(image, plan, "bgr8")[0].numpy()
        theirs = (picodet_preprocess if family == "picodet" else nanodet_preprocess)(image, INPUT_HW)[0]
        np.testing.assert_allclose(ours, theirs, atol=1e-4)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_detect_runs_the_file_with_no_option(family, tmp_path, capsys, caplog, monkeypatch) -> None:
    import cv2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = PHOTO_FILES[0] if PHOTO_FILES else tmp_path / "frame.png"
    if not PHOTO_FILES:
        cv2.imwrite(str(path), make_scene(5, 832, 624).image[..., ::-1])
    with caplog.at_level(logging.INFO):
        assert main(["detect", str(path), "--model", str(FILES[family]), "--json"]) == 0
    assert '"detections": [' in capsys.readouterr().out.strip().splitlines()[-1]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("COCO's" in m for m in messages) == 1
    assert any("rewritten to a dynamic batch (proven equal" in m for m in messages)


SMALL_OBJECTS = {"terrain1.jpg": "person", "small-vehicles1.jpeg": "car"}  # SAHI's photos of small objects


@pytest.mark.skipif(
    not any((PHOTOS / p).is_file() for p in SMALL_OBJECTS), reason=f"SAHI's photos are not in {PHOTOS}"
)
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_tiles_find_more_small_objects_than_the_whole_frame(family) -> None:
    """SAHI's terrain1.jpg (2048x1365, seven people a few dozen pixels tall) and small-vehicles1.jpeg (1068x580, a
    motorway's cars): tiles + the full frame find more of them than the whole frame alone."""
    import cv2

    for name, cls in SMALL_OBJECTS.items():
        if not (PHOTOS / name).is_file():
            continue
        image = cv2.imread(str(PHOTOS / name))
        tiled = TiledDetector(FILES[family], conf_threshold=0.3, classes=[cls])
        whole = tiled.with_config(tile_size=image.shape[1::-1], full_frame=False)
        assert len(tiled.detect(image, "bgr8")) > len(whole.detect(image, "bgr8")), name
