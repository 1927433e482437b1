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


def deserialize(runtime: Any, data: bytes) -> Any | None:
    """The ICudaEngine in `data`, or None when it is not an engine this TensorRT and GPU can run."""
    try:
        return runtime.deserialize_cuda_engine(data)
    except (RuntimeError, TypeError, ValueError) as err:
        LOG.warning("engine does not deserialize: %s", err)
        return None


def engine_precision(trt: ModuleType, engine: Any, io_dtypes: Iterable[str]) -> Precision | None:
    """The lowest precision an engine's layers run in, read from the engine itself: from the engine inspector's
    layer formats when it was built with detailed profiling verbosity (as `build-engine` builds), else from its
    I/O tensor types (`io_dtypes`, e.g. "torch.float16") when they are reduced; None when the engine does not
    say (fp32 I/O, no layer details)."""
    layers = []
    detailed = getattr(trt, "ProfilingVerbosity", None)
    if detailed is not None and getattr(engine, "profiling_verbosity", None) == detailed.DETAILED:
        try:  # the lean runtime's bindings cannot return the inspector
            inspector = checked(engine.create_engine_inspector, what="create_engine_inspector")
            info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
        except (TensorRTError, json.JSONDecodeError) as error:
            LOG.debug("no layer information: %s", error)
            info = {}
        layers = [layer for layer in info.get("Layers", []) if isinstance(layer, dict)]
    formats = " ".join(
        str(tensor.get("Format/Datatype", ""))
        for layer in layers
        for tensor in (*layer.get("Inputs", ()), *layer.get("Outputs", ()))
    )
    formats = (formats if layers else " ".join(io_dtypes)).lower()
    if "int8" in formats:
        return Precision.INT8
    if "fp16" in formats or "half" in formats or "float16" in formats:
        return Precision.FP16
    return Precision.FP32 if layers else None
