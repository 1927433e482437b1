"""The engine a config asks for, and how the frame program runs on it: compiled (torch.compile) where `compile`
is on and can be had, captured as a CUDA graph where the fixed-size path runs on CUDA with `cuda_graph` on."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from tiled_detector.config import DetectorConfig
from tiled_detector.engines.base import Engine, load_engine
from tiled_detector.pipeline.program import Capture, Compiler, fused
from tiled_detector.runtime.devices import cuda_graph

LOG = logging.getLogger(__name__)


def default_compiler(config: DetectorConfig, engine: Engine) -> Compiler | None:
    """`program.fused` (torch.compile) when `compile` is on and the engine runs on CUDA with triton installed;
    else None (one log line when it was asked for but cannot be had)."""
    if not config.compile:
        return None
    if engine.device.type != "cuda" or importlib.util.find_spec("triton") is None:
        LOG.warning("compile needs a CUDA device and triton (device %s): running uncompiled", engine.device)
        return None
    return fused


def default_capture(config: DetectorConfig, engine: Engine) -> Capture | None:
    """`cuda_graph` when the frame program can be captured: a CUDA device, the fixed-size (sync-free) path and
    `cuda_graph` on; else None (eager). An engine that cannot be recorded (`Engine.capturable` false, or found so
    when capturing) runs eagerly between the captured parts before and after it (`program.Runner`)."""
    return cuda_graph if engine.device.type == "cuda" and config.sync_free and config.cuda_graph else None


def load_config_engine(config: DetectorConfig, model: Path | None = None) -> Engine:
    """The engine `config` asks for, loading `model` in place of `config.model` where given (its Q/DQ copy)."""
    return load_engine(
        model or config.model,
        config.backend,
        config.device,
        config.precision,
        config.max_batch,
        **config.engine_arguments(),
    )
