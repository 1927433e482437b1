"""Build TensorRT engines from ONNX at fp32 / fp16 / int8 across TensorRT 8, 10 and 11, through the cache.

What a precision means depends on the TensorRT feature set (`PRECISION_ACTIONS`, a table):
- 8.x / 10.x: builder flags FP16 / INT8; INT8 from an ONNX with Q/DQ nodes (explicit), else through an
  IInt8EntropyCalibrator2 fed with calibration images tiled exactly as at run time, with a cache file.
- 11+: no FP16/INT8 builder flags, networks are strongly typed. fp16 = the ONNX converted to fp16 before the
  build (graph inputs/outputs kept fp32 behind Cast nodes); int8 = an ONNX with Q/DQ nodes, made by NVIDIA
  ModelOpt from the calibration images when `modelopt` is importable, otherwise a clear error.
"""

from __future__ import annotations

import enum
import importlib.util
import io
import logging
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import torch

from tiled_detector.engines.base import Precision
from tiled_detector.engines.cache import EngineCache, EngineKey, atomic_write, sha256_file
from tiled_detector.engines.metadata import ModelMetadata, exporter_metadata
from tiled_detector.engines.tensorrt_api import TensorRTError, checked, deserialize, trt_version

LOG = logging.getLogger(__name__)
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
WORKSPACE_BYTES = 2 << 30

MODELOPT_MISSING = (
    "INT8 on TensorRT {version} needs an ONNX with QuantizeLinear/DequantizeLinear (Q/DQ) nodes: TensorRT 11 "
    "removed implicit INT8 calibration. Either install NVIDIA ModelOpt (`pip install 'nvidia-modelopt[onnx]'`) "
    "and rerun with calibration images (`tiled-detector build-engine {model} --precision int8 --calib DIR`), "
    "or quantize yourself (`python -m modelopt.onnx.quantization --onnx_path={model} --quantize_mode=int8 "
    "--calibration_data=calib.npy --output_path=model.qdq.onnx`) and build from model.qdq.onnx."
)


class FeatureSet(str, enum.Enum):
    """TensorRT generations whose build APIs differ."""

    TRT8 = "trt8"  # builder flags, implicit INT8 calibration, EXPLICIT_BATCH network flag required
    TRT10 = "trt10"  # builder flags, calibration deprecated (10.1) but present, explicit batch implied
    TRT11 = "trt11"  # strongly typed only: no FP16/INT8 flags, no calibrator


class Int8Source(str, enum.Enum):
    """Where INT8 scales come from."""

    NONE = "none"
    CALIBRATOR = "calibrator"  # IInt8EntropyCalibrator2, unless the ONNX already has Q/DQ nodes
    QDQ = "qdq"  # Q/DQ nodes in the ONNX (made by ModelOpt when missing)


@dataclass(frozen=True)
class BuildActions:
    """What to do for one (feature set, precision)."""

    network_flags: tuple[str, ...] = ()  # NetworkDefinitionCreationFlag members (set where they exist)
    builder_flags: tuple[str, ...] = ()  # BuilderFlag members
    onnx_fp16: bool = False  # convert the ONNX to fp16 (I/O kept fp32) before parsing
    int8: Int8Source = Int8Source.NONE


PRECISION_ACTIONS: dict[tuple[FeatureSet, Precision], BuildActions] = {
    (FeatureSet.TRT8, Precision.FP32): BuildActions(network_flags=("EXPLICIT_BATCH",)),
    (FeatureSet.TRT8, Precision.FP16): BuildActions(
        network_flags=("EXPLICIT_BATCH",), builder_flags=("FP16",)
    ),
    (FeatureSet.TRT8, Precision.INT8): BuildActions(
        network_flags=("EXPLICIT_BATCH",), builder_flags=("FP16", "INT8"), int8=Int8Source.CALIBRATOR
    ),
    (FeatureSet.TRT10, Precision.FP32): BuildActions(),
    (FeatureSet.TRT10, Precision.FP16): BuildActions(builder_flags=("FP16",)),
    (FeatureSet.TRT10, Precision.INT8): BuildActions(
        builder_flags=("FP16", "INT8"), int8=Int8Source.CALIBRATOR
    ),
    (FeatureSet.TRT11, Precision.FP32): BuildActions(network_flags=("STRONGLY_TYPED",)),
    (FeatureSet.TRT11, Precision.FP16): BuildActions(network_flags=("STRONGLY_TYPED",), onnx_fp16=True),
    (FeatureSet.TRT11, Precision.INT8): BuildActions(network_flags=("STRONGLY_TYPED",), int8=Int8Source.QDQ),
}


def feature_set(trt: ModuleType) -> FeatureSet:
    """The feature set of this TensorRT: by BuilderFlag.FP16's presence first, then by major version."""
    major = trt_version(trt)[0]
    if major >= 11 or not hasattr(trt.BuilderFlag, "FP16"):
        return FeatureSet.TRT11
    return FeatureSet.TRT10 if major >= 10 else FeatureSet.TRT8


# --- ONNX preparation ------------------------------------------------------------------------------------


def has_qdq(model: onnx.ModelProto) -> bool:
    """Whether the graph (or a subgraph) has QuantizeLinear / DequantizeLinear nodes."""

    def walk(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
        for node in graph.node:
            yield node
            for attr in node.attribute:
                yield from (n for g in ([attr.g] if attr.HasField("g") else attr.graphs) for n in walk(g))

    return any(node.op_type in QDQ_OPS for node in walk(model.graph))


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """fp16 copy of `model` whose graph inputs and outputs stay fp32 (Cast nodes at the boundary)."""
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(model, keep_io_types=True)


def onnx_input(model: onnx.ModelProto, input_hw: tuple[int, int] | None) -> tuple[str, tuple[int, int, int]]:
    """Name and (C, H, W) of the model's single image input; `input_hw` fills dynamic H/W."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise ValueError(f"expected an ONNX model with one input, got {[i.name for i in inputs]}")
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) != 4:
        raise ValueError(f"expected an NCHW input, got {inputs[0].name} with {len(dims)} dims")
    c, h, w = dims[1:]
    if input_hw is not None:
        if (h > 0 and h != input_hw[0]) or (w > 0 and w != input_hw[1]):
            raise ValueError(f"input_hw {input_hw} contradicts the model's fixed input {h}x{w}")
        h, w = input_hw
    if c <= 0 or h <= 0 or w <= 0:
        raise ValueError(f"the model's input {inputs[0].name} has dynamic C/H/W {dims}: pass input_hw")
    return inputs[0].name, (c, h, w)


def onnx_metadata(model_path: Path) -> ModelMetadata:
    """What an ONNX file's metadata_props say (ultralytics, YOLOv5), read without its weights."""
    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    dims = inputs[0].type.tensor_type.shape.dim if inputs else ()
    props = {prop.key: prop.value for prop in model.metadata_props}
    return exporter_metadata(props, dynamic_batch=not dims or not dims[0].HasField("dim_value"))


def quantize_with_modelopt(model_path: Path, calibration: np.ndarray, output: Path) -> None:
    """Write a Q/DQ INT8 copy of `model_path` made by NVIDIA ModelOpt from `calibration` (N, C, H, W)."""
    from modelopt.onnx.quantization import quantize

    quantize(
        onnx_path=str(model_path),
        quantize_mode="int8",
        calibration_data=calibration,
        calibration_method="entropy",
        output_path=str(output),
    )


# --- calibration data (batches from the caller: see tiled_detector.tools.calibration) ---------------------------


def rebatch(batches: Iterable[torch.Tensor], size: int, limit: int) -> Iterator[torch.Tensor]:
    """Fixed-size batches of `size` images from batches of any size, at most `limit` images in all."""
    pending: list[torch.Tensor] = []
    count = taken = 0
    for batch in batches:
        part = batch[: limit - taken]
        pending.append(part)
        count += len(part)
        taken += len(part)
        while count >= size:
            joined = torch.cat(pending)
            yield joined[:size]
            pending, count = [joined[size:]], count - size
        if taken >= limit:
            return


def make_calibrator(
    trt: ModuleType, batches: Iterable[torch.Tensor], batch_size: int, cache_file: Path
) -> Any:
    """An IInt8EntropyCalibrator2 over device batches of `batch_size` images, with a calibration cache."""
    base = trt.IInt8EntropyCalibrator2

    class _Calibrator(base):
        def __init__(self) -> None:
            base.__init__(self)
            self._batches = iter(batches)
            self._current: torch.Tensor | None = None  # kept alive while TensorRT reads it

        def get_batch_size(self) -> int:
            return batch_size

        def get_batch(self, names: list[str]) -> list[int] | None:
            self._current = next(self._batches, None)
            if self._current is None:
                return None
            self._current = self._current.contiguous()
            return [int(self._current.data_ptr())]

        def read_calibration_cache(self) -> bytes | None:
            return cache_file.read_bytes() if cache_file.exists() else None

        def write_calibration_cache(self, cache: Any) -> None:
            atomic_write(cache_file, bytes(cache))

    return _Calibrator()


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
    calib: Path | None = None  # the calibration source (it names the cached engine)
    # input (height, width) -> engine batches of calibration images, tiled as at run time
    calib_batches: Callable[[tuple[int, int]], Iterable[torch.Tensor]] | None = None
    calib_tiles: int = 128
    workspace_bytes: int = WORKSPACE_BYTES

    def __post_init__(self) -> None:
        if not 1 <= self.opt_batch <= self.max_batch:
            raise ValueError(
                f"need 1 <= opt_batch <= max_batch, got opt {self.opt_batch}, max {self.max_batch}"
            )
        if self.calib_tiles < 1:
            raise ValueError(f"calib_tiles must be >= 1, got {self.calib_tiles}")


def profile_shapes(options: BuildOptions, chw: tuple[int, int, int]) -> tuple[tuple[int, ...], ...]:
    """(min, opt, max) input shapes: dynamic batch 1 .. max_batch, optimised for opt_batch."""
    return tuple((b, *chw) for b in (1, options.opt_batch, options.max_batch))


def _calibration_batches(options: BuildOptions, input_hw: tuple[int, int]) -> Iterator:
    if options.calib_batches is None:
        raise ValueError(
            "INT8 needs calibration images: pass calib=DIR_OR_BAG (--calib), or an ONNX with Q/DQ nodes"
        )
    return rebatch(options.calib_batches(input_hw), options.opt_batch, options.calib_tiles)


def prepare_onnx(
    model_path: Path, actions: BuildActions, options: BuildOptions, trt_version_str: str
) -> bytes:
    """The ONNX bytes to parse: converted to fp16, or quantized with ModelOpt, where the actions say so."""
    model = onnx.load(str(model_path))
    if actions.onnx_fp16:
        model = to_fp16(model)
    elif actions.int8 is Int8Source.QDQ and not has_qdq(model):
        if importlib.util.find_spec("modelopt") is None:
            raise TensorRTError(MODELOPT_MISSING.format(version=trt_version_str, model=model_path))
        _, chw = onnx_input(model, options.input_hw)
        data = torch.cat(list(_calibration_batches(options, chw[1:]))).cpu().numpy()
        with tempfile.TemporaryDirectory() as tmp:
            quantized = Path(tmp) / "model.qdq.onnx"
            quantize_with_modelopt(model_path, data, quantized)
            model = onnx.load(str(quantized))
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
    calib_cache: Path | None = None,
) -> bytes:
    """Build a serialized engine from `model_path` as `PRECISION_ACTIONS` says for this TensorRT."""
    actions = PRECISION_ACTIONS[(feature_set(trt), options.precision)]
    data = prepare_onnx(model_path, actions, options, str(trt.__version__))
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
    if hasattr(trt, "ProfilingVerbosity"):  # layer formats in the engine: it reports its own precision
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    lo, opt, hi = profile_shapes(options, chw)
    profile = checked(builder.create_optimization_profile, what="create_optimization_profile")
    profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    if actions.int8 is Int8Source.CALIBRATOR and not has_qdq(model):
        calibration_profile = checked(builder.create_optimization_profile, what="create_optimization_profile")
        calibration_profile.set_shape(name, opt, opt, opt)
        config.set_calibration_profile(calibration_profile)
        batches = _calibration_batches(options, chw[1:])
        cache_file = calib_cache or model_path.with_suffix(".calib")
        config.int8_calibrator = make_calibrator(trt, batches, options.opt_batch, cache_file)
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


def engine_key(
    trt: ModuleType, model_path: Path, options: BuildOptions, gpu: tuple[str, tuple[int, int]]
) -> EngineKey:
    """The cache key of the engine these options build on this TensorRT and GPU."""
    name, chw = onnx_input(onnx.load(str(model_path), load_external_data=False), options.input_hw)
    extra = (("input", name),)
    if options.precision is Precision.INT8 and options.calib is not None:
        extra += (("calib", str(options.calib.resolve())), ("calib_tiles", str(options.calib_tiles)))
    return EngineKey(
        model_name=model_path.stem,
        onnx_sha256=sha256_file(model_path),
        precision=options.precision.value,
        profile=profile_shapes(options, chw),
        trt_version=str(trt.__version__),
        gpu_name=gpu[0],
        compute_capability=(int(gpu[1][0]), int(gpu[1][1])),
        extra=extra,
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
    """The deserialized engine for `model_path` from the cache, built (once, under a lock) when missing."""
    key = engine_key(trt, model_path, options, gpu or gpu_identity(device))
    cache = EngineCache(cache_dir)
    calib_cache = cache.path_for(key).with_suffix(".calib")
    return cache.get_or_build(
        key,
        build=lambda: build_serialized(trt, logger, model_path, options, device, progress, calib_cache),
        load=lambda data: deserialize(runtime, data),
    )
