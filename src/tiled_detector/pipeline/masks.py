"""Instance masks of the kept detections, built on the engine's device after the merge.

A segmentation head gives each candidate mask coefficients (`PaddedDecoded.extra`) and each view its prototypes
(`PaddedDecoded.prototypes`); the merge says which candidates became each kept detection (`postprocess.Rows`).
A kept detection's mask in frame pixels: for each of its members (the candidate itself; an nmm / greedy_nmm
group's every member, each from its own view) the logit coefficients . prototypes of that member's view, sampled
bilinearly at each pixel's centre (the prototypes' pixel centres are at (i + 0.5) x the view's stride, like
`F.interpolate(align_corners=False)`) and kept inside the member's box (a pixel whose left / top edge lies in
[x1, x2) x [y1, y2), ultralytics' `crop_mask`) and inside the member's view (its tile, or the frame: a box reaching
past its tile's edge owns none of the pixels its tile never saw, as SAHI keeps each slice's masks in the slice),
above 0 (sigmoid above 0.5); the union of its members.

Only the pixels of kept detections' boxes are computed, at `mask_scale` of the frame's resolution: the boxes' pixels
are enumerated (a fixed number, `capacity`, on the sync-free path: the status says how many were needed), so memory
follows the kept detections, never a full-frame mask per candidate, and no loop runs per detection. The result is
each detection's own mask (its box in label pixels and its bits), packed into bytes for the one download (`pack`:
8 bits a byte; `unpack`). The label image is made on the device only where asked for (`pipeline.labels`, while the `masks` topic has a
subscriber); otherwise `InstanceMasks.labels` composes it on the host
from the boxes and bits, where it is used.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from tiled_detector.pipeline.decode import PaddedDecoded
from tiled_detector.pipeline.tiling import BatchPlan
from tiled_detector.types import InstanceMasks


def label_size(frame_hw: tuple[int, int], scale: float) -> tuple[int, int]:
    """The label image's (height, width) for a frame at `scale` (`mask_scale`): rounded, at least 1."""
    return max(1, round(frame_hw[0] * scale)), max(1, round(frame_hw[1] * scale))


def label_sizes(plan: BatchPlan, scale: float) -> list[tuple[int, int]]:
    """Each frame's label image size."""
    return [label_size(p.frame_hw, scale) for p in plan.plans]


@functools.lru_cache(maxsize=64)
def _sizes(sizes: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """(F, 2) label image sizes (height, width) on `device` (made once per sizes and device: before a capture, in
    its warm-up run)."""
    return torch.tensor(sizes, dtype=torch.int64, device=device).reshape(-1, 2)


class MaskRows(NamedTuple):
    """The masks of a batch's result rows on the device: per row its box in label pixels (R, 4) int32 x0, y0, x1,
    y1 (end exclusive; empty for a row that is not a result), its pixels' bits (P,) bool in row order (each row's
    box row-major), and the pixels (or, where more, the prototype cells of a member slot) its boxes needed (0-dim
    int64; more than P: the bits are not all there)."""

    boxes: torch.Tensor
    bits: torch.Tensor
    needed: torch.Tensor


def _label_boxes(boxes: torch.Tensor, frame: torch.Tensor, sizes: torch.Tensor, scale: float) -> torch.Tensor:
    """The label pixels (x0, y0, x1, y1; end exclusive, int64) whose left / top edge lies in each box (frame
    pixels), clipped to its frame's label image (`sizes` (F, 2) height, width)."""
    ends = sizes[frame].flip(1).repeat(1, 2)  # (R, 4): width, height, width, height
    return torch.minimum(torch.ceil(boxes * scale).clamp_min(0).long(), ends)


def build(
    packed: torch.Tensor,
    members: torch.Tensor,
    found: PaddedDecoded,
    plan: BatchPlan,
    scale: float,
    capacity: int | None,
) -> MaskRows:
    """The masks of the result rows of `packed` (`postprocess` rows: boxes, kept flag, frame) whose merged
    candidates are `members` (rows of `found`, -1 where none), at `scale` of the frames' pixels (module
    docstring). `capacity` pixels are computed (fixed shapes, no host read); None: as many as needed (a host read:
    the exact path)."""
    if found.extra is None or found.prototypes is None:
        raise ValueError("masks need a segmentation head's mask coefficients and prototypes")
    device = packed.device
    rows = packed[: len(members)]
    kept = rows[:, 6] > 0
    frame = rows[:, 7].long()
    sizes = _sizes(tuple(label_sizes(plan, scale)), device)
    box = _label_boxes(rows[:, :4].float(), frame, sizes, scale)
    wide, high = (box[:, 2] - box[:, 0]).clamp_min(0), (box[:, 3] - box[:, 1]).clamp_min(0)
    area = torch.where(kept, wide * high, 0)
    box = torch.where((area > 0)[:, None], box, 0)
    if len(area) == 0:
        bits = torch.zeros(capacity or 0, dtype=torch.bool, device=device)
        return MaskRows(box.int(), bits, area.new_zeros(()))
    row, local, inside, needed = enumerated(area, capacity)
    width = wide[row].clamp_min(1)
    x = box[row, 0] + local % width
    y = box[row, 1] + local // width
    covered, cells = _covered(x, y, row, kept, members, found, plan, scale, capacity)
    bits = inside & covered
    needed = torch.maximum(needed, cells)  # pixels and prototype cells share the capacity
    return MaskRows(box.int(), bits, needed)


def enumerated(
    area: torch.Tensor, capacity: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Items of rows that have `area` of them each, one after the other: (row, position in its row, whether the
    item is one, how many the rows need). `capacity` items (fixed shapes, no host read), None: as many as needed."""
    ends = area.cumsum(0)
    needed = ends[-1]
    count = int(needed) if capacity is None else capacity
    item = torch.arange(count, device=area.device)
    row = torch.searchsorted(ends, item, right=True).clamp_max(len(area) - 1)
    return row, item - (ends - area)[row], item < needed, needed


def _covered(
    x: torch.Tensor,
    y: torch.Tensor,
    row: torch.Tensor,
    kept: torch.Tensor,
    members: torch.Tensor,
    found: PaddedDecoded,
    plan: BatchPlan,
    scale: float,
    capacity: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each pixel (its label-image column `x` and line `y`, its result `row`) is on the mask of one of its
    row's members (a loop over the member slots, not the rows), and the prototype cells that took.

    Per member only the prototype cells its pixels' bilinear samples read are computed (its box in prototype
    pixels, one cell of margin): coefficients . prototypes for those cells, enumerated like the pixels
    (`capacity` of them on the fixed-size path), and each pixel's four corners read from them. What depends on the
    row alone (where its member's view maps a pixel, its cells, its crop) is worked out per row, then gathered."""
    prototypes = found.prototypes
    assert prototypes is not None and found.extra is not None
    values = prototypes.values
    high, wide = values.shape[2:]
    tensors = plan.tensors(x.device)
    mapping = tensors.to_frame  # (B, 3, 4): frame = model * scale + offset
    # each view's own pixels (label pixels whose left / top edge lies in its frame region): a member's mask stays
    # in the view that produced it (past its edge the view saw nothing: its prototypes would repeat their border)
    view_pixels = torch.ceil(tensors.views * scale)  # (B, 4)
    input_hw = plan.plans[0].input_hw
    per_x, per_y = wide / input_hw[1], high / input_hw[0]  # prototype pixels per model-input pixel
    proto_rows = prototypes.rows(found.image_index, plan.batch_size)
    on = torch.zeros(len(row), dtype=torch.bool, device=x.device)
    needed = torch.zeros((), dtype=torch.int64, device=x.device)
    xf, yf = x.float(), y.float()
    for slot in range(members.shape[1]):
        member = members[:, slot]
        present = (member >= 0) & kept
        candidate = member.clamp_min(0)
        view = found.image_index[candidate]
        model_box = found.boxes[candidate].float()  # (R, 4): the member's own box, model-input pixels
        # its cells (inclusive): the box in prototype pixels (centres at i + 0.5), one cell of margin each side
        x0 = torch.floor(model_box[:, 0] * per_x - 1.5).clamp(0, wide - 1).long()
        x1 = torch.floor(model_box[:, 2] * per_x + 0.5).clamp(0, wide - 1).long()
        y0 = torch.floor(model_box[:, 1] * per_y - 1.5).clamp(0, high - 1).long()
        y1 = torch.floor(model_box[:, 3] * per_y + 0.5).clamp(0, high - 1).long()
        cells_wide, cells_high = x1 - x0 + 1, y1 - y0 + 1
        area = torch.where(present, cells_wide * cells_high, 0)
        cell_row, local, _, taken = enumerated(area, capacity)
        needed = torch.maximum(needed, taken)
        # (cells past those needed, on the fixed-size path: any cell, read and not used)
        cx = (x0[cell_row] + local % cells_wide[cell_row]).clamp(0, wide - 1)
        cy = (y0[cell_row] + local // cells_wide[cell_row]).clamp(0, high - 1)
        vectors = values[proto_rows[candidate[cell_row]], :, cy, cx]  # (cells, P)
        logits = (vectors.float() * found.extra[candidate[cell_row]].float()).sum(1)
        logits = torch.cat([logits, logits.new_zeros(1)])  # (a row without cells reads a 0)
        # per row: a label pixel's prototype coordinate u = x * a + b (its centre, (x + 0.5) / scale in frame pixels,
        # in the member's view, then prototype pixels with centres at i + 0.5), its crop in label pixels (a pixel
        # whose left / top edge lies in the member's own box and in its view's region), where its cells start (minus
        # their corner)
        view_scale, view_offset = mapping[view, 0, :2], mapping[view, 1, :2]
        step = [per / (view_scale[:, k] * scale) for k, per in enumerate((per_x, per_y))]
        start = [
            (0.5 / scale - view_offset[:, k]) / view_scale[:, k] * per - 0.5
            for k, per in enumerate((per_x, per_y))
        ]
        crop = torch.ceil(plan.to_frame(model_box, view) * scale)  # (R, 4) label pixels, end exclusive
        seen = view_pixels[view]
        crop = torch.cat([crop[:, :2].maximum(seen[:, :2]), crop[:, 2:].minimum(seen[:, 2:])], 1)
        first = area.cumsum(0) - area
        table = torch.stack([*step, *start, *crop.unbind(1), present.float()], 1)[row]  # (N, 9): one gather
        u = (xf * table[:, 0] + table[:, 2]).clamp(0, wide - 1)
        v = (yf * table[:, 1] + table[:, 3]).clamp(0, high - 1)
        within = (xf >= table[:, 4]) & (yf >= table[:, 5]) & (xf < table[:, 6]) & (yf < table[:, 7])
        u0, v0 = u.floor(), v.floor()
        fu, fv = u - u0, v - v0
        # corners in the member's cells (clamped to them: a corner past the border is the border's)
        left, top = x0[row], y0[row]
        span_x, span_y = cells_wide[row], cells_high[row]
        lx0 = (u0.long() - left).clamp_min(0).minimum(span_x - 1)
        lx1 = (lx0 + 1).minimum(span_x - 1).minimum((wide - 1) - left)
        ly0 = (v0.long() - top).clamp_min(0).minimum(span_y - 1)
        ly1 = (ly0 + 1).minimum(span_y - 1).minimum((high - 1) - top)
        line0, line1 = first[row] + ly0 * span_x, first[row] + ly1 * span_x
        limit = len(logits) - 1
        upper = (
            logits[(line0 + lx0).clamp_max(limit)] * (1 - fu) + logits[(line0 + lx1).clamp_max(limit)] * fu
        )
        lower = (
            logits[(line1 + lx0).clamp_max(limit)] * (1 - fu) + logits[(line1 + lx1).clamp_max(limit)] * fu
        )
        sampled = upper * (1 - fv) + lower * fv
        on |= (table[:, 8] > 0) & within & (sampled > 0)
    return on, needed


@functools.lru_cache(maxsize=8)
def _bit_weights(device: torch.device) -> torch.Tensor:
    """(8,) uint8 128, 64, ..., 1 on `device`: a byte's bits, first bit highest (`numpy.unpackbits`' order); made
    once per device (before a capture, in its warm-up run)."""
    return torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=device)


def pack(masks: MaskRows, labels: torch.Tensor | None = None) -> torch.Tensor:
    """The masks as one uint8 tensor (boxes, pixels needed, bits 8 a byte, then the frames' label images where
    composed on the device: `labels.frame_labels`), for the one download beside the rows. Fixed sizes: the bits
    are padded to whole bytes (a pure function of the shapes, capturable)."""
    bits = masks.bits.view(torch.uint8)
    bits = torch.cat([bits, bits.new_zeros(-len(bits) % 8)]).reshape(-1, 8)
    parts = [
        masks.boxes.contiguous().view(torch.uint8).reshape(-1),
        masks.needed.reshape(1).long().view(torch.uint8),
        (bits * _bit_weights(bits.device)).sum(1, dtype=torch.uint8),
    ]
    if labels is not None:
        parts.append(labels.contiguous().view(torch.uint8))
    return torch.cat(parts)


class HostMasks(NamedTuple):
    """`MaskRows` downloaded: boxes (R, 4) int32, the pixels needed, bits (P,) bool (P rounded up to whole bytes:
    the padding after every row's bits), and the frames' label images composed on the device (flat uint16, frame
    after frame; None: not composed there)."""

    boxes: np.ndarray
    needed: int
    bits: np.ndarray
    labels: np.ndarray | None = None


def unpack(data: np.ndarray, rows: int, label_pixels: int = 0) -> HostMasks:
    """`pack`'s bytes (uint8) of `rows` result rows (and `label_pixels` pixels of label images after them), back
    to arrays."""
    data = np.ascontiguousarray(data)
    at = rows * 16
    boxes = data[:at].view(np.int32).reshape(rows, 4)
    needed = int(data[at : at + 8].view(np.int64)[0])
    end = len(data) - 2 * label_pixels
    bits = np.unpackbits(data[at + 8 : end]).view(bool)
    labels = data[end:].view(np.uint16) if label_pixels else None
    return HostMasks(boxes, needed, bits, labels)


def row_sizes(masks: HostMasks) -> Sequence[int]:
    """Each row's pixel count (its box's area in label pixels)."""
    wide = (masks.boxes[:, 2] - masks.boxes[:, 0]).clip(0)
    return wide * (masks.boxes[:, 3] - masks.boxes[:, 1]).clip(0)


def frame_masks(
    rows: np.ndarray, masks: HostMasks | None, plan: BatchPlan, scale: float
) -> list[InstanceMasks | None]:
    """Each frame's `InstanceMasks` (its result rows', in order), from the downloaded result `rows` (the packed rows
    without their status row) and masks (None: none), at `scale` (`mask_scale`)."""
    if masks is None:
        return [None] * plan.num_frames
    areas = np.asarray(row_sizes(masks), np.int64)
    starts = np.cumsum(areas) - areas
    found = []
    label_start = 0
    for k, frame_plan in enumerate(plan.plans):
        mine = np.flatnonzero((rows[:, 6] > 0) & (rows[:, 7] == k))  # consecutive rows (`_per_frame_best`)
        first = starts[mine[0]] if len(mine) else 0
        bits = masks.bits[first : first + int(areas[mine].sum())]
        # the label image: composed on the device where asked for (`labels`), else where it is used (on the host,
        # `InstanceMasks.labels`)
        shape = label_size(frame_plan.frame_hw, scale)
        image = None
        if masks.labels is not None:
            image = masks.labels[label_start : label_start + shape[0] * shape[1]].reshape(shape)
            label_start += shape[0] * shape[1]
        found.append(InstanceMasks(shape, masks.boxes[mine], bits, scale, frame_plan.frame_hw, image=image))
    return found
