"""Build TensorRT engines from ONNX at fp32 / fp16 / int8 across TensorRT 8, 10 and 11, through the cache.

What a precision means depends on the TensorRT feature set (`PRECISION_ACTIONS`, a table):
- 8.x / 10.x: builder flags FP16 / INT8 (INT8 lets the Q/DQ layers run in int8, FP16 the rest in fp16).
- 11+: no FP16/INT8 builder flags, networks are strongly typed. fp16 = the ONNX converted to fp16 before the
  build (graph inputs/outputs kept fp32 behind Cast nodes).
INT8 is explicit on every generation: the ONNX must have Q/DQ nodes (`engines/quantize.py` makes them from
calibration frames; the node and `build-engine` do so before building), the very file ONNX Runtime runs.
Implicit calibration (IInt8Calibrator) is not used: deprecated in 10.1 and removed in 11.
fp32 is fp32: TF32 (on by default, BuilderFlag.TF32 in NvInfer.h) is cleared, so Ampere and later GPUs (Orin) do not
round the inputs of fp32 matrix products to 10-bit mantissas. `version_compatible` builds an engine that TensorRT's
lean runtime and later TensorRT versions run (BuilderFlag.VERSION_COMPATIBLE; it carries the lean runtime).
The cache key (`engine_key`) holds all of it: the ONNX and its external data, the recipe, TF32, the profile, the
TensorRT version and the GPU.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import onnx
import torch

from tiled_detector.engines.base import Precision
from tiled_detector.engines.cache import EngineCache, EngineKey
from tiled_detector.engines.onnx_model import INT8_NEEDS_QDQ, has_qdq, onnx_input, onnx_sha256
from tiled_detector.engines.rebatch import dynamic_batch_model, fixed_batch_one
from tiled_detector.engines.tensorrt_api import (
    LEAN_ENGINES,
    TensorRTError,
    checked,
    deserialize,
    is_lean,
    trt_version,
)
from tiled_detector.runtime.devices import made_current

LOG = logging.getLogger(__name__)
WORKSPACE_BYTES = 2 << 30
# what `build_serialized` does beyond the table and the options (profiling verbosity, the fp16 conversion): raised
# when it changes, so that no cached engine of the old recipe is taken for a new one
RECIPE_REVISION = 2


class FeatureSet(str, enum.Enum):
    """TensorRT generations whose build APIs differ."""

    TRT8 = "trt8"  # builder flags, EXPLICIT_BATCH network flag required
    TRT10 = "trt10"  # builder flags, explicit batch implied
    TRT11 = "trt11"  # strongly typed only: no FP16/INT8 flags


@dataclass(frozen=True)
class BuildActions:
    """What to do for one (feature set, precision)."""

    network_flags: tuple[str, ...] = ()  # NetworkDefinitionCreationFlag members (set where they exist)
    builder_flags: tuple[str, ...] = ()  # BuilderFlag members
    cleared_flags: tuple[str, ...] = ()  # BuilderFlag members on by default, cleared (where they exist)
    onnx_fp16: bool = False  # convert the ONNX to fp16 (I/O kept fp32) before parsing
    qdq: bool = False  # the ONNX must carry Q/DQ nodes (explicit INT8)


PRECISION_ACTIONS: dict[tuple[FeatureSet, Precision], BuildActions] = {
    (FeatureSet.TRT8, Precision.FP32): BuildActions(
        network_flags=("EXPLICIT_BATCH",), cleared_flags=("TF32",)
    ),
    (FeatureSet.TRT8, Precision.FP16): BuildActions(
        network_flags=("EXPLICIT_BATCH",), builder_flags=("FP16",)
    ),
    (FeatureSet.TRT8, Precision.INT8): BuildActions(
        network_flags=("EXPLICIT_BATCH",), builder_flags=("FP16", "INT8"), qdq=True
    ),
    (FeatureSet.TRT10, Precision.FP32): BuildActions(cleared_flags=("TF32",)),
    (FeatureSet.TRT10, Precision.FP16): BuildActions(builder_flags=("FP16",)),
    (FeatureSet.TRT10, Precision.INT8): BuildActions(builder_flags=("FP16", "INT8"), qdq=True),
    (FeatureSet.TRT11, Precision.FP32): BuildActions(
        network_flags=("STRONGLY_TYPED",), cleared_flags=("TF32",)
    ),
    (FeatureSet.TRT11, Precision.FP16): BuildActions(network_flags=("STRONGLY_TYPED",), onnx_fp16=True),
    (FeatureSet.TRT11, Precision.INT8): BuildActions(network_flags=("STRONGLY_TYPED",), qdq=True),
}


def feature_set(trt: ModuleType) -> FeatureSet:
    """The feature set of this TensorRT: by BuilderFlag.FP16's presence first, then by major version."""
    major = trt_version(trt)[0]
    flags = getattr(trt, "BuilderFlag", None)
    if major >= 11 or (flags is not None and not hasattr(flags, "FP16")):
        return FeatureSet.TRT11
    return FeatureSet.TRT10 if major >= 10 else FeatureSet.TRT8


# --- ONNX preparation ------------------------------------------------------------------------------------


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """fp16 copy of `model` whose graph inputs and outputs stay fp32 (Cast nodes at the boundary)."""
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(model, keep_io_types=True)


# --- progress -----------------------------------------------------------------------------------------------

ProgressCallback = Callable[[str, int, int], None]  # (phase, steps done, steps in phase)


def make_progress_monitor(trt: ModuleType, callback: ProgressCallback) -> Any | None:
    """A TensorRT IProgressMonitor forwarding to `callback`, or None where TensorRT has none (< 10)."""
    if not hasattr(trt, "IProgressMonitor"):
        return None
    base = trt.IProgressMonitor

    class _Monitor(base):
        def __init__(self) -> None:
            base.__init__(self)
            self._steps: dict[str, int] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self._steps[phase_name] = num_steps
            callback(phase_name, 0, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            callback(phase_name, step + 1, self._steps.get(phase_name, step + 1))
            return True

        def phase_finish(self, phase_name: str) -> None:
            total = self._steps.pop(phase_name, 0)
            callback(phase_name, total, total)

    return _Monitor()


# --- building -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildOptions:
    """How to build an engine from ONNX."""

    precision: Precision = Precision.FP32
    max_batch: int = 32
    opt_batch: int = 9  # tiles per frame + full-frame view
    input_hw: tuple[int, int] | None = None
    workspace_bytes: int = WORKSPACE_BYTES
    # BuilderFlag.VERSION_COMPATIBLE: the engine runs on the lean runtime and on later TensorRT versions
    version_compatible: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.opt_batch <= self.max_batch:
            raise ValueError(
                f"need 1 <= opt_batch <= max_batch, got opt {self.opt_batch}, max {self.max_batch}"
            )


def check_options(trt: ModuleType, options: BuildOptions) -> None:
    """Refuse in one line what this TensorRT cannot build, before anything is parsed or cached: a version-compatible
    engine where BuilderFlag has no VERSION_COMPATIBLE (NvInfer.h: from TensorRT 8.6; JetPack 5.1's 8.5.2 lacks it)."""
    flags = getattr(trt, "BuilderFlag", None)
    if options.version_compatible and flags is not None and not hasattr(flags, "VERSION_COMPATIBLE"):
        raise TensorRTError(
            f"TensorRT {trt.__version__} cannot build version-compatible engines (BuilderFlag.VERSION_COMPATIBLE "
            "came with TensorRT 8.6: JetPack 6.0 and later): build without --version-compatible / "
            "version_compatible"
        )


def profile_shapes(options: BuildOptions, chw: tuple[int, int, int]) -> tuple[tuple[int, ...], ...]:
    """(min, opt, max) input shapes: dynamic batch 1 .. max_batch, optimised for opt_batch."""
    return tuple((b, *chw) for b in (1, options.opt_batch, options.max_batch))


def prepare_onnx(model_path: Path, actions: BuildActions) -> bytes:
    """The ONNX bytes to parse: converted to fp16 where the actions say so; INT8 needs the Q/DQ nodes there."""
    model = onnx.load(str(model_path))
    if actions.onnx_fp16:
        model = to_fp16(model)
    elif actions.qdq and not has_qdq(model):
        raise TensorRTError(INT8_NEEDS_QDQ.format(model=model_path))
    buffer = io.BytesIO()
    onnx.save(model, buffer)
    return buffer.getvalue()


def build_serialized(
    trt: ModuleType,
    logger: Any,
    model_path: Path,
    options: BuildOptions,
    device: torch.device,
    progress: ProgressCallback | None = None,
) -> bytes:
    """Build a serialized engine from `model_path` as `PRECISION_ACTIONS` says for this TensorRT."""
    if not hasattr(trt, "Builder"):
        if is_lean(trt):
            raise TensorRTError(LEAN_ENGINES.format(module=trt.__name__, version=trt.__version__))
        raise TensorRTError(f"this TensorRT module ({trt.__name__}) cannot build engines: it has no Builder")
    check_options(trt, options)
    actions = PRECISION_ACTIONS[(feature_set(trt), options.precision)]
    data = prepare_onnx(model_path, actions)
    model = onnx.load_from_string(data)
    name, chw = onnx_input(model, options.input_hw)

    builder = checked(trt.Builder, logger, what="Builder()")
    flags = 0
    for flag in actions.network_flags:
        if hasattr(trt.NetworkDefinitionCreationFlag, flag):
            flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, flag))
    network = checked(builder.create_network, flags, what="create_network")
    parser = checked(trt.OnnxParser, network, logger, what="OnnxParser()")
    if not parser.parse(data, str(model_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TensorRTError(f"TensorRT cannot parse {model_path}: {errors}")
    config = checked(builder.create_builder_config, what="create_builder_config")
    if hasattr(config, "set_memory_pool_limit"):  # TensorRT >= 8.4
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    else:
        config.max_workspace_size = options.workspace_bytes
    for flag in actions.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    for flag in actions.cleared_flags:
        if hasattr(trt.BuilderFlag, flag):
            config.clear_flag(getattr(trt.BuilderFlag, flag))
    if options.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if hasattr(trt, "ProfilingVerbosity"):  # layer formats in the engine: it reports its own precision
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    lo, opt, hi = profile_shapes(options, chw)
    profile = checked(builder.create_optimization_profile, what="create_optimization_profile")
    profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    monitor = make_progress_monitor(trt, progress) if progress else None
    if monitor is not None:
        config.progress_monitor = monitor
    elif progress:
        LOG.info("building %s (this TensorRT reports no progress; this takes minutes)", model_path.name)
    serialized = checked(builder.build_serialized_network, network, config, what="build_serialized_network")
    return bytes(serialized)


def gpu_identity(device: torch.device) -> tuple[str, tuple[int, int]]:
    """Name and compute capability of the CUDA device."""
    return torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device))


def build_recipe(trt: ModuleType, options: BuildOptions) -> tuple[tuple[str, str], ...]:
    """How `build_serialized` builds with these options on this TensorRT, as cache-key entries: the actions of
    `PRECISION_ACTIONS`, TF32, version compatibility, the workspace, the fp16 converter's version."""
    actions = PRECISION_ACTIONS[(feature_set(trt), options.precision)]
    recipe = [
        ("recipe", f"{RECIPE_REVISION} {actions}"),
        ("tf32", "off" if "TF32" in actions.cleared_flags else "on"),
        ("version_compatible", str(options.version_compatible)),
        ("workspace", str(options.workspace_bytes)),
    ]
    if actions.onnx_fp16:
        converter = importlib.metadata.version("onnxconverter-common")
        recipe.append(("fp16_conversion", f"onnxconverter-common {converter}"))
    return tuple(recipe)


def engine_key(
    trt: ModuleType, model_path: Path, options: BuildOptions, gpu: tuple[str, tuple[int, int]]
) -> EngineKey:
    """The cache key of the engine these options build on this TensorRT and GPU (the ONNX with its external data)."""
    name, chw = onnx_input(onnx.load(str(model_path), load_external_data=False), options.input_hw)
    return EngineKey(
        model_name=model_path.stem,
        onnx_sha256=onnx_sha256(model_path),
        precision=options.precision.value,
        profile=profile_shapes(options, chw),
        trt_version=str(trt.__version__),
        gpu_name=gpu[0],
        compute_capability=(int(gpu[1][0]), int(gpu[1][1])),
        extra=(("input", name), *build_recipe(trt, options)),
    )


def load_or_build(
    trt: ModuleType,
    runtime: Any,
    logger: Any,
    model_path: Path,
    options: BuildOptions,
    device: torch.device,
    cache_dir: str | Path | None = None,
    progress: ProgressCallback | None = None,
    gpu: tuple[str, tuple[int, int]] | None = None,
) -> tuple[Any, Path]:
    """The deserialized engine for `model_path` from the cache, built (once, under a lock) when missing. A batch-1
    export is built from its dynamic-batch rewrite where that is proven equal (`engines.rebatch`), so that the
    optimisation profile reaches `max_batch`. Built and deserialised with `device` current (TensorRT works on the
    current device). What this TensorRT cannot build is refused first (`check_options`): nothing reaches the cache."""
    check_options(trt, options)
    if options.max_batch > 1:
        model_path = dynamic_batch_model(model_path, cache_dir)
        if fixed_batch_one(onnx.load(str(model_path), load_external_data=False)):  # not proven: view by view
            options = dataclasses.replace(options, max_batch=1, opt_batch=1)
    key = engine_key(trt, model_path, options, gpu or gpu_identity(device))
    with made_current(device):
        return EngineCache(cache_dir).get_or_build(
            key,
            build=lambda: build_serialized(trt, logger, model_path, options, device, progress),
            load=lambda data: deserialize(runtime, data),
        )
