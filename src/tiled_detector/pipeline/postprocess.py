"""Post-processing of one engine batch (one frame or several): decoded candidates -> packed result rows.

`postprocess` is a free function of (candidates, batch plan, settings, limits) with no host read when `limits`
are given (fixed sizes: the accelerator's sync-free path, capturable as a CUDA graph); with `limits` None the
same computation takes its sizes from the data (host reads: the exact path, and the CPU's). Pipeline: frame
pixels (`BatchPlan.to_frame`; rotated boxes: `rotated.frame_obb`, in ultralytics' regular form, degenerate rows
dropped and counted) -> seam rule -> merge (groups never span frames) -> the best `max_detections`
rows of every frame -> one (R + 1, 8 + E) float32 tensor: rows x1, y1, x2, y2 (a rotated box's hull, clipped to
the frame), score, class, valid, frame, then the box form's own columns (E: rotated boxes cx, cy, w, h, angle),
then a status row (candidates needed, exact, largest merge group, degenerate rows dropped, rotated-box pairs
needed: `STATUS`) that the host reads
after the one download.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from tiled_detector.pipeline.decode import PaddedDecoded
from tiled_detector.pipeline.frame_settings import FrameSettings
from tiled_detector.pipeline.groups import geometry_of
from tiled_detector.pipeline.merge import merge_padded
from tiled_detector.pipeline.policy import policy_keep
from tiled_detector.pipeline.seams import suppress_truncated
from tiled_detector.pipeline.tiling import BatchPlan

MIN_CAPACITY = 256  # sync-free candidates per batch at first (doubled up to MAX_CAPACITY when exceeded)
MAX_CAPACITY = 4096  # (N, N) matrices: beyond this, batches keep taking the exact path
# Both paths merge at most this many candidates per frame (the best scores): the (N, N) matrices stay bounded
# whatever the frame (433 views x top_k 100 could be 43,300 candidates: 7.5 GB per matrix), and a one-frame flood
# (a 4K frame in 85 views of 416 x top_k 100: 8,500) keeps the sync-free path, captured, equal to the exact one.
MAX_CANDIDATES = MAX_CAPACITY
MIN_SLOTS, MAX_SLOTS = 8, 256  # merge-group positions walked by the sync-free merge (adapted likewise)
MIN_ROUNDS, MAX_ROUNDS = 4, 256  # NMS fixed-point rounds of the sync-free merge (adapted likewise)
# pairs of rotated boxes whose hulls meet, measured as polygons by the sync-free seam rule and merge (a bounded pair
# list, adapted likewise; a 4K flood's 4096 candidates meet in some 10^5 pairs, every pair would be 1.7 * 10^7)
MIN_PAIRS, MAX_PAIRS = 1 << 12, 1 << 20
COLUMNS = (
    8  # x1, y1, x2, y2, score, class, valid, frame (then the box form's own: rotated cx, cy, w, h, angle)
)
OBB_COLUMNS = 5  # a rotated box's own columns after them: cx, cy, w, h, angle
STATUS = ("needed", "exact", "largest", "degenerate", "pairs")  # the status row's first columns
# mask pixels (the kept detections' boxes at mask_scale) the sync-free masks stage computes (adapted likewise; a
# 4K frame is 8.3 million pixels)
MIN_MASK_PIXELS, MAX_MASK_PIXELS = 1 << 16, 1 << 25


@dataclass(frozen=True)
class Limits:
    """Fixed sizes of the sync-free path: candidates kept, merge-group positions walked, NMS rounds, mask pixels
    computed, rotated-box pairs measured as polygons."""

    capacity: int = MIN_CAPACITY
    slots: int = MIN_SLOTS
    rounds: int = MIN_ROUNDS
    mask_pixels: int = MIN_MASK_PIXELS
    pairs: int = MIN_PAIRS

    def grown(
        self, needed: int, exact: bool, largest: int, pixels: int = 0, pairs: int = 0
    ) -> tuple[Limits, bool]:
        """The limits a batch with this status needs (each at most its maximum; `pixels`: the mask pixels it
        needed, `pairs`: the rotated-box pairs), and whether a limit already at its maximum was exceeded (then the
        exact path is the only way)."""
        capacity, slots, rounds, mask_pixels = self.capacity, self.slots, self.rounds, self.mask_pixels
        if pixels > mask_pixels:
            mask_pixels = min(MAX_MASK_PIXELS, 1 << (pixels - 1).bit_length())
        if needed > capacity:
            capacity = min(MAX_CAPACITY, 1 << (needed - 1).bit_length())
        listed = min(MAX_PAIRS, 1 << (pairs - 1).bit_length()) if pairs > self.pairs else self.pairs
        if largest > slots:
            slots = min(MAX_SLOTS, 1 << (largest - 1).bit_length())
        elif (
            not exact and pairs <= self.pairs
        ):  # the group walk and pairs sufficed: the NMS fixed point did not
            rounds = min(MAX_ROUNDS, 2 * rounds)
        maxed = (
            (pixels > self.mask_pixels >= MAX_MASK_PIXELS)
            or (needed > self.capacity >= MAX_CAPACITY)
            or (largest > self.slots >= MAX_SLOTS)
            or (pairs > self.pairs >= MAX_PAIRS)
            or (not exact and pairs <= self.pairs and largest <= self.slots and self.rounds >= MAX_ROUNDS)
        )
        return Limits(capacity, slots, rounds, mask_pixels, listed), maxed


def valid_first(valid: torch.Tensor) -> torch.Tensor:
    """Permutation putting the True rows first, each part in its original order (fixed shape, no sync)."""
    return torch.sort((~valid).to(torch.int32), stable=True).indices


def _best(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` best `scores`, equal ones taken in index order (both paths cut a flood alike), in
    index order."""
    return torch.sort(scores, descending=True, stable=True).indices[:count].sort().values


def _strongest(
    found: PaddedDecoded, plan: BatchPlan, limits: Limits | None
) -> tuple[PaddedDecoded, torch.Tensor | None]:
    """The candidates post-processing takes, and where each is among `found` (None: all of them, in order): at most
    the capacity of rows, every valid one when they fit, else the valid ones of the best scores, in their original
    order (sync-free); or exactly the valid rows, at most MAX_CANDIDATES per frame, the best ones in their original
    order (exact). A one-frame flood at the largest capacity so keeps the same candidates on both paths."""
    if limits is not None:
        if len(found.valid) <= limits.capacity:
            return found, None
        ranked = found.scores.float().masked_fill(~found.valid, float("-inf"))
        keep = _best(ranked, limits.capacity)
        return found.take(keep), keep
    keep = found.valid.nonzero().squeeze(1)
    cap = MAX_CANDIDATES * plan.num_frames
    if len(keep) > cap:  # a candidate flood
        keep = keep[_best(found.scores[keep].float(), cap)]
    return found.take(keep), keep


def _per_frame_best(
    valid: torch.Tensor, frame: torch.Tensor, num_frames: int, max_detections: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (in rank order) to download: the first `max_detections` valid rows of every frame, grouped by frame,
    then the rest; and which of those rows are results. At most num_frames * max_detections + 1 rows."""
    key = torch.where(valid, frame, num_frames)
    order = torch.sort(key, stable=True).indices
    grouped = key[order]
    position = torch.arange(len(order), device=order.device) - torch.searchsorted(grouped, grouped)
    kept = (grouped < num_frames) & (position < max_detections)
    order = order[valid_first(kept)][: num_frames * max_detections]
    return order, kept[valid_first(kept)][: num_frames * max_detections]


class Rows(NamedTuple):
    """`postprocess_rows`' result: the packed (R + 1, 8) rows and status row, and per result row the candidates
    merged into it (R, S) int64: rows of the candidates given, -1 where none (their payload follows them)."""

    packed: torch.Tensor
    members: torch.Tensor


def postprocess(
    found: PaddedDecoded, plan: BatchPlan, settings: FrameSettings, limits: Limits | None
) -> torch.Tensor:
    """Candidates of a batch (image indices into `plan`) -> packed (R + 1, 8) rows and status (module docstring):
    `postprocess_rows`' packed rows."""
    return postprocess_rows(found, plan, settings, limits).packed


def postprocess_rows(
    found: PaddedDecoded, plan: BatchPlan, settings: FrameSettings, limits: Limits | None
) -> Rows:
    """Candidates of a batch (image indices into `plan`) -> packed (R + 1, 8) rows and status (module docstring),
    and the candidates merged into each row (the group map: `Rows`).

    With `limits` no op reads device data on the host; `exact` in the status row says whether the result equals
    the exact one (`limits` None, always exact). The candidates needed are at most the exact path's cut
    (MAX_CANDIDATES per frame): a flood beyond it needs no more capacity than that."""
    needed = found.valid.sum().clamp_max(MAX_CANDIDATES * plan.num_frames)
    found, source = _strongest(found, plan, limits)
    geometry = geometry_of(found.boxes)
    boxes = geometry.in_frame(plan, found.boxes, found.image_index)
    bad = geometry.degenerate(boxes)
    dropped = needed.new_zeros(())
    if bad is not None:  # rows that are no box: counted, then never valid
        bad = bad & found.valid
        dropped = bad.sum()
        found = found._replace(valid=found.valid & ~bad)
        boxes = torch.where(bad[:, None], 0.0, boxes)
        if limits is None:  # the exact path's rows are all valid
            kept = found.valid.nonzero().squeeze(1)
            found, boxes = found.take(kept), boxes[kept]
            source = kept if source is None else source[kept]
    bounds = plan.tensors(boxes.device).to_frame[found.image_index, 2, :2]  # each row's frame width, height
    frame = plan.tensors(boxes.device).frame[found.image_index]
    scores, class_ids, valid = found.scores.float(), found.class_ids, found.valid
    pairs = None if limits is None else limits.pairs  # (rotated boxes: the bounded pair list's capacity)
    # the pairs a bounded comparison needs: those of every valid row with every valid row, which bounds the seam
    # rule's and the merge's (past the capacity the result is not exact: the host redoes it, the bound grows)
    listed = geometry.pairs_needed(boxes, valid) if pairs is not None else dropped.new_zeros(())
    if settings.seam_suppression:  # the exact path's rows are all valid: only its truncated rows are compared
        valid = suppress_truncated(
            boxes,
            scores,
            class_ids,
            found.image_index,
            plan,
            class_agnostic=settings.class_agnostic,
            valid=None if limits is None else valid,
            pairs=pairs,
        )
    if limits is None:  # the exact path: the rows the seam rule dropped leave the (N, N) merge too
        kept = valid.nonzero().squeeze(1)
        boxes, scores, class_ids, frame, valid, bounds = (
            t[kept] for t in (boxes, scores, class_ids, frame, valid, bounds)
        )
        source = kept if source is None else source[kept]
    merged = merge_padded(
        boxes,
        scores,
        class_ids,
        valid,
        settings.merge_rule,
        nms_rounds=None if limits is None else limits.rounds,
        slots=None if limits is None else limits.slots,
        frame_index=frame,
        use_torchvision=limits is None,
        pairs=pairs,
    )
    keep = policy_keep(merged.boxes, merged.frame_index, plan, settings.min_box_size, settings.max_box_size)
    valid = merged.valid if keep is None else merged.valid & keep
    rows, kept = _per_frame_best(valid, merged.frame_index, plan.num_frames, settings.max_detections)
    exact = merged.exact if pairs is None else merged.exact & (listed <= pairs)
    status = torch.stack(
        [needed.float(), exact.float(), merged.largest.float(), dropped.float(), listed.float()]
    )
    hulls = geometry.hulls(merged.boxes[rows]).clamp_min(0.0)
    hulls = torch.minimum(hulls, bounds[merged.index[rows]].repeat(1, 2))
    members = merged.members[rows]
    if source is not None:  # rows of the merge's input -> rows of the candidates given (-1 stays)
        members = torch.cat([source, source.new_full((1,), -1)])[members]
    body = torch.cat(
        [
            hulls,
            merged.scores[rows, None],
            merged.class_ids[rows, None].float(),
            kept[:, None].float(),
            merged.frame_index[rows, None].float(),
            *(c.float() for c in geometry.packed(merged.boxes[rows])),
        ],
        dim=1,
    )
    packed = torch.cat([body, torch.cat([status, status.new_zeros(body.shape[1] - len(STATUS))])[None]])
    return Rows(packed, members)


def unpack(host: np.ndarray, num_frames: int, extra: int = 0) -> list[np.ndarray]:
    """The (M, 6 + extra) result rows (x1, y1, x2, y2, score, class, then the first `extra` columns of the box
    form's own: rotated boxes 5) of every frame from a downloaded `postprocess` result, in rank order."""
    rows = host[:-1]
    rows = rows[rows[:, 6] > 0]
    columns = [*range(6), *range(COLUMNS, COLUMNS + extra)]
    return [rows[rows[:, 7] == k][:, columns] for k in range(num_frames)]
