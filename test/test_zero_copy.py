"""Zero-copy import of external buffers. CPU paths run for real; CUDA paths run against fakes (no GPU here)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch

from tiled_detector.pipeline import zero_copy
from tiled_detector.pipeline.zero_copy import ZeroCopyError, as_torch_tensor


def test_torch_tensor_is_returned_as_is() -> None:
    t = torch.arange(6.0)
    assert as_torch_tensor(t) is t
    assert as_torch_tensor(t, device="cpu") is t


def test_numpy_through_dlpack_shares_memory() -> None:
    frame = np.zeros((4, 5, 3), np.uint8)
    t = as_torch_tensor(frame)
    assert t.data_ptr() == frame.ctypes.data and np.shares_memory(t.numpy(), frame)
    t[0, 0, 0] = 7
    assert frame[0, 0, 0] == 7


def test_dlpack_capsule_shares_memory() -> None:
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = as_torch_tensor(src.__dlpack__())
    assert t.data_ptr() == src.data_ptr() and t.shape == (3, 4)


def test_host_memory_demanded_on_cuda_without_copy_raises() -> None:
    with pytest.raises(ZeroCopyError, match=r"host memory.*copy=True"):
        as_torch_tensor(np.zeros((2, 2), np.float32), device="cuda")
    with pytest.raises(ZeroCopyError, match="host memory"):
        as_torch_tensor(torch.zeros(2), device="cuda:0")


def test_copy_allowed_moves_once() -> None:
    moved = torch.zeros(2)
    with mock.patch.object(torch.Tensor, "to", return_value=moved) as to:
        assert as_torch_tensor(torch.ones(2), device="cuda", copy=True) is moved
    to.assert_called_once_with(torch.device("cuda"))


def test_unsupported_objects_and_failed_dlpack_raise() -> None:
    with pytest.raises(ZeroCopyError, match="__cuda_array_interface__"):
        as_torch_tensor([1, 2, 3])

    class Unexportable:
        def __dlpack__(self, **kwargs: Any) -> Any:
            raise BufferError("cannot export")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    with pytest.raises(ZeroCopyError, match="DLPack: cannot export"):
        as_torch_tensor(Unexportable())


class FakeCudaArray:
    """An object that only speaks the CUDA Array Interface (like Numba / PyCUDA arrays)."""

    def __init__(self, pointer: int, stream: int | None = None) -> None:
        self.__cuda_array_interface__ = {
            "shape": (2, 3),
            "typestr": "<f4",
            "data": (pointer, False),
            "version": 3,
            "stream": stream,
        }


def fake_cuda_tensor(pointer: int) -> Any:
    fake = mock.Mock(spec=torch.Tensor)
    fake.numel.return_value = 6
    fake.data_ptr.return_value = pointer
    fake.device = torch.device("cuda", 0)
    return fake


def test_cuda_array_interface_wrapped_without_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    wrapped = fake_cuda_tensor(0x1000)
    as_tensor = mock.Mock(return_value=wrapped)
    monkeypatch.setattr(zero_copy.torch, "as_tensor", as_tensor)
    obj = FakeCudaArray(0x1000)
    assert as_torch_tensor(obj, device="cuda") is wrapped
    as_tensor.assert_called_once_with(obj, device="cuda")


def test_cuda_array_interface_copy_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zero_copy.torch, "as_tensor", mock.Mock(return_value=fake_cuda_tensor(0x2000)))
    with pytest.raises(ZeroCopyError, match="copied"):
        as_torch_tensor(FakeCudaArray(0x1000))


def test_cuda_array_interface_producer_stream_is_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zero_copy.torch, "as_tensor", mock.Mock(return_value=fake_cuda_tensor(0x1000)))
    waits = mock.Mock()
    monkeypatch.setattr(zero_copy, "wait_for_producer_stream", waits)
    as_torch_tensor(FakeCudaArray(0x1000, stream=0xBEEF))
    waits.assert_called_once_with(0xBEEF, torch.device("cuda", 0))
    waits.reset_mock()
    as_torch_tensor(FakeCudaArray(0x1000, stream=None))
    waits.assert_not_called()


def test_cuda_tensor_on_another_device_is_refused() -> None:
    fake = fake_cuda_tensor(0x1000)
    fake.__class__ = torch.Tensor  # isinstance check passes; nothing else of the tensor is touched
    with pytest.raises(ZeroCopyError, match="memory on cuda:0"):
        as_torch_tensor(fake, device="cuda:1")
