"""What an ONNX file says without running it: its image input, its exporter's metadata, whether it is quantized
(Q/DQ nodes), the external data files it names and the digest of all its bytes. Shared by ONNX Runtime, the TensorRT
builder and the quantizer; imports neither torch nor TensorRT."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from tiled_detector.engines.cache import sha256_file
from tiled_detector.engines.metadata import ModelMetadata, exporter_metadata

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
INT8_NEEDS_QDQ = (
    "precision int8 runs an ONNX with QuantizeLinear/DequantizeLinear (Q/DQ) nodes, and {model} has none: set "
    "calibration (node parameter calibration, flag --calibration) to a folder of images or a rosbag2 bag of the "
    "camera's frames to quantize it once, or give a Q/DQ model as the model (`tiled-detector build-engine MODEL "
    "--precision int8 --calibration DIR_OR_BAG --backend onnxruntime` writes one)"
)


def graph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its subgraphs."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                yield from graph_nodes(sub)


def has_qdq(model: onnx.ModelProto) -> bool:
    """Whether the graph (or a subgraph) has QuantizeLinear / DequantizeLinear nodes."""
    return any(node.op_type in QDQ_OPS for node in graph_nodes(model.graph))


def file_has_qdq(path: Path) -> bool:
    """`has_qdq` of an ONNX file, read without its external weights; False for a file ONNX cannot read (the
    engine that loads it says why)."""
    try:
        return has_qdq(onnx.load(str(path), load_external_data=False))
    except Exception:  # onnx's DecodeError and friends: not ours to report here
        return False


def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in `graph` and its subgraphs: initializers, sparse initializers and the tensors of node
    attributes (e.g. Constant's value)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph_nodes(graph):
        for attr in node.attribute:
            yield from [attr.t] if attr.HasField("t") else attr.tensors


def external_data_files(model: onnx.ModelProto, directory: Path) -> list[Path]:
    """The files (beside the model, in `directory`) that hold its tensors stored as external data, sorted."""
    locations = {
        ExternalDataInfo(tensor).location
        for tensor in graph_tensors(model.graph)
        if uses_external_data(tensor)
    }
    return sorted(directory / location for location in locations)


def onnx_sha256(path: Path) -> str:
    """Hex SHA-256 of an ONNX model's bytes: the file and every external data file it names (their names and
    bytes), so that new weights beside an unchanged graph file are a new model."""
    files = external_data_files(onnx.load(str(path), load_external_data=False), Path(path).parent)
    if not files:
        return sha256_file(path)
    digest = hashlib.sha256(sha256_file(path).encode())
    for file in files:
        digest.update(f"\n{file.relative_to(Path(path).parent).as_posix()}\n{sha256_file(file)}".encode())
    return digest.hexdigest()


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The model's graph inputs that are not initializers."""
    initializers = {init.name for init in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def image_input(model: onnx.ModelProto) -> onnx.ValueInfoProto:
    """The model's one graph input that is not an initializer."""
    inputs = graph_inputs(model)
    if len(inputs) != 1:
        raise ValueError(f"expected an ONNX model with one input, got {[i.name for i in inputs]}")
    return inputs[0]


def onnx_input(model: onnx.ModelProto, input_hw: tuple[int, int] | None) -> tuple[str, tuple[int, int, int]]:
    """Name and (C, H, W) of the model's single image input; `input_hw` fills dynamic H/W."""
    node = image_input(model)
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in node.type.tensor_type.shape.dim]
    if len(dims) != 4:
        raise ValueError(f"expected an NCHW input, got {node.name} with {len(dims)} dims")
    c, h, w = dims[1:]
    if input_hw is not None:
        if (h > 0 and h != input_hw[0]) or (w > 0 and w != input_hw[1]):
            raise ValueError(f"input_hw {input_hw} contradicts the model's fixed input {h}x{w}")
        h, w = input_hw
    if c <= 0 or h <= 0 or w <= 0:
        raise ValueError(f"the model's input {node.name} has dynamic C/H/W {dims}: pass input_hw")
    return node.name, (c, h, w)


def onnx_metadata(model_path: Path) -> ModelMetadata:
    """What an ONNX file's metadata_props say (ultralytics, YOLOv5) and its producer, read without its weights."""
    model = onnx.load(str(model_path), load_external_data=False)
    inputs = graph_inputs(model)
    dims = inputs[0].type.tensor_type.shape.dim if inputs else ()
    props = {prop.key: prop.value for prop in model.metadata_props}
    found = exporter_metadata(props, dynamic_batch=not dims or not dims[0].HasField("dim_value"))
    return dataclasses.replace(found, producer=model.producer_name)
