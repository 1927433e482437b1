"""PyTorch engine: a TorchScript file (.torchscript / .ts / .pt) or a torch.export program (.pt2).

What the file says about itself is read from its extra files (`engines.metadata`): ultralytics' and YOLOv5's
`config.txt` (input size, batch rule, class names, end-to-end head, fp16), or ours, written when exporting:

    extra = {"input_shape": "-1,3,640,640", "labels": "car\nperson"}
    torch.jit.save(torch.jit.trace(model, example), "model.ts", _extra_files=extra)
    program = torch.export.export(model, (example,), dynamic_shapes=...)
    torch.export.save(program, "model.pt2", extra_files=extra)

A TorchScript is frozen when loaded (`torch.jit.freeze`, in the engine's dtype and layout): its weights become
constants and a BatchNorm after a convolution is folded into it (one kernel fewer per BatchNorm a call; results
within the dtype's rounding: folded in fp16, the same error against fp32 as the unfolded fp16 model); a module that
cannot be frozen runs as it is, with one INFO line.

On CUDA a TorchScript forward is rewritten where it does host work that a CUDA graph cannot record
(`engines.capture.specialise`: tensors made on the CPU in every forward, as ultralytics' `dynamic=True` export makes
its anchors, are made on the device; reads of constants folded); host work left makes the engine run between the
captured parts of the frame program, its reason in `capture_problem`.

`input_shape` is "B,C,H,W" with B = -1 for a dynamic batch or a positive number for a model traced for exactly
that batch (padded to it). Without any of these, a .pt2 program's input shape is read from its graph (symbolic
dimensions are dynamic); a TorchScript file then needs the model's input size (setting `input_size`, or the
engine option `input_shape`). Outputs are named output0, output1, ... in the order the model returns them (a dict
output keeps its keys).
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Sequence
from pathlib import Path

import torch

from tiled_detector.engines.base import Backend, Engine, ModelFormat, Precision, TensorSpec, model_format
from tiled_detector.engines.capture import specialise
from tiled_detector.engines.metadata import INPUT_KEYS, ModelMetadata, extra_files_metadata, parse_input_shape

LOG = logging.getLogger(__name__)

# extra files read from a TorchScript / torch.export file: ours (with the input conventions), and the exporters'
# config.txt
EXTRA_FILES = ("input_shape", "labels", *INPUT_KEYS, "config.txt")


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
        input_hw: Sequence[int] | None = None,
    ) -> None:
        super().__init__(model, device, precision, max_batch)
        if self.precision is Precision.INT8:
            raise ValueError("torch engine: int8 is not supported; use fp32 or fp16")
        module, extra, graph_shape = self._load(Path(model))
        try:
            self.metadata = extra_files_metadata(extra)
        except ValueError as error:
            if input_hw is None:
                raise ValueError(f"{model}: {error}") from None
            self.metadata = extra_files_metadata({**extra, "input_shape": ""})  # input_size says which
        shape = _input_shape(Path(model), self.metadata, input_shape, input_hw, graph_shape)
        if self.metadata.half and self.precision is not Precision.FP16:
            raise ValueError(f"{model} was exported for fp16 input (half): set precision fp16")
        dtype = torch.float16 if self.precision is Precision.FP16 else torch.float32
        self._module = module.half() if dtype == torch.float16 else module
        # fp16 convolutions on CUDA run fastest on channels-last tensors (docs/PERFORMANCE.md); the preprocessor then
        # writes its batch channels-last, so `infer` copies nothing; fp32 and the CPU keep their layout and results
        if dtype == torch.float16 and self.device.type == "cuda":
            self.memory_format = torch.channels_last
            self._module = self._module.to(memory_format=torch.channels_last)
        self._module = _frozen(self._module, Path(model))
        self.input = TensorSpec("images", shape, dtype)
        self._bound_batch()
        self.labels = self.metadata.labels
        probe = self._run(torch.zeros((max(shape[0], 1), *shape[1:]), dtype=dtype, device=self.device))
        self.outputs = tuple(
            TensorSpec(name, (shape[0], *out.shape[1:]), out.dtype) for name, out in probe.items()
        )

    def _load(self, path: Path) -> tuple[torch.nn.Module, dict[str, str], str]:
        """The module on the device, its extra files, and the input shape found in its graph ('' if none)."""
        extra = dict.fromkeys(EXTRA_FILES, "")
        if model_format(path) is ModelFormat.TORCH_EXPORT:
            program = torch.export.load(str(path), extra_files=extra)
            # imported here: torch.export.passes is missing from some torch wheels (JetPack 6 torch 2.3-2.5),
            # which must still run TorchScript models
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, self.device)
            return program.module(), _texts(extra), _program_input_shape(program)
        _refuse_checkpoint(path)
        module = torch.jit.load(str(path), map_location=self.device, _extra_files=extra).eval()
        # host work in the forward (a dynamic export's anchors made on the CPU) moved to the device where it can be
        left = specialise(module, self.device)
        if left:  # the engine runs between the captured parts of the frame program
            self.capturable, self.capture_problem = False, "; ".join(left)
        return module, _texts(extra), ""

    def _infer(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        return self._padded(batch, self._run)

    def _run(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        # a copy only for a batch in another layout
        batch = batch.contiguous(memory_format=self.memory_format)
        with torch.inference_mode():
            return _named_outputs(self._module(batch))


def _frozen(module: torch.nn.Module, path: Path) -> torch.nn.Module:
    """A TorchScript frozen in its current dtype and layout (BatchNorms after convolutions folded into them), or
    the module as it is (a torch.export program; a module freezing refuses, with one INFO line)."""
    if not isinstance(module, torch.jit.ScriptModule):
        return module
    try:
        return torch.jit.freeze(module)
    except Exception as error:  # (freezing refuses modules that mutate attributes, and the like)
        LOG.info("%s: not frozen (%s): its BatchNorms run unfolded", path, str(error).splitlines()[0])
        return module


def _input_shape(
    model: Path,
    metadata: ModelMetadata,
    input_shape: str | Sequence[int] | None,
    input_hw: Sequence[int] | None,
    graph_shape: str,
) -> tuple[int, int, int, int]:
    """The model's input (B, C, H, W): the `input_shape` option, else the file's metadata, else its graph; the
    `input_hw` option (setting `input_size`) gives or replaces the height and width."""
    shape = parse_input_shape(input_shape) if input_shape is not None else metadata.input_shape
    if shape is None and graph_shape:
        shape = parse_input_shape(graph_shape)
    if input_hw is not None:
        height, width = (int(v) for v in input_hw)
        return (shape[0], shape[1], height, width) if shape else (-1, 3, height, width)
    if shape is None:
        raise ValueError(
            f"{model} does not say its input size (no ultralytics/YOLOv5 config.txt or input_shape extra file): "
            "give it with the setting input_size (--input-size W H; node parameters input_width, input_height)"
        )
    return shape


def _refuse_checkpoint(path: Path) -> None:
    """A torch.save checkpoint (ultralytics' .pt files) is no TorchScript: one line saying how to export it."""
    if not zipfile.is_zipfile(path):
        return
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any(n.endswith("/data.pkl") for n in names) and not any(n.endswith("/constants.pkl") for n in names):
        raise ValueError(
            f"{path} is a PyTorch checkpoint (torch.save), not TorchScript: export it first, e.g. "
            f"`yolo export model={path.name} format=torchscript` or `format=onnx` (docs/MODELS.md: Bring your own model)"
        )


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
