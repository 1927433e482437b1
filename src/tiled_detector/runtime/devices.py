"""torch devices: concrete indices, compatibility, the check that CUDA is really there, the device made current
around a library's calls, and CUDA graph capture."""

from __future__ import annotations

import contextlib
import ctypes
import functools
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
    libraries allocate their workspaces): (replay, outputs), replay() recomputing `outputs` in place. The graph is
    kept where torch can keep it (`graph_nodes` counts its nodes)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        function()
    torch.cuda.current_stream().wait_stream(stream)
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # torch < 2.7 (JetPack's): the graph is instantiated and dropped at the capture's end
        graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = function()
    if hasattr(graph, "instantiate") and hasattr(graph, "raw_cuda_graph"):
        with contextlib.suppress(RuntimeError):
            graph.instantiate()
    return graph.replay, outputs


@functools.cache
def _driver() -> ctypes.CDLL | None:
    """The CUDA driver library (libcuda), or None."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        with contextlib.suppress(OSError):
            return ctypes.CDLL(name)
    return None


def graph_nodes(replay: Callable[[], None]) -> int | None:
    """The node count (kernels, copies, memsets) of the graph a `cuda_graph` replay runs; None where it cannot be
    read (torch did not keep the graph, no driver library)."""
    graph = getattr(replay, "__self__", None)
    driver = _driver()
    if graph is None or driver is None or not hasattr(graph, "raw_cuda_graph"):
        return None
    try:
        handle = graph.raw_cuda_graph()
    except RuntimeError:
        return None
    count = ctypes.c_size_t(0)
    result = driver.cuGraphGetNodes(ctypes.c_void_p(handle), None, ctypes.byref(count))
    return int(count.value) if result == 0 else None
