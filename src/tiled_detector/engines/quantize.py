"""INT8 as a file: an ONNX model with QuantizeLinear / DequantizeLinear (Q/DQ) nodes, made from calibration
batches by ONNX Runtime's `quantize_static`, kept in the engine cache, run by ONNX Runtime as it is and built by
TensorRT (8, 10, 11) from the same bytes.

The recipe (`RECIPE`, part of the cache key) is the one TensorRT's explicit quantization accepts: int8 Q/DQ with
zero points 0 (symmetric activations and weights), weights per output channel, biases left in float, the inputs of
`Conv` nodes only (TensorRT fuses each DQ -> Conv <- DQ; ONNX Runtime runs them as QLinearConv). The first
convolutions (they read the image) and the last ones before an output (box and class regressions, whose pixel
precision decides small objects) stay float: on the bundled model that kept AP_small within 0.02 of fp32, where
quantizing them lost 0.03. Activation ranges: the mean over calibration batches of each batch's min / max.
This module imports neither torch nor TensorRT.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tiled_detector.engines.cache import EngineCache, entry_name
from tiled_detector.engines.onnx_model import graph_inputs, has_qdq, image_input
from tiled_detector.runtime.errors import one_line

QUANTIZED_OPS = ("Conv",)
RECIPE = "ort-quantize_static qdq int8 symmetric per-channel conv-inputs float-bias first-last-float minmax-mean v1"


def float_convs(model: onnx.ModelProto) -> list[str]:
    """Names of the convolutions kept float: those reached from the graph input and those reaching an output
    without passing another quantized operator on the way (none where that would leave nothing to quantize)."""
    nodes = list(model.graph.node)
    producers = {out: node for node in nodes for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def reach(starts: Iterable[str], step: Callable[[str], list[onnx.NodeProto]], ends: Callable) -> set[str]:
        found, seen, todo = set(), set(), list(starts)
        while todo:
            tensor = todo.pop()
            for node in step(tensor):
                if id(node) in seen:
                    continue
                seen.add(id(node))
                if node.op_type in QUANTIZED_OPS:
                    found.add(node.name)
                else:
                    todo.extend(ends(node))
        return found

    first = reach(
        [i.name for i in graph_inputs(model)], lambda t: consumers.get(t, []), lambda n: list(n.output)
    )
    last = reach(
        [o.name for o in model.graph.output],
        lambda t: [producers[t]] if t in producers else [],
        lambda n: list(n.input),
    )
    kept = first | last
    return [] if kept >= {n.name for n in nodes if n.op_type in QUANTIZED_OPS} else sorted(kept)


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Run the block in `path` as the working directory (`contextlib.chdir` from Python 3.11)."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def quantize_onnx(model_path: Path, batches: Iterable[np.ndarray], output: Path, chunk: int = 8) -> int:
    """Write a Q/DQ INT8 copy of `model_path` to `output`, calibrated on `batches` (N, C, H, W float32 of any N,
    fed to the model in chunks of its fixed batch, else of `chunk`); the number of images used. ValueError (one
    line, ONNX Runtime's or onnx's reason) when the model cannot be quantized or `batches` is empty."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        node = image_input(onnx.load(str(model_path), load_external_data=False))
    except Exception as error:
        raise ValueError(f"ONNX Runtime cannot quantize {model_path}: {one_line(error)}") from error
    first = node.type.tensor_type.shape.dim[0] if node.type.tensor_type.shape.dim else None
    fixed = first is not None and first.HasField("dim_value")
    size = first.dim_value if fixed else chunk

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.used = 0
            self._chunks = (
                np.ascontiguousarray(batch[start : start + size], dtype=np.float32)
                for batch in batches
                for start in range(0, len(batch) - (size - 1 if fixed else 0), size)
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            part = next(self._chunks, None)
            if part is None:
                return None
            self.used += len(part)
            return {node.name: part}

    reader = Reader()
    model_path, output = Path(model_path).resolve(), Path(output).resolve()
    # ONNX Runtime's tools write into the working directory (symbolic shape inference saves
    # sym_shape_infer_temp.onnx and its .data there when it gives up): they run in the temporary one
    with tempfile.TemporaryDirectory() as tmp, working_directory(Path(tmp)):
        prepared = Path(tmp) / "prepared.onnx"
        try:
            # shape inference and ONNX Runtime's basic graph optimisations (constant folding, fusing batch norms)
            quant_pre_process(str(model_path), str(prepared), skip_symbolic_shape=True)
            quantize_static(
                str(prepared),
                str(output),
                reader,
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(QUANTIZED_OPS),
                per_channel=True,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=float_convs(onnx.load(str(prepared))),
                calibrate_method=CalibrationMethod.MinMax,
                extra_options={
                    "ActivationSymmetric": True,
                    "WeightSymmetric": True,
                    "QuantizeBias": False,
                    "CalibMovingAverage": True,
                },
            )
        except Exception as error:  # ONNX Runtime's and onnx's own exception types
            if reader.used == 0:
                raise ValueError(f"no calibration images to quantize {model_path} with") from error
            raise ValueError(f"ONNX Runtime cannot quantize {model_path}: {one_line(error)}") from error
    return reader.used


@dataclass(frozen=True)
class QuantizedKey:
    """Everything a Q/DQ model depends on: the float model's bytes, the calibration frames (`calibration`: a digest
    of the source), how they were tiled, how many views, the recipe and the tools' versions."""

    model_name: str
    model_sha256: str
    calibration: str
    tiling: tuple[tuple[str, str], ...]
    views: int
    versions: tuple[tuple[str, str], ...]

    @property
    def digest(self) -> str:
        """Stable hex digest of all fields but the model's name."""
        fields = (
            self.model_sha256,
            self.calibration,
            repr(self.tiling),
            str(self.views),
            RECIPE,
            repr(self.versions),
        )
        return hashlib.sha256("\n".join(fields).encode()).hexdigest()

    @property
    def file_name(self) -> str:
        """`<model>-int8-<digest16>.qdq.onnx`."""
        return entry_name(self.model_name, "int8", self.digest, ".qdq.onnx")


def _valid_qdq(data: bytes) -> bool | None:
    """True for the bytes of an ONNX model with Q/DQ nodes, else None (the cache rebuilds it)."""
    try:
        return True if has_qdq(onnx.load_from_string(data)) else None
    except Exception:  # a truncated or foreign file
        return None


def cached_quantized(
    key: QuantizedKey, build: Callable[[Path], None], cache_dir: str | Path | None = None
) -> Path:
    """The cached Q/DQ model for `key`: `build(path)` writes it to a temporary path under the cache's lock (once,
    whichever process comes first); the cache stores it whole (atomic rename) or not at all."""

    def make() -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.qdq.onnx"
            build(path)
            return path.read_bytes()

    return EngineCache(cache_dir).get_or_build(key, build=make, load=_valid_qdq)[1]
