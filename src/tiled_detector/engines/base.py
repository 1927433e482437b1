"""The engine interface every backend implements, and the registry that picks one by name.

An engine takes one NCHW batch tensor on its device and returns its named outputs on the same device.
Engines are stateless per call: nothing from a call is kept on `self` except reusable buffers.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch

from tiled_detector.devices import concrete_device, require_cuda, same_device
from tiled_detector.options import Option


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (-1 for a dynamic dimension) and dtype of an engine input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class Backend(Option):
    """Engine backends selectable by name."""

    AUTO = "auto"
    TENSORRT = "tensorrt"
    ONNXRUNTIME = "onnxruntime"
    TORCH = "torch"


class Precision(Option):
    """Numeric precision of the engine."""

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class Engine(ABC):
    """A loaded model. Subclasses set `input`, `outputs`, `device` and `max_batch` and implement `_infer`."""

    input: TensorSpec  # (B, C, H, W); B may be -1 (dynamic)
    outputs: tuple[TensorSpec, ...]
    device: torch.device
    max_batch: int
    precision: Precision = Precision.FP32
    backend: Backend
    labels: tuple[str, ...] | None = None  # class names stored in the model file, if any
    reuses_output_buffers: bool = False  # outputs alias buffers the next `_infer` overwrites (TensorRT)
    capturable: bool = False  # a call can be recorded in a CUDA graph (no host sync or allocation per call)
    # the layout `infer` reads without a copy (the preprocessor writes its batch in it)
    memory_format: torch.memory_format = torch.contiguous_format

    @property
    def input_hw(self) -> tuple[int, int]:
        """Model input height and width in pixels."""
        return int(self.input.shape[2]), int(self.input.shape[3])

    @property
    def fixed_batch(self) -> int | None:
        """The batch size a static-batch model requires, None when the batch dimension is dynamic."""
        return int(self.input.shape[0]) if self.input.shape[0] > 0 else None

    def input_buffer(self, batch_size: int) -> torch.Tensor | None:
        """A bound input tensor (at least `batch_size` long) to preprocess into; None: `infer` takes any."""
        return None

    @abstractmethod
    def _infer(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run one batch of at most `max_batch` images (exactly `fixed_batch` when the model has one)."""

    def infer(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run a batch of any size, split into chunks of at most `max_batch`; outputs concatenated on dim 0.

        A static-batch model gets its last chunk zero-padded to `fixed_batch`; padded rows are dropped.
        """
        if (
            not same_device(batch.device, self.device)
            or batch.dtype != self.input.dtype
            or batch.shape[1:] != self.input.shape[1:]
        ):
            raise ValueError(
                f"engine input must be (B, {', '.join(map(str, self.input.shape[1:]))}) "
                f"{self.input.dtype} on {self.device}, "
                f"got {tuple(batch.shape)} {batch.dtype} on {batch.device}"
            )
        if batch.shape[0] <= self.max_batch and batch.shape[0] == (self.fixed_batch or batch.shape[0]):
            return self._infer(batch)
        chunks = torch.split(batch, self.max_batch)
        if len(chunks) == 1:
            return self._infer_padded(chunks[0])
        parts = []
        for chunk in chunks:  # one engine call per chunk of max_batch images
            out = self._infer_padded(chunk)
            # reused output buffers are overwritten by the next chunk: keep a copy of this one's
            parts.append({k: v.clone() for k, v in out.items()} if self.reuses_output_buffers else out)
        return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}

    def _infer_padded(self, chunk: torch.Tensor) -> dict[str, torch.Tensor]:
        size = self.fixed_batch
        if size is None or chunk.shape[0] == size:
            return self._infer(chunk)
        padded = chunk.new_zeros((size, *chunk.shape[1:]))
        padded[: chunk.shape[0]] = chunk
        return {name: out[: chunk.shape[0]] for name, out in self._infer(padded).items()}


# backend -> "module:Class"; modules are imported only when the backend is chosen.
_ENGINES: dict[Backend, str] = {
    Backend.ONNXRUNTIME: "tiled_detector.engines.onnxruntime:OnnxRuntimeEngine",
    Backend.TORCH: "tiled_detector.engines.torch:TorchEngine",
    Backend.TENSORRT: "tiled_detector.engines.tensorrt:TensorRTEngine",
}


def resolve_backend(model: str | Path, backend: str | Backend, device: str | torch.device) -> Backend:
    """Pick the backend for `backend="auto"` from the model file's suffix and the device."""
    chosen = Backend.from_value(backend)
    if chosen is not Backend.AUTO:
        return chosen
    suffix = Path(model).suffix.lower()
    if suffix in {".engine", ".plan", ".trt"}:
        return Backend.TENSORRT
    if suffix in {".pt", ".ts", ".pt2", ".torchscript"}:
        return Backend.TORCH
    if suffix == ".onnx":
        if torch.device(device).type == "cuda" and importlib.util.find_spec("tensorrt") is not None:
            return Backend.TENSORRT
        return Backend.ONNXRUNTIME
    raise ValueError(f"cannot choose a backend for {model!r}: expected .onnx, .engine/.plan, .pt/.ts/.pt2")


# Images per engine call on a CPU (a dynamic batch): per-image time is lowest when a call's activations stay in
# the caches (bundled model, ONNX Runtime, 2-core Xeon: 3.5 ms per image at 4, 5.0 at 9; torch alike)
CPU_BATCH = 4


def engine_class(backend: Backend) -> type[Engine]:
    """The Engine subclass registered for a concrete backend (imports it lazily)."""
    module_name, class_name = _ENGINES[backend].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def load_engine(
    model: str | Path,
    backend: str | Backend = Backend.AUTO,
    device: str | torch.device = "cpu",
    precision: str | Precision = Precision.FP32,
    max_batch: int = 32,
    cpu_batch: int = CPU_BATCH,
    **options: object,
) -> Engine:
    """Load `model` with the chosen backend (`auto` picks by suffix and device); on a CPU a dynamic-batch model
    takes at most `cpu_batch` images per call (`CPU_BATCH`)."""
    if int(cpu_batch) < 1:
        raise ValueError(f"engine option cpu_batch must be >= 1, got {cpu_batch}")
    chosen = resolve_backend(model, backend, device)
    if not Path(model).is_file():
        raise ValueError(
            f"model file {model} not found: give an .onnx, .engine/.plan or .ts/.pt2 file (an empty model "
            "setting loads the bundled one)"
        )
    if torch.device(device).type == "cuda":
        require_cuda(
            device, f"the {chosen.value} engine was asked to run there (device cpu runs without one)"
        )
    on_cpu = torch.device(device).type == "cpu"
    return engine_class(chosen)(
        Path(model),
        device=concrete_device(device),
        precision=Precision.from_value(precision),
        max_batch=min(int(max_batch), int(cpu_batch)) if on_cpu else max_batch,
        **options,
    )
