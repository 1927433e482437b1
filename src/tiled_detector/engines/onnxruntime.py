"""ONNX Runtime engine: torch tensors bound in place through I/O binding (CPU provider, CUDA if available)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tiled_detector.engines.base import Backend, Engine, ModelFormat, Precision, TensorSpec
from tiled_detector.engines.metadata import ModelMetadata, exporter_metadata
from tiled_detector.engines.onnx_model import INT8_NEEDS_QDQ, file_has_qdq
from tiled_detector.engines.rebatch import dynamic_batch_model

# ONNX Runtime type string -> (torch dtype, numpy dtype used for binding)
_TYPES: dict[str, tuple[torch.dtype, type]] = {
    "tensor(float)": (torch.float32, np.float32),
    "tensor(float16)": (torch.float16, np.float16),
    "tensor(int64)": (torch.int64, np.int64),
    "tensor(int32)": (torch.int32, np.int32),
    "tensor(uint8)": (torch.uint8, np.uint8),
    "tensor(bool)": (torch.bool, np.bool_),
}


def _dtypes(node: ort.NodeArg) -> tuple[torch.dtype, type]:
    if node.type not in _TYPES:
        raise ValueError(
            f"unsupported ONNX tensor type {node.type} of {node.name!r}; expected one of {sorted(_TYPES)}"
        )
    return _TYPES[node.type]


def _static(dim: object) -> int:
    """-1 for a symbolic or unknown dimension."""
    return dim if isinstance(dim, int) and dim > 0 else -1


def onnx_input_hw(
    model: Path, node_shape: Sequence[object], metadata: ModelMetadata, input_hw: Sequence[int] | None
) -> tuple[int, int]:
    """The input's height and width: the graph's where static (the `input_hw` option, setting `input_size`,
    must then agree: it settles a contradiction with the metadata), else the option's, else the metadata's
    `imgsz` (ultralytics' dynamic=True exports)."""
    graph = (_static(node_shape[2]), _static(node_shape[3]))
    given = (int(input_hw[0]), int(input_hw[1])) if input_hw is not None else None
    if min(graph) > 0:
        if given is not None and given != graph:
            raise ValueError(
                f"{model}: input_size {given[1]}x{given[0]} contradicts the model's fixed input "
                f"{graph[1]}x{graph[0]}"
            )
        if given is None and metadata.hw is not None and metadata.hw != graph:
            raise ValueError(
                f"{model}: its {metadata.source} metadata says imgsz {list(metadata.hw)} but its input is "
                f"{graph[0]}x{graph[1]} (h x w): re-export it, or confirm the input with the setting input_size "
                f"(--input-size {graph[1]} {graph[0]})"
            )
        return graph
    size = given or metadata.hw
    if size is None:
        raise ValueError(
            f"{model}: its input has a dynamic height and width {list(node_shape)} and no imgsz metadata: give "
            "the model's input size with the setting input_size (--input-size W H; node parameters input_width, "
            "input_height)"
        )
    return size


class OnnxRuntimeEngine(Engine):
    """An ONNX model in an ONNX Runtime session, fed and read through I/O binding on torch buffers.

    A batch-1 export runs through its dynamic-batch rewrite where that is proven equal (`engines.rebatch`).

    `threads` sets the intra-op thread count (default: ONNX Runtime's own default, one per physical core).
    One I/O binding serves every call; static-shaped outputs are written straight into torch buffers allocated
    once at `max_batch` (the next call overwrites them), dynamic ones are allocated by ONNX Runtime and wrapped
    through DLPack. On CUDA the session runs on torch's current stream, followed per call. fp16 needs a model
    whose input is float16 (ONNX Runtime does not convert); int8 a model with Q/DQ nodes (`engines/quantize.py`),
    which runs as int8 whatever precision was asked.
    """

    backend = Backend.ONNXRUNTIME
    formats = frozenset({ModelFormat.ONNX})
    reuses_output_buffers = True

    def __init__(
        self,
        model: Path,
        device: torch.device | str = "cpu",
        precision: Precision = Precision.FP32,
        max_batch: int = 32,
        threads: int | None = None,
        input_hw: Sequence[int] | None = None,
    ) -> None:
        super().__init__(model, device, precision, max_batch)
        options = ort.SessionOptions()
        # errors only: Paddle2ONNX files warn once per initializer listed as a graph input
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # ONNX Runtime's own arena for its activations: a CPU call takes at most `cpu_batch` images, so the arena
        # stays that size, where without it the freed activations of every call fragment the process heap (the
        # peak memory of a huge frame's many calls then varies from run to run: docs/PERFORMANCE.md)
        options.enable_cpu_mem_arena = True
        options.intra_op_num_threads = 0 if threads is None else int(threads)
        # ORT's threads spin between the operators of a run (idle waits there cost more than the spinning), and
        # stop the moment a run returns: torch's pre/post-processing runs on the same cores right after
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.force_spinning_stop", "1")
        providers = self._providers()
        # a batch-1 export runs as one batch: its rewrite to a dynamic batch, where proven equal (`rebatch`)
        source = dynamic_batch_model(Path(model)) if max_batch > 1 else model
        try:
            self._session = ort.InferenceSession(str(source), options, providers=providers)
        except Exception as error:  # ONNX Runtime's own exception types (InvalidProtobuf, Fail, ...)
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(
                f"{model} is not a model ONNX Runtime can load ({first}); re-export it, or check the file is whole"
            ) from error
        inputs = self._session.get_inputs()
        if len(inputs) != 1 or len(inputs[0].shape) != 4:
            raise ValueError(
                f"{model}: expected one NCHW image input, got {[(i.name, i.shape) for i in inputs]}"
            )
        node = inputs[0]
        meta = self._session.get_modelmeta()
        self.metadata = dataclasses.replace(
            exporter_metadata(meta.custom_metadata_map, dynamic_batch=_static(node.shape[0]) < 0),
            producer=meta.producer_name,
        )
        shape = (
            _static(node.shape[0]),
            _static(node.shape[1]),
            *onnx_input_hw(model, node.shape, self.metadata, input_hw),
        )
        dtype, self._np_dtype = _dtypes(node)
        self.precision = self._check_precision(self.precision, dtype, model, file_has_qdq(model))
        self.input = TensorSpec(node.name, shape, dtype)
        self._bound_batch()
        self.outputs = self._output_specs()
        self._out_np_dtypes = {o.name: _dtypes(o)[1] for o in self._session.get_outputs()}
        # outputs whose first dimension is the input's batch dimension and all others static: bound in place
        batch_dim = node.shape[0]
        self._batch_outputs = {
            o.name
            for o in self._session.get_outputs()
            if o.shape and o.shape[0] == batch_dim and all(_static(d) > 0 for d in o.shape[1:])
        }
        self.labels = self.metadata.labels
        self._device_type = "cuda" if self.device.type == "cuda" else "cpu"
        self._device_id = (self.device.index or 0) if self.device.type == "cuda" else 0
        # one binding and one buffer per batch output at the largest batch, reused by every call
        self._binding = self._session.io_binding()
        self._buffers = {
            spec.name: torch.empty((self.max_batch, *spec.shape[1:]), dtype=spec.dtype, device=self.device)
            for spec in self.outputs
            if spec.name in self._batch_outputs
        }

    def _output_specs(self) -> tuple[TensorSpec, ...]:
        """Each output's name, shape and dtype; symbolic dimensions past the batch (ultralytics' dynamic=True
        `anchors`) are read from one run on a blank image, so that the output layout is known at load time."""
        outputs = self._session.get_outputs()
        shapes = [tuple(_static(d) for d in o.shape) for o in outputs]
        if any(d < 0 for shape in shapes for d in shape[1:]):
            blank = np.zeros((max(self.input.shape[0], 1), *self.input.shape[1:]), self._np_dtype)
            ran = self._session.run(None, {self.input.name: blank})
            shapes = [(shape[0], *out.shape[1:]) for shape, out in zip(shapes, ran, strict=True)]
        return tuple(TensorSpec(o.name, s, _dtypes(o)[0]) for o, s in zip(outputs, shapes, strict=True))

    def _providers(self) -> list[str | tuple[str, dict[str, str]]]:
        if self.device.type == "cpu":
            return ["CPUExecutionProvider"]
        if self.device.type != "cuda" or "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ValueError(
                f"ONNX Runtime cannot run on {self.device}: available providers are "
                f"{ort.get_available_providers()} (install onnxruntime-gpu for CUDA)"
            )
        self._stream = torch.cuda.current_stream(self.device).cuda_stream
        return [("CUDAExecutionProvider", self._cuda_options(self._stream)), "CPUExecutionProvider"]

    def _cuda_options(self, stream: int) -> dict[str, str]:
        """The CUDA provider on `stream` (torch's: no extra synchronisation between torch and the session)."""
        return {"device_id": str(self.device.index or 0), "user_compute_stream": str(stream)}

    def _follow_stream(self) -> None:
        """CUDA: run on torch's current stream; a new one re-binds the provider to it (rare: once per stream)."""
        if self.device.type != "cuda":
            return
        stream = torch.cuda.current_stream(self.device).cuda_stream
        if stream != self._stream:
            options = [self._cuda_options(stream), {}]
            self._session.set_providers(["CUDAExecutionProvider", "CPUExecutionProvider"], options)
            self._stream = stream

    @staticmethod
    def _check_precision(precision: Precision, dtype: torch.dtype, model: Path, qdq: bool) -> Precision:
        """The precision the model runs at: a Q/DQ model runs as it is (int8), whatever was asked."""
        if qdq:
            return Precision.INT8
        if precision is Precision.INT8:
            raise ValueError(INT8_NEEDS_QDQ.format(model=model))
        if precision is Precision.FP16 and dtype != torch.float16:
            raise ValueError(
                f"ONNX Runtime engine: precision fp16 needs an fp16 model (float16 input), but {model} takes "
                f"{dtype}; convert the model to fp16 or use precision fp32"
            )
        return Precision.FP16 if dtype == torch.float16 else Precision.FP32

    def _infer(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        return self._padded(batch, self._run)

    def _run(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        self._follow_stream()
        batch = batch.contiguous()
        n = batch.shape[0]
        binding = self._binding
        binding.bind_input(
            self.input.name,
            self._device_type,
            self._device_id,
            self._np_dtype,
            tuple(batch.shape),
            batch.data_ptr(),
        )
        results: dict[str, torch.Tensor] = {}
        for spec in self.outputs:
            if spec.name in self._buffers:
                out = results[spec.name] = self._buffers[spec.name][:n]
                binding.bind_output(
                    spec.name,
                    self._device_type,
                    self._device_id,
                    self._out_np_dtypes[spec.name],
                    tuple(out.shape),
                    out.data_ptr(),
                )
            else:
                binding.bind_output(spec.name, self._device_type, self._device_id)
        self._session.run_with_iobinding(binding)
        allocated = [s.name for s in self.outputs if s.name not in self._buffers]
        if allocated:
            values = dict(zip([s.name for s in self.outputs], binding.get_outputs(), strict=True))
            results.update({name: torch.from_dlpack(values[name]) for name in allocated})
        return {spec.name: results[spec.name] for spec in self.outputs}
