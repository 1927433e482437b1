"""A batch-1 ONNX export run as one batch: its batch dimension rewritten once to a dynamic one, proven equal to
per-view calls before use, and cached.

Exporters fix the batch at 1 by default (YOLOX's `tools/export_onnx.py`, ultralytics' `export(format="onnx")`), and
then every view of a tiled frame is an engine call of its own. The rewrite makes the input's and outputs' first
dimension symbolic, drops the intermediate shapes the exporter recorded (they are inferred again), turns the
batch-1 constants of `Reshape` shapes into "whatever the batch is" (-1, or 0: copy the input's first dimension,
where the shape already has a -1), and a `Resize` to constant `sizes` of batch 1 (PyTorch 1.x's export of
`F.interpolate(size=...)`: NanoDet's FPN) into the same resize by `scales` (output / input per dimension, the
input's shape inferred from the batch-1 graph), which follow the batch; weights also listed as graph inputs (the
habit of Paddle2ONNX and PyTorch 1.x exports, harmless from IR version 4) leave the inputs, so that ONNX Runtime
folds them as the constants they are. Whether that is right for the graph at hand is not assumed: the rewritten model
must give the original's outputs, view for view, on sample views of a batch, before it is used or cached (key:
the model's sha256, the rewrite's own version `REWRITE` and onnx's and ONNX Runtime's; temporary file + rename, like the Q/DQ models); where it does not
(or cannot be run), the model runs view by view, with one INFO line saying why.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from tiled_detector.engines.cache import EngineCache, entry_name, sha256_file
from tiled_detector.engines.onnx_model import image_input
from tiled_detector.runtime.errors import one_line

LOG = logging.getLogger(__name__)
BATCH = "batch"  # the symbolic batch dimension's name
PROOF_VIEWS = 3  # sample views the rewritten model must get right, in one batch
REWRITE = (
    "symbolic batch dim, value_info dropped, Reshape of values batch-1 -> -1 or 0, Resize sizes -> scales, v4"
)


def fixed_batch_one(model: onnx.ModelProto) -> bool:
    """Whether the model's image input has a batch fixed at 1."""
    dims = image_input(model).type.tensor_type.shape.dim
    return bool(dims) and dims[0].HasField("dim_value") and dims[0].dim_value == 1


def _symbolic_batch(value: onnx.ValueInfoProto) -> None:
    dims = value.type.tensor_type.shape.dim
    if dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
        dims[0].dim_param = BATCH


def _constant(graph: onnx.GraphProto, name: str) -> onnx.TensorProto | None:
    """The tensor an initializer or a Constant node gives `name`, else None (a computed value)."""
    for init in graph.initializer:
        if init.name == name:
            return init
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name and node.attribute:
            return node.attribute[0].t if node.attribute[0].HasField("t") else None
    return None


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Every value's static shape in the batch-1 graph (onnx's shape inference; empty where it cannot)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnx's own errors: the Resize rewrite is then skipped, and the proof decides
        return {}
    values = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    return {
        v.name: [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
        for v in values
    }


def _resize_by_scales(graph: onnx.GraphProto, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> None:
    """A Resize to constant batch-1 `sizes` made the same resize by `scales` (output / input per dimension)."""
    sizes = _constant(graph, node.input[3]) if len(node.input) == 4 and node.input[3] else None
    source = shapes.get(node.input[0], [])
    if sizes is None or not source or min(source) <= 0:
        return
    size = numpy_helper.to_array(sizes)
    if size.ndim != 1 or len(size) != len(source) or size[0] != 1:
        return
    name = f"{node.name or node.output[0]}_td_scales"
    graph.initializer.append(numpy_helper.from_array((size / np.array(source)).astype(np.float32), name))
    node.input[2] = name
    del node.input[3]


def rebatched(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a batch-1 model whose batch is dynamic (see the module's docstring); not yet proven equal."""
    shapes = _inferred_shapes(model)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    _symbolic_batch(image_input(result))
    for output in graph.output:
        _symbolic_batch(output)
    del graph.value_info[:]
    # initializers need not be inputs: as inputs they could be fed, so are not folded
    if result.ir_version >= 4:
        weights = {init.name for init in graph.initializer}
        inputs = [value for value in graph.input if value.name not in weights]
        del graph.input[:]
        graph.input.extend(inputs)
    constants = {init.name for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Resize":
            _resize_by_scales(graph, node, shapes)
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        if (
            node.input[0] in constants
        ):  # a weight reshaped (a quantized conv's bias to (1, C, 1, 1)): no batch
            continue
        tensor = _constant(graph, node.input[1])
        if tensor is None:
            continue  # a computed shape follows the batch by itself
        shape = numpy_helper.to_array(tensor).copy()
        if shape.ndim != 1 or not len(shape) or shape[0] != 1:
            continue
        shape[0] = 0 if (shape == -1).any() else -1
        tensor.CopyFrom(numpy_helper.from_array(shape.astype(np.int64), tensor.name))
    return result


def _sample_views(model: onnx.ModelProto, count: int) -> np.ndarray:
    """`count` deterministic sample views for the model's input: noise at the two usual pixel scales (0-1 and
    0-255) and a flat grey."""
    node = image_input(model)
    _, channels, height, width = (d.dim_value for d in node.type.tensor_type.shape.dim)
    rng = np.random.default_rng(0)
    views = rng.random((count, channels, height, width), dtype=np.float32)
    views[1::2] *= 255.0
    views[-1] = 0.5
    dtype = onnx.helper.tensor_dtype_to_np_dtype(node.type.tensor_type.elem_type)
    return views.astype(dtype)


def proof(original: bytes, rewritten: bytes, views: int = PROOF_VIEWS) -> str | None:
    """None when `rewritten` run on a batch of sample views gives, view for view, what `original` gives on each
    alone (ONNX Runtime, CPU); else why not."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        one = ort.InferenceSession(original, options, providers=["CPUExecutionProvider"])
        many = ort.InferenceSession(rewritten, options, providers=["CPUExecutionProvider"])
        name = one.get_inputs()[0].name
        batch = _sample_views(onnx.load_from_string(original), views)
        expected = [one.run(None, {name: batch[i : i + 1]}) for i in range(views)]
        got = many.run(None, {name: batch})
    except Exception as error:  # ONNX Runtime's own exception types
        return f"the rewritten model does not run a batch ({one_line(error)})"
    for k, output in enumerate(one.get_outputs()):
        reference = np.concatenate([e[k] for e in expected])
        if got[k].shape != reference.shape:
            return f"output {output.name} is {list(got[k].shape)} for a batch of {views}, not {list(reference.shape)}"
        scale = float(np.abs(reference).max()) or 1.0
        if not np.allclose(got[k], reference, rtol=1e-4, atol=1e-4 * scale):
            worst = float(np.abs(got[k].astype(np.float64) - reference).max())
            return f"output {output.name} differs from per-view calls by up to {worst:.3g}"
    return None


@dataclass(frozen=True)
class RebatchKey:
    """A rewritten model's cache entry: the original's bytes, the rewrite and the tools' versions."""

    model_name: str
    model_sha256: str
    versions: tuple[tuple[str, str], ...]

    @property
    def file_name(self) -> str:
        """`<model>-batch-<digest16>.onnx`."""
        digest = hashlib.sha256(
            "\n".join((self.model_sha256, REWRITE, repr(self.versions))).encode()
        ).hexdigest()
        return entry_name(self.model_name, "batch", digest, ".onnx")


def _dynamic(data: bytes) -> bool | None:
    """True for the bytes of an ONNX model whose batch is not fixed at 1 (a usable entry), else None."""
    try:
        return None if fixed_batch_one(onnx.load_from_string(data)) else True
    except Exception:  # a truncated or foreign file
        return None


class RebatchError(Exception):
    """The rewrite was not proven equal: the model runs view by view."""


def dynamic_batch_model(path: Path, cache_dir: str | Path | None = None) -> Path:
    """The model to load for `path`: itself unless its batch is fixed at 1, else the cached rewrite with a dynamic
    batch (made and proven on first use), or itself again when the rewrite cannot be proven equal (one INFO line;
    nothing is cached)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
        if not fixed_batch_one(model) or any(
            init.HasField("data_location") and init.data_location for init in model.graph.initializer
        ):
            return path
    except Exception:  # not ours to report: the engine loading it says why
        return path
    try:
        import onnxruntime
    except ImportError:
        LOG.info(
            "%s takes one image per call; without onnxruntime its batch cannot be rewritten and proven, so "
            "each view is an engine call (pip install onnxruntime)",
            path,
        )
        return path
    versions = (("onnx", onnx.__version__), ("onnxruntime", onnxruntime.__version__))  # and `REWRITE`
    key = RebatchKey(path.stem, sha256_file(path), versions)

    def build() -> bytes:
        original = model.SerializeToString()
        rewritten = rebatched(model).SerializeToString()
        why = proof(original, rewritten)
        if why is not None:
            raise RebatchError(why)
        LOG.info(
            "%s takes one image per call: rewritten to a dynamic batch (proven equal on %d sample views; "
            "cached)",
            path,
            PROOF_VIEWS,
        )
        return rewritten

    try:
        return EngineCache(cache_dir).get_or_build(key, build=build, load=_dynamic)[1]
    except RebatchError as why:
        LOG.info(
            "%s takes one image per call and its batch cannot be made dynamic (%s): each view is an engine "
            "call",
            path,
            why,
        )
        return path
