"""TensorRT engine whose buffers are torch tensors (no PyCUDA).

Runs a serialized engine (.engine / .plan) or builds one from ONNX through the engine cache. The input
buffer is preallocated at the profile maximum and exposed (`input_buffer`) so preprocessing can write
straight into it; outputs are allocated once at the profile maximum and every call writes into them, so a
captured CUDA graph replays with the same addresses.

One execution context per input shape (batch size), its shape set once when it is made: a CUDA graph captured with
one context keeps replaying what it captured while others run other shapes, as trtexec captures one graph per
context (samples/common/sampleInference.cpp). The contexts share one activation memory (USER_MANAGED; they never run
in parallel: NvInferRuntime.h, setDeviceMemoryV2). TensorRT 8.5 / 8.6 (JetPack 5.1, 6.0) give optimization profile 0
to one execution context only ("The first execution context created will call setOptimizationProfile(0)
implicitly. For other execution contexts, setOptimizationProfile() must be called with unique profile index",
NvInferRuntime.h 8.5.2; 8.6.1: "if there are no other execution contexts assigned to optimization profile 0"; all
contexts profile 0 from 9.0): there one context is re-shaped per call (a batch size other than the last sets its
shape again), and the engine is not captured (the frame program captures the parts around it). A batch size that
profile 0 does not take is refused in one line naming the engine's profiles, before any context is made for it.

Streams: `execute_async_v3` on the default stream makes TensorRT synchronise the device ("Using default stream may
lead to performance issues due to additional cudaDeviceSynchronize() calls", NvInferRuntime.h, enqueueV3). When
torch's current stream is a default stream the engine enqueues on its own stream, ordered after the current one and
the current one after it by events; otherwise (a stream of the caller's, the capture stream while a CUDA graph is
captured) on the current stream itself. A torch CUDA event is recorded after the work (`done_event`): consumers on
the current stream need nothing, consumers on another stream wait on the event; and every call's stream waits on the
previous call's event (its contexts share the activation memory: a call on another caller stream must not overlap
it), except while a CUDA graph is captured (an event from outside a capture cannot be waited on inside it). A caller's batch bound in place must
be 256-byte aligned (setTensorAddress) and is kept alive for the engine's stream (`record_stream`); else it is
copied into the engine's input. Deserialisation, contexts, enqueues and the release of the contexts, the engine and
the runtime (`close`, also when the engine is collected) run with the engine's device current.

The named-tensor API is used (TensorRT >= 8.5: set_input_shape, set_tensor_address, execute_async_v3; older
TensorRT is refused with one line). `current_stream`, `capturing`, `new_stream`, `new_event`, `allocate`,
`keep_alive` and `made_current` are the only CUDA touch points, kept as module names so tests without a GPU can
replace them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tiled_detector.engines.base import Backend, Engine, ModelFormat, Precision, TensorSpec, model_format
from tiled_detector.engines.metadata import split_engine_file
from tiled_detector.engines.tensorrt_api import (
    LEAN_ENGINES,
    LOG,
    TensorRTError,
    checked,
    deserialize,
    engine_precision,
    import_tensorrt,
    is_lean,
    make_logger,
    make_runtime,
    trt_version,
)
from tiled_detector.runtime.devices import made_current

# TensorRT DataType member name -> torch dtype
TORCH_DTYPES: dict[str, torch.dtype] = {
    "FLOAT": torch.float32,
    "HALF": torch.float16,
    "BF16": torch.bfloat16,
    "INT8": torch.int8,
    "UINT8": torch.uint8,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "BOOL": torch.bool,
}
# setTensorAddress: "The pointer must have at least 256-byte alignment" (NvInferRuntime.h)
TENSOR_ALIGNMENT = 256
# the CUDA default streams' handles: the legacy default stream (0, cudaStreamLegacy) and the per-thread one
DEFAULT_STREAMS = frozenset({0, 1, 2})
# from TensorRT 9.0 every new execution context takes optimization profile 0 (NvInferRuntime.h 8.6.1,
# createExecutionContext); 8.5 and 8.6 give it to one context only
CONTEXTS_SHARE_PROFILE_0 = (9, 0)


# --- CUDA touch points (replaced in tests: no GPU there) -------------------------------------------------


def current_stream(device: torch.device) -> Any:
    """torch's current CUDA stream on `device` (`.cuda_stream` is the raw handle TensorRT needs)."""
    return torch.cuda.current_stream(device)


def capturing(device: torch.device) -> bool:
    """Whether torch's current stream on `device` is capturing a CUDA graph."""
    return torch.cuda.is_current_stream_capturing()


def new_stream(device: torch.device) -> Any:
    """A torch CUDA stream of the engine's own (not a default stream)."""
    return torch.cuda.Stream(device)


def new_event() -> Any:
    """A torch CUDA event, recorded after every enqueue."""
    return torch.cuda.Event()


def allocate(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised buffer."""
    return torch.empty(shape, dtype=dtype, device=device)


def keep_alive(tensor: torch.Tensor, stream: Any) -> None:
    """Keep `tensor`'s memory from reuse until the work queued on `stream` so far is done (`record_stream`)."""
    tensor.record_stream(stream)


# --- TensorRT I/O by tensor name ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IOTensor:
    """One engine input or output as TensorRT describes it."""

    name: str
    is_input: bool
    shape: tuple[int, ...]  # -1 for dynamic dimensions
    dtype: torch.dtype
    max_shape: tuple[int, ...] | None  # profile 0 maximum (inputs only)


def torch_dtype(trt_dtype: Any) -> torch.dtype:
    """torch dtype of a TensorRT DataType."""
    try:
        return TORCH_DTYPES[trt_dtype.name]
    except KeyError:
        raise TensorRTError(f"TensorRT tensor type {trt_dtype.name} has no torch equivalent") from None


def engine_tensors(trt: ModuleType, engine: Any) -> list[IOTensor]:
    """All I/O tensors of a named-tensor engine (TensorRT >= 8.5) in engine order; older TensorRT is refused with one
    line."""
    if not hasattr(engine, "num_io_tensors"):
        raise TensorRTError(
            f"TensorRT {trt.__version__} has no named-tensor API (execute_async_v3): TensorRT 8.5 or newer is "
            "needed (JetPack 5.1+)"
        )
    result = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        max_shape = tuple(engine.get_tensor_profile_shape(name, 0)[2]) if is_input else None
        result.append(
            IOTensor(
                name,
                is_input,
                tuple(engine.get_tensor_shape(name)),
                torch_dtype(engine.get_tensor_dtype(name)),
                max_shape,
            )
        )
    return result


def new_context(trt: ModuleType, engine: Any, memory: torch.Tensor) -> Any:
    """An execution context running in `memory` (activations), shared with the engine's other contexts: they run one
    after another, never in parallel (NvInferRuntime.h, setDeviceMemoryV2). TensorRT 10 and later: the USER_MANAGED
    allocation strategy; 8.5 to 9.x: a context without device memory."""
    strategy = getattr(trt, "ExecutionContextAllocationStrategy", None)
    if strategy is None:
        context = checked(
            engine.create_execution_context_without_device_memory,
            what="create_execution_context_without_device_memory",
        )
        context.device_memory = memory.data_ptr()
        return context
    context = checked(
        engine.create_execution_context, strategy.USER_MANAGED, what="create_execution_context(USER_MANAGED)"
    )
    if hasattr(context, "set_device_memory"):  # TensorRT >= 10.1
        context.set_device_memory(memory.data_ptr(), memory.numel())
    else:
        context.device_memory = memory.data_ptr()
    return context


def activation_bytes(engine: Any) -> int:
    """The device memory an execution context needs, at most, for any shape of the profile."""
    size = getattr(engine, "device_memory_size_v2", None)  # TensorRT >= 10.1
    return int(engine.device_memory_size if size is None else size)


class ShapeContext:
    """An execution context and the input shape set on it: everything enqueued on it (and any CUDA graph captured
    from it) runs that shape until `reshape` sets another."""

    def __init__(
        self, trt: ModuleType, engine: Any, memory: torch.Tensor, name: str, shape: tuple[int, ...]
    ) -> None:
        self.context = new_context(trt, engine, memory)
        self.name, self.shape = name, ()
        self.reshape(shape)

    def reshape(self, shape: tuple[int, ...]) -> None:
        """Set the input shape (where it differs from the one set)."""
        if shape != self.shape:
            name = self.name
            checked(self.context.set_input_shape, name, shape, what=f"set_input_shape({name!r}, {shape})")
            self.shape = shape

    def output_shape(self, name: str) -> tuple[int, ...]:
        """Shape of an output at this context's input shape."""
        return tuple(self.context.get_tensor_shape(name))

    def enqueue(self, addresses: dict[str, int], stream_handle: int) -> None:
        """Bind every tensor's address and enqueue the inference on `stream_handle`."""
        for name, address in addresses.items():
            checked(self.context.set_tensor_address, name, address, what=f"set_tensor_address({name!r})")
        checked(self.context.execute_async_v3, stream_handle, what="execute_async_v3")


# --- the engine -------------------------------------------------------------------------------------------


class TensorRTEngine(Engine):
    """A TensorRT engine on one CUDA device; see the module docstring.

    Options: `opt_batch` (optimisation-profile batch when building: tiles per frame + full-frame view),
    `input_hw` (for ONNX models with dynamic height/width), `cache_dir`, `verbose`, `version_compatible` (an ONNX
    model is built with BuilderFlag.VERSION_COMPATIBLE: it then runs on TensorRT's lean runtime and later TensorRT
    versions; the engine built here carries the lean runtime and is loaded with host code allowed),
    `engine_host_code_allowed` (a prebuilt engine file may carry host code, e.g. a version-compatible engine's lean
    runtime: only for engine files you trust). INT8 builds from an ONNX with Q/DQ nodes (`engines/quantize.py`).
    """

    backend = Backend.TENSORRT
    formats = frozenset({ModelFormat.ONNX, ModelFormat.TENSORRT})
    capturable = True
    reuses_output_buffers = True

    def __init__(
        self,
        model: Path,
        device: torch.device | str = "cuda",
        precision: Precision = Precision.FP32,
        max_batch: int = 32,
        opt_batch: int | None = None,
        input_hw: tuple[int, int] | None = None,
        cache_dir: str | Path | None = None,
        verbose: bool = False,
        version_compatible: bool = False,
        engine_host_code_allowed: bool = False,
    ) -> None:
        super().__init__(model, device, precision, max_batch)
        if self.device.type != "cuda":
            raise ValueError(
                f"the TensorRT backend runs on CUDA devices only, got device {device}: use device cuda"
            )
        self.device = torch.device("cuda", 0 if self.device.index is None else self.device.index)
        self.trt = import_tensorrt()
        self._logger = make_logger(self.trt, verbose)
        model = Path(model)
        from_onnx = model_format(model) is ModelFormat.ONNX
        with made_current(self.device):  # TensorRT deserialises onto, and runs on, the current device
            # the engine built here from a version-compatible build carries the lean runtime: trusted, ours
            allowed = engine_host_code_allowed or (from_onnx and version_compatible)
            self._runtime = make_runtime(self.trt, self._logger, host_code_allowed=allowed)
            if from_onnx:
                self._build(model, max_batch, opt_batch, input_hw, cache_dir, version_compatible)
            else:
                self._deserialize(model)
            tensors = engine_tensors(self.trt, self._engine)
            inputs = [t for t in tensors if t.is_input]
            if len(inputs) != 1:
                raise TensorRTError(f"expected an engine with one input, got {[t.name for t in inputs]}")
            self._in = inputs[0]
            self._outs = [t for t in tensors if not t.is_input]
            # TensorRT 8.5 / 8.6: one context (profile 0), re-shaped per call, not captured (module docstring)
            self._one_context = trt_version(self.trt) < CONTEXTS_SHARE_PROFILE_0
            if self._one_context:
                self.capturable = False
                self.capture_problem = (
                    f"TensorRT {self.trt.__version__} gives optimization profile 0 to one execution context only: "
                    "one context, re-shaped per batch size, runs between the captured parts"
                )
            self.input = TensorSpec(self._in.name, self._in.shape, self._in.dtype)
            self.outputs = tuple(TensorSpec(t.name, t.shape, t.dtype) for t in self._outs)
            self.labels = self.metadata.labels
            # (min, max) batch of each optimization profile of the input
            self._profiles = [
                (int(low[0]), int(high[0]))
                for low, _, high in (
                    self._engine.get_tensor_profile_shape(self._in.name, k)
                    for k in range(int(getattr(self._engine, "num_optimization_profiles", 1)))
                )
            ]
            max_shape = self._in.max_shape or self._in.shape
            self._bound_batch(max_shape[0])
            self._input = allocate((self.max_batch, *max_shape[1:]), self._in.dtype, self.device)
            # one activation memory for every context (they run one after another)
            self._activations = allocate((activation_bytes(self._engine),), torch.uint8, self.device)
            self._contexts: dict[tuple[int, ...], ShapeContext] = {}
            largest = self._context((self.fixed_batch or self.max_batch, *self._input.shape[1:]))
            if not from_onnx:
                self.precision = self._prebuilt_precision(model, [str(t.dtype) for t in tensors], largest)
            # outputs at the largest batch, allocated once (those whose shape depends on the input's H, W at their
            # first call)
            self._outputs: dict[str, torch.Tensor] = {}
            for spec in self._outs:
                if all(d >= 0 for d in spec.shape[1:]):
                    self._output_buffer(spec, (self.fixed_batch or self.max_batch, *spec.shape[1:]))
            self._stream = new_stream(self.device)
            self._done = new_event()

    def _build(
        self,
        model: Path,
        max_batch: int,
        opt_batch: int | None,
        input_hw: tuple[int, int] | None,
        cache_dir: str | Path | None,
        version_compatible: bool,
    ) -> None:
        """The engine of an ONNX model, from the cache or built into it."""
        from tiled_detector.engines.onnx_model import onnx_metadata
        from tiled_detector.engines.tensorrt_build import BuildOptions, load_or_build

        self.metadata = onnx_metadata(model)
        options = BuildOptions(
            precision=self.precision,
            max_batch=max_batch,
            # the default of `tiled-detector build-engine`, so that both find the same cached engine
            opt_batch=opt_batch or min(BuildOptions.opt_batch, max_batch),
            input_hw=input_hw or self.metadata.hw,
            version_compatible=version_compatible,
        )
        self._engine, self.engine_path = load_or_build(
            self.trt, self._runtime, self._logger, model, options, self.device, cache_dir
        )

    def _deserialize(self, model: Path) -> None:
        """The engine in a serialized engine file (after ultralytics' metadata header, where it has one)."""
        self.metadata, data = split_engine_file(model.read_bytes())
        self._engine = deserialize(self._runtime, data)
        if self._engine is None:
            why = (
                LEAN_ENGINES.format(module=self.trt.__name__, version=self.trt.__version__)
                if is_lean(self.trt)
                else "engines are tied to the TensorRT version and GPU that built them (unless built version-"
                "compatible, and then loaded with engine_host_code_allowed); rebuild it (tiled-detector "
                "build-engine MODEL.onnx) or pass the .onnx to build through the cache"
            )
            raise TensorRTError(
                f"{model} is not an engine this TensorRT ({self.trt.__version__}) and GPU can run: {why}"
            )
        self.engine_path = model

    def _context(self, shape: tuple[int, ...]) -> ShapeContext:
        """The execution context of this input shape, made (its shape set) at the first call with it; on TensorRT
        8.5 / 8.6 the one context, re-shaped. A batch size optimization profile 0 does not take is refused in one
        line, before any context is made or re-shaped for it."""
        self._check_batch(shape[0])
        if self._one_context and self._contexts:
            (context,) = self._contexts.values()
            context.reshape(shape)
            return context
        context = self._contexts.get(shape)
        if context is None:
            context = self._contexts[shape] = ShapeContext(
                self.trt, self._engine, self._activations, self._in.name, shape
            )
        return context

    def _check_batch(self, batch: int) -> None:
        """Refuse a batch size outside optimization profile 0 (the one every context here runs), naming the
        engine's profiles."""
        low, high = self._profiles[0]
        if not low <= batch <= high:
            profiles = ", ".join(f"{k}: {a}..{b}" for k, (a, b) in enumerate(self._profiles))
            raise TensorRTError(
                f"the TensorRT engine {self.engine_path} cannot run a batch of {batch} images: its optimization "
                f"profile 0 takes {low}..{high} (profiles {profiles}); rebuild it with a profile from 1 to "
                "max_batch (tiled-detector build-engine MODEL.onnx), or pass the .onnx"
            )

    def close(self) -> None:
        """Release the execution contexts, the engine and the runtime, with the engine's device current (their
        device memory is freed where it was made); the engine cannot run after."""
        if getattr(self, "_engine", None) is None:
            return
        with made_current(self.device):
            getattr(self, "_contexts", {}).clear()
            self._engine = None
            self._runtime = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # (at interpreter exit what it needs may be gone already)
            self.close()

    def _prebuilt_precision(self, model: Path, io_dtypes: list[str], context: ShapeContext) -> Precision:
        """The precision a prebuilt engine was built with (the `precision` setting cannot change it), read with an
        execution context whose input shape is set; the requested one, with a warning, when the engine does not
        record it."""
        found = engine_precision(self.trt, self._engine, io_dtypes, context.context)
        if found is None:
            LOG.warning(
                "%s does not record its precision (built without detailed profiling verbosity); reporting the "
                "requested %s",
                model,
                self.precision.value,
            )
            return self.precision
        if found is not self.precision:
            LOG.warning(
                "%s was built for %s: the precision setting %s does not apply to a prebuilt engine",
                model,
                found.value,
                self.precision.value,
            )
        return found

    @property
    def done_event(self) -> Any:
        """torch CUDA event recorded after the last enqueue; `other_stream.wait_event(...)` before reading."""
        return self._done

    def input_buffer(self, batch: int) -> torch.Tensor | None:
        """View of the engine's own input memory for `batch` images: write preprocessed tiles here and
        pass the view to `infer`, which then binds it without a copy. None above `max_batch` (the frame program
        never asks for more)."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        return self._input[:batch] if batch <= self.max_batch else None

    def _infer(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        n = batch.shape[0]
        run = self.fixed_batch or n  # a static-batch engine runs its full batch, padded with zeros
        with made_current(self.device):
            source = self._bind_input(batch, run)
            context = self._context(tuple(source.shape))
            addresses = {self._in.name: source.data_ptr()}
            outputs = {}
            for spec in self._outs:
                out = self._output_buffer(spec, context.output_shape(spec.name))
                outputs[spec.name] = out if run == n else out[:n]
                addresses[spec.name] = out.data_ptr()
            current = current_stream(self.device)
            if current.cuda_stream not in DEFAULT_STREAMS:
                if not capturing(self.device):  # after the previous call, whatever stream ran it
                    current.wait_event(self._done)
                context.enqueue(addresses, current.cuda_stream)
                self._done.record(current)
                return outputs
            # torch's default stream: the engine's own stream, after the work queued so far and before what follows
            self._stream.wait_stream(current)
            self._stream.wait_event(self._done)
            if source.untyped_storage().data_ptr() != self._input.untyped_storage().data_ptr():
                keep_alive(source, self._stream)  # the caller's batch, read on the engine's stream
            context.enqueue(addresses, self._stream.cuda_stream)
            self._done.record(self._stream)
            current.wait_event(self._done)
        return outputs

    def _bind_input(self, batch: torch.Tensor, run: int) -> torch.Tensor:
        """`batch` itself when TensorRT can read it in place (its type, device and shape, contiguous, 256-byte
        aligned), else a copy into the input buffer."""
        expected = self._input.shape[1:]
        n = batch.shape[0]
        if batch.dim() != 4 or batch.shape[1:] != expected or not 1 <= n <= self.max_batch:
            raise ValueError(
                f"input batch must be (1..{self.max_batch}, {', '.join(map(str, expected))}), "
                f"got {tuple(batch.shape)}"
            )
        in_place = batch.dtype == self._input.dtype and batch.device == self._input.device
        if in_place and run == n and batch.is_contiguous() and batch.data_ptr() % TENSOR_ALIGNMENT == 0:
            return batch
        buffer = self._input[:run]
        if buffer.data_ptr() != batch.data_ptr():
            buffer[:n].copy_(batch)
        buffer[n:].zero_()
        return buffer

    def _output_buffer(self, spec: IOTensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The output buffer's leading `shape[0]` rows (reallocated only for a shape it cannot hold)."""
        if any(d < 0 for d in shape):
            raise TensorRTError(f"output {spec.name!r} has a data-dependent shape {shape}: not supported")
        buffer = self._outputs.get(spec.name)
        if buffer is None or tuple(buffer.shape[1:]) != shape[1:] or buffer.shape[0] < shape[0]:
            buffer = self._outputs[spec.name] = allocate(shape, spec.dtype, self.device)
        return buffer[: shape[0]]
