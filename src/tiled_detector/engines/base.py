"""The engine interface every backend implements, and the registry that picks one by name.

An engine takes one NCHW batch tensor on its device and returns its named outputs on the same device.
Engines are stateless per call: nothing from a call is kept on `self` except reusable buffers.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from tiled_detector.engines.metadata import ModelMetadata
from tiled_detector.runtime.devices import concrete_device, require_cuda, same_device
from tiled_detector.settings.options import Option

LOG = logging.getLogger(__name__)


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


class ModelFormat(Option):
    """The model files the engines load, told apart by suffix (`SUFFIXES`)."""

    ONNX = "onnx"
    TENSORRT = "tensorrt engine"
    TORCHSCRIPT = "torchscript"
    TORCH_EXPORT = "torch.export program"


# the one suffix table: model file suffix -> format
SUFFIXES: dict[str, ModelFormat] = {
    ".onnx": ModelFormat.ONNX,
    ".engine": ModelFormat.TENSORRT,
    ".plan": ModelFormat.TENSORRT,
    ".trt": ModelFormat.TENSORRT,
    ".ts": ModelFormat.TORCHSCRIPT,
    ".pt": ModelFormat.TORCHSCRIPT,
    ".torchscript": ModelFormat.TORCHSCRIPT,
    ".pt2": ModelFormat.TORCH_EXPORT,
}


def model_format(model: str | Path) -> ModelFormat:
    """The format of a model file, by its suffix (ValueError listing the suffixes we load)."""
    suffix = Path(model).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"cannot tell the format of {model}: expected one of {', '.join(SUFFIXES)}")
    return SUFFIXES[suffix]


class Engine(ABC):
    """A loaded model. Every backend's constructor is `(model, device, precision, max_batch, **its options)`:
    `Engine.__init__` checks and stores the common arguments; the backend loads the model, sets `input` and
    `outputs` and calls `_bound_batch`; it implements `_infer` for at most `max_batch` images."""

    backend: ClassVar[Backend]
    formats: ClassVar[frozenset[ModelFormat]]  # the model files it loads
    reuses_output_buffers: ClassVar[bool] = (
        False  # outputs alias buffers the next `_infer` overwrites (TensorRT)
    )
    capturable: bool = False  # a call can be recorded in a CUDA graph (no host sync or allocation)
    # why a call cannot be recorded, where the engine knows ('': it can, or it is not known)
    capture_problem: str = ""
    input: TensorSpec  # (B, C, H, W); B may be -1 (dynamic)
    outputs: tuple[TensorSpec, ...]
    metadata: ModelMetadata = ModelMetadata()  # what the model file says about itself (`engines.metadata`)
    labels: tuple[str, ...] | None = None  # class names stored in the model file, if any
    # the layout `infer` reads without a copy (the preprocessor writes its batch in it)
    memory_format: torch.memory_format = torch.contiguous_format

    def __init__(
        self,
        model: str | Path,
        device: torch.device | str = "cpu",
        precision: str | Precision = Precision.FP32,
        max_batch: int = 32,
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.model = Path(model)
        self.device = torch.device(device)
        self.precision = Precision.from_value(precision)
        self.max_batch = max_batch  # asked for; `_bound_batch` settles it once the model is loaded

    def _bound_batch(self, largest: int | None = None) -> None:
        """Settle `max_batch`: a static-batch model's batch, else the one asked for, at most `largest` (the
        engine's own limit, e.g. a TensorRT profile's maximum)."""
        if self.fixed_batch is not None:
            self.max_batch = self.fixed_batch
        elif largest is not None:
            self.max_batch = min(self.max_batch, largest)

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
        """Run one checked batch of 1..`max_batch` images."""

    def infer(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run a batch of 1..`max_batch` images (the frame program cuts larger ones into such calls); a
        static-batch model gets the batch zero-padded to its size, and outputs for the batch's images only."""
        if (
            not same_device(batch.device, self.device)
            or batch.dtype != self.input.dtype
            or batch.shape[1:] != self.input.shape[1:]
            or not 1 <= batch.shape[0] <= self.max_batch
        ):
            raise ValueError(
                f"engine input must be (1..{self.max_batch}, {', '.join(map(str, self.input.shape[1:]))}) "
                f"{self.input.dtype} on {self.device}, "
                f"got {tuple(batch.shape)} {batch.dtype} on {batch.device}"
            )
        return self._infer(batch)

    def _padded(self, batch: torch.Tensor, run: Callable[[torch.Tensor], dict[str, torch.Tensor]]) -> dict:
        """`run` on the batch zero-padded to the model's static batch (if it has one), outputs cut back."""
        size = self.fixed_batch
        if size is None or batch.shape[0] == size:
            return run(batch)
        padded = batch.new_zeros((size, *batch.shape[1:]))
        padded[: batch.shape[0]] = batch
        return {name: out[: batch.shape[0]] for name, out in run(padded).items()}


# backend -> "module:Class"; modules are imported only when the backend is chosen.
_ENGINES: dict[Backend, str] = {
    Backend.ONNXRUNTIME: "tiled_detector.engines.onnxruntime:OnnxRuntimeEngine",
    Backend.TORCH: "tiled_detector.engines.torch:TorchEngine",
    Backend.TENSORRT: "tiled_detector.engines.tensorrt:TensorRTEngine",
}
# the backend `auto` picks for a format (ONNX on CUDA: TensorRT when it is installed)
_AUTO: dict[ModelFormat, Backend] = {
    ModelFormat.ONNX: Backend.ONNXRUNTIME,
    ModelFormat.TENSORRT: Backend.TENSORRT,
    ModelFormat.TORCHSCRIPT: Backend.TORCH,
    ModelFormat.TORCH_EXPORT: Backend.TORCH,
}


@dataclass(frozen=True)
class Choice:
    """What loading a model runs: the backend, the file it loads, and why (`backend: auto` on a CUDA device)."""

    backend: Backend
    model: Path
    why: str | None = None


def _onnxruntime_cuda() -> bool:
    """Whether the installed ONNX Runtime has its CUDA execution provider."""
    if importlib.util.find_spec("onnxruntime") is None:
        return False
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def torch_sibling(model: Path) -> Path | None:
    """The torch file beside an ONNX model, with its stem (the same network: the bundled model's `default.ts`,
    ultralytics' `.torchscript` export), or None."""
    for suffix, found in SUFFIXES.items():
        if (
            found in (ModelFormat.TORCHSCRIPT, ModelFormat.TORCH_EXPORT)
            and model.with_suffix(suffix).is_file()
        ):
            return model.with_suffix(suffix)
    return None


def choose_backend(model: str | Path, backend: str | Backend, device: str | torch.device) -> Choice:
    """The backend (and file) for `backend="auto"` from the model file's format and the device: one that can run
    on the device. An ONNX file on CUDA: TensorRT where it is installed, else ONNX Runtime where it has its CUDA
    execution provider, else torch on the TorchScript file beside it (ValueError, one line, where none of them
    can). Where CUDA itself is missing, ONNX Runtime (the device check then says what is missing)."""
    chosen, path = Backend.from_value(backend), Path(model)
    if chosen is not Backend.AUTO:
        return Choice(chosen, path)
    found = model_format(path)
    if found is not ModelFormat.ONNX or torch.device(device).type != "cuda":
        return Choice(_AUTO[found], path)
    if importlib.util.find_spec("tensorrt") is not None:
        return Choice(Backend.TENSORRT, path, "TensorRT is installed")
    if not torch.cuda.is_available():
        return Choice(Backend.ONNXRUNTIME, path)
    if _onnxruntime_cuda():
        return Choice(Backend.ONNXRUNTIME, path, "ONNX Runtime has its CUDA execution provider")
    sibling = torch_sibling(path)
    if sibling is not None:
        why = f"{sibling.name} beside it: ONNX Runtime here has no CUDA execution provider, TensorRT is not installed"
        return Choice(Backend.TORCH, sibling, why)
    raise ValueError(
        f"backend auto on {device}: nothing here runs {path.name} on CUDA: TensorRT is not installed, ONNX Runtime "
        "has no CUDA execution provider (install onnxruntime-gpu) and no TorchScript file with its stem is beside "
        "it (export one, or use device cpu)"
    )


# Images per engine call on a CPU (a dynamic batch): per-image time is lowest when a call's activations stay in
# the caches (docs/PERFORMANCE.md)
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
    """Load `model` with the chosen backend (`auto` picks by format and device); on a CPU a dynamic-batch model
    takes at most `cpu_batch` images per call (`CPU_BATCH`)."""
    if int(cpu_batch) < 1:
        raise ValueError(f"engine option cpu_batch must be >= 1, got {cpu_batch}")
    choice = choose_backend(model, backend, device)
    if choice.why is not None:
        LOG.info(
            "backend auto on %s: %s, %s (%s)", device, choice.backend.value, choice.model.name, choice.why
        )
    chosen, model = choice.backend, choice.model
    if not Path(model).is_file():
        raise ValueError(
            f"model file {model} not found: give an .onnx, .engine/.plan or .ts/.pt2 file (an empty model "
            "setting loads the bundled one)"
        )
    engine = engine_class(chosen)
    found = model_format(model)
    if found not in engine.formats:
        loads = " or ".join(sorted(f.value for f in engine.formats))
        raise ValueError(
            f"the {chosen.value} backend loads {loads} files, and {model} is a {found.value} file"
        )
    if torch.device(device).type == "cuda":
        require_cuda(
            device, f"the {chosen.value} engine was asked to run there (device cpu runs without one)"
        )
    on_cpu = torch.device(device).type == "cpu"
    return engine(
        Path(model),
        device=concrete_device(device),
        precision=Precision.from_value(precision),
        max_batch=min(int(max_batch), int(cpu_batch)) if on_cpu else int(max_batch),
        **options,
    )
