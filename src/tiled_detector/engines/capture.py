"""What keeps a TorchScript forward from being captured in a CUDA graph, and the rewrites that remove it.

A CUDA graph records device work only: a forward that makes tensors on the host, copies them to the device, reads a
device tensor on the host or makes a shape from device data cannot be recorded. Exports with a dynamic input shape
do the first two: ultralytics' `dynamic=True` TorchScript computes its anchor grid in every forward with
`torch.arange` traced on the CPU (its device baked into the graph as a constant) and then copies it to the
device, and fills the strides from a tensor constant read on the host (`aten::ScalarImplicit` of a select: on the
device once the file is loaded there). `specialise` rewrites the graphs of a module loaded on the device it will
run on: factory ops whose only device is a host constant make their tensors on that device instead (the anchors
are then computed there), and reads of constants are folded at load time (constant propagation). What is left
(`host_work`: host tensors still made, host reads of tensors that are not host scalars such as sizes, ops whose
output shape depends on data) is named, so that `inspect` and `bench` can say why a model runs between captured
parts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

# ops that make a tensor, with a `device` argument
FACTORIES = frozenset(
    {
        "aten::arange",
        "aten::zeros",
        "aten::ones",
        "aten::full",
        "aten::empty",
        "aten::tensor",
        "aten::linspace",
        "aten::eye",
        "aten::scalar_tensor",
        "aten::as_tensor",
    }
)
# a tensor's value read on the host
READS = frozenset(
    {
        "aten::ScalarImplicit",
        "aten::Int",
        "aten::IntImplicit",
        "aten::Float",
        "aten::FloatImplicit",
        "aten::Bool",
        "aten::item",
        "aten::tolist",
        "prim::TensorToNum",
    }
)
# ops whose output shape depends on the data (the host waits for the device)
DATA_SHAPED = frozenset(
    {"aten::nonzero", "aten::nonzero_numpy", "aten::unique", "aten::_unique2", "aten::masked_select"}
)
# arithmetic that keeps a host scalar (a size turned into a tensor) a host scalar
_SCALAR_MATH = frozenset({"aten::mul", "aten::add", "aten::sub", "aten::div", "aten::floor_divide"})


def graphs(module: torch.jit.ScriptModule) -> Iterator[Any]:
    """The `forward` graph of the module and of each submodule type (instances of one type share it)."""
    seen = set()
    for submodule in module.modules():
        kind = submodule._c._type().qualified_name()
        if kind not in seen and submodule._c._has_method("forward"):
            seen.add(kind)
            yield submodule._c._get_method("forward").graph


def _constant(node: Any) -> str | None:
    """The kind of a constant node's value ("s" text, "t" tensor, "i" integer, ...), None for other nodes or None
    constants."""
    if node.kind() != "prim::Constant" or not node.hasAttribute("value"):
        return None
    return node.kindOf("value")


def _host_device(value: Any) -> str | None:
    """The device a `Device` input names where it is a constant other than an accelerator's, else None."""
    node = value.node()
    return node.s("value") if str(value.type()) == "Device" and _constant(node) == "s" else None


def _host_scalar(value: Any) -> bool:
    """Whether a tensor value is a host scalar made from sizes (`prim::NumToTensor`, and arithmetic of those)."""
    node = value.node()
    if node.kind() == "prim::NumToTensor":
        return True
    tensors = [v for v in node.inputs() if str(v.type()) == "Tensor"]
    return node.kind() in _SCALAR_MATH and bool(tensors) and all(_host_scalar(v) for v in tensors)


def host_work(module: torch.jit.ScriptModule, device: str | torch.device) -> tuple[str, ...]:
    """What in the module's forward keeps it from being captured on `device` (a CUDA device): one line per kind of
    host work, with its count; empty when there is none that can be seen in the graph. Tensor constants are checked
    too where the module was loaded on `device` (they are on it then: one elsewhere was made by folding)."""
    target = torch.device(device)
    loaded_there = any(p.device == target for p in module.parameters())
    found: dict[str, int] = {}

    def note(text: str) -> None:
        found[text] = found.get(text, 0) + 1

    for graph in graphs(module):
        for node in graph.nodes():
            kind = node.kind()
            if kind in FACTORIES or kind in {"aten::to", "aten::_to_copy"}:
                for value in node.inputs():
                    where = _host_device(value)
                    if where is not None and torch.device(where) != target:
                        note(f"{kind} makes a tensor on {where} (copied to {target} in every forward)")
            elif kind in READS:
                source = next(node.inputs())
                if str(source.type()) == "Tensor" and not _host_scalar(source):
                    note(f"{kind} reads a device tensor on the host ({source.node().kind()})")
            elif kind in DATA_SHAPED:
                note(f"{kind} has a shape that depends on the data")
            elif loaded_there and _constant(node) == "t" and node.t("value").device != target:
                note(f"a tensor constant on {node.t('value').device}")
    return tuple(f"{text} (x{count})" if count > 1 else text for text, count in found.items())


def specialise(module: torch.jit.ScriptModule, device: str | torch.device) -> tuple[str, ...]:
    """Rewrite `module`'s graphs in place for running (and being captured) on `device` (module docstring): tensor
    factories whose device is a host constant, where that constant feeds only factories, make their tensors on
    `device`; then constants are propagated (a factory of constants and reads of tensor constants folded at load
    time; where an op cannot run here, e.g. the CUDA ones of a module read on a CPU machine, it is left as it is).
    Returns `host_work` after it. Does nothing for a CPU device."""
    target = torch.device(device)
    if target.type == "cpu":
        return ()
    for graph in graphs(module):
        for node in graph.nodes():
            if _constant(node) != "s":
                continue
            output = node.output()
            uses = [use.user.kind() for use in output.uses()]
            only_factories = bool(uses) and all(u in FACTORIES for u in uses)
            if (
                str(output.type()) == "Device"
                and only_factories
                and torch.device(node.s("value")).type == "cpu"
            ):
                node.s_("value", str(target))
        torch._C._jit_pass_constant_propagation(graph)
    return host_work(module, target)
