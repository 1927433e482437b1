"""PyTorch engine: a TorchScript file (.ts / .pt / .torchscript) or a torch.export program (.pt2).

Metadata convention, written into the file when exporting (read back here, overridable by options):

    extra = {"input_shape": "-1,3,640,640", "labels": "car\nperson"}
    torch.jit.save(torch.jit.trace(model, example), "model.ts", _extra_files=extra)
    program = torch.export.export(model, (example,), dynamic_shapes=...)
    torch.export.save(program, "model.pt2", extra_files=extra)

`input_shape` is "B,C,H,W" with B = -1 for a dynamic batch (split at `max_batch`) or a positive number for a
model traced for exactly that batch (padded and split to it). Without it, a .pt2 program's input shape is read
from its graph (symbolic dimensions are dynamic); TorchScript files without it need the `input_shape` option.
`labels` is one class name per line (a JSON list is accepted too). Outputs are named output0, output1, ... in the
order the model returns them (a dict output keeps its keys).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from tiled_detector.engines.base import Backend, Engine, ModelFormat, Precision, TensorSpec, model_format


def parse_input_shape(text: str | Sequence[int]) -> tuple[int, int, int, int]:
    """'B,C,H,W' (or a sequence) -> a 4-tuple; B may be -1 (dynamic), C, H and W must be positive."""
    try:
        dims = tuple(int(d) for d in (text.split(",") if isinstance(text, str) else text))
    except ValueError:
        dims = ()
    if len(dims) != 4 or dims[0] == 0 or dims[0] < -1 or min(dims[1:]) <= 0:
        raise ValueError(f"input_shape must be 'B,C,H,W' with B = -1 or > 0 and C, H, W > 0, got {text!r}")
    return dims  # type: ignore[return-value]


def parse_labels(text: str) -> tuple[str, ...] | None:
    """A JSON list of names or one name per line; None for empty text."""
    text = text.strip()
    if not text:
        return None
    if text.startswith("["):
        return tuple(str(n) for n in json.loads(text))
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def _named_outputs(result: object) -> dict[str, torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return {"output0": result}
    if isinstance(result, dict):
        items = list(result.items())
    elif isinstance(result, list | tuple):
        items = [(f"output{i}", r) for i, r in enumerate(result)]
    else:
        raise TypeError(
            f"model returned {type(result).__name__}; expected a tensor, or a tuple/list/dict of tensors"
        )
    bad = [name for name, value in items if not isinstance(value, torch.Tensor)]
    if bad:
        raise TypeError(f"model outputs {bad} are not tensors; export a model that returns tensors only")
    return {str(name): value for name, value in items}


class TorchEngine(Engine):
    """A TorchScript or torch.export model run eagerly under `torch.inference_mode` on CPU or CUDA."""

    backend = Backend.TORCH
    formats = frozenset({ModelFormat.TORCHSCRIPT, ModelFormat.TORCH_EXPORT})
    capturable = True

    def __init__(
        self,
        model: Path,
        device: torch.device | str = "cpu",
        precision: Precision = Precision.FP32,
        max_batch: int = 32,
        input_shape: str | Sequence[int] | None = None,
    ) -> None:
        super().__init__(model, device, precision, max_batch)
        if self.precision is Precision.INT8:
            raise ValueError("torch engine: int8 is not supported; use fp32 or fp16")
        module, extra, graph_shape = self._load(Path(model))
        shape_text = input_shape if input_shape is not None else extra.get("input_shape") or graph_shape
        if not shape_text:
            raise ValueError(
                f"{model}: no input shape; pass input_shape='B,3,H,W' or save it in the file's extra files "
                f"(see tiled_detector.engines.torch)"
            )
        shape = parse_input_shape(shape_text)
        dtype = torch.float16 if self.precision is Precision.FP16 else torch.float32
        self._module = module.half() if dtype == torch.float16 else module
        # fp16 convolutions on CUDA run fastest on channels-last tensors (H100, YOLOv8n: 13-16 % less than
        # NCHW, scripts/torch_engine_check.py; the preprocessor then writes its batch channels-last, so `infer`
        # copies nothing); fp32 and the CPU keep their layout and results
        if dtype == torch.float16 and self.device.type == "cuda":
            self.memory_format = torch.channels_last
            self._module = self._module.to(memory_format=torch.channels_last)
        self.input = TensorSpec("images", shape, dtype)
        self._bound_batch()
        self.labels = parse_labels(extra.get("labels", ""))
        probe = self._run(torch.zeros((max(shape[0], 1), *shape[1:]), dtype=dtype, device=self.device))
        self.outputs = tuple(
            TensorSpec(name, (shape[0], *out.shape[1:]), out.dtype) for name, out in probe.items()
        )

    def _load(self, path: Path) -> tuple[torch.nn.Module, dict[str, str], str]:
        """The module on the device, its extra files, and the input shape found in its graph ('' if none)."""
        extra = {"input_shape": "", "labels": ""}
        found = model_format(path)
        if found is ModelFormat.TORCH_EXPORT:
            program = torch.export.load(str(path), extra_files=extra)
            # imported here: torch.export.passes is missing from some torch wheels (JetPack 6 torch 2.3-2.5),
            # which must still run TorchScript models
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, self.device)
            return program.module(), _texts(extra), _program_input_shape(program)
        if found is ModelFormat.TORCHSCRIPT:
            module = torch.jit.load(str(path), map_location=self.device, _extra_files=extra)
            return module.eval(), _texts(extra), ""
        raise ValueError(f"torch engine: cannot load {path}, a {found.value} file")

    def _infer(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        return self._padded(batch, self._run)

    def _run(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        # a copy only for a batch in another layout
        batch = batch.contiguous(memory_format=self.memory_format)
        with torch.inference_mode():
            return _named_outputs(self._module(batch))


def _texts(extra: dict[str, str | bytes]) -> dict[str, str]:
    """Extra files as text (torch returns bytes for the ones it found)."""
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in extra.items()}


def _program_input_shape(program: torch.export.ExportedProgram) -> str:
    """'B,C,H,W' of an exported program's only user input, symbolic dimensions as -1."""
    names = set(program.graph_signature.user_inputs)
    values = [n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder" and n.name in names]
    if len(values) != 1 or not isinstance(values[0], torch.Tensor) or values[0].dim() != 4:
        return ""
    return ",".join(str(d) if isinstance(d, int) else "-1" for d in values[0].shape)
