"""TensorRT backend and builder, against doubles made from the REAL TensorRT 11.4 lean bindings.

What is NOT executed here (no GPU on this machine): a real engine build, deserialization of a real engine,
kernels, CUDA streams and events. `current_stream`, `new_event` and `allocate` are replaced by CPU stand-ins;
call order, arguments and buffer handling are checked. Builder / network / parser / config / calibrator and
the TensorRT 8 builder flags do not exist in the lean package: their fakes below use method names checked in
NVIDIA's TensorRT Python API documentation (8.4, 10.x, 11.0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import re
import types
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from tiled_detector.commands.progress import TextProgress
from tiled_detector.engines import base as engine_base
from tiled_detector.engines import tensorrt as trt_mod
from tiled_detector.engines import tensorrt_api as api_mod
from tiled_detector.engines import tensorrt_build as build_mod
from tiled_detector.engines.base import Precision
from tiled_detector.engines.cache import sha256_file
from tiled_detector.engines.onnx_model import INT8_NEEDS_QDQ, has_qdq, onnx_input
from tiled_detector.engines.quantize import quantize_onnx
from tiled_detector.engines.tensorrt import TensorRTEngine, TensorRTError, checked
from tiled_detector.engines.tensorrt_build import (
    PRECISION_ACTIONS,
    BuildActions,
    BuildOptions,
    FeatureSet,
    feature_set,
    to_fp16,
)

trt = pytest.importorskip("tensorrt_lean_bindings")
C, H, W = 3, 32, 32
MAX_BATCH = 8


# --- strict doubles ---------------------------------------------------------------------------------------


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch in "[(") - (ch in "])")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p.strip() for p in [*parts, current] if p.strip()]


def pybind_signatures(func: Any) -> list[inspect.Signature]:
    """Signatures (self excluded) of every overload listed in a pybind11 docstring."""
    sigs: list[inspect.Signature] = []
    if not callable(func) or not hasattr(func, "__name__"):
        return sigs
    for match in re.finditer(rf"^(?:\d+\. )?{func.__name__}\((.*)\) -> ", func.__doc__ or "", re.MULTILINE):
        params = []
        for part in _split_top(match.group(1))[1:]:
            name = part.split(":")[0].split("=")[0].strip()
            default = None if "=" in part else inspect.Parameter.empty
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
        sigs.append(inspect.Signature(params))
    return sigs


def strict(cls: type) -> Any:
    """create_autospec(cls, instance=True) whose methods also reject arguments the real binding rejects."""
    double = mock.create_autospec(cls, instance=True)
    for name in dir(cls):
        sigs = [] if name.startswith("_") else pybind_signatures(getattr(cls, name))
        if sigs:

            def check(*args: Any, _sigs: list = sigs, _name: str = name, **kwargs: Any) -> Any:
                for sig in _sigs:
                    try:
                        sig.bind(*args, **kwargs)
                        return mock.DEFAULT
                    except TypeError:
                        continue
                raise TypeError(f"{cls.__name__}.{_name}{args}{kwargs} matches no real signature")

            getattr(double, name).side_effect = check
    return double


def test_strict_double_rejects_wrong_arguments() -> None:
    context = strict(trt.IExecutionContext)
    assert context.set_tensor_address("x", 1) is not None
    with pytest.raises(TypeError, match="matches no real signature"):
        context.set_tensor_address("x", 1, 2)
    with pytest.raises(TypeError):
        context.execute_async_v3(stream=1)
    with pytest.raises(AttributeError):
        context.execute_async_v2  # noqa: B018 - not in TensorRT 11


ACTIVATION_BYTES = 4096  # the engine double's device_memory_size_v2
ALIGNMENT = 256  # setTensorAddress: "The pointer must have at least 256-byte alignment" (NvInferRuntime.h)


class Contexts(list):
    """The execution context doubles an engine double made, in order of creation."""

    def of(self, batch: int) -> Any:
        """The one context whose input shape was set to `batch` images."""
        (found,) = [
            c for c in self if any(call.args[1][0] == batch for call in c.set_input_shape.call_args_list)
        ]
        return found


def context_double(outputs: dict[str, tuple[int, ...]]) -> Any:
    """An IExecutionContext double: its output shapes follow the input shape set on it."""
    context = strict(trt.IExecutionContext)
    shapes: dict[str, tuple[int, ...]] = {}

    def set_input_shape(name: str, shape: Any) -> bool:
        shapes[name] = tuple(shape)
        return True

    context.set_input_shape.side_effect = set_input_shape
    context.get_tensor_shape.side_effect = lambda n: trt.Dims((shapes["images"][0], *outputs[n]))
    context.set_tensor_address.side_effect = None
    context.set_tensor_address.return_value = True
    context.execute_async_v3.side_effect = None
    context.execute_async_v3.return_value = True
    return context


def named_engine(
    outputs: dict[str, tuple[int, ...]], fixed_batch: int | None = None, min_batch: int = 1
) -> tuple[Any, Contexts]:
    """An ICudaEngine double for one input 'images' and `outputs` (shapes after batch), its one optimization profile
    taking `min_batch`..MAX_BATCH images, and the execution context doubles it makes (a new one at every
    create_execution_context, called as the real binding accepts)."""
    engine = strict(trt.ICudaEngine)
    engine.num_optimization_profiles = 1
    names = ["images", *outputs]
    batch_dim = fixed_batch or -1
    engine.num_io_tensors = len(names)
    engine.device_memory_size_v2 = ACTIVATION_BYTES
    engine.get_tensor_name.side_effect = None
    engine.get_tensor_name.side_effect = names.__getitem__
    engine.get_tensor_mode.side_effect = lambda n: (
        trt.TensorIOMode.INPUT if n == "images" else trt.TensorIOMode.OUTPUT
    )
    engine.get_tensor_shape.side_effect = lambda n: trt.Dims(
        (batch_dim, C, H, W) if n == "images" else (batch_dim, *outputs[n])
    )
    engine.get_tensor_dtype.side_effect = lambda n: trt.DataType.FLOAT
    top = fixed_batch or MAX_BATCH
    engine.get_tensor_profile_shape.side_effect = lambda n, p: [
        trt.Dims((fixed_batch or min_batch, C, H, W)),
        trt.Dims((top, C, H, W)),
        trt.Dims((top, C, H, W)),
    ]
    contexts = Contexts()
    signature = engine.create_execution_context.side_effect  # raises for arguments the binding rejects

    def create_execution_context(*args: Any, **kwargs: Any) -> Any:
        signature(*args, **kwargs)
        contexts.append(context_double(outputs))
        return contexts[-1]

    engine.create_execution_context.side_effect = create_execution_context
    return engine, contexts


class Cuda(types.SimpleNamespace):
    """The CPU stand-ins of the CUDA touch points, and what was done with them."""

    event: mock.Mock  # the engine's done event
    current: mock.Mock  # torch's current stream
    capturing: bool  # whether torch's current stream is capturing a CUDA graph
    own: mock.Mock  # the engine's own stream
    kept: list  # (tensor, stream) of every keep_alive
    device: list  # the current device: its last entry (made_current pushes and pops)


@pytest.fixture
def cpu_cuda(monkeypatch: pytest.MonkeyPatch) -> Cuda:
    """CPU stand-ins for the CUDA touch points; torch's current stream is not a default stream."""
    cuda = Cuda(
        event=mock.Mock(name="event"),
        current=mock.Mock(name="current", cuda_stream=0xC0FFEE),
        capturing=False,
        own=mock.Mock(name="own", cuda_stream=0x5EED),
        kept=[],
        device=[0],
    )

    @contextlib.contextmanager
    def made_current(device: torch.device) -> Any:
        cuda.device.append(device.index)
        yield
        cuda.device.pop()

    monkeypatch.setattr(trt_mod, "current_stream", lambda device: cuda.current)
    monkeypatch.setattr(trt_mod, "new_event", lambda: cuda.event)
    monkeypatch.setattr(trt_mod, "allocate", lambda shape, dtype, device: torch.empty(shape, dtype=dtype))
    # (raising=False: the names the old engine lacked, so that its tests fail for what they check)
    monkeypatch.setattr(trt_mod, "new_stream", lambda device: cuda.own, raising=False)
    monkeypatch.setattr(trt_mod, "keep_alive", lambda t, stream: cuda.kept.append((t, stream)), raising=False)
    monkeypatch.setattr(trt_mod, "made_current", made_current, raising=False)
    monkeypatch.setattr(trt_mod, "capturing", lambda device: cuda.capturing, raising=False)
    monkeypatch.setattr(engine_base, "same_device", lambda have, want: True)  # CPU memory stands in for CUDA
    return cuda


def make_engine(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    engine: Any,
    module: Any = trt,
    runtime: Any = None,
    device: str = "cuda",
    **kw: Any,
):
    if runtime is None:
        runtime = strict(trt.Runtime)
        runtime.deserialize_cuda_engine.side_effect = None
        runtime.deserialize_cuda_engine.return_value = engine
    runtime_cls = mock.create_autospec(trt.Runtime)
    runtime_cls.return_value = runtime
    fake_module = types.SimpleNamespace(**{**vars(module), "Runtime": runtime_cls})
    monkeypatch.setattr(trt_mod, "import_tensorrt", lambda: fake_module)
    path = tmp_path / "model.engine"
    path.write_bytes(b"serialized")
    result = TensorRTEngine(path, device=torch.device(device), max_batch=kw.pop("max_batch", MAX_BATCH), **kw)
    runtime.deserialize_cuda_engine.assert_called_once_with(b"serialized")
    return result


# --- runtime ------------------------------------------------------------------------------------------------


def test_import_tensorrt_falls_back_to_the_lean_bindings() -> None:
    module = api_mod.import_tensorrt()
    assert module.__name__ in api_mod.TENSORRT_MODULES
    assert api_mod.trt_version(module)[0] >= 8


def test_import_tensorrt_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_mod, "TENSORRT_MODULES", ("no_such_trt_module",))
    with pytest.raises(ImportError, match="python3-libnvinfer"):
        api_mod.import_tensorrt()


def test_checked_turns_false_none_and_exceptions_into_tensorrt_errors() -> None:
    assert checked(lambda: 3, what="x") == 3
    with pytest.raises(TensorRTError, match="set_input_shape"):
        checked(lambda: False, what="set_input_shape")
    with pytest.raises(TensorRTError, match="returned None"):
        checked(lambda: None, what="deserialize")

    def boom() -> None:
        raise RuntimeError("bad shape")

    with pytest.raises(TensorRTError, match="bad shape"):
        checked(boom, what="x")


def test_specs_and_buffers_from_the_engine(monkeypatch, tmp_path, cpu_cuda) -> None:
    engine, _ = named_engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    assert (
        eng.input.name == "images" and eng.input.shape == (-1, C, H, W) and eng.input.dtype == torch.float32
    )
    assert [o.name for o in eng.outputs] == ["output0"]
    assert eng.max_batch == MAX_BATCH and eng.device == torch.device("cuda", 0)
    view = eng.input_buffer(3)
    assert view.shape == (3, C, H, W) and view.data_ptr() == eng.input_buffer(MAX_BATCH).data_ptr()
    assert eng.input_buffer(MAX_BATCH + 1) is None  # the base contract: infer splits such a batch
    with pytest.raises(ValueError, match="batch must be >= 1"):
        eng.input_buffer(0)


@pytest.mark.parametrize(("max_batch", "opt_batch"), [(32, 9), (4, 4)])
def test_onnx_build_uses_the_build_engine_default_opt_batch(
    monkeypatch, tmp_path, cpu_cuda, max_batch, opt_batch
) -> None:
    """The node (TensorRTEngine on an .onnx) and `tiled-detector build-engine` hash to the same cache entry."""
    import argparse

    from tiled_detector.commands.build_engine import add_arguments

    engine, _ = named_engine({"output0": (84, 21)})
    built = []

    def load_or_build(trt_module, runtime, logger, model, options, device, cache_dir):
        built.append(options)
        return engine, tmp_path / "cached.engine"

    monkeypatch.setattr(build_mod, "load_or_build", load_or_build)
    runtime = mock.Mock()
    monkeypatch.setattr(
        trt_mod, "import_tensorrt", lambda: types.SimpleNamespace(**{**vars(trt), "Runtime": runtime})
    )
    model = tmp_path / "model.onnx"
    onnx.save(conv_model(), str(model))
    TensorRTEngine(model, device=torch.device("cuda"), max_batch=max_batch)
    assert built[0].max_batch == max_batch and built[0].opt_batch == opt_batch
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cli = parser.parse_args([str(model), "--max-batch", str(max_batch)])
    assert cli.opt_batch is None  # the command then uses the same default as the engine:
    assert min(build_mod.BuildOptions.opt_batch, cli.max_batch) == opt_batch


ENQUEUE_CALLS = {"set_input_shape", "set_tensor_address", "execute_async_v3"}


def enqueue_calls(context: Any) -> list[Any]:
    """A context double's calls that set shapes and addresses and enqueue, in order."""
    return [c for c in context.mock_calls if c[0] in ENQUEUE_CALLS]


def test_call_order_addresses_and_stream(monkeypatch, tmp_path, cpu_cuda) -> None:
    engine, contexts = named_engine({"output0": (84, 21), "aux": (5,)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    batch = eng.input_buffer(3)
    batch.copy_(torch.rand(3, C, H, W))
    out = eng.infer(batch)
    assert out["output0"].shape == (3, 84, 21) and out["aux"].shape == (3, 5)
    assert enqueue_calls(contexts.of(3)) == [
        mock.call.set_input_shape("images", (3, C, H, W)),
        mock.call.set_tensor_address("images", batch.data_ptr()),  # preprocessed in place: no copy
        mock.call.set_tensor_address("output0", out["output0"].data_ptr()),
        mock.call.set_tensor_address("aux", out["aux"].data_ptr()),
        mock.call.execute_async_v3(cpu_cuda.current.cuda_stream),
    ]
    cpu_cuda.event.record.assert_called_once_with(cpu_cuda.current)


def test_outputs_are_allocated_once_at_the_profile_maximum(monkeypatch, tmp_path, cpu_cuda) -> None:
    allocated: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        trt_mod,
        "allocate",
        lambda shape, dtype, device: allocated.append(shape) or torch.empty(shape, dtype=dtype),
    )
    engine, contexts = named_engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    # input, the contexts' activations and output, at the profile maximum
    assert allocated == [(MAX_BATCH, C, H, W), (ACTIVATION_BYTES,), (MAX_BATCH, 84, 21)]
    first = eng.infer(torch.rand(4, C, H, W))["output0"].data_ptr()
    assert eng.infer(torch.rand(4, C, H, W))["output0"].data_ptr() == first
    changed = eng.infer(torch.rand(2, C, H, W))["output0"]
    # a smaller batch writes into the same memory: TensorRT is given the same address every call
    assert changed.shape[0] == 2 and changed.data_ptr() == first
    addresses = {
        c.args[1]
        for context in (contexts.of(4), contexts.of(2))
        for c in context.set_tensor_address.call_args_list
        if c.args[0] == "output0"
    }
    assert addresses == {first}
    assert len(allocated) == 3


def test_every_call_enqueues_on_torchs_current_stream_with_fixed_addresses(
    monkeypatch, tmp_path, cpu_cuda
) -> None:
    """What a CUDA graph capture needs of the engine: the work goes to the stream current at the call (the
    capture stream while capturing) and a repeated batch binds the same memory, allocating nothing."""
    engine, contexts = named_engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    assert eng.capturable
    cpu_cuda.capturing = True
    capture_stream = mock.Mock(name="capture", cuda_stream=0xCAB)
    monkeypatch.setattr(trt_mod, "current_stream", lambda device: capture_stream)
    monkeypatch.setattr(
        trt_mod, "allocate", mock.Mock(side_effect=AssertionError("allocated while capturing"))
    )
    batch = eng.input_buffer(MAX_BATCH)
    first = eng.infer(batch)["output0"].data_ptr()
    second = eng.infer(batch)["output0"].data_ptr()
    assert first == second
    context = contexts.of(MAX_BATCH)
    assert [c.args for c in context.execute_async_v3.call_args_list] == [(0xCAB,), (0xCAB,)]
    cpu_cuda.event.record.assert_called_with(capture_stream)
    # the capture stream itself: no fork to another stream, no wait on an event from outside the capture
    capture_stream.wait_event.assert_not_called()
    bound = [c.args for c in context.set_tensor_address.call_args_list]
    assert bound[:2] == bound[2:] == [("images", batch.data_ptr()), ("output0", first)]


class Inspector:
    """The engine inspector's part used here (the lean bindings have no IEngineInspector class): TensorRT's Python
    API, EngineInspector (execution_context, get_engine_information)."""

    execution_context: Any = None

    def get_engine_information(self, format: Any) -> str: ...


def inspected_engine(layers: list[dict[str, Any]]) -> tuple[Any, Contexts, Any]:
    """An engine double built with detailed profiling verbosity whose inspector reports `layers`."""
    engine, contexts = named_engine({"output0": (84, 21)})
    engine.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    inspector = mock.create_autospec(Inspector, instance=True)
    inspector.execution_context = None
    inspector.get_engine_information.return_value = json.dumps({"Layers": layers})
    engine.create_engine_inspector.side_effect = None
    engine.create_engine_inspector.return_value = inspector
    return engine, contexts, inspector


def test_prebuilt_engine_reports_the_precision_it_was_built_with(
    monkeypatch, tmp_path, cpu_cuda, caplog
) -> None:
    layers = [
        {
            "Name": "conv",
            "Inputs": [{"Format/Datatype": "Row major linear FP32"}],
            "Outputs": [{"Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
        },
    ]
    engine, _, inspector = inspected_engine(layers)
    eng = make_engine(monkeypatch, tmp_path, engine, precision=Precision.FP32)
    assert eng.precision is Precision.FP16  # read from the engine, not the setting echoed back
    inspector.get_engine_information.assert_called_once_with(trt.LayerInformationFormat.JSON)
    assert "was built for fp16" in caplog.text
    # an engine without layer details says nothing about fp16 inside: the setting, with a warning
    plain, _ = named_engine({"output0": (84, 21)})
    assert make_engine(monkeypatch, tmp_path, plain, precision=Precision.INT8).precision is Precision.INT8
    assert "does not record its precision" in caplog.text
    assert api_mod.engine_precision(trt, plain, ["torch.float16", "torch.float32"]) is Precision.FP16


@pytest.mark.parametrize(
    ("tensor", "precision"),
    [
        # TensorRT 11 splits "Format/Datatype" into "Format" and "Datatype" (NVIDIA: "Migrating IEngineInspector
        # Usage from TensorRT 10.x to 11.x"; TensorRT 11.1's .agents/skills/trt-perf-analysis schema)
        ({"Format": "Channel major FP16 format where channel % 8 == 0", "Datatype": "Half"}, Precision.FP16),
        (
            {"Format": "Thirty-two wide channel vectorized row major Int8 format", "Datatype": "Int8"},
            Precision.INT8,
        ),
        ({"Format": "Row major linear FP32 format (kLINEAR)", "Datatype": "Float"}, Precision.FP32),
        (
            {"Format": "Row major linear UInt8 format (kLINEAR)", "Datatype": "UInt8"},
            Precision.FP32,
        ),  # not int8
        # TensorRT 10.9+: the type alone in the combined field
        ({"Format/Datatype": "Half"}, Precision.FP16),
    ],
)
def test_prebuilt_precision_from_the_inspector_fields_of_tensorrt_10_and_11(
    monkeypatch, tmp_path, cpu_cuda, tensor, precision
) -> None:
    layers = [{"Name": "in", "Inputs": [{"Format": "Row major linear FP32 format", "Datatype": "Float"}]}]
    layers.append({"Name": "conv", "Inputs": [tensor], "Outputs": [tensor]})
    engine, _, _ = inspected_engine(layers)
    assert make_engine(monkeypatch, tmp_path, engine, precision=Precision.FP32).precision is precision


def test_dynamic_shape_engine_is_inspected_with_a_context_whose_shape_is_set(
    monkeypatch, tmp_path, cpu_cuda
) -> None:
    """An engine with a dynamic batch says "N/A due to dynamic shapes" unless the inspector is given an execution
    context with its input shapes set (TensorRT's Engine Inspector docs: inspector.execution_context = context)."""
    engine, contexts, inspector = inspected_engine([])
    shapes_seen = []

    def information(format: Any) -> str:
        context = inspector.execution_context
        known = context is not None and context.set_input_shape.call_args is not None
        shapes_seen.append(context.set_input_shape.call_args.args[1] if known else None)
        half = {"Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}
        unknown = {"Format/Datatype": "N/A due to dynamic shapes"}
        return json.dumps({"Layers": [{"Name": "conv", "Inputs": [half if known else unknown]}]})

    inspector.get_engine_information.side_effect = information
    eng = make_engine(monkeypatch, tmp_path, engine, precision=Precision.FP32)
    assert shapes_seen == [(MAX_BATCH, C, H, W)] and inspector.execution_context is contexts.of(MAX_BATCH)
    assert eng.precision is Precision.FP16
    # no type known (N/A only): the engine does not say, it is not "fp32"
    inspector.execution_context = None
    assert api_mod.engine_precision(trt, engine, ["torch.float32"], context=None) is None


def test_one_execution_context_per_input_shape(monkeypatch, tmp_path, cpu_cuda) -> None:
    """Each batch size gets its own execution context, its shape set once, as trtexec captures one CUDA graph per
    context (samples/common/sampleInference.cpp, IterationStd): a graph captured at one batch size replays what it
    captured after another size ran. The contexts share one activation memory (USER_MANAGED): they never run in
    parallel (NvInferRuntime.h, setDeviceMemoryV2)."""
    engine, contexts = named_engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    for n in (3, 5, 3, 5, MAX_BATCH):
        eng.infer(eng.input_buffer(n))
    assert len(contexts) == 3
    for n, runs in ((3, 2), (5, 2), (MAX_BATCH, 1)):
        context = contexts.of(n)
        assert context.set_input_shape.call_args_list == [mock.call("images", (n, C, H, W))]
        assert context.execute_async_v3.call_count == runs
    strategy = trt.ExecutionContextAllocationStrategy.USER_MANAGED
    assert engine.create_execution_context.call_args_list == [mock.call(strategy)] * 3
    memory = {c.set_device_memory.call_args.args for c in contexts}
    assert len(memory) == 1 and next(iter(memory))[1] == ACTIVATION_BYTES


class Trt8Engine:
    """A TensorRT 8.5 / 8.6 ICudaEngine stand-in (no 8.x bindings import here) that enforces the profile rule of
    their NvInferRuntime.h: "The first execution context created will call setOptimizationProfile(0) implicitly.
    For other execution contexts, setOptimizationProfile() must be called with unique profile index before calling
    execute or enqueue" (8.5.2, createExecutionContext; 8.6.1: profile 0 "if there are no other execution contexts
    assigned to optimization profile 0"). A context without a profile fails setInputShape and enqueueV3 (they return
    false). Its queries, and its contexts' calls, are the 11.4 doubles' (`named_engine`, `context_double`): the
    named-tensor API of 8.5 has the same names; 8.x's own names (create_execution_context_without_device_memory,
    device_memory, set_optimization_profile_async, device_memory_size) are written from NVIDIA's 8.6 Python API."""

    def __init__(self, outputs: dict[str, tuple[int, ...]], profiles: int = 1) -> None:
        self._double, self.contexts = named_engine(outputs)
        self._outputs = outputs
        self.num_optimization_profiles = profiles
        self.device_memory_size = ACTIVATION_BYTES
        self.profiling_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY
        self.num_io_tensors = self._double.num_io_tensors
        for name in ("get_tensor_name", "get_tensor_mode", "get_tensor_shape", "get_tensor_dtype"):
            setattr(self, name, getattr(self._double, name))
        self.profile_of: dict[int, int | None] = {}  # id(context) -> its optimization profile

    def get_tensor_profile_shape(self, name: str, profile: int) -> Any:
        assert 0 <= profile < self.num_optimization_profiles
        return self._double.get_tensor_profile_shape(name, profile)

    def create_execution_context_without_device_memory(self) -> Any:
        context = context_double(self._outputs)
        taken = set(self.profile_of.values())
        self.profile_of[id(context)] = 0 if 0 not in taken else None
        set_shape, execute = context.set_input_shape.side_effect, context.execute_async_v3

        def set_input_shape(name: str, shape: Any) -> bool:
            return self.profile_of[id(context)] is not None and set_shape(name, shape)

        def set_optimization_profile_async(index: int, stream: int) -> bool:
            if index in {p for c, p in self.profile_of.items() if c != id(context)}:
                return False
            self.profile_of[id(context)] = index
            return True

        context.set_input_shape.side_effect = set_input_shape
        context.execute_async_v3.side_effect = lambda stream: self.profile_of[id(context)] is not None
        context.set_optimization_profile_async = mock.Mock(side_effect=set_optimization_profile_async)
        del execute
        self.contexts.append(context)
        return context


def trt8(version: str = "8.6.1") -> Any:
    """The 11.4 bindings' module as TensorRT 8.x shows itself: its version, no ExecutionContextAllocationStrategy."""
    names = {k: v for k, v in vars(trt).items() if k != "ExecutionContextAllocationStrategy"}
    return types.SimpleNamespace(**{**names, "__version__": version, "__name__": "tensorrt"})


@pytest.mark.parametrize("version", ["8.5.2", "8.6.1"])
def test_tensorrt_8_runs_every_batch_size_on_the_one_context_holding_profile_0(
    monkeypatch, tmp_path, cpu_cuda, version
) -> None:
    """TensorRT 8.5 / 8.6 (JetPack 5.1; 6.0 = 8.6.2): contexts cannot share profile 0, so one context is re-shaped
    per call (its shape set again only when the batch size changes), in the activation memory given to it, and the
    engine is not captured (the frame program captures the parts around it)."""
    engine = Trt8Engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine, module=trt8(version))
    for n in (3, 5, 3, 3, MAX_BATCH):
        out = eng.infer(eng.input_buffer(n))["output0"]
        assert out.shape == (n, 84, 21)
    (context,) = engine.contexts
    shapes = [c.args[1][0] for c in context.set_input_shape.call_args_list]
    assert shapes == [MAX_BATCH, 3, 5, 3, MAX_BATCH]  # (the largest at load)
    assert context.execute_async_v3.call_count == 5
    assert context.device_memory == eng._activations.data_ptr()
    assert not eng.capturable and "profile 0 to one execution context only" in eng.capture_problem
    # the rule the stand-in enforces: a second context has no profile
    assert not engine.create_execution_context_without_device_memory().set_input_shape("images", (3, C, H, W))


def test_a_batch_size_profile_0_does_not_take_is_refused_in_one_line(monkeypatch, tmp_path, cpu_cuda) -> None:
    """A prebuilt engine whose profile starts above 1 (trtexec --minShapes=images:4x3x32x32): a smaller batch is
    refused naming the size and the engine's profiles, and no context is made for it."""
    engine, contexts = named_engine({"output0": (84, 21)}, min_batch=4)
    eng = make_engine(monkeypatch, tmp_path, engine)
    made = len(contexts)
    with pytest.raises(TensorRTError) as refused:
        eng.infer(eng.input_buffer(2))
    message = str(refused.value)
    assert "\n" not in message and "cannot run a batch of 2 images" in message
    assert f"profile 0 takes 4..{MAX_BATCH} (profiles 0: 4..{MAX_BATCH})" in message
    assert len(contexts) == made and 2 not in {c.set_input_shape.call_args.args[1][0] for c in contexts}
    eng.infer(eng.input_buffer(4))  # what the profile takes still runs


def test_a_call_on_another_caller_stream_waits_for_the_previous_call(monkeypatch, tmp_path, cpu_cuda) -> None:
    """The contexts share one activation memory: a call enqueued on a caller's stream waits on the event the
    previous call recorded, whichever stream that was (outside a capture)."""
    engine, _ = named_engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    first, second = (mock.Mock(name=n, cuda_stream=h) for n, h in (("first", 0xA1), ("second", 0xB2)))
    order = mock.Mock()
    for stream in (first, second):
        order.attach_mock(stream.wait_event, f"{stream._mock_name}_wait_event")
    order.attach_mock(cpu_cuda.event.record, "record")
    for stream, n in ((first, 3), (second, 5)):
        monkeypatch.setattr(trt_mod, "current_stream", lambda device, stream=stream: stream)
        eng.infer(eng.input_buffer(n))
    assert order.mock_calls == [
        mock.call.first_wait_event(cpu_cuda.event),
        mock.call.record(first),
        mock.call.second_wait_event(cpu_cuda.event),  # after the call on the first stream
        mock.call.record(second),
    ]


class Released:
    """A double seen through a plain object that only its holder refers to (mocks keep cycles among themselves, so
    their own release waits for the collector): `finalize` says when the holder lets it go."""

    def __init__(self, double: Any) -> None:
        self._double = double

    def __getattr__(self, name: str) -> Any:
        return getattr(self._double, name)


def test_contexts_engine_and_runtime_are_released_under_the_engines_device(
    monkeypatch, tmp_path, cpu_cuda
) -> None:
    """An engine on cuda:1 released (the node's cleanup drops the detector and collects): its contexts, its
    ICudaEngine and its runtime go with cuda:1 current, as they were made (TensorRT frees their device memory on the
    current device, which is cuda:0 in the thread that collects)."""
    import gc
    import weakref

    engine_double, contexts = named_engine({"output0": (84, 21)})
    runtime_double = strict(trt.Runtime)
    released: list[tuple[str, int]] = []

    def runtime(logger: Any) -> Released:
        made = Released(runtime_double)
        weakref.finalize(made, lambda: released.append(("runtime", cpu_cuda.device[-1])))
        return made

    def deserialized(data: bytes) -> Released:
        made = Released(engine_double)
        weakref.finalize(made, lambda: released.append(("engine", cpu_cuda.device[-1])))
        return made

    runtime_double.deserialize_cuda_engine.side_effect = deserialized
    module = types.SimpleNamespace(**{**vars(trt), "Runtime": runtime})
    monkeypatch.setattr(trt_mod, "import_tensorrt", lambda: module)
    path = tmp_path / "model.engine"
    path.write_bytes(b"serialized")
    eng = TensorRTEngine(path, device=torch.device("cuda:1"), max_batch=MAX_BATCH)
    eng.infer(eng.input_buffer(3))
    assert len(contexts) == 2 and released == []
    del eng
    gc.collect()
    assert sorted(released) == [("engine", 1), ("runtime", 1)]
    assert cpu_cuda.device == [0]


def test_the_default_stream_is_left_for_the_engines_own_stream_ordered_by_events(
    monkeypatch, tmp_path, cpu_cuda
) -> None:
    """enqueueV3 on the default stream makes TensorRT synchronise the device (NvInferRuntime.h: "Please use
    non-default stream instead"): the engine enqueues on its own stream, after the work queued on torch's stream
    and before what follows it there."""
    engine, contexts = named_engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    cpu_cuda.current.cuda_stream = 0  # torch's legacy default stream
    order = mock.Mock()
    order.attach_mock(cpu_cuda.own.wait_stream, "own_wait_stream")
    order.attach_mock(cpu_cuda.own.wait_event, "own_wait_event")
    order.attach_mock(contexts.of(MAX_BATCH).execute_async_v3, "execute_async_v3")
    order.attach_mock(cpu_cuda.event.record, "record")
    order.attach_mock(cpu_cuda.current.wait_event, "current_wait_event")
    eng.infer(eng.input_buffer(MAX_BATCH))
    assert order.mock_calls == [
        mock.call.own_wait_stream(cpu_cuda.current),
        mock.call.own_wait_event(cpu_cuda.event),  # the previous call, whatever stream ran it
        mock.call.execute_async_v3(cpu_cuda.own.cuda_stream),
        mock.call.record(cpu_cuda.own),
        mock.call.current_wait_event(cpu_cuda.event),
    ]
    assert cpu_cuda.kept == []  # the engine's own input buffer needs no keeping alive


def test_a_callers_batch_read_on_the_engines_stream_is_kept_alive(monkeypatch, tmp_path, cpu_cuda) -> None:
    engine, contexts = named_engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    cpu_cuda.current.cuda_stream = 0
    batch = aligned(torch.rand(2, C, H, W))  # bound in place
    eng.infer(batch)
    assert contexts.of(2).set_tensor_address.call_args_list[0] == mock.call("images", batch.data_ptr())
    assert [(t.data_ptr(), s) for t, s in cpu_cuda.kept] == [(batch.data_ptr(), cpu_cuda.own)]


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` whose memory starts on a 256-byte boundary (CPU allocations are 64-byte aligned)."""
    storage = torch.empty(tensor.numel() + 256, dtype=tensor.dtype)
    skip = (-storage.data_ptr() % 256) // tensor.element_size()
    copy = storage[skip : skip + tensor.numel()].view(tensor.shape)
    copy.copy_(tensor)
    assert copy.data_ptr() % ALIGNMENT == 0
    return copy


def test_a_misaligned_batch_is_copied_not_bound(monkeypatch, tmp_path, cpu_cuda) -> None:
    """setTensorAddress: "The pointer must have at least 256-byte alignment" (NvInferRuntime.h)."""
    engine, contexts = named_engine({"output0": (84, 21)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    storage = aligned(torch.rand(2 * C * H * W + 1))
    batch = storage[1:].view(2, C, H, W)  # contiguous, the right type and shape, 4 bytes off
    assert batch.is_contiguous() and batch.data_ptr() % ALIGNMENT == 4
    eng.infer(batch)
    bound = contexts.of(2).set_tensor_address.call_args_list[0].args[1]
    assert bound == eng.input_buffer(2).data_ptr() and torch.equal(eng.input_buffer(2), batch)


def test_the_engines_device_is_current_for_every_tensorrt_call(monkeypatch, tmp_path, cpu_cuda) -> None:
    """TensorRT deserialises onto, and enqueues on, the current CUDA device: an engine on cuda:1 makes it current
    around every call into TensorRT (torch's current device stays 0 outside)."""
    engine, _ = named_engine({"output0": (84, 21)})
    seen: list[tuple[str, int]] = []

    def noted(name: str, method: Any) -> None:
        """`method` of a double notes its name and the current device, then does what it did."""
        behaviour = method.side_effect

        def call(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, cpu_cuda.device[-1]))
            return behaviour(*args, **kwargs) if behaviour else method.return_value

        method.side_effect = call

    runtime = strict(trt.Runtime)
    runtime.deserialize_cuda_engine.side_effect = None
    runtime.deserialize_cuda_engine.return_value = engine
    noted("deserialize_cuda_engine", runtime.deserialize_cuda_engine)
    create = engine.create_execution_context.side_effect

    def create_noted(*args: Any) -> Any:
        context = create(*args)
        noted("set_input_shape", context.set_input_shape)
        noted("execute_async_v3", context.execute_async_v3)
        return context

    engine.create_execution_context.side_effect = create_noted
    noted("create_execution_context", engine.create_execution_context)
    eng = make_engine(monkeypatch, tmp_path, engine, runtime=runtime, device="cuda:1")
    assert eng.device == torch.device("cuda", 1)
    eng.infer(eng.input_buffer(MAX_BATCH))
    eng.infer(eng.input_buffer(2))
    calls = [name for name, _ in seen]
    assert calls == [
        "deserialize_cuda_engine",
        *("create_execution_context", "set_input_shape"),  # the largest batch's context, at load
        "execute_async_v3",
        *("create_execution_context", "set_input_shape", "execute_async_v3"),  # batch 2's, at its first call
    ]
    assert {device for _, device in seen} == {1} and cpu_cuda.device == [0]


def test_engines_are_built_and_deserialised_with_their_device_current(monkeypatch, tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    current = [0]

    @contextlib.contextmanager
    def made_current(device: torch.device) -> Any:
        current.append(device.index)
        yield
        current.pop()

    monkeypatch.setattr(build_mod, "made_current", made_current, raising=False)
    seen = []
    monkeypatch.setattr(
        build_mod, "build_serialized", lambda *a, **k: seen.append(("build", current[-1])) or b"E"
    )
    monkeypatch.setattr(
        build_mod, "deserialize", lambda runtime, data: seen.append(("load", current[-1])) or data
    )
    options = BuildOptions(max_batch=4, opt_batch=2)
    build_mod.load_or_build(
        trt, None, None, path, options, torch.device("cuda", 1), tmp_path, None, ("GPU", (8, 7))
    )
    assert seen == [("build", 1), ("load", 1)] and current == [0]


def test_foreign_input_is_copied_into_the_bound_buffer(monkeypatch, tmp_path, cpu_cuda) -> None:
    engine, contexts = named_engine({"output0": (4,)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    batch = torch.rand(2, C, W, H).transpose(2, 3)  # non-contiguous
    eng.infer(batch)
    bound = contexts.of(2).set_tensor_address.call_args_list[0].args[1]
    assert bound == eng.input_buffer(2).data_ptr()
    assert torch.equal(eng.input_buffer(2), batch)
    with pytest.raises(ValueError, match="engine input must be"):
        eng.infer(torch.rand(2, C, H + 1, W))


def test_a_call_takes_at_most_max_batch_images(monkeypatch, tmp_path, cpu_cuda) -> None:
    engine, contexts = named_engine({"output0": (1,)})
    eng = make_engine(monkeypatch, tmp_path, engine, max_batch=4)
    assert eng.input_buffer(4) is not None and eng.input_buffer(5) is None
    with pytest.raises(ValueError, match=r"engine input must be \(1..4"):
        eng.infer(torch.rand(10, C, H, W))
    assert all(not c.execute_async_v3.called for c in contexts)


def test_static_batch_engine_pads_and_trims(monkeypatch, tmp_path, cpu_cuda) -> None:
    engine, contexts = named_engine({"output0": (2,)}, fixed_batch=4)
    eng = make_engine(monkeypatch, tmp_path, engine)
    assert eng.max_batch == 4 and eng.fixed_batch == 4
    batch = torch.ones(3, C, H, W)
    out = eng.infer(batch)["output0"]
    assert out.shape == (3, 2)
    (context,) = contexts
    assert context.set_input_shape.call_args.args[1] == (4, C, H, W)
    bound = context.set_tensor_address.call_args_list[0].args[1]
    assert bound != batch.data_ptr()  # Engine.infer padded the batch to the engine's static size first


def test_failed_enqueue_raises_a_clear_error(monkeypatch, tmp_path, cpu_cuda) -> None:
    engine, contexts = named_engine({"output0": (2,)})
    eng = make_engine(monkeypatch, tmp_path, engine)
    contexts.of(MAX_BATCH).execute_async_v3.return_value = False
    with pytest.raises(TensorRTError, match="execute_async_v3 failed"):
        eng.infer(torch.rand(MAX_BATCH, C, H, W))
    cpu_cuda.event.record.assert_not_called()


def test_engine_file_that_does_not_deserialize(monkeypatch, tmp_path, cpu_cuda) -> None:
    full = types.SimpleNamespace(**{**vars(trt), "__name__": "tensorrt"})  # the full TensorRT's module
    with pytest.raises(TensorRTError, match="rebuild it"):
        make_engine(monkeypatch, tmp_path, None, module=full)


def test_the_lean_runtime_runs_only_version_compatible_engines(monkeypatch, tmp_path, cpu_cuda) -> None:
    """The lean runtime (these bindings) runs only engines built with BuilderFlag.VERSION_COMPATIBLE (NvInfer.h:
    "Restrict to lean runtime operators"), and one that carries the lean runtime, host code, only when the runtime
    allows it (engine_host_code_allowed, default False: NvInferRuntime.h setEngineHostCodeAllowed; NVIDIA sets it
    for version-compatible engines in samples/common/sampleEngines.cpp and
    samples/python/refactored/2_construct_network_with_layer_apis/main.ipynb)."""
    with pytest.raises(TensorRTError, match=r"runs only version-compatible engines: .*--version-compatible"):
        make_engine(monkeypatch, tmp_path, None)
    assert api_mod.is_lean(trt)
    engine, _ = named_engine({"output0": (4,)})
    for allowed in (False, True):
        runtime = strict(trt.Runtime)
        runtime.engine_host_code_allowed = False
        seen = []
        runtime.deserialize_cuda_engine.side_effect = lambda data, r=runtime, s=seen: (
            s.append(r.engine_host_code_allowed) or engine
        )
        make_engine(monkeypatch, tmp_path, engine, runtime=runtime, engine_host_code_allowed=allowed)
        assert seen == [
            allowed
        ]  # set before deserialising, and only when asked: host code from trusted files


def test_the_lean_runtime_builds_nothing_and_says_how_to_get_an_engine(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    assert not hasattr(trt, "Builder")
    with pytest.raises(
        TensorRTError, match=r"lean runtime \(tensorrt_lean_bindings\) runs only version-compatible"
    ):
        build_mod.build_serialized(
            trt, None, path, BuildOptions(max_batch=2, opt_batch=1), torch.device("cpu")
        )


def test_an_onnx_model_built_version_compatible_is_loaded_with_host_code_allowed(
    monkeypatch, tmp_path, cpu_cuda
) -> None:
    engine, _ = named_engine({"output0": (84, 21)})
    built = []
    monkeypatch.setattr(
        build_mod,
        "load_or_build",
        lambda trt_module, runtime, *rest: (
            built.append((runtime, rest[2])) or (engine, tmp_path / "e.engine")
        ),
    )
    runtime = strict(trt.Runtime)
    runtime.engine_host_code_allowed = False
    runtime_cls = mock.Mock(return_value=runtime)
    monkeypatch.setattr(
        trt_mod, "import_tensorrt", lambda: types.SimpleNamespace(**{**vars(trt), "Runtime": runtime_cls})
    )
    model = tmp_path / "model.onnx"
    onnx.save(conv_model(), str(model))
    TensorRTEngine(model, device=torch.device("cuda"), max_batch=MAX_BATCH, version_compatible=True)
    ((used_runtime, options),) = built
    assert options.version_compatible and used_runtime.engine_host_code_allowed is True


def test_rejects_cpu_device(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CUDA devices only"):
        TensorRTEngine(tmp_path / "m.engine", device=torch.device("cpu"))


def test_tensorrt_without_named_tensors_is_refused_with_one_line(monkeypatch, tmp_path, cpu_cuda) -> None:
    # TensorRT < 8.5 (binding indices, execute_async_v2) has no num_io_tensors: refused, naming the version needed
    engine = types.SimpleNamespace(create_execution_context=object, num_bindings=2)
    trt8 = types.SimpleNamespace(__version__="8.2.1", ILogger=trt.ILogger, DataType=trt.DataType)
    with pytest.raises(
        TensorRTError, match=r"TensorRT 8.2.1 has no named-tensor API .*TensorRT 8.5 or newer"
    ):
        make_engine(monkeypatch, tmp_path, engine, module=trt8)


def test_feature_set_of_the_installed_lean_bindings() -> None:
    assert not hasattr(trt.BuilderFlag, "FP16")
    assert feature_set(trt) is FeatureSet.TRT11


@pytest.mark.parametrize(
    ("features", "precision", "flags", "onnx_fp16", "qdq"),
    [
        (FeatureSet.TRT8, Precision.FP32, (), False, False),
        (FeatureSet.TRT8, Precision.FP16, ("FP16",), False, False),
        (FeatureSet.TRT8, Precision.INT8, ("FP16", "INT8"), False, True),
        (FeatureSet.TRT10, Precision.FP32, (), False, False),
        (FeatureSet.TRT10, Precision.FP16, ("FP16",), False, False),
        (FeatureSet.TRT10, Precision.INT8, ("FP16", "INT8"), False, True),
        (FeatureSet.TRT11, Precision.FP32, (), False, False),
        (FeatureSet.TRT11, Precision.FP16, (), True, False),
        (FeatureSet.TRT11, Precision.INT8, (), False, True),
    ],
)
def test_precision_table(features, precision, flags, onnx_fp16, qdq) -> None:
    actions = PRECISION_ACTIONS[(features, precision)]
    assert (actions.builder_flags, actions.onnx_fp16, actions.qdq) == (flags, onnx_fp16, qdq)
    assert ("EXPLICIT_BATCH" in actions.network_flags) == (features is FeatureSet.TRT8)
    if features is FeatureSet.TRT11:  # every flag the table asks for on 11 really exists there
        assert all(hasattr(trt.BuilderFlag, f) for f in actions.builder_flags)


# --- ONNX preparation --------------------------------------------------------------------------------------


def conv_model(qdq: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, C, 3, 3], rng.normal(size=(4, C, 3, 3)).ravel())
    nodes = [helper.make_node("Conv", ["images", "w"], ["conv"], pads=[1, 1, 1, 1])]
    inits = [weight]
    if qdq:
        inits += [
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
            helper.make_tensor("z", TensorProto.INT8, [], [0]),
        ]
        nodes = [
            helper.make_node("QuantizeLinear", ["images", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
            helper.make_node("Conv", ["dq", "w"], ["conv"], pads=[1, 1, 1, 1]),
        ]
    nodes.append(helper.make_node("Sigmoid", ["conv"], ["output0"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", C, H, W])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 4, H, W])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_fp16_conversion_keeps_fp32_io_and_matches_fp32() -> None:
    model = conv_model()
    half = to_fp16(model)
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert half.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert any(i.data_type == TensorProto.FLOAT16 for i in half.graph.initializer)
    assert "Cast" in {n.op_type for n in half.graph.node}
    x = np.random.default_rng(1).random((2, C, H, W), dtype=np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"images": x}
    )
    got = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"images": x}
    )
    assert got[0].dtype == np.float32
    np.testing.assert_allclose(got[0], ref[0], atol=5e-3)


def test_qdq_detection() -> None:
    assert not has_qdq(conv_model())
    assert has_qdq(conv_model(qdq=True))


def test_onnx_input_reads_chw_and_needs_hw_when_dynamic() -> None:
    assert onnx_input(conv_model(), None) == ("images", (C, H, W))
    with pytest.raises(ValueError, match="contradicts"):
        onnx_input(conv_model(), (64, 64))


@pytest.mark.parametrize("features", list(FeatureSet))
def test_int8_without_qdq_nodes_says_what_to_give(tmp_path, features) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    actions = PRECISION_ACTIONS[(features, Precision.INT8)]
    with pytest.raises(TensorRTError) as err:
        build_mod.prepare_onnx(path, actions)
    assert str(err.value) == INT8_NEEDS_QDQ.format(model=path)
    assert "calibration" in str(err.value) and "--precision int8" in str(err.value)
    # an ONNX that already has Q/DQ nodes is taken as it is
    onnx.save(conv_model(qdq=True), path)
    assert onnx.load_from_string(build_mod.prepare_onnx(path, actions)) == onnx.load(path)


# --- building with builder doubles (fakes for classes the lean package lacks) -----------------------------


class FakeBuilderConfig:
    def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None: ...
    def set_flag(self, flag: Any) -> None: ...
    def clear_flag(self, flag: Any) -> None: ...
    def add_optimization_profile(self, profile: Any) -> int: ...


class FakeBuilder:
    def create_network(self, flags: int = 0) -> Any: ...
    def create_builder_config(self) -> Any: ...
    def create_optimization_profile(self) -> Any: ...
    def build_serialized_network(self, network: Any, config: Any) -> Any: ...


class FakeParser:
    num_errors = 0

    def parse(self, model: bytes, path: str | None = None) -> bool: ...
    def get_error(self, index: int) -> Any: ...


def fake_trt(version: str, fp16_flag: bool, version_flag: bool = True) -> tuple[Any, Any, Any]:
    builder = mock.create_autospec(FakeBuilder, instance=True)
    config = mock.create_autospec(FakeBuilderConfig, instance=True)
    config.progress_monitor = None
    config.profiling_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY
    parser = mock.create_autospec(FakeParser, instance=True)
    parser.parse.return_value = True
    builder.create_builder_config.return_value = config
    builder.create_optimization_profile.side_effect = lambda: strict(trt.IOptimizationProfile)
    builder.build_serialized_network.return_value = b"PLAN"
    flag_names = [
        "TF32",
        *(["VERSION_COMPATIBLE"] if version_flag else []),
        *(["FP16", "INT8"] if fp16_flag else []),
    ]
    module = types.SimpleNamespace(
        __version__=version,
        Builder=mock.Mock(return_value=builder),
        OnnxParser=mock.Mock(return_value=parser),
        BuilderFlag=types.SimpleNamespace(**{f: f for f in flag_names}),
        NetworkDefinitionCreationFlag=types.SimpleNamespace(EXPLICIT_BATCH=0, STRONGLY_TYPED=1),
        MemoryPoolType=trt.MemoryPoolType,
        IProgressMonitor=trt.IProgressMonitor,
        ProfilingVerbosity=trt.ProfilingVerbosity,
    )
    return module, builder, config


@pytest.mark.parametrize(
    ("version", "fp16_flag", "net_flags", "set_flags"),
    [
        ("8.6.1", True, 1 << 0, ["FP16"]),
        ("10.3.0", True, 0, ["FP16"]),
        ("11.4.0", False, 1 << 1, []),
    ],
)
def test_build_fp16_per_tensorrt_generation(tmp_path, version, fp16_flag, net_flags, set_flags) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    module, builder, config = fake_trt(version, fp16_flag)
    phases = []
    options = BuildOptions(precision=Precision.FP16, max_batch=8, opt_batch=5)
    plan = build_mod.build_serialized(
        module, None, path, options, torch.device("cpu"), progress=lambda *a: phases.append(a)
    )
    assert plan == b"PLAN"
    # layer details in the engine: it can report its precision
    assert config.profiling_verbosity == trt.ProfilingVerbosity.DETAILED
    builder.create_network.assert_called_once_with(net_flags)
    assert [c.args[0] for c in config.set_flag.call_args_list] == set_flags
    profile = config.add_optimization_profile.call_args.args[0]
    profile.set_shape.assert_called_once_with("images", (1, C, H, W), (5, C, H, W), (8, C, H, W))
    parsed = onnx.load_from_string(module.OnnxParser.return_value.parse.call_args.args[0])
    assert any(i.data_type == TensorProto.FLOAT16 for i in parsed.graph.initializer) == (not fp16_flag)
    assert isinstance(config.progress_monitor, trt.IProgressMonitor)
    config.progress_monitor.phase_start("Building", None, 2)
    config.progress_monitor.step_complete("Building", 0)
    config.progress_monitor.phase_finish("Building")
    assert phases == [("Building", 0, 2), ("Building", 1, 2), ("Building", 2, 2)]


@pytest.mark.parametrize(
    ("version", "fp16_flag", "net_flags", "set_flags"),
    [
        ("8.6.1", True, 1 << 0, ["FP16", "INT8"]),
        ("10.3.0", True, 0, ["FP16", "INT8"]),
        ("11.4.0", False, 1 << 1, []),  # strongly typed: the Q/DQ nodes say what runs in int8
    ],
)
def test_build_int8_from_the_quantizers_qdq_file(tmp_path, version, fp16_flag, net_flags, set_flags) -> None:
    """TensorRT parses exactly the Q/DQ file ONNX Runtime runs (made here by the real quantizer)."""
    source, qdq = tmp_path / "m.onnx", tmp_path / "m.qdq.onnx"
    onnx.save(conv_model(), source)
    calibration = np.random.default_rng(2).random((16, C, H, W), dtype=np.float32)
    assert quantize_onnx(source, [calibration[:10], calibration[10:]], qdq) == 16
    module, builder, config = fake_trt(version, fp16_flag)
    options = BuildOptions(precision=Precision.INT8, max_batch=8, opt_batch=5)
    assert build_mod.build_serialized(module, None, qdq, options, torch.device("cpu")) == b"PLAN"
    builder.create_network.assert_called_once_with(net_flags)
    assert [c.args[0] for c in config.set_flag.call_args_list] == set_flags
    parsed = onnx.load_from_string(module.OnnxParser.return_value.parse.call_args.args[0])
    assert parsed == onnx.load(qdq) and has_qdq(parsed)
    scales = [n for n in parsed.graph.node if n.op_type == "QuantizeLinear"]
    zero_points = {i.name: onnx.numpy_helper.to_array(i) for i in parsed.graph.initializer}
    # what TensorRT accepts: int8 zero points of 0 (symmetric), per-channel weights
    assert scales and all(zero_points[n.input[2]].dtype == np.int8 for n in scales)
    assert all(not zero_points[n.input[2]].any() for n in scales)


@pytest.mark.parametrize(("version", "fp16_flag"), [("8.6.1", True), ("10.3.0", True), ("11.4.0", False)])
def test_fp32_is_built_without_tf32(tmp_path, version, fp16_flag) -> None:
    """BuilderFlag.TF32 is on by default (NvInfer.h, kTF32: "Enabled by default"): on Ampere and later (Orin) an
    "fp32" engine would round matrix-product inputs to 10-bit mantissas. fp32 clears it; fp16 leaves it."""
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    for precision, cleared in ((Precision.FP32, ["TF32"]), (Precision.FP16, [])):
        module, _, config = fake_trt(version, fp16_flag)
        build_mod.build_serialized(
            module, None, path, BuildOptions(precision, max_batch=2, opt_batch=1), torch.device("cpu")
        )
        assert [c.args[0] for c in config.clear_flag.call_args_list] == cleared
        assert "TF32" not in [c.args[0] for c in config.set_flag.call_args_list]


@pytest.mark.parametrize(("version", "fp16_flag"), [("10.3.0", True), ("11.4.0", False)])
def test_version_compatible_build(tmp_path, version, fp16_flag) -> None:
    """BuilderFlag.VERSION_COMPATIBLE, as NVIDIA's samples set it (samples/common/sampleEngines.cpp,
    samples/python/engine_refit_onnx_bidaf/build_and_refit_engine.py): the engine runs on the lean runtime."""
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    module, _, config = fake_trt(version, fp16_flag)
    options = BuildOptions(max_batch=2, opt_batch=1, version_compatible=True)
    build_mod.build_serialized(module, None, path, options, torch.device("cpu"))
    assert "VERSION_COMPATIBLE" in [c.args[0] for c in config.set_flag.call_args_list]


GPU = ("Orin", (8, 7))


def test_version_compatible_is_refused_in_one_line_where_tensorrt_cannot_build_it(tmp_path) -> None:
    """TensorRT 8.5 (JetPack 5.1: 8.5.2) has no BuilderFlag.VERSION_COMPATIBLE (NvInfer.h: kVERSION_COMPATIBLE = 15
    from 8.6.1): `--version-compatible` there is one line, before any parsing, and nothing reaches the cache (not
    even the batch-1 rewrite)."""
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    module, _, _ = fake_trt("8.5.2", True, version_flag=False)
    options = BuildOptions(max_batch=2, opt_batch=1, version_compatible=True)
    with pytest.raises(
        TensorRTError, match=r"TensorRT 8\.5\.2 cannot build version-compatible engines"
    ) as refused:
        build_mod.build_serialized(module, None, path, options, torch.device("cpu"))
    assert "\n" not in str(refused.value) and "8.6" in str(refused.value)
    module.Builder.assert_not_called()
    cache = tmp_path / "cache"
    with pytest.raises(TensorRTError, match="cannot build version-compatible engines"):
        build_mod.load_or_build(module, None, None, path, options, torch.device("cpu"), cache, gpu=GPU)
    assert not cache.exists() or not any(cache.rglob("*"))
    # 8.6 has the flag: built as asked
    module, _, config = fake_trt("8.6.1", True)
    build_mod.build_serialized(module, None, path, options, torch.device("cpu"))
    assert "VERSION_COMPATIBLE" in [c.args[0] for c in config.set_flag.call_args_list]


def test_cache_key_holds_the_build_recipe_tf32_and_version_compatibility(tmp_path, monkeypatch) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    options = BuildOptions(max_batch=8, opt_batch=4)
    base = build_mod.engine_key(trt, path, options, GPU)
    assert ("tf32", "off") in base.extra and ("version_compatible", "False") in base.extra
    half = build_mod.engine_key(trt, path, dataclasses.replace(options, precision=Precision.FP16), GPU)
    assert ("tf32", "on") in half.extra
    assert any(name == "fp16_conversion" for name, _ in half.extra)  # the converter's version: its output
    compatible = dataclasses.replace(options, version_compatible=True)
    names = {base.file_name, build_mod.engine_key(trt, path, compatible, GPU).file_name}
    # another recipe for the same options (here fp32 leaving TF32 on) is another engine
    monkeypatch.setitem(
        PRECISION_ACTIONS, (FeatureSet.TRT11, Precision.FP32), BuildActions(("STRONGLY_TYPED",))
    )
    names.add(build_mod.engine_key(trt, path, options, GPU).file_name)
    assert len(names) == 3


def test_cache_key_covers_the_models_external_data(tmp_path) -> None:
    """An ONNX model with its weights in external data files (> 2 GB, or exported so): new weights beside an
    unchanged graph file are a new engine."""
    path, data = tmp_path / "m.onnx", tmp_path / "m.onnx.data"
    model = conv_model()
    for init in model.graph.initializer:  # raw bytes: what onnx writes to external data
        init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init), init.name))
    onnx.save(model, str(path), save_as_external_data=True, location=data.name, size_threshold=0)
    options = BuildOptions(max_batch=8, opt_batch=4)
    before, graph = build_mod.engine_key(trt, path, options, GPU), path.read_bytes()
    weights = bytearray(data.read_bytes())
    weights[0] ^= 0xFF
    data.write_bytes(bytes(weights))
    after = build_mod.engine_key(trt, path, options, GPU)
    assert path.read_bytes() == graph and after.onnx_sha256 != before.onnx_sha256
    assert after.file_name != before.file_name
    # the build parses those weights (the ONNX loaded with its external data)
    parsed = onnx.load_from_string(
        build_mod.prepare_onnx(path, PRECISION_ACTIONS[(FeatureSet.TRT11, Precision.FP32)])
    )
    assert onnx.numpy_helper.to_array(parsed.graph.initializer[0]).tobytes()[:1] == bytes(weights[:1])

    from tiled_detector.engines.onnx_model import external_data_files, onnx_sha256

    assert external_data_files(onnx.load(str(path), load_external_data=False), tmp_path) == [data]
    plain = tmp_path / "plain.onnx"
    onnx.save(conv_model(), str(plain))
    assert onnx_sha256(plain) == sha256_file(plain)  # no external data: the file's own digest, as before


def test_build_engine_version_compatible(monkeypatch, tmp_path) -> None:
    import argparse

    from tiled_detector.commands import build_engine
    from tiled_detector.config import DetectorConfig

    model = tmp_path / "m.onnx"
    onnx.save(conv_model(), model)
    parser = argparse.ArgumentParser()
    build_engine.add_arguments(parser)
    args = parser.parse_args([str(model), "--version-compatible"])
    runtime = strict(trt.Runtime)
    runtime.engine_host_code_allowed = False
    module = types.SimpleNamespace(**{**vars(trt), "Runtime": mock.Mock(return_value=runtime)})
    monkeypatch.setattr(api_mod, "import_tensorrt", lambda: module)
    built = []
    monkeypatch.setattr(
        build_mod,
        "load_or_build",
        lambda trt_module, runtime, logger, path, options, *rest: (
            built.append((runtime, options)) or (None, tmp_path / "e.engine")
        ),
    )
    build_engine._build_tensorrt(args, DetectorConfig(model=model), model, TextProgress())
    ((used, options),) = built
    assert options.version_compatible and used.engine_host_code_allowed is True


def test_parser_errors_are_reported(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), path)
    module, _, _ = fake_trt("10.3.0", True)
    parser = module.OnnxParser.return_value
    parser.parse.return_value = False
    parser.num_errors = 1
    parser.get_error.return_value = "unsupported op Foo"
    with pytest.raises(TensorRTError, match="unsupported op Foo"):
        build_mod.build_serialized(
            module, None, path, BuildOptions(max_batch=2, opt_batch=1), torch.device("cpu")
        )


def test_text_progress_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    stream = io.StringIO()
    bar = TextProgress(stream, width=10)
    bar._tqdm = False  # the plain-text bar, whether or not tqdm is installed
    bar("Building engine", 5, 10)
    bar("Building engine", 10, 10)
    lines = stream.getvalue().split("\r")
    assert "[#####-----] 5/10 Building engine" in lines[1]
    assert "[##########] 10/10" in lines[2] and lines[2].endswith("\n")


def test_build_engine_sizes_the_profile_for_the_cameras_of_one_node(capsys) -> None:
    import argparse

    from tiled_detector.commands.build_engine import add_arguments, batch_profile, camera_batch
    from tiled_detector.config import DetectorConfig
    from tiled_detector.pipeline.tiling import make_plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = DetectorConfig()
    one_1080p = make_plan((1080, 1920), (640, 640), 0.2, (640, 640), True).batch_size  # 8 tiles + the frame
    assert (
        camera_batch([(1920, 1080)] * 2 + [(1280, 720)], config)
        == 2 * one_1080p + make_plan((720, 1280), (640, 640), 0.2, (640, 640), True).batch_size
    )
    plain = parser.parse_args(["m.onnx"])
    assert batch_profile(plain, config, 9) == (9, 32)  # the node's own build: the same cache entry
    two = parser.parse_args(["m.onnx", "--camera-size", "1920x1080", "1920x1080"])
    assert batch_profile(two, config, 9) == (2 * one_1080p, 32)  # one frame of each camera per cycle
    assert capsys.readouterr().out == ""
    four = parser.parse_args(["m.onnx", "--camera-size", *["1920x1080"] * 4])
    assert batch_profile(four, config, 9) == (4 * one_1080p, 4 * one_1080p)  # 36 > 32: max_batch raised
    assert f"run the node with max_batch:={4 * one_1080p}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["m.onnx", "--camera-size", "1920by1080"])
    assert "a frame size is WIDTHxHEIGHT" in capsys.readouterr().err


def test_a_pose_engine_file_resolves_to_its_keypoints(monkeypatch, tmp_path, cpu_cuda) -> None:
    """ultralytics' pose `.engine` (metadata header with `kpt_shape`, `kpt_names`) on the real bindings' doubles: the
    engine reads the header, and the detector's reading of it is the pose layout with its keypoints."""
    from support.exports import ultralytics_engine_file
    from tiled_detector.config import DetectorConfig
    from tiled_detector.model_files.resolve import engine_view, resolve
    from tiled_detector.pipeline.layouts import OutputLayout

    engine, _ = named_engine({"output0": (4 + 2 + 15, 16)})
    runtime = strict(trt.Runtime)
    runtime.deserialize_cuda_engine.side_effect = None
    runtime.deserialize_cuda_engine.return_value = engine
    runtime_cls = mock.create_autospec(trt.Runtime)
    runtime_cls.return_value = runtime
    monkeypatch.setattr(
        trt_mod, "import_tensorrt", lambda: types.SimpleNamespace(**{**vars(trt), "Runtime": runtime_cls})
    )
    names = ["a", "b", "c", "d", "e"]
    path = ultralytics_engine_file(
        tmp_path / "pose.engine",
        b"serialized",
        task="pose",
        kpt_shape=[5, 3],
        kpt_names={0: names},
        imgsz=[H, W],
    )
    loaded = TensorRTEngine(path, device=torch.device("cuda"), max_batch=MAX_BATCH)
    runtime.deserialize_cuda_engine.assert_called_once_with(b"serialized")  # the header split off
    assert loaded.metadata.keypoint_shape == (5, 3) and loaded.metadata.task == "pose"
    found = resolve(DetectorConfig(model=path), engine_view(loaded))
    assert (
        found.layout is OutputLayout.POSE and found.keypoint_names == tuple(names) and found.num_classes == 2
    )
