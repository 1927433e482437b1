"""Tests for engines/onnxruntime.py and engines/torch.py against plain ONNX Runtime and torch calls."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from tiled_detector.engines.base import CPU_BATCH, Backend, Precision, load_engine
from tiled_detector.engines.metadata import parse_input_shape, parse_labels
from tiled_detector.engines.onnxruntime import OnnxRuntimeEngine
from tiled_detector.engines.torch import TorchEngine

HW = (16, 16)


class TwoHeads(nn.Module):
    """Two outputs of different shapes, batch-first (a stand-in for multi-output detectors)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y.flatten(2), y.mean((2, 3))


class Bright(nn.Module):
    """A data-dependent output length: the values above 0.9 (ONNX NonZero)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0.9]


def _batch(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.rand(n, 3, *HW, generator=torch.Generator().manual_seed(n)).to(dtype)


def _plain_ort(path, batch: torch.Tensor) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: batch.numpy()})


@pytest.fixture(scope="module")
def two_heads_onnx(export_onnx):
    return export_onnx(TwoHeads(), HW)


def test_onnxruntime_outputs_equal_session_run(two_heads_onnx):
    engine = OnnxRuntimeEngine(two_heads_onnx, max_batch=8)
    assert engine.input.name == "images" and engine.input.shape == (-1, 3, *HW)
    assert engine.max_batch == 8 and engine.fixed_batch is None and engine.precision is Precision.FP32
    assert len(engine.outputs) == 2 and engine.outputs[0].name == "output0"
    assert engine.outputs[0].shape[0] == -1 and engine.outputs[0].dtype == torch.float32
    batch = _batch(5)
    outputs = engine.infer(batch)
    expected = _plain_ort(two_heads_onnx, batch)
    assert list(outputs) == [o.name for o in engine.outputs]
    for got, want in zip(outputs.values(), expected, strict=True):
        assert isinstance(got, torch.Tensor) and got.device == engine.device
        np.testing.assert_array_equal(got.numpy(), want)


def test_onnxruntime_reuses_one_binding_and_output_buffers_at_max_batch(two_heads_onnx, monkeypatch):
    engine = OnnxRuntimeEngine(two_heads_onnx, max_batch=8)
    bindings = []
    io_binding = engine._session.io_binding
    monkeypatch.setattr(engine._session, "io_binding", lambda: bindings.append(1) or io_binding())
    # the static-shaped output (batch, 4); output0's flattened dims are symbolic: ORT allocates it
    bound = {"12"}
    assert set(engine._buffers) == bound
    first = engine.infer(_batch(5))
    pointers = {name: first[name].data_ptr() for name in bound}
    expected = _plain_ort(two_heads_onnx, _batch(3))
    second = engine.infer(_batch(3))  # a smaller batch: the same memory, the leading rows
    assert {name: second[name].data_ptr() for name in bound} == pointers
    assert pointers == {name: engine._buffers[name].data_ptr() for name in bound}
    assert bindings == []  # the binding made at load time serves every call
    for got, want in zip(second.values(), expected, strict=True):
        assert got.shape[0] == 3
        np.testing.assert_array_equal(got.numpy(), want)
    assert engine.reuses_output_buffers  # callers that keep outputs across calls copy them (infer does)


def test_onnxruntime_follows_torchs_current_cuda_stream(two_heads_onnx, monkeypatch):
    from types import SimpleNamespace
    from unittest import mock

    engine = OnnxRuntimeEngine(two_heads_onnx, max_batch=8)
    engine.device, engine._stream = torch.device("cuda", 0), 0xA  # as made on CUDA with stream 0xA
    session = mock.create_autospec(ort.InferenceSession, instance=True)
    engine._session = session
    stream = SimpleNamespace(cuda_stream=0xA)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: stream)
    engine._follow_stream()
    session.set_providers.assert_not_called()  # the stream the session was made with
    stream.cuda_stream = 0xB
    engine._follow_stream()
    engine._follow_stream()
    session.set_providers.assert_called_once_with(
        ["CUDAExecutionProvider", "CPUExecutionProvider"],
        [{"device_id": "0", "user_compute_stream": str(0xB)}, {}],
    )


def test_an_engine_call_takes_at_most_max_batch_images(two_heads_onnx):
    # the frame program cuts a frame's views into calls of at most max_batch (test_program); one call never splits
    engine = OnnxRuntimeEngine(two_heads_onnx, max_batch=3)
    assert engine.infer(_batch(3))["output0"].shape[0] == 3
    with pytest.raises(ValueError, match=r"engine input must be \(1..3, 3, 16, 16\)"):
        engine.infer(_batch(7))
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1, got 0"):
        OnnxRuntimeEngine(two_heads_onnx, max_batch=0)


def test_onnxruntime_fixed_batch_model_is_padded(export_onnx, two_heads_onnx):
    fixed = export_onnx(TwoHeads(), HW, batch=2)
    engine = OnnxRuntimeEngine(fixed, max_batch=32)
    assert engine.fixed_batch == 2 and engine.max_batch == 2
    for size in (1, 2):
        batch = _batch(size)
        got = engine.infer(batch)
        want = OnnxRuntimeEngine(two_heads_onnx).infer(batch)
        for name in want:
            assert got[name].shape == want[name].shape
            torch.testing.assert_close(got[name], want[name])


def test_onnxruntime_dynamic_output_is_wrapped(tmp_path):
    path = tmp_path / "bright.onnx"
    dynamic = {"images": {0: "batch"}, "output0": {0: "count"}}
    torch.onnx.export(
        Bright(),
        (_batch(1),),
        str(path),
        input_names=["images"],
        output_names=["output0"],
        dynamic_axes=dynamic,
        dynamo=False,
    )
    batch = _batch(3)
    got = OnnxRuntimeEngine(path).infer(batch)["output0"]
    np.testing.assert_array_equal(got.numpy(), _plain_ort(path, batch)[0])
    assert got.numel() == int((batch > 0.9).sum())


def test_onnxruntime_fp16_needs_an_fp16_model(two_heads_onnx, tmp_path):
    with pytest.raises(ValueError, match="fp16 needs an fp16 model"):
        OnnxRuntimeEngine(two_heads_onnx, precision=Precision.FP16)
    with pytest.raises(ValueError, match="int8"):
        OnnxRuntimeEngine(two_heads_onnx, precision=Precision.INT8)
    x = onnx.helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT16, ["b", 3, *HW])
    y = onnx.helper.make_tensor_value_info("output0", onnx.TensorProto.FLOAT16, ["b", 3, *HW])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["images", "images"], ["output0"])], "g", [x], [y]
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "half.onnx"
    onnx.save(model, path)
    engine = OnnxRuntimeEngine(path, precision=Precision.FP16)
    assert engine.precision is Precision.FP16 and engine.input.dtype == torch.float16
    batch = _batch(2, torch.float16)
    torch.testing.assert_close(engine.infer(batch)["output0"], batch * 2)


def test_onnxruntime_reads_labels_and_threads(two_heads_onnx, tmp_path):
    model = onnx.load(two_heads_onnx)
    onnx.helper.set_model_props(model, {"names": "{0: 'car', 1: 'person'}"})
    path = tmp_path / "named.onnx"
    onnx.save(model, path)
    assert OnnxRuntimeEngine(path, threads=1).labels == ("car", "person")
    assert OnnxRuntimeEngine(two_heads_onnx).labels is None


def test_engine_rejects_wrong_inputs(two_heads_onnx):
    engine = OnnxRuntimeEngine(two_heads_onnx)
    with pytest.raises(ValueError, match="engine input must be"):
        engine.infer(_batch(1, torch.float64))
    with pytest.raises(ValueError, match="engine input must be"):
        engine.infer(torch.zeros(1, 3, 8, 8))
    with pytest.raises(ValueError, match="cannot run on"):
        OnnxRuntimeEngine(two_heads_onnx, device=torch.device("meta"))


def test_torchscript_outputs_equal_the_module(export_torchscript):
    module = TwoHeads().eval()
    path = export_torchscript(module, HW, labels=["a", "b"])
    engine = TorchEngine(path, max_batch=4)
    assert engine.input.shape == (-1, 3, *HW) and engine.labels == ("a", "b")
    assert [o.name for o in engine.outputs] == ["output0", "output1"]
    assert engine.outputs[0].shape == (-1, 4, HW[0] * HW[1]) and engine.outputs[1].shape == (-1, 4)
    batch = _batch(4)
    got = engine.infer(batch)
    with torch.no_grad():
        want = module(batch)
    torch.testing.assert_close(got["output0"], want[0])
    torch.testing.assert_close(got["output1"], want[1])


def test_yolov8_layout_torchscript_carries_ultralytics_metadata(export_torchscript):
    # bench --peer sahi gives ultralytics the same file: it reads `*/extra/config.txt` from the TorchScript zip
    import zipfile

    from support.networks import SquareDetector

    path = export_torchscript(SquareDetector((64, 64)), (64, 64), labels=["red", "blue"])
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("extra/config.txt")]
        meta = json.loads(archive.read(name))
    assert (
        meta["task"] == "detect" and meta["imgsz"] == [64, 64] and meta["names"] == {"0": "red", "1": "blue"}
    )
    engine = TorchEngine(path)  # our own metadata still read
    assert engine.input.shape == (-1, 3, 64, 64) and engine.labels == ("red", "blue")


def test_torchscript_input_shape_from_option_and_fp16(tmp_path):
    module = TwoHeads().eval()
    path = tmp_path / "plain.pt"
    torch.jit.save(torch.jit.trace(module, _batch(1)), str(path))
    with pytest.raises(ValueError, match=r"does not say its input size .* input_size"):
        TorchEngine(path)
    engine = TorchEngine(path, precision=Precision.FP16, input_shape="-1,3,16,16")
    assert engine.input.dtype == torch.float16 and engine.labels is None
    got = engine.infer(_batch(2, torch.float16))["output1"]
    with torch.no_grad():
        want = module(_batch(2))[1]
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_torch_fp16_on_cuda_runs_channels_last_and_agrees_with_fp32(tmp_path):
    module = TwoHeads().eval()
    path = tmp_path / "plain.pt"
    torch.jit.save(torch.jit.trace(module, _batch(1)), str(path))
    fp32 = TorchEngine(path, device="cuda", input_shape="-1,3,16,16")
    fp16 = TorchEngine(path, device="cuda", precision=Precision.FP16, input_shape="-1,3,16,16")
    # fp32 keeps its layout and results
    assert fp16.memory_format == torch.channels_last and fp32.memory_format == torch.contiguous_format
    batch = _batch(4).cuda()
    want = fp32.infer(batch)["output1"]
    got = fp16.infer(batch.half())["output1"]
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    last = fp16.infer(batch.half().contiguous(memory_format=torch.channels_last))["output1"]
    torch.testing.assert_close(last, got)


def test_torch_engine_reads_a_batch_in_its_layout_without_a_copy(export_torchscript):
    engine = TorchEngine(export_torchscript(TwoHeads().eval(), HW), max_batch=4)
    assert engine.memory_format == torch.contiguous_format  # CPU and fp32 keep NCHW
    module, seen = engine._module, []
    engine._module = lambda batch: seen.append(batch) or module(batch)
    for layout in (torch.contiguous_format, torch.channels_last):
        engine.memory_format = layout  # what fp16 on CUDA sets (channels-last)
        own = _batch(3).contiguous(memory_format=layout)
        other = _batch(3).contiguous(
            memory_format=torch.channels_last
            if layout == torch.contiguous_format
            else torch.contiguous_format
        )
        torch.testing.assert_close(engine.infer(own), engine.infer(other))
        assert seen[-2] is own  # read where it is
        assert seen[-1] is not other and seen[-1].is_contiguous(memory_format=layout)  # converted once


def test_torch_export_program(tmp_path):
    module = TwoHeads().eval()
    batch_dim = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(module, (_batch(2),), dynamic_shapes=({0: batch_dim},))
    path = tmp_path / "model.pt2"
    torch.export.save(program, str(path), extra_files={"labels": "x\ny\n"})
    engine = load_engine(path, max_batch=3)
    assert isinstance(engine, TorchEngine) and engine.backend is Backend.TORCH
    assert engine.input.shape == (-1, 3, *HW) and engine.labels == ("x", "y")
    batch = _batch(3)
    got = engine.infer(batch)
    with torch.no_grad():
        want = module(batch)
    torch.testing.assert_close(got["output0"], want[0])


def test_torch_fixed_batch_from_metadata(tmp_path):
    module = TwoHeads().eval()
    path = tmp_path / "fixed.ts"
    torch.jit.save(torch.jit.trace(module, _batch(2)), str(path), _extra_files={"input_shape": "2,3,16,16"})
    engine = TorchEngine(path, max_batch=16)
    assert engine.fixed_batch == 2 and engine.max_batch == 2
    got = engine.infer(_batch(1))  # padded to the traced batch, the padding's outputs cut off
    with torch.no_grad():
        want = module(_batch(1))
    torch.testing.assert_close(got["output1"], want[1])


def test_load_engine_picks_the_backend_by_suffix(two_heads_onnx, export_torchscript):
    assert isinstance(load_engine(two_heads_onnx), OnnxRuntimeEngine)
    assert isinstance(load_engine(export_torchscript(TwoHeads(), HW)), TorchEngine)


@pytest.fixture
def cuda_without_onnxruntime_cuda(monkeypatch):
    """What a CUDA machine reports where ONNX Runtime without CUDA is installed and TensorRT is not: torch sees a
    GPU; ONNX Runtime lists only its CPU provider (monkeypatched here: this machine has no GPU)."""
    import importlib.util

    import onnxruntime

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorrt" else real_find_spec(name, *a)
    )
    return monkeypatch


def test_auto_on_cuda_chooses_a_backend_that_runs_there(cuda_without_onnxruntime_cuda, tmp_path, caplog):
    """The bundled model on `device: cuda` with ONNX Runtime lacking CUDA and no TensorRT: auto runs the TorchScript
    beside it on torch, said in one INFO line (was: ONNX Runtime, which stops: "cannot run on cuda:0"); with
    ONNX Runtime's CUDA provider, ONNX Runtime; with nothing that runs there, one line saying what is missing."""
    import onnxruntime

    from tiled_detector.engines import base
    from tiled_detector.models import default_model_path

    loaded = []

    class StandIn:  # the engine class the choice loads: records what it was given (no GPU here)
        formats = frozenset(base.ModelFormat)

        def __init__(self, model, **options):
            loaded.append((model, options["device"]))

    cuda_without_onnxruntime_cuda.setattr(
        base, "engine_class", lambda backend: loaded.append(backend) or StandIn
    )
    cuda_without_onnxruntime_cuda.setattr(base, "require_cuda", lambda device, why: None)
    cuda_without_onnxruntime_cuda.setattr(base, "concrete_device", torch.device)
    with caplog.at_level("INFO", logger="tiled_detector.engines.base"):
        load_engine(default_model_path(), "auto", "cuda")
    assert loaded == [Backend.TORCH, (default_model_path("torch"), torch.device("cuda"))]
    said = [r.getMessage() for r in caplog.records if r.name == "tiled_detector.engines.base"]
    assert said == [
        "backend auto on cuda: torch, default.ts (default.ts beside it: ONNX Runtime here has no CUDA execution "
        "provider, TensorRT is not installed)"
    ]
    cuda_without_onnxruntime_cuda.setattr(
        onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    assert base.choose_backend(default_model_path(), "auto", "cuda").backend is Backend.ONNXRUNTIME
    alone = tmp_path / "alone.onnx"
    alone.write_bytes(default_model_path().read_bytes())
    cuda_without_onnxruntime_cuda.setattr(
        onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"]
    )
    with pytest.raises(
        ValueError, match=r"backend auto on cuda: nothing here runs alone\.onnx on CUDA"
    ) as error:
        base.choose_backend(alone, "auto", "cuda")
    assert "onnxruntime-gpu" in str(error.value) and "\n" not in str(error.value)
    assert base.choose_backend(default_model_path(), "auto", "cpu").backend is Backend.ONNXRUNTIME  # as ever
    assert base.choose_backend(default_model_path(), "onnxruntime", "cuda").model == default_model_path()


def test_onnxruntime_threads_spin_within_a_run_only_and_use_its_arena(two_heads_onnx):
    # spinning between a run's operators (ONNX Runtime faster: bundled model, 1080p, 36 -> 32 ms), stopped when
    # a run returns (torch's work follows on the same cores); the arena keeps a huge frame's many calls from
    # fragmenting the heap
    options = OnnxRuntimeEngine(two_heads_onnx)._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert options.enable_cpu_mem_arena


def test_a_cpu_engine_takes_at_most_cpu_batch_images_per_call(two_heads_onnx, export_torchscript, tmp_path):
    torchscript = export_torchscript(TwoHeads(), HW)
    assert load_engine(two_heads_onnx).max_batch == CPU_BATCH  # max_batch 32 on a CPU: the cache-sized call
    assert load_engine(torchscript).max_batch == CPU_BATCH
    assert load_engine(two_heads_onnx, max_batch=2).max_batch == 2
    assert load_engine(two_heads_onnx, max_batch=16, cpu_batch=8).max_batch == 8
    fixed = tmp_path / "fixed.ts"  # a static batch is the model's, whatever the cap
    torch.jit.save(
        torch.jit.trace(TwoHeads().eval(), _batch(6)), str(fixed), _extra_files={"input_shape": "6,3,16,16"}
    )
    assert load_engine(fixed).max_batch == 6
    with pytest.raises(ValueError, match="cpu_batch must be >= 1"):
        load_engine(two_heads_onnx, cpu_batch=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("-1,3,640,640", (-1, 3, 640, 640)), ([4, 3, 32, 48], (4, 3, 32, 48)), ("1, 3, 8, 8", (1, 3, 8, 8))],
)
def test_parse_input_shape(text, expected):
    assert parse_input_shape(text) == expected


@pytest.mark.parametrize("text", ["3,640,640", "0,3,8,8", "-2,3,8,8", "1,3,0,8", "a,b,c,d"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(ValueError, match="input_shape must be"):
        parse_input_shape(text)


def test_parse_labels():
    assert parse_labels(json.dumps(["a", "b"])) == ("a", "b")
    assert parse_labels("a\n\n b \n") == ("a", "b")
    assert parse_labels("  ") is None


def test_onnxruntime_dynamic_height_width_from_imgsz_metadata_or_option(tmp_path):
    """ultralytics `export(dynamic=True)` makes H and W dynamic and stores `imgsz` in the metadata."""
    path = tmp_path / "dynamic_hw.onnx"
    dynamic = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch"}}
    torch.onnx.export(
        nn.Conv2d(3, 4, 1),
        (torch.rand(1, 3, 32, 48),),
        str(path),
        input_names=["images"],
        output_names=["output0"],
        dynamic_axes=dynamic,
        dynamo=False,
    )
    with pytest.raises(
        ValueError, match=r"no imgsz metadata: give the model.s input size with the setting input_size"
    ):
        OnnxRuntimeEngine(path)
    assert OnnxRuntimeEngine(path, input_hw=(32, 48)).input_hw == (32, 48)
    model = onnx.load(path)
    model.metadata_props.add(key="imgsz", value="[32, 48]")
    onnx.save(model, path)
    engine = OnnxRuntimeEngine(path)
    assert engine.input.shape[1:] == (3, 32, 48)
    batch = torch.rand(2, 3, 32, 48)
    np.testing.assert_allclose(engine.infer(batch)["output0"].numpy(), _plain_ort(path, batch)[0], rtol=1e-6)


def test_torch_engine_module_imports_without_torch_export_passes(monkeypatch, export_torchscript):
    """JetPack 6 torch wheels may lack torch.export.passes: TorchScript models must still load."""
    import importlib.util
    import sys

    import tiled_detector.engines.torch as torch_engine

    monkeypatch.setitem(sys.modules, "torch.export.passes", None)  # makes `import torch.export.passes` fail
    spec = importlib.util.spec_from_file_location("_torch_engine_without_passes", torch_engine.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    engine = module.TorchEngine(export_torchscript(TwoHeads().eval(), HW), max_batch=4)
    assert engine.input.shape == (-1, 3, *HW)


class _ConvBn(nn.Module):
    """Convolutions each followed by a BatchNorm with non-trivial statistics, then a 1x1 head."""

    def __init__(self) -> None:
        super().__init__()
        layers = []
        for cin, cout in ((3, 8), (8, 8)):
            bn = nn.BatchNorm2d(cout)
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), bn, nn.ReLU()]
        self.body = nn.Sequential(*layers, nn.Conv2d(8, 6, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).flatten(2)


def _batch_norms(module: torch.jit.ScriptModule) -> int:
    return sum("batch_norm" in node.kind() for node in module.inlined_graph.nodes())


def test_torchscript_batchnorms_after_convolutions_run_folded(export_torchscript):
    """A TorchScript's BatchNorms are folded into the convolutions at load (frozen): none is left in the forward,
    and the outputs equal the module's within float32 rounding."""
    torch.manual_seed(0)
    model = _ConvBn().eval()
    path = export_torchscript(model, (32, 32))
    assert _batch_norms(torch.jit.load(str(path))) == 2
    engine = TorchEngine(path, precision=Precision.FP32)
    assert _batch_norms(engine._module) == 0
    batch = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(batch)
    torch.testing.assert_close(engine.infer(batch)["output0"], expected, rtol=1e-5, atol=1e-5)


def test_a_torchscript_freezing_refuses_runs_unfrozen_with_one_info_line(
    export_torchscript, monkeypatch, caplog
):
    """Bad input: a module torch.jit.freeze refuses runs as it is (its BatchNorms unfolded), with one INFO line."""
    import logging

    path = export_torchscript(_ConvBn().eval(), (32, 32))

    def refuse(module, *args, **kwargs):
        raise RuntimeError("attributes mutated in forward\nmore")

    monkeypatch.setattr(torch.jit, "freeze", refuse)
    with caplog.at_level(logging.INFO, logger="tiled_detector.engines.torch"):
        engine = TorchEngine(path, precision=Precision.FP32)
    assert _batch_norms(engine._module) == 2
    lines = [r.getMessage() for r in caplog.records if "not frozen" in r.getMessage()]
    assert len(lines) == 1 and "attributes mutated in forward" in lines[0] and "more" not in lines[0]


@pytest.mark.parametrize("name", ["default.ts", "obb.ts"])
def test_the_bundled_torchscripts_ship_folded(name):
    """The bundled models have no BatchNorm left (folded into their convolutions when they were exported)."""
    from pathlib import Path

    from tiled_detector.models import __file__ as models

    assert _batch_norms(torch.jit.load(str(Path(models).parent / name))) == 0
