"""torch devices: concrete indices, compatibility, the check that CUDA is really there, the device made current
around a library's calls, and CUDA graph capture."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

import torch

T = TypeVar("T")


def concrete_device(device: str | torch.device) -> torch.device:
    """`device` with the index made explicit (`cuda` -> `cuda:N` of the current device), so that it compares
    equal to the `.device` of the tensors allocated on it."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def require_cuda(device: torch.device | str, why: str) -> None:
    """ValueError (one line: what is missing and what to do) unless torch can use the CUDA `device`."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device {device} is not a CUDA device: {why}; use cuda or cuda:N")
    if not torch.cuda.is_available():
        build = (
            "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no GPU visible"
        )
        raise ValueError(
            f"device {device}: torch {torch.__version__} ({build}) has no CUDA device here: {why}; use a machine "
            "with an NVIDIA GPU and a CUDA build of torch (on a Jetson: NVIDIA's JetPack wheel)"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")


def same_device(have: torch.device, want: torch.device) -> bool:
    """Whether memory on `have` is usable on `want`; `cuda` without an index matches any CUDA device."""
    return have.type == want.type and (want.index is None or have.index is None or have.index == want.index)


def made_current(device: torch.device) -> AbstractContextManager[object]:
    """`device` made the current CUDA device for the block (libraries that use the current device, e.g. TensorRT's
    deserialisation and enqueue, then work on it); nothing for a CPU device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def cuda_graph(function: Callable[[], T]) -> tuple[Callable[[], None], T]:
    """Capture `function` as one `torch.cuda.CUDAGraph` (after a warm-up run on a side stream, which lets
    libraries allocate their workspaces): (replay, outputs), replay() recomputing `outputs` in place."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        function()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = function()
    return graph.replay, outputs
