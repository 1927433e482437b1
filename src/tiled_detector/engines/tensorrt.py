"""TensorRT engine whose buffers are torch tensors (no PyCUDA).

Runs a serialized engine (.engine / .plan) or builds one from ONNX through the engine cache. The input
buffer is preallocated at the profile maximum and exposed (`input_buffer`) so preprocessing can write
straight into it; outputs are allocated once at the profile maximum and every call writes into them, so a
captured CUDA graph replays with the same addresses. Work is enqueued on torch's current CUDA stream and a
torch CUDA event is recorded after it (`done_event`): consumers on the same stream need nothing, consumers on
another stream wait on the event.

The named-tensor API is used (TensorRT >= 8.5: set_input_shape, set_tensor_address, execute_async_v3; older
TensorRT is refused with one line). `current_stream`, `new_event` and `allocate` are the only CUDA touch points, kept as
module functions so tests without a GPU can replace them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tiled_detector.engines.base import Backend, Engine, ModelFormat, Precision, TensorSpec, model_format
from tiled_detector.engines.metadata import split_engine_file
from tiled_detector.engines.tensorrt_api import (
    LOG,
    TensorRTError,
    checked,
    deserialize,
    engine_precision,
    import_tensorrt,
    make_logger,
)

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


# --- CUDA touch points (replaced in tests: no GPU there) -------------------------------------------------


def current_stream(device: torch.device) -> Any:
    """torch's current CUDA stream on `device` (`.cuda_stream` is the raw handle TensorRT needs)."""
    return torch.cuda.current_stream(device)


def new_event() -> Any:
    """A torch CUDA event, recorded after every enqueue."""
    return torch.cuda.Event()


def allocate(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised buffer."""
    return torch.empty(shape, dtype=dtype, device=device)


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


class NamedTensorIO:
    """TensorRT >= 8.5: tensors addressed by name, `execute_async_v3`."""

    def __init__(self, trt: ModuleType, engine: Any, context: Any) -> None:
        self._trt, self._engine, self._context = trt, engine, context

    def tensors(self) -> list[IOTensor]:
        """All I/O tensors in engine order."""
        result = []
        for i in range(self._engine.num_io_tensors):
            name = self._engine.get_tensor_name(i)
            is_input = self._engine.get_tensor_mode(name) == self._trt.TensorIOMode.INPUT
            max_shape = tuple(self._engine.get_tensor_profile_shape(name, 0)[2]) if is_input else None
            result.append(
                IOTensor(
                    name,
                    is_input,
                    tuple(self._engine.get_tensor_shape(name)),
                    torch_dtype(self._engine.get_tensor_dtype(name)),
                    max_shape,
                )
            )
        return result

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Fix the shape of a dynamic input for the next enqueue."""
        checked(self._context.set_input_shape, name, shape, what=f"set_input_shape({name!r}, {shape})")

    def output_shape(self, name: str) -> tuple[int, ...]:
        """Shape of an output given the input shapes set."""
        return tuple(self._context.get_tensor_shape(name))

    def enqueue(self, addresses: dict[str, int], stream_handle: int) -> None:
        """Bind every tensor's address and enqueue the inference on `stream_handle`."""
        for name, address in addresses.items():
            checked(self._context.set_tensor_address, name, address, what=f"set_tensor_address({name!r})")
        checked(self._context.execute_async_v3, stream_handle, what="execute_async_v3")


def tensor_io(trt: ModuleType, engine: Any, context: Any) -> NamedTensorIO:
    """The named-tensor I/O of this engine (TensorRT >= 8.5); older TensorRT is refused with one line."""
    if not hasattr(engine, "num_io_tensors"):
        raise TensorRTError(
            f"TensorRT {trt.__version__} has no named-tensor API (execute_async_v3): TensorRT 8.5 or newer is "
            "needed (JetPack 5.1+)"
        )
    return NamedTensorIO(trt, engine, context)


# --- the engine -------------------------------------------------------------------------------------------


class TensorRTEngine(Engine):
    """A TensorRT engine on one CUDA device; see the module docstring.

    Options: `opt_batch` (optimisation-profile batch when building: tiles per frame + full-frame view),
    `input_hw` (for ONNX models with dynamic height/width), `cache_dir`, `verbose`. INT8 builds from an ONNX with
    Q/DQ nodes (`engines/quantize.py`).
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
    ) -> None:
        super().__init__(model, device, precision, max_batch)
        if self.device.type != "cuda":
            raise ValueError(
                f"the TensorRT backend runs on CUDA devices only, got device {device}: use device cuda"
            )
        self.device = torch.device("cuda", 0 if self.device.index is None else self.device.index)
        self.trt = import_tensorrt()
        self._logger = make_logger(self.trt, verbose)
        self._runtime = checked(self.trt.Runtime, self._logger, what="Runtime()")
        model = Path(model)
        if model_format(model) is ModelFormat.ONNX:
            from tiled_detector.engines.onnx_model import onnx_metadata
            from tiled_detector.engines.tensorrt_build import BuildOptions, load_or_build

            self.metadata = onnx_metadata(model)
            options = BuildOptions(
                precision=self.precision,
                max_batch=max_batch,
                # the default of `tiled-detector build-engine`, so that both find the same cached engine
                opt_batch=opt_batch or min(BuildOptions.opt_batch, max_batch),
                input_hw=input_hw or self.metadata.hw,
            )
            self._engine, self.engine_path = load_or_build(
                self.trt, self._runtime, self._logger, model, options, self.device, cache_dir
            )
        else:
            self.metadata, data = split_engine_file(model.read_bytes())  # ultralytics writes a header first
            self._engine = deserialize(self._runtime, data)
            if self._engine is None:
                raise TensorRTError(
                    f"{model} is not an engine this TensorRT ({self.trt.__version__}) and GPU can run: "
                    "engines are tied to the TensorRT version and GPU that built them; rebuild it "
                    "(tiled-detector build-engine MODEL.onnx) or pass the .onnx to build through the cache"
                )
            self.engine_path = model
        self._context = checked(self._engine.create_execution_context, what="create_execution_context")
        self._io = tensor_io(self.trt, self._engine, self._context)
        tensors = self._io.tensors()
        inputs = [t for t in tensors if t.is_input]
        if len(inputs) != 1:
            raise TensorRTError(f"expected an engine with one input, got {[t.name for t in inputs]}")
        self._in = inputs[0]
        self._outs = [t for t in tensors if not t.is_input]
        if model_format(model) is not ModelFormat.ONNX:
            self.precision = self._prebuilt_precision(model, [str(t.dtype) for t in tensors])
        self.input = TensorSpec(self._in.name, self._in.shape, self._in.dtype)
        self.outputs = tuple(TensorSpec(t.name, t.shape, t.dtype) for t in self._outs)
        self.labels = self.metadata.labels
        max_shape = self._in.max_shape or self._in.shape
        self._bound_batch(max_shape[0])
        self._input = allocate((self.max_batch, *max_shape[1:]), self._in.dtype, self.device)
        # outputs at the largest batch, allocated once (those whose shape depends on the input's H, W at their
        # first call)
        self._outputs: dict[str, torch.Tensor] = {}
        for spec in self._outs:
            if all(d >= 0 for d in spec.shape[1:]):
                self._output_buffer(spec, (self.fixed_batch or self.max_batch, *spec.shape[1:]))
        self._done = new_event()

    def _prebuilt_precision(self, model: Path, io_dtypes: list[str]) -> Precision:
        """The precision a prebuilt engine was built with (the `precision` setting cannot change it); the
        requested one, with a warning, when the engine does not record it."""
        found = engine_precision(self.trt, self._engine, io_dtypes)
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
        source = self._bind_input(batch, run)
        self._io.set_input_shape(self._in.name, tuple(source.shape))
        addresses = {self._in.name: source.data_ptr()}
        outputs = {}
        for spec in self._outs:
            out = self._output_buffer(spec, self._io.output_shape(spec.name))
            outputs[spec.name] = out if run == n else out[:n]
            addresses[spec.name] = out.data_ptr()
        stream = current_stream(self.device)
        self._io.enqueue(addresses, stream.cuda_stream)
        self._done.record(stream)
        return outputs

    def _bind_input(self, batch: torch.Tensor, run: int) -> torch.Tensor:
        """`batch` itself when TensorRT can read it in place, else a copy into the input buffer."""
        expected = self._input.shape[1:]
        n = batch.shape[0]
        if batch.dim() != 4 or batch.shape[1:] != expected or not 1 <= n <= self.max_batch:
            raise ValueError(
                f"input batch must be (1..{self.max_batch}, {', '.join(map(str, expected))}), "
                f"got {tuple(batch.shape)}"
            )
        in_place = batch.dtype == self._input.dtype and batch.device == self._input.device
        if in_place and run == n and batch.is_contiguous():
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
