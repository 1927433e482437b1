"""The TensorRT Python bindings: which module provides them, its version, checked calls, a logger, and engine
deserialisation. Shared by the engine (`tensorrt.py`) and the builder (`tensorrt_build.py`)."""

from __future__ import annotations

import importlib
import json
import logging
import re
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, TypeVar

from tiled_detector.engines.base import Precision

LOG = logging.getLogger(__name__)
R = TypeVar("R")

# Module names of the TensorRT Python bindings, in order of preference: the full package, TensorRT-RTX,
# the lean runtime (as `tensorrt_lean`, and as the standalone wheel's `tensorrt_lean_bindings`).
TENSORRT_MODULES = ("tensorrt", "tensorrt_rtx", "tensorrt_lean", "tensorrt_lean_bindings")
# The lean runtime builds nothing and deserialises only engines built with BuilderFlag.VERSION_COMPATIBLE (NvInfer.h:
# "Restrict to lean runtime operators to provide version forward compatibility for the plan").
LEAN_MODULES = frozenset({"tensorrt_lean", "tensorrt_lean_bindings"})
LEAN_ENGINES = (
    "the lean runtime ({module}) runs only version-compatible engines: build one where the full TensorRT {version} "
    "is installed (tiled-detector build-engine MODEL.onnx --version-compatible --out model.engine; it carries the "
    "lean runtime, host code) and load it with the engine option engine_host_code_allowed"
)


class TensorRTError(RuntimeError):
    """A TensorRT call failed."""


def import_tensorrt() -> ModuleType:
    """The first importable TensorRT binding module of `TENSORRT_MODULES`."""
    failures = []
    for name in TENSORRT_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as err:
            failures.append(f"{name}: {err}")
    raise ImportError(
        "no TensorRT Python bindings found (" + "; ".join(failures) + "). Jetson: `sudo apt install "
        "python3-libnvinfer` and a venv made with --system-site-packages; x86_64: `pip install tensorrt`"
    )


def trt_version(trt: ModuleType) -> tuple[int, ...]:
    """`trt.__version__` as integers, e.g. (10, 3, 0, 30)."""
    return tuple(int(part) for part in re.findall(r"\d+", str(trt.__version__)))


def is_lean(trt: ModuleType) -> bool:
    """Whether `trt` is TensorRT's lean runtime (`LEAN_MODULES`)."""
    return trt.__name__.split(".")[0] in LEAN_MODULES


def checked(call: Callable[..., R], *args: Any, what: str, **kwargs: Any) -> R:
    """Call a TensorRT function; a raised error, None or False becomes a `TensorRTError` naming `what`."""
    try:
        result = call(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError) as err:
        raise TensorRTError(f"TensorRT {what} failed: {err}") from err
    if result is None or result is False:
        raise TensorRTError(f"TensorRT {what} failed (returned {result!r}); the TensorRT log above says why")
    return result


def make_logger(trt: ModuleType, verbose: bool = False) -> Any:
    """A TensorRT logger that forwards to Python logging."""
    severity = trt.ILogger.Severity
    levels = {
        severity.INTERNAL_ERROR: logging.CRITICAL,
        severity.ERROR: logging.ERROR,
        severity.WARNING: logging.WARNING,
        severity.INFO: logging.INFO,
        severity.VERBOSE: logging.DEBUG,
    }

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, sev: Any, msg: str) -> None:
            if verbose or sev in (severity.INTERNAL_ERROR, severity.ERROR, severity.WARNING):
                LOG.log(levels.get(sev, logging.INFO), "[TensorRT] %s", msg)

    return _Logger()


def make_runtime(trt: ModuleType, logger: Any, host_code_allowed: bool = False) -> Any:
    """A TensorRT runtime; `host_code_allowed` lets it deserialise engines that carry host code (a version-compatible
    engine carries the lean runtime): NVIDIA's samples set `engine_host_code_allowed` for exactly those
    (samples/common/sampleEngines.cpp, samples/python/engine_refit_onnx_bidaf/build_and_refit_engine.py). Only for
    engine files you trust: their code runs in this process."""
    runtime = checked(trt.Runtime, logger, what="Runtime()")
    if host_code_allowed:
        if not hasattr(runtime, "engine_host_code_allowed"):
            raise TensorRTError(
                f"TensorRT {trt.__version__} cannot run engines with host code: version-compatible engines need "
                "TensorRT 8.6 or newer"
            )
        runtime.engine_host_code_allowed = True
    return runtime


def deserialize(runtime: Any, data: bytes) -> Any | None:
    """The ICudaEngine in `data`, or None when it is not an engine this TensorRT and GPU can run."""
    try:
        return runtime.deserialize_cuda_engine(data)
    except (RuntimeError, TypeError, ValueError) as err:
        LOG.warning("engine does not deserialize: %s", err)
        return None


# The engine inspector's per-tensor type fields: TensorRT 8.2 to 10.x write one "Format/Datatype" string ("Channel
# major FP16 format where channel % 8 == 0"), TensorRT 11 a "Format" and a "Datatype" ("DataType" for its I/O
# tensors): NVIDIA's "Migrating IEngineInspector Usage from TensorRT 10.x to 11.x" and the layer-information schema
# of TensorRT 11.1's trt-perf-analysis (.agents/skills/trt-perf-analysis/schemas/analyze-data.schema.json).
TENSOR_TYPE_FIELDS = ("Format/Datatype", "Format", "Datatype", "DataType")
# the words (of a type field or a torch dtype) that name each reduced precision, lowest first ("uint8", "bfloat16"
# are other words)
PRECISION_WORDS = (
    (Precision.INT8, frozenset({"int8"})),
    (Precision.FP16, frozenset({"fp16", "half", "float16"})),
)


def lowest_precision(types: Iterable[str]) -> Precision | None:
    """The lowest precision named by `types` (inspector type fields or torch dtypes); None when none is reduced."""
    words = {word for text in types for word in re.findall(r"[a-z0-9]+", text.lower())}
    return next((precision for precision, names in PRECISION_WORDS if words & names), None)


def layer_types(trt: ModuleType, engine: Any, context: Any | None = None) -> list[str]:
    """The type fields of every layer's inputs and outputs, from the engine inspector (an engine built with detailed
    profiling verbosity; with `context`, an execution context whose input shapes are set, so that an engine with
    dynamic shapes reports its formats instead of "N/A due to dynamic shapes"); [] when the engine does not say."""
    detailed = getattr(trt, "ProfilingVerbosity", None)
    if detailed is None or getattr(engine, "profiling_verbosity", None) != detailed.DETAILED:
        return []
    try:
        inspector = checked(engine.create_engine_inspector, what="create_engine_inspector")
        if context is not None:
            inspector.execution_context = context
        info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    except (TensorRTError, AttributeError, TypeError, json.JSONDecodeError) as error:
        LOG.debug("no layer information: %s", error)
        return []
    layers = [layer for layer in info.get("Layers", []) if isinstance(layer, dict)]
    found = (
        str(tensor[field])
        for layer in layers
        for tensor in (*layer.get("Inputs", ()), *layer.get("Outputs", ()))
        if isinstance(tensor, dict)
        for field in TENSOR_TYPE_FIELDS
        if field in tensor
    )
    return [text for text in found if not text.upper().startswith("N/A")]


def engine_precision(
    trt: ModuleType, engine: Any, io_dtypes: Iterable[str], context: Any | None = None
) -> Precision | None:
    """The lowest precision an engine's layers run in, read from the engine itself: from the engine inspector's
    layer types (`layer_types`) when it was built with detailed profiling verbosity (as `build-engine` builds), else
    from its I/O tensor types (`io_dtypes`, e.g. "torch.float16") when they are reduced; None when the engine does
    not say (fp32 I/O, no layer details)."""
    types = layer_types(trt, engine, context)
    if types:
        return lowest_precision(types) or Precision.FP32
    return lowest_precision(io_dtypes)
