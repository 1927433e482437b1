"""Batch-1 ONNX exports run as one batch: the rewrite to a dynamic batch, its proof against per-view calls, the
cache, the fallback to view-by-view calls, and TensorRT builds from the rewrite."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tiled_detector import TiledDetector
from tiled_detector.engines import tensorrt_build
from tiled_detector.engines.base import load_engine
from tiled_detector.engines.rebatch import dynamic_batch_model, fixed_batch_one, rebatched
from tiled_detector.engines.tensorrt_build import BuildOptions
from tiled_detector.tools.worlds.synthetic import make_scene


class FlatHead(nn.Module):
    """A detector-shaped model whose export carries batch-1 Reshape constants (YOLOX's `flatten` of each level):
    (B, 3, 32, 32) -> (B, 16, 6) rows."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=8, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.conv(x))  # (B, 6, 4, 4)
        return y.reshape(x.shape[0], 6, 16).permute(0, 2, 1)


class BatchMixer(FlatHead):
    """Batch-1 is the only size it is right at: each view's rows are averaged with every other view's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = super().forward(x)
        return rows.reshape(1, -1).mean(0, keepdim=True).reshape(1, 16, 6)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "tiled_detector" / "engines"


def test_a_batch_one_export_is_rewritten_proven_cached_and_run_as_one_batch(
    export_onnx, cache, caplog
) -> None:
    torch.manual_seed(0)
    path = export_onnx(FlatHead(), (32, 32), batch=1)
    model = onnx.load(str(path))
    assert fixed_batch_one(model)
    reshapes = [n for n in model.graph.node if n.op_type == "Reshape"]
    assert reshapes  # the export holds the batch-1 constants the rewrite must change
    assert not fixed_batch_one(rebatched(model))
    with caplog.at_level(logging.INFO):
        engine = load_engine(path, "onnxruntime", "cpu", max_batch=8)
    assert engine.max_batch == 4 and engine.fixed_batch is None  # the CPU's calls of 4
    cached = sorted(cache.glob("*-batch-*.onnx"))
    assert len(cached) == 1 and not fixed_batch_one(onnx.load(str(cached[0])))
    assert sum("rewritten to a dynamic batch" in r.getMessage() for r in caplog.records) == 1
    batch = torch.rand(3, 3, 32, 32)
    together = engine.infer(batch)["output0"].clone()
    single = load_engine(path, "onnxruntime", "cpu", max_batch=1)  # the original file, view by view
    assert single.max_batch == 1
    alone = torch.cat([single.infer(batch[i : i + 1])["output0"].clone() for i in range(3)])  # buffers reused
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert dynamic_batch_model(path) == cached[0]  # found, not made again
    assert not any("rewritten" in r.getMessage() for r in caplog.records)


def test_a_rewrite_that_is_not_equal_runs_view_by_view_and_caches_nothing(
    export_onnx, cache, caplog, monkeypatch
) -> None:
    torch.manual_seed(0)
    path = export_onnx(BatchMixer(), (32, 32), batch=1)
    torch.manual_seed(0)  # the same weights: one view at a time, the mixer is this head
    same_head = export_onnx(FlatHead(), (32, 32))
    options = dict(backend="onnxruntime", tile_size=(32, 32), input_size=(32, 32), layout="yolov8_transposed")
    with caplog.at_level(logging.INFO):
        detector = TiledDetector(path, labels=["a", "b"], **options)
    assert detector.engine.max_batch == 1
    why = [r.getMessage() for r in caplog.records if "cannot be made dynamic" in r.getMessage()]
    assert len(why) == 1 and "each view is an engine call" in why[0]
    assert not list(cache.glob("*.onnx"))  # nothing cached (the folder may not exist)
    calls: list[int] = []
    infer = detector.engine.infer

    def counted(batch: torch.Tensor) -> dict[str, torch.Tensor]:
        calls.append(len(batch))
        return infer(batch)

    monkeypatch.setattr(detector.engine, "infer", counted)
    frame = make_scene(0, 80, 60).image
    found = detector.detect(frame)
    batched = TiledDetector(same_head, labels=["a", "b"], **options)
    assert batched.engine.max_batch > 1
    want = batched.detect(frame)
    assert len(calls) > 1 and set(calls) == {1}  # every view, one per call
    assert len(want.scores) > 0
    np.testing.assert_allclose(found.boxes, want.boxes, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(found.scores, want.scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(found.class_ids, want.class_ids)


def resize_to_constant_sizes(path: Path) -> Path:
    """A batch-1 graph as PyTorch 1.x exported `F.interpolate(size=...)` (NanoDet's FPN): a Resize to the constant
    `sizes` [1, C, h, w], then a Reshape of batch-1 constants: (1, 3, 8, 8) -> (1, 256, 4); its weights listed as
    graph inputs too, as that exporter and Paddle2ONNX list them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 3, 1, 1)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1, 4, 16, 16], np.int64), "sizes"),
        numpy_helper.from_array(np.zeros(0, np.float32), "empty"),  # opset 11's roi and scales, unused
        numpy_helper.from_array(np.array([1, 4, 256], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["images", "w"], ["c"]),
        helper.make_node(
            "Resize",
            ["c", "empty", "empty", "sizes"],
            ["r"],
            mode="linear",
            coordinate_transformation_mode="pytorch_half_pixel",
        ),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("Transpose", ["f"], ["output0"], perm=[0, 2, 1]),
    ]
    inputs = [
        helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 1, 1]),
    ]
    outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 256, 4])]
    graph = helper.make_graph(nodes, "resize", inputs, outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6), str(path))
    return path


def test_a_resize_to_constant_batch_one_sizes_is_rewritten_to_scales_and_proven(tmp_path, cache) -> None:
    path = resize_to_constant_sizes(tmp_path / "resize.onnx")
    rewritten = rebatched(onnx.load(str(path)))
    resize = next(n for n in rewritten.graph.node if n.op_type == "Resize")
    assert len(resize.input) == 3 and resize.input[2]  # by scales now, which follow the batch
    assert [i.name for i in rewritten.graph.input] == ["images"]  # the weights are constants to fold
    engine = load_engine(path, "onnxruntime", "cpu", max_batch=4)
    assert engine.max_batch == 4 and engine.fixed_batch is None  # proven equal, so one call per 4 views
    batch = torch.rand(3, 3, 8, 8)
    single = load_engine(path, "onnxruntime", "cpu", max_batch=1)
    alone = torch.cat([single.infer(batch[i : i + 1])["output0"].clone() for i in range(3)])
    torch.testing.assert_close(engine.infer(batch)["output0"], alone, rtol=1e-5, atol=1e-6)


def test_a_reshaped_weight_keeps_its_shape(tmp_path, cache) -> None:
    """ONNX Runtime's dynamic quantization adds each conv's bias as a weight reshaped to (1, -1, 1, 1): a weight has
    no batch, so that Reshape stays (the old rewrite made it (0, -1, 1, 1): the bias's length as the batch)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w"),
        numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias"),
        numpy_helper.from_array(np.array([1, -1, 1, 1], np.int64), "bias_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["images", "w"], ["c"]),
        helper.make_node("Reshape", ["bias", "bias_shape"], ["b"]),
        helper.make_node("Add", ["c", "b"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bias",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    path = tmp_path / "bias.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7), str(path))
    engine = load_engine(path, "onnxruntime", "cpu", max_batch=4)
    assert engine.max_batch == 4 and engine.fixed_batch is None  # proven equal: one call per 4 views
    batch = torch.rand(3, 3, 8, 8)
    torch.testing.assert_close(
        engine.infer(batch)["output0"], batch.sum(1, keepdim=True) + torch.arange(4.0)[:, None, None]
    )


def test_tensorrt_builds_a_batch_one_export_from_its_rewrite(export_onnx, cache, monkeypatch) -> None:
    path = export_onnx(FlatHead(), (32, 32), batch=1)
    built: list[tuple[Path, BuildOptions]] = []

    def build(trt, logger, model_path, options, device, progress):
        built.append((Path(model_path), options))
        return b"engine"

    monkeypatch.setattr(tensorrt_build, "build_serialized", build)
    monkeypatch.setattr(tensorrt_build, "deserialize", lambda runtime, data: ("engine", data))
    trt = types.SimpleNamespace(__version__="10.3.0")
    options = BuildOptions(max_batch=8, opt_batch=4)
    engine, _ = tensorrt_build.load_or_build(
        trt, None, None, path, options, torch.device("cpu"), None, None, ("GPU", (8, 7))
    )
    assert engine == ("engine", b"engine")
    ((model_path, used),) = built
    assert model_path != path and not fixed_batch_one(onnx.load(str(model_path)))
    assert used.max_batch == 8
    # a model whose rewrite is not proven builds for one image per call
    mixer = export_onnx(BatchMixer(), (32, 32), batch=1)
    tensorrt_build.load_or_build(
        trt, None, None, mixer, options, torch.device("cpu"), None, None, ("GPU", (8, 7))
    )
    assert built[-1][0] == mixer and (built[-1][1].max_batch, built[-1][1].opt_batch) == (1, 1)


def test_engine_calls_per_frame_in_bench(export_onnx, cache) -> None:
    from tiled_detector.tools.benchmark import Row, measure

    path = export_onnx(FlatHead(), (32, 32), batch=1)
    detector = TiledDetector(
        path,
        backend="onnxruntime",
        tile_size=(32, 32),
        input_size=(32, 32),
        layout="yolov8_transposed",
        labels=["a", "b"],
    )
    frame = make_scene(0, 200, 100).image
    row = measure(detector, frame, runs=2, warmup=0, row=Row("onnxruntime", "fp32", "200x100"))
    views = detector.plan_for(100, 200).batch_size
    assert row.values["engine_calls"] == -(-views // 4) < views
    assert np.isfinite(row.values["total_ms"])
