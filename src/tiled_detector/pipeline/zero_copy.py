"""Turn frames that already live in (GPU) memory into torch tensors without copying them.

Accepts a torch tensor, a DLPack capsule, any object with `__dlpack__` (CuPy, numpy, JAX, ...) or one with
only `__cuda_array_interface__` (Numba, PyCUDA, VPI, ...), and returns a torch tensor on the same memory.
When the caller names a `device` and the memory is elsewhere (typically a frame in host RAM while the
engine runs on CUDA), it raises `ZeroCopyError` unless `copy=True` allows one explicit transfer.
"""

from __future__ import annotations

from typing import Any

import torch

from tiled_detector.runtime.devices import same_device


class ZeroCopyError(ValueError):
    """The input cannot be used in place on the requested device."""


def _is_capsule(obj: object) -> bool:
    return type(obj).__name__ == "PyCapsule"


def wait_for_producer_stream(stream_ptr: int, device: torch.device) -> None:
    """Order torch's current stream after the producer's stream (CUDA Array Interface v3 `stream` key)."""
    producer = torch.cuda.ExternalStream(stream_ptr, device=device)
    torch.cuda.current_stream(device).wait_stream(producer)


def _from_cuda_array_interface(obj: Any) -> torch.Tensor:
    """Wrap an object that only has `__cuda_array_interface__`, checking that torch did not copy it."""
    iface = obj.__cuda_array_interface__
    pointer = int(iface["data"][0])
    tensor = torch.as_tensor(obj, device="cuda")
    if tensor.numel() and tensor.data_ptr() != pointer:
        raise ZeroCopyError(
            f"torch copied the __cuda_array_interface__ buffer (0x{pointer:x} -> 0x{tensor.data_ptr():x}); "
            "pass an object with __dlpack__ instead"
        )
    stream = iface.get("stream")
    if stream:  # v3: None = no sync needed; 1 / 2 = legacy / per-thread default stream; else a handle
        wait_for_producer_stream(int(stream), tensor.device)
    return tensor


def as_torch_tensor(obj: Any, device: str | torch.device | None = None, copy: bool = False) -> torch.Tensor:
    """A torch tensor sharing `obj`'s memory.

    `device=None` accepts memory anywhere. With a `device`, memory on another device raises `ZeroCopyError`
    unless `copy=True`, in which case the one transfer is made with `Tensor.to`.
    """
    if isinstance(obj, torch.Tensor):
        tensor = obj
    elif _is_capsule(obj) or hasattr(obj, "__dlpack__"):
        try:
            tensor = torch.from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError) as err:
            raise ZeroCopyError(f"cannot import {type(obj).__name__} through DLPack: {err}") from err
    elif hasattr(obj, "__cuda_array_interface__"):
        tensor = _from_cuda_array_interface(obj)
    else:
        raise ZeroCopyError(
            f"cannot share memory with a {type(obj).__name__}: expected a torch tensor, a DLPack capsule, "
            "or an object with __dlpack__ or __cuda_array_interface__"
        )
    if device is None:
        return tensor
    target = torch.device(device)
    if same_device(tensor.device, target):
        return tensor
    if copy:
        return tensor.to(target)
    where = "host memory" if tensor.device.type == "cpu" else f"memory on {tensor.device}"
    raise ZeroCopyError(
        f"the input is in {where} but a tensor on {target} was demanded without a copy; "
        f"give a tensor on {target} (e.g. decode on the GPU) or allow one copy (copy=True)"
    )
