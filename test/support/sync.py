"""Recording the ops that would make an accelerator wait: the sync-free paths dispatch none of them."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tiled_detector.pipeline import rotated

aten = torch.ops.aten
# ops that read device data on the host: data-dependent shapes, scalars, comparisons returning Python values
SYNCING = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._local_scalar_dense.default,
    aten.equal.default,
    aten.repeat_interleave.Tensor,
    aten.unique_consecutive.default,
    aten._unique2.default,
}


class SyncCounter(TorchDispatchMode):
    """Records every syncing aten op, including indexing with boolean masks, of the code as a GPU runs it (rotated
    pairs measured as `rotated.EVERY_PAIR` devices measure them, whatever the device)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._devices = set(rotated.EVERY_PAIR)

    def __enter__(self):
        rotated.EVERY_PAIR.add("cpu")
        return super().__enter__()

    def __exit__(self, *exc):
        rotated.EVERY_PAIR.clear()
        rotated.EVERY_PAIR.update(self._devices)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING:
            self.found.append(str(func))
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            indices = args[1]
            if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                self.found.append(f"{func} with a mask")
        return func(*args, **kwargs)
