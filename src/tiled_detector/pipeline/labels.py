"""The frames' label images composed on the engine's device, for the `masks` topic while it has a subscriber.

The masks stage (`pipeline.masks`) leaves each kept detection's own mask (its box in label pixels and its bits).
The label image of docs/MASKS.md is one `mono16` image per frame: pixel value k + 1 where the frame's k-th
detection covers it, 0 elsewhere; where masks overlap, the detection of the lower rank wins (the detector's rows
are in rank order: k itself). `compose` is that rule on tensors: every mask pixel bids its row's (rank, row) as one
int64 key into its frame's pixel, the lowest key wins (one `scatter_reduce`), and the winner's value is written:
fixed shapes (the bits the masks stage computed, the frames' label sizes), no host read, so it is captured with
the frame program (a second capture, selected by whether label images are asked for) and leaves in the frame's
one download beside the rows and the masks' bits. `InstanceMasks.labels` (the host's composition, one slice
assignment per detection) is the same rule on arrays; test/test_masks.py checks the two equal.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from tiled_detector.pipeline.masks import MaskRows, enumerated, label_sizes
from tiled_detector.pipeline.tiling import BatchPlan

NO_LABEL = torch.iinfo(torch.int64).max  # the key of a pixel no mask covers


@functools.lru_cache(maxsize=64)
def _frame_geometry(sizes: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """(F, 2) int64 on `device`: each frame's label image width and where it starts in the flat images."""
    widths = [w for _, w in sizes]
    starts = [0]
    for h, w in sizes[:-1]:
        starts.append(starts[-1] + h * w)
    return torch.tensor(list(zip(widths, starts, strict=True)), dtype=torch.int64, device=device).reshape(
        -1, 2
    )


def compose(
    boxes: torch.Tensor,
    ranks: torch.Tensor,
    values: torch.Tensor,
    bits: torch.Tensor,
    frame: torch.Tensor,
    sizes: Sequence[tuple[int, int]],
) -> torch.Tensor:
    """The label images of frames of `sizes` ((height, width) each), flat one after the other (int32): a pixel takes
    `values[r]` of the row r of the lowest `ranks` (then the lowest r) whose mask covers it, 0 where none does.

    boxes (R, 4) int: each row's box in label pixels x0, y0, x1, y1 (end exclusive; empty: no pixels), in its frame
    `frame` (R,); bits (P,) bool: every row's box pixels row-major, one row after the other (bits past them are
    ignored)."""
    total = sum(h * w for h, w in sizes)
    device = bits.device
    boxes = boxes.long()
    wide = (boxes[:, 2] - boxes[:, 0]).clamp_min(0)
    area = wide * (boxes[:, 3] - boxes[:, 1]).clamp_min(0)
    if len(area) == 0 or total == 0:
        return torch.zeros(total, dtype=torch.int32, device=device)
    row, local, inside, _ = enumerated(area, len(bits))
    geometry = _frame_geometry(tuple((int(h), int(w)) for h, w in sizes), device)[frame[row]]
    width = wide[row].clamp_min(1)
    x, y = boxes[row, 0] + local % width, boxes[row, 1] + local // width
    on = bits & inside
    flat = torch.where(
        on, geometry[:, 1] + y * geometry[:, 0] + x, total
    )  # (a pixel no bit sets: past the end)
    key = torch.where(on, ranks.long()[row] * len(area) + row, NO_LABEL)
    best = torch.full((total + 1,), NO_LABEL, dtype=torch.int64, device=device)
    best.scatter_reduce_(0, flat, key, "amin")
    winner = torch.where(best < NO_LABEL, best % len(area), 0)[:total]
    return torch.where(best[:total] < NO_LABEL, values.to(torch.int32)[winner], 0)


def frame_labels(packed: torch.Tensor, masks: MaskRows, plan: BatchPlan, scale: float) -> torch.Tensor:
    """Every frame's label image (`label_sizes`), flat one after the other, as int16 holding the uint16 values:
    k + 1 where the frame's k-th result row (of `packed`, the rows `masks` are of) covers a pixel, the lower k
    winning an overlap."""
    rows = packed[: len(masks.boxes)]
    kept = rows[:, 6] > 0
    frame = rows[:, 7].long().clamp(0, plan.num_frames - 1)
    # result rows are grouped by frame in rank order, kept first (`postprocess._per_frame_best`): a row's index in
    # its frame is its position less the kept rows of the frames before
    counts = torch.zeros(plan.num_frames, dtype=torch.int64, device=rows.device).index_add_(
        0, frame, kept.long()
    )
    index = torch.arange(len(rows), device=rows.device) - (counts.cumsum(0) - counts)[frame]
    boxes = torch.where(kept[:, None], masks.boxes.long(), 0)
    images = compose(boxes, index, index + 1, masks.bits, frame, label_sizes(plan, scale))
    return images.to(torch.int16)
