"""Which detections are compared with which: one int64 key per row, so that one (N, N) comparison stands for
"same frame and same class" in the merge's match matrix and the seam rule."""

from __future__ import annotations

from torch import Tensor


def group_key(class_ids: Tensor | None, frame_index: Tensor | None) -> Tensor | None:
    """(N,) int64 >= 0, equal for two rows exactly when they are in the same frame (None: one frame) and class
    (None: any); None when both are None. (Class ids, from an argmax or the model, lie far within +-2**31; no
    arange-based constant, which torch.compile's triton code cannot add to its 32-bit indices.)"""
    key = None if class_ids is None else class_ids + (1 << 31)
    if frame_index is not None:
        key = frame_index * (1 << 32) + (0 if key is None else key)
    return key
