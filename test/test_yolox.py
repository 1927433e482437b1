"""YOLOX as YOLOX exports it: the raw head decoded on the device (against YOLOX's own `demo_postprocess`), the same
weights with the decode folded into the graph, YOLOX's input conventions, the top-left letterbox, labels, and the
bad-input lines. The real pretrained YOLOX-nano (`../shared/models/yolox_nano.onnx`) is used where present; tests
that need it skip cleanly without it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from tiled_detector import TiledDetector
from tiled_detector.cli import main
from tiled_detector.config import DetectorConfig
from tiled_detector.engines.metadata import ModelMetadata
from tiled_detector.models import coco_labels, default_model_path
from tiled_detector.pipeline.decode import decode_outputs, yolox_decoded
from tiled_detector.pipeline.layouts import AmbiguousLayoutError, OutputLayout, anchor_points, detect_layout
from tiled_detector.pipeline.preprocess import InputFormat, Preprocessor
from tiled_detector.pipeline.tiling import Letterbox, make_plan
from tiled_detector.tools.peers import YoloxRunner, yolox_demo_postprocess, yolox_preprocess
from tiled_detector.tools.worlds.synthetic import make_scene

ROOT = Path(__file__).resolve().parents[1]
YOLOX = Path(os.environ.get("TILED_DETECTOR_YOLOX", ROOT.parent / "shared" / "models" / "yolox_nano.onnx"))
needs_yolox = pytest.mark.skipif(not YOLOX.is_file(), reason=f"the real YOLOX model is not at {YOLOX}")
INPUT_HW = (416, 416)


@pytest.fixture(autouse=True)
def cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The engine cache (rewritten batch-1 models) in a temporary directory shared by this module's tests."""
    directory = tmp_path_factory.getbasetemp() / "yolox-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(directory))
    return directory / "tiled_detector" / "engines"


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    """A 832x624 frame (an exact 2x downscale into 416: YOLOX's and our resize read the same pixels) with the
    synthetic scenes' shapes: enough for the real model to score candidates above a low threshold."""
    return make_scene(3, 832, 624).image


def decoded_yolox(raw: Path, out: Path) -> Path:
    """The same weights with YOLOX's decode folded into the graph (as `--decode_in_inference` exports it): boxes
    (offset + grid) x stride and exp(log size) x stride, then objectness and class scores unchanged."""
    model = onnx.load(str(raw))
    rows = yolox_demo_postprocess(np.zeros((1, anchor_points(INPUT_HW), 4), np.float32), INPUT_HW)[0]
    # demo_postprocess of zeros: centre = grid x stride, size = stride; so grid x stride and stride as constants
    stride = rows[:, 2:4].astype(np.float32)
    grid_scaled = rows[:, :2].astype(np.float32)
    graph, head = model.graph, model.graph.output[0].name
    constants = {
        "td_stride": stride[None],
        "td_grid": grid_scaled[None],
        "td_axis": np.array([2], np.int64),
    }
    bounds = {"starts": (0, 2, 4), "ends": (2, 4, 1 << 30)}
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in constants.items())
    graph.node.extend(
        [
            helper.make_node("Slice", [head, "td_starts_0", "td_ends_0", "td_axis"], ["td_xy"]),
            helper.make_node("Slice", [head, "td_starts_1", "td_ends_1", "td_axis"], ["td_wh"]),
            helper.make_node("Slice", [head, "td_starts_2", "td_ends_2", "td_axis"], ["td_rest"]),
            helper.make_node("Mul", ["td_xy", "td_stride"], ["td_xy_scaled"]),
            helper.make_node("Add", ["td_xy_scaled", "td_grid"], ["td_xy_pixels"]),
            helper.make_node("Exp", ["td_wh"], ["td_wh_exp"]),
            helper.make_node("Mul", ["td_wh_exp", "td_stride"], ["td_wh_pixels"]),
            helper.make_node("Concat", ["td_xy_pixels", "td_wh_pixels", "td_rest"], ["decoded"], axis=2),
        ]
    )
    for name, values in bounds.items():
        for k, value in enumerate(values):
            graph.initializer.append(numpy_helper.from_array(np.array([value], np.int64), f"td_{name}_{k}"))
    output = helper.make_tensor_value_info(
        "decoded", onnx.TensorProto.FLOAT, [1, anchor_points(INPUT_HW), 85]
    )
    del graph.output[:]
    graph.output.append(output)
    path = out / "yolox_decoded.onnx"
    onnx.save(model, str(path))
    return path


def raw_head(image: np.ndarray) -> tuple[np.ndarray, float]:
    """The real model's raw outputs (1, A, 85) on YOLOX's own preprocessing of an RGB image, and its ratio."""
    views, ratio = yolox_preprocess(np.ascontiguousarray(image[..., ::-1]), INPUT_HW)
    session = ort.InferenceSession(str(YOLOX), providers=["CPUExecutionProvider"])
    return session.run(None, {"images": views[None]})[0], ratio


@needs_yolox
def test_the_yolox_decode_equals_yolox_demo_postprocess_on_the_real_outputs(photo: np.ndarray) -> None:
    head, _ = raw_head(photo)
    reference = yolox_demo_postprocess(head, INPUT_HW)[0]
    scores = reference[:, 4:5] * reference[:, 5:]
    threshold = float(np.sort(scores.max(1))[-50])  # the 50 best anchors
    keep = scores.max(1) >= threshold
    decoded = decode_outputs(
        {"output": torch.from_numpy(head)}, "yolox", threshold - 1e-6, 1000, input_hw=INPUT_HW
    )
    order = torch.argsort(decoded.scores, descending=True).numpy()
    want = np.argsort(-scores.max(1)[keep])
    boxes = reference[keep][:, :4]
    expected = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], 1)[want]
    assert len(decoded.scores) == keep.sum() == 50
    np.testing.assert_allclose(decoded.boxes.numpy()[order], expected, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(decoded.scores.numpy()[order], scores.max(1)[keep][want], rtol=1e-6)
    np.testing.assert_array_equal(decoded.class_ids.numpy()[order], scores.argmax(1)[keep][want])


def test_yolox_is_told_by_its_anchor_points_and_the_class_count_and_raw_from_decoded() -> None:
    """By shapes alone a (1, 3549, 85) head is YOLOX's (80 classes) or a transposed YOLOv8's (81): ambiguous (the
    detector's probe tells YOLOX's raw offsets apart: test_resolve.py); 80 names make it YOLOX's."""
    rows = anchor_points(INPUT_HW)
    assert rows == 52 * 52 + 26 * 26 + 13 * 13 == 3549
    with pytest.raises(
        AmbiguousLayoutError, match=r"fits yolox \(80 classes\), yolov8_transposed \(81 classes\)"
    ):
        detect_layout({"output": (1, rows, 85)}, None, "auto", INPUT_HW)
    assert detect_layout({"output": (1, rows, 85)}, 80, "auto", INPUT_HW) is OutputLayout.YOLOX
    # YOLOv5 has three anchors per cell; YOLOv8 transposed has no objectness
    assert detect_layout({"output": (1, 3 * rows, 85)}, 80, "auto", INPUT_HW) is OutputLayout.YOLOV5
    assert detect_layout({"output": (1, rows, 84)}, 80, "auto", INPUT_HW) is OutputLayout.YOLOV8_TRANSPOSED
    raw = torch.zeros(1, rows, 85)
    raw[..., :2] = 0.5
    pixels = torch.from_numpy(yolox_demo_postprocess(raw.numpy(), INPUT_HW))
    assert not yolox_decoded(raw, INPUT_HW) and yolox_decoded(pixels, INPUT_HW)


@needs_yolox
def test_the_raw_file_equals_the_same_weights_with_the_decode_in_the_graph(tmp_path: Path, photo) -> None:
    decoded = decoded_yolox(YOLOX, tmp_path)
    settings = dict(tile_size=(416, 416), conf_threshold=0.05)
    raw = TiledDetector(YOLOX, **settings)
    assert raw.resolved.layout is OutputLayout.YOLOX and raw.labels == coco_labels()
    folded = TiledDetector(decoded, layout="yolox", **settings)
    assert folded.resolved.layout is OutputLayout.YOLOV5  # the probe found boxes in pixels
    as_v5 = TiledDetector(
        decoded,
        layout="yolov5",
        labels=["coco"],
        channel_order="bgr",
        input_scale=1.0,
        letterbox="top_left",
        pad_value=114,
        **settings,
    )
    assert raw.input_format == folded.input_format == as_v5.input_format
    frame = make_scene(4, 1500, 1000).image
    for image in (photo, frame):
        a, b, c = raw.detect(image), folded.detect(image), as_v5.detect(image)
        assert len(a) == len(b) == len(c) > 0
        for other in (b, c):
            np.testing.assert_allclose(other.boxes, a.boxes, atol=0.5)
            np.testing.assert_allclose(other.scores, a.scores, atol=1e-5)
            np.testing.assert_array_equal(other.class_ids, a.class_ids)


@needs_yolox
def test_the_full_frame_view_finds_what_yolox_demo_pipeline_finds(photo: np.ndarray) -> None:
    """Our full-frame view against YOLOX's own preproc + demo_postprocess + multiclass_nms, same weights."""
    boxes, scores, classes = YoloxRunner(YOLOX)(np.ascontiguousarray(photo[..., ::-1]), 0.05)
    height, width = photo.shape[:2]
    ours = TiledDetector(
        YOLOX,
        tile_size=(width, height),
        full_frame=False,
        conf_threshold=0.05,
        merge_threshold=0.45,
        match_metric="iou",
        class_agnostic=True,
    ).detect(photo)
    assert len(ours) == len(scores) > 0
    order, want = np.argsort(-ours.scores), np.argsort(-scores)
    np.testing.assert_allclose(ours.boxes[order], boxes[want], atol=1.0)
    # YOLOX rounds its resized image to uint8 (cv2's fixed-point resize); ours stays float: scores move by < 0.01
    np.testing.assert_allclose(ours.scores[order], scores[want], atol=1e-2)
    np.testing.assert_array_equal(ours.class_ids[order], classes[want])


@needs_yolox
def test_detect_runs_the_raw_file_with_no_option_and_names_coco_once(
    tmp_path, capsys, caplog, monkeypatch
) -> None:
    import cv2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # an empty cache: the rewrite is made here
    path = tmp_path / "frame.png"
    cv2.imwrite(str(path), make_scene(5, 832, 624).image[..., ::-1])
    with caplog.at_level(logging.INFO):
        assert main(["detect", str(path), "--model", str(YOLOX), "--conf", "0.05", "--json"]) == 0
    report = capsys.readouterr().out.strip().splitlines()[-1]
    assert '"label": ' in report
    assert sum("COCO's" in r.getMessage() for r in caplog.records) == 1
    # the batch-1 file ran through its proven dynamic-batch rewrite
    assert any("rewritten to a dynamic batch" in r.getMessage() for r in caplog.records)


@settings(max_examples=60, deadline=None)
@given(
    frame=st.tuples(st.integers(1, 5000), st.integers(1, 5000)),
    model=st.tuples(st.integers(16, 1280), st.integers(16, 1280)),
    point=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_the_top_left_letterbox_maps_boxes_back_exactly(frame, model, point) -> None:
    box = Letterbox.fit(frame, model, "top_left")
    assert (box.pad_x, box.pad_y) == (0, 0)
    assert box.resized_hw[0] <= model[0] and box.resized_hw[1] <= model[1]
    plan = make_plan(frame, frame, 0.2, model, True, letterbox="top_left")
    full = plan.batch_size - 1  # the full-frame view
    x, y = point[0] * frame[1], point[1] * frame[0]
    sx, sy = box.scales  # the resize's own scales: the resized size over the frame's
    in_model = torch.tensor([[x * sx, y * sy, x * sx, y * sy]])
    back = plan.to_frame(in_model, torch.tensor([full]))[0].numpy()
    np.testing.assert_allclose(back, [x, y, x, y], rtol=1e-5, atol=1e-3 * max(1.0, 1 / min(sx, sy)))


def test_the_input_conventions_apply_in_one_pass_to_tiles_full_frame_and_padding() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (30, 90, 3), dtype=np.uint8)  # shorter than a tile: tiles reach past it
    fmt = InputFormat("bgr", 2.0, (10.0, 20.0, 30.0), (2.0, 4.0, 8.0), "top_left", 100.0)
    plan = make_plan((30, 90), (40, 40), 0.0, (32, 32), True, letterbox="top_left")
    batch = Preprocessor("cpu", torch.float32, (32, 32), fmt).run(frame, plan, "rgb8").numpy()
    plain = Preprocessor(
        "cpu", torch.float32, (32, 32), InputFormat("bgr", 2.0, letterbox="top_left", pad_value=100.0)
    )
    reference = plain.run(frame, plan, "rgb8").numpy()
    mean, std = np.array(fmt.mean)[:, None, None], np.array(fmt.std)[:, None, None]
    np.testing.assert_allclose(batch, (reference - mean) / std, rtol=1e-5, atol=1e-4)
    # pixels past the frame (a tile reaching over its border) and the letterbox padding are 100 x 2, normalised
    # the full frame's padding (top-left: right, below)
    assert reference[-1, :, -1, -1].tolist() == [200.0] * 3
    # tile 0's last row is past
    assert plan.tiles[0, 3] > 30 and reference[0, :, -1, 0].tolist() == [200.0] * 3
    np.testing.assert_allclose(batch[-1, :, -1, -1], (200.0 - np.array(fmt.mean)) / np.array(fmt.std))


def test_given_settings_win_over_the_model_file_and_the_family() -> None:
    model = ModelMetadata(inputs=(("input_scale", 0.5), ("input_mean", (1, 2, 3)), ("letterbox", "center")))
    config = DetectorConfig()
    assert config.input_format(OutputLayout.YOLOV8, ModelMetadata()) == InputFormat()
    yolox = config.input_format(OutputLayout.YOLOX, ModelMetadata())
    assert yolox == InputFormat("bgr", 1.0, letterbox="top_left", pad_value=114.0)
    assert config.input_format(OutputLayout.YOLOX, model) == InputFormat(
        "bgr", 0.5, (1, 2, 3), letterbox="center"
    )
    given_ = DetectorConfig(
        channel_order="rgb", input_scale=0.25, input_std=[1, 2, 4], letterbox="top_left", pad_value=0
    )
    assert given_.input_format(OutputLayout.YOLOX, model) == InputFormat(
        "rgb", 0.25, (1, 2, 3), (1, 2, 4), "top_left", 0.0
    )


def test_the_model_file_states_its_input_conventions(export_onnx) -> None:
    from support.networks import SquareDetector

    path = export_onnx(SquareDetector(), (64, 64))
    model = onnx.load(str(path))
    for key, value in (
        ("input_mean", "[0.5, 0.5, 0.5]"),
        ("input_std", "[0.25, 0.25, 0.25]"),
        ("input_scale", "0.00392156862745098"),
        ("channel_order", "bgr"),
    ):
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    onnx.save(model, str(path))
    detector = TiledDetector(path, tile_size=(64, 64))
    assert detector.input_format == InputFormat("bgr", 1 / 255, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--input-std", "1", "0", "1"], "input_std must not hold a 0 (it divides), got [1.0, 0.0, 1.0]"),
        (["--input-scale", "0"], "input_scale must be in [1e-06, 1000.0], got 0.0"),
        (["--input-scale", "-1"], "input_scale must be in [1e-06, 1000.0], got -1.0"),
        (["--pad-value", "300"], "pad_value must be in [0.0, 255.0], got 300.0"),
        (["--layout", "yolox"], "layout yolox: "),
    ],
)
def test_bad_input_settings_are_one_line_and_nothing_is_cached(flags, message, tmp_path, capsys, monkeypatch):
    import cv2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    image = tmp_path / "frame.png"
    cv2.imwrite(str(image), np.zeros((64, 64, 3), np.uint8))
    assert main(["detect", str(image), "--model", str(default_model_path()), *flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot start" in err[0] and message in err[0], err
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("input_mean", [1, 2], "input_mean must be 3 numbers, one per input channel"),
        ("input_std", [1, 2, 3, 4], "input_std must be 3 numbers, one per input channel"),
        (
            "letterbox",
            "bottom",
            "letterbox: unknown letterbox anchor 'bottom'; expected one of: auto, center, top_left",
        ),
        ("pad_value", -1, "pad_value must be in [0.0, 255.0], got -1"),
        ("channel_order", "gbr", "channel_order: unknown channel order 'gbr'"),
    ],
)
def test_bad_values_name_the_setting(setting, value, message) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        DetectorConfig(**{setting: value})


def test_the_seam_margin_is_in_model_input_pixels() -> None:
    """A real model's box of a cut object ends a few input pixels before the seam (YOLOX-nano on a tile shrunk
    640 -> 416: 5 frame pixels); the margin is 4 input pixels, so a shrunk tile's is wider in frame pixels."""
    from tiled_detector.pipeline.seams import truncated_sides

    boxes = torch.tensor([[10.0, 10.0, 93.0, 50.0], [10.0, 10.0, 91.0, 50.0]])
    image = torch.tensor([0, 0])
    shrunk = make_plan((100, 300), (100, 100), 0.0, (50, 50), False)  # 2 frame pixels per input pixel
    assert truncated_sides(boxes, image, shrunk)[:, 2].tolist() == [True, False]  # within 8 of x = 100
    same = make_plan((100, 300), (100, 100), 0.0, (100, 100), False)
    assert truncated_sides(boxes, image, same)[:, 2].tolist() == [False, False]  # within 4 of x = 100
