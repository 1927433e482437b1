"""Tests for decode.py on outputs of tiny ONNX models exported in each exporter layout, run with onnxruntime."""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.pipeline.decode import Decoded, decode_outputs, decode_padded
from tiled_detector.pipeline.layouts import (
    KEYPOINT_LAYOUTS,
    ROTATED_LAYOUTS,
    OutputLayout,
    detect_layout,
)

NUM_CLASSES, ANCHORS, K = 3, 50, 8
NEG = -12.0  # logit of "nothing here"


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# (image, anchor, cx, cy, w, h, class logits)
OBJECTS = [
    (0, 3, 50.0, 60.0, 20.0, 10.0, [NEG, 0.0, 3.0]),
    (0, 7, 100.0, 100.0, 40.0, 40.0, [1.0, NEG, NEG]),
    (1, 0, 10.0, 10.0, 4.0, 4.0, [NEG, 0.0, NEG]),
    (1, 49, 200.0, 150.0, 30.0, 20.0, [NEG, 2.0, NEG]),
]


def raw_head() -> torch.Tensor:
    """Pre-activation head (B, 5 + C, A): cx, cy, w, h, objectness logit, class logits."""
    raw = torch.full((2, 5 + NUM_CLASSES, ANCHORS), NEG)
    raw[:, :4] = torch.rand(2, 4, ANCHORS) * 100 + 5
    for image, anchor, cx, cy, w, h, logits in OBJECTS:
        raw[image, :5, anchor] = torch.tensor([cx, cy, w, h, 12.0])
        raw[image, 5:, anchor] = torch.tensor(logits)
    return raw


def expected(score_fn=lambda logits: max(sigmoid(v) for v in logits), allowed=None) -> list[tuple]:
    rows = []
    for image, _, cx, cy, w, h, logits in OBJECTS:
        probs = [sigmoid(v) if allowed is None or c in allowed else -1.0 for c, v in enumerate(logits)]
        c = int(np.argmax(probs))
        rows.append((image, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, score_fn([logits[c]]), c))
    return sorted(rows)


class V8Head(torch.nn.Module):
    """(B, 4 + C, A) like ultralytics' detect head export: boxes, then sigmoid class scores."""

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return torch.cat([raw[:, :4], raw[:, 5:].sigmoid()], dim=1)


class V8TransposedHead(V8Head):
    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return super().forward(raw).transpose(1, 2)


class V5Head(torch.nn.Module):
    """(B, A, 5 + C): boxes, sigmoid objectness, sigmoid class scores."""

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return torch.cat([raw[:, :4], raw[:, 4:].sigmoid()], dim=1).transpose(1, 2)


def _topk_xyxy(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores, classes = raw[:, 5:].sigmoid().max(dim=1)
    top, index = scores.topk(K, dim=1)
    boxes = raw[:, :4].transpose(1, 2).gather(1, index.unsqueeze(-1).expand(-1, -1, 4))
    xyxy = torch.cat([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], dim=-1)
    return xyxy, top, classes.gather(1, index)


class End2EndHead(torch.nn.Module):
    """(B, K, 6) x1, y1, x2, y2, score, class like YOLOv10 / YOLO26 end-to-end exports."""

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        xyxy, top, classes = _topk_xyxy(raw)
        return torch.cat([xyxy, top.unsqueeze(-1), classes.unsqueeze(-1).float()], dim=-1)


class EfficientNmsHead(torch.nn.Module):
    """The four EfficientNMS_TRT outputs; rows past num_detections hold garbage, as padding does."""

    def forward(self, raw: torch.Tensor) -> tuple[torch.Tensor, ...]:
        xyxy, top, classes = _topk_xyxy(raw)
        num = (top > 0.4).sum(dim=1, keepdim=True).to(torch.int32)
        return num, xyxy, top + 0.0, classes.to(torch.int32)


EFFICIENT_NAMES = ["num_detections", "detection_boxes", "detection_scores", "detection_classes"]


def run_onnx(module: torch.nn.Module, raw: torch.Tensor, output_names: list[str]) -> dict[str, torch.Tensor]:
    """Export `module` to ONNX in memory and run it with onnxruntime; outputs as torch tensors by name."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (raw,),
            buffer,
            dynamo=False,
            input_names=["raw"],
            output_names=output_names,
            dynamic_axes={"raw": {0: "batch"}},
        )
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    values = session.run(None, {"raw": raw.numpy()})
    return {name: torch.from_numpy(v) for name, v in zip(output_names, values, strict=True)}


@pytest.fixture(scope="module")
def exported() -> dict[OutputLayout, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    raw = raw_head()
    return {
        OutputLayout.YOLOV8: run_onnx(V8Head(), raw, ["output0"]),
        OutputLayout.YOLOV8_TRANSPOSED: run_onnx(V8TransposedHead(), raw, ["output0"]),
        OutputLayout.YOLOV5: run_onnx(V5Head(), raw, ["output0"]),
        OutputLayout.END2END: run_onnx(End2EndHead(), raw, ["output0"]),
        OutputLayout.EFFICIENT_NMS: run_onnx(EfficientNmsHead(), raw, EFFICIENT_NAMES),
    }


def rows(d: Decoded) -> list[tuple]:
    assert d.boxes.dtype == torch.float32 and d.scores.dtype == torch.float32
    assert d.class_ids.dtype == torch.int64 and d.image_index.dtype == torch.int64
    assert d.boxes.shape == (len(d.scores), 4) == (len(d.class_ids), 4) == (len(d.image_index), 4)
    return sorted(
        (int(i), *map(float, b), float(s), int(c))
        for i, b, s, c in zip(d.image_index, d.boxes, d.scores, d.class_ids, strict=True)
    )


def assert_rows(got: list[tuple], want: list[tuple]) -> None:
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0] and g[-1] == w[-1]
        np.testing.assert_allclose(g[1:-1], w[1:-1], rtol=1e-5, atol=1e-4)


# the layouts the `exported` fixture writes: YOLOX's and GFL heads place their boxes by the input size
# (test_yolox.py and test_gfl.py decode them), rotated heads are test_obb.py's, pose heads are told by their metadata
# (`task: pose`: test_pose.py, test_keypoints.py on CUDA)
EXPORTED_LAYOUTS = [
    x
    for x in OutputLayout
    if x not in (OutputLayout.AUTO, OutputLayout.YOLOX, OutputLayout.GFL, *ROTATED_LAYOUTS, *KEYPOINT_LAYOUTS)
]


@pytest.mark.parametrize("layout", EXPORTED_LAYOUTS)
def test_each_exported_layout_detected_and_decoded(exported, layout):
    outputs = exported[layout]
    assert detect_layout(outputs, NUM_CLASSES) is layout
    # YOLOv5 scores are objectness (~1 here) * class score
    decoded = decode_outputs(outputs, "auto", 0.25, 100, num_classes=NUM_CLASSES)
    assert_rows(rows(decoded), expected())


def test_yolov5_score_is_objectness_times_class():
    raw = raw_head()
    raw[0, 4, 3] = 0.0  # objectness 0.5 on the first object (image 0, box x1 = 40)
    decoded = decode_outputs(run_onnx(V5Head(), raw, ["output0"]), OutputLayout.YOLOV5, 0.25, 100)
    first = (decoded.image_index == 0) & (decoded.boxes[:, 0] == 40.0)
    assert decoded.scores[first].tolist() == [pytest.approx(0.5 * sigmoid(3.0), rel=1e-5)]


@pytest.mark.parametrize("layout", [OutputLayout.YOLOV8, OutputLayout.YOLOV5, OutputLayout.END2END])
def test_top_k_per_image_and_threshold(exported, layout):
    best = {}
    for row in expected():
        if row[5] > best.get(row[0], (0,) * 7)[5]:
            best[row[0]] = row
    assert_rows(rows(decode_outputs(exported[layout], layout, 0.25, 1)), sorted(best.values()))
    strict = decode_outputs(exported[layout], layout, 0.6, 100)
    assert_rows(rows(strict), [r for r in expected() if r[5] > 0.6])


@pytest.mark.parametrize(
    "layout",
    [OutputLayout.YOLOV8, OutputLayout.YOLOV8_TRANSPOSED, OutputLayout.END2END, OutputLayout.EFFICIENT_NMS],
)
def test_class_filter(exported, layout):
    decoded = decode_outputs(exported[layout], layout, 0.25, 100, class_filter={1})
    if layout in (OutputLayout.YOLOV8, OutputLayout.YOLOV8_TRANSPOSED):
        # a raw head falls back to the best allowed class: image 0 anchor 3 has class 1 at 0.5
        want = expected(allowed={1})
        want = [r for r in want if r[6] == 1 and r[5] > 0.25]
    else:
        want = [r for r in expected() if r[6] == 1]
    assert_rows(rows(decoded), want)
    assert len(decode_outputs(exported[layout], layout, 0.25, 100, class_filter=[]).scores) == 0


def test_efficient_nms_respects_num_detections(exported):
    outputs = dict(exported[OutputLayout.EFFICIENT_NMS])
    outputs["num_detections"] = torch.tensor([[1], [0]], dtype=torch.int32)
    decoded = decode_outputs(outputs, "auto", 0.0, 100)
    assert_rows(rows(decoded), [r for r in expected() if r[0] == 0 and r[6] == 2])


@pytest.mark.parametrize("layout", [OutputLayout.YOLOV8, OutputLayout.YOLOV5, OutputLayout.END2END])
def test_fp16_outputs_decode_in_fp32(exported, layout):
    half = {name: t.half() if t.is_floating_point() else t for name, t in exported[layout].items()}
    decoded = decode_outputs(half, layout, 0.25, 100)
    got, want = rows(decoded), expected()
    assert [(g[0], g[-1]) for g in got] == [(w[0], w[-1]) for w in want]
    np.testing.assert_allclose([g[1:-1] for g in got], [w[1:-1] for w in want], rtol=2e-3, atol=0.1)


def test_nothing_above_threshold_gives_empty_tensors(exported):
    decoded = decode_outputs(exported[OutputLayout.YOLOV8], OutputLayout.YOLOV8, 0.99, 100)
    assert decoded.boxes.shape == (0, 4) and decoded.image_index.shape == (0,)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "layout", EXPORTED_LAYOUTS
)  # the others on CUDA: test_yolox, test_gfl, test_obb, test_keypoints
def test_cuda_matches_cpu(exported, layout):
    outputs = {name: t.cuda() for name, t in exported[layout].items()}
    decoded = decode_outputs(outputs, layout, 0.25, 100, class_filter=[0, 1, 2])
    assert all(t.device.type == "cuda" for t in decoded)
    assert_rows(rows(Decoded(*(t.cpu() for t in decoded))), expected())


@pytest.mark.parametrize(
    ("shapes", "num_classes", "layout"),
    [
        ({"output0": (1, 84, 8400)}, None, OutputLayout.YOLOV8),
        ({"output0": (1, 84, 8400)}, 80, OutputLayout.YOLOV8),
        ({"output0": (4, 6, 8400)}, 2, OutputLayout.YOLOV8),  # 2 classes: 6 channels, anchors larger
        ({"output0": (1, 25200, 85)}, 80, OutputLayout.YOLOV5),
        ({"output0": (1, 8400, 84)}, 80, OutputLayout.YOLOV8_TRANSPOSED),
        ({"output0": (1, 8400, 6)}, 2, OutputLayout.YOLOV8_TRANSPOSED),
        ({"output0": (1, 8400, 6)}, 1, OutputLayout.YOLOV5),
        ({"output0": (1, 300, 6)}, None, OutputLayout.END2END),
        ({"output0": (1, 300, 6)}, 2, OutputLayout.END2END),
        (
            {"output0": (2, 116, 8400), "output1": (2, 32, 160, 160)},
            None,
            OutputLayout.YOLOV8,
        ),  # segmentation
        (
            {"num_dets": (1, 1), "det_boxes": (1, 100, 4), "det_scores": (1, 100), "det_classes": (1, 100)},
            None,
            OutputLayout.EFFICIENT_NMS,
        ),
    ],
)
def test_detect_layout_rules(shapes, num_classes, layout):
    assert detect_layout(shapes, num_classes) is layout


@pytest.mark.parametrize(
    ("shapes", "num_classes", "message"),
    [
        ({"output0": (1, 25200, 85)}, None, "layout explicitly"),
        ({"output0": (1, 8400, 6)}, None, "layout explicitly"),
        ({"output0": (1, 84, 8400)}, 3, "80 classes, not 3"),
        ({"output0": (1, 8400, 84)}, 3, "neither"),
        ({"output0": (-1, 84, -1)}, None, "layout explicitly"),
        ({"a": (1, 2), "b": (1, 3)}, None, "no \\(batch"),
    ],
)
def test_detect_layout_refuses_ambiguous_shapes(shapes, num_classes, message):
    with pytest.raises(ValueError, match=message):
        detect_layout(shapes, num_classes)


def test_explicit_layout_wins_and_enum_lookup():
    assert detect_layout({"output0": (1, 25200, 85)}, None, "YOLOV5") is OutputLayout.YOLOV5
    assert OutputLayout.from_value("End2End") is OutputLayout.END2END
    with pytest.raises(ValueError, match="yolov5, yolov8"):
        OutputLayout.from_value("detr")
    with pytest.raises(ValueError, match="top_k"):
        decode_outputs({"output0": torch.zeros(1, 84, 100)}, "yolov8", 0.25, 0)


def _built_per_frame(*args, **kwargs):
    pytest.fail("a class filter tensor was built on the host for this frame")


def test_class_filter_tensors_are_built_once_per_filter_and_device(exported):
    """The per-frame decode reuses the filter's device tensor: no host-built tensor copied every frame."""
    from tiled_detector.pipeline import decode

    created = []
    real = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        created.append(args)
        return real(self, *args, **kwargs)

    for layout in (OutputLayout.YOLOV8, OutputLayout.END2END):
        first = decode_outputs(exported[layout], layout, 0.25, 100, class_filter=[1, 1])
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.Tensor, "to", counting_to)
            for name in ("tensor", "as_tensor", "zeros"):
                patch.setattr(torch, name, _built_per_frame)
            again = decode_outputs(exported[layout], layout, 0.25, 100, class_filter={1})
        assert rows(again) == rows(first)
    assert created == []
    device = torch.device("cpu")
    assert decode._allowed([2, 0], 3, device) is decode._allowed((0, 2, 2), 3, device)


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from([OutputLayout.YOLOV8, OutputLayout.YOLOV8_TRANSPOSED, OutputLayout.YOLOV5]),
    images=st.integers(1, 3),
    anchors=st.integers(1, 40),
    classes=st.integers(2, 6),
    levels=st.integers(1, 4),  # few distinct scores: ties between classes and anchors are common
    top_k=st.integers(1, 50),
    half=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_class_ids_are_each_kept_anchors_first_best_class(
    layout, images, anchors, classes, levels, top_k, half, seed
):
    # the reference: one max with indices over every anchor (the first of equal scores), then the kept anchors
    generator = torch.Generator().manual_seed(seed)
    first = 5 if layout is OutputLayout.YOLOV5 else 4
    head = torch.randint(0, levels + 1, (images, first + classes, anchors), generator=generator) / levels
    head = head.half() if half else head
    channel_dim = 1
    if layout is not OutputLayout.YOLOV8:
        head, channel_dim = head.transpose(1, 2).contiguous(), 2
    found = decode_padded({"output0": head}, layout, 0.0, top_k)
    scores = head.narrow(channel_dim, first, classes).float()
    if layout is OutputLayout.YOLOV5:
        scores = scores * head[..., 4:5].float()
    best, best_class = scores.max(dim=channel_dim)
    # decode's top-k of the same scores
    anchors_kept = best.topk(min(top_k, anchors), dim=1).indices.reshape(-1)
    assert torch.equal(found.image_index, torch.arange(images).repeat_interleave(min(top_k, anchors)))
    assert torch.equal(found.scores, best[found.image_index, anchors_kept])
    assert torch.equal(found.class_ids, best_class[found.image_index, anchors_kept])


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(
        [OutputLayout.YOLOV8, OutputLayout.YOLOV8_TRANSPOSED, OutputLayout.YOLOV5, OutputLayout.END2END]
    ),
    images=st.integers(1, 3),
    anchors=st.integers(1, 60),
    classes=st.integers(2, 6),
    conf=st.floats(0.0, 0.9),
    listed=st.dictionaries(st.integers(0, 7), st.floats(0.0, 1.0), max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_class_thresholds_equal_filtering_the_unfiltered_candidates(
    layout, images, anchors, classes, conf, listed, seed
):
    # decoding with per-class thresholds keeps exactly the candidates that decoding at the lowest threshold keeps
    # and that are above their class's own (same boxes, same order): a class below its threshold takes no place
    generator = torch.Generator().manual_seed(seed)
    if layout is OutputLayout.END2END:
        head = torch.rand(images, anchors, 6, generator=generator)
        head[..., 5] = torch.randint(0, classes, (images, anchors), generator=generator).float()
    else:
        first = 5 if layout is OutputLayout.YOLOV5 else 4
        head = torch.rand(images, first + classes, anchors, generator=generator)
        if layout is not OutputLayout.YOLOV8:
            head = head.transpose(1, 2).contiguous()
    pairs = tuple(listed.items())
    limit = torch.tensor([listed.get(c, conf) for c in range(max(8, classes))])
    found = decode_outputs({"output0": head}, layout, conf, anchors, class_thresholds=pairs)
    everything = decode_outputs({"output0": head}, layout, min([conf, *listed.values()]), anchors)
    kept = everything.scores > limit[everything.class_ids]
    for got, want in zip(found, everything, strict=True):
        assert torch.equal(got, want[kept])
    if not pairs:
        assert torch.equal(found.scores, decode_outputs({"output0": head}, layout, conf, anchors).scores)


def test_class_thresholds_tensor_is_built_once_per_setting_and_device(exported):
    from tiled_detector.pipeline import decode

    decode._cached_thresholds.cache_clear()
    for _ in range(3):
        decode_padded(exported[OutputLayout.YOLOV8], "yolov8", 0.25, 100, class_thresholds=((1, 0.5),))
    assert decode._cached_thresholds.cache_info().misses == 1
    values = decode._cached_thresholds(((1, 0.5), (3, 0.9)), 0.25, torch.device("cpu"))
    assert values.tolist() == pytest.approx([0.25, 0.5, 0.25, 0.9, 0.25])  # last: every class beyond
