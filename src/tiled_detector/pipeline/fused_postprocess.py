"""`postprocess_rows` of the default box form as one Triton kernel: candidates -> packed rows + status row.

The torch stages (`postprocess.postprocess_rows`: frame pixels, seam rule, merge, policy, the per-frame cut) run
some two hundred small kernels a frame on fixed-size tensors; this is the same function in one launch, for
axis-aligned boxes merged by `nms` (class-aware or not, IoU or IoS, `nms_rounds` 0), the seam rule, the region of
interest and the size limits (other settings: `supports` says no and the torch stages run). One program walks the
phases in order, each over the candidates still in play (their count read on the device, so the work follows the
valid rows, not the padded ones, and no host read is needed: a captured graph replays it):

1. the valid rows are compacted (in index order) and mapped to frame pixels; each row's seam flags;
2. the seam rule: a truncated row yields to a covering whole view (pairs of compacted rows, in tiles);
3. the rows the seam rule kept are ranked (score descending, then x1, y1, x2, y2, then index: SAHI's lexsort) by
   counting the rows before each, and written in rank order;
4. NMS, block by block in rank order: rows a kept earlier row suppresses are dropped, then the block's own fixed
   point (a loop until nothing changes: always the exact greedy result, never a round limit);
5. the policy (region of interest, size limits) and the best `max_detections` of each frame, written grouped by
   frame in rank order; the status row.

The result equals the torch stages' exact result wherever the valid candidates fit the limits' capacity; when
they do not, the status row says so as the torch stages' does (`needed` above the capacity: the host redoes the
batch on the exact path and grows the capacity). Floats are rounded operation by operation as torch's kernels
round them (no multiply-add contraction: `kernels.launch_options`), so threshold decisions are the same.
"""

# ruff: noqa: N803  (Triton kernels: compile-time constants and sizes are named in capitals)

from __future__ import annotations

import torch

from tiled_detector.pipeline import kernels
from tiled_detector.pipeline.decode import PaddedDecoded
from tiled_detector.pipeline.frame_settings import FrameSettings
from tiled_detector.pipeline.merge import MatchMetric, MergeMethod
from tiled_detector.pipeline.postprocess import COLUMNS, MAX_CANDIDATES, Limits, Rows
from tiled_detector.pipeline.tiling import FULL_FRAME_ROI, BatchPlan

SEAM_MARGIN_PX, SEAM_MIN_COVER, SEAM_MIN_SCORE_RATIO = 4.0, 0.6, 0.5  # `seams.suppress_truncated`'s defaults
BLOCK = 64  # rows per tile of the pairwise phases (a 64 x 64 tile of pairs at a time)
ROWS = 1024  # rows per step of the row-wise phases

_found = kernels.triton()
if _found is not None:
    triton, tl = _found

    @triton.jit
    def _overlap(ax1, ay1, ax2, ay2, a_area, bx1, by1, bx2, by2, b_area, IOU: tl.constexpr):
        """IoU / IoS of broadcast boxes with SAHI's float operations (`groups.overlap`)."""
        w = tl.maximum(tl.minimum(ax2, bx2) - tl.maximum(ax1, bx1), 0.0)
        h = tl.maximum(tl.minimum(ay2, by2) - tl.maximum(ay1, by1), 0.0)
        inter = w * h
        if IOU:  # noqa: SIM108 (a compile-time branch)
            denom = a_area + b_area - inter
        else:
            denom = tl.minimum(a_area, b_area)
        return tl.where(denom > 0, inter / tl.where(denom > 0, denom, 1.0), 0.0)

    @triton.jit
    def _intersection(ax1, ay1, ax2, ay2, bx1, by1, bx2, by2):
        w = tl.maximum(tl.minimum(ax2, bx2) - tl.maximum(ax1, bx1), 0.0)
        h = tl.maximum(tl.minimum(ay2, by2) - tl.maximum(ay1, by1), 0.0)
        return w * h

    @triton.jit
    def _before(s_a, x1_a, y1_a, x2_a, y2_a, i_a, s_b, x1_b, y1_b, x2_b, y2_b, i_b):
        """Whether a ranks before b: score descending, then x1, y1, x2, y2 ascending, then index."""
        tie = y2_a < y2_b
        tie = (y2_a == y2_b) & (i_a < i_b) | tie
        tie = (x2_a == x2_b) & tie | (x2_a < x2_b)
        tie = (y1_a == y1_b) & tie | (y1_a < y1_b)
        tie = (x1_a == x1_b) & tie | (x1_a < x1_b)
        return (s_a == s_b) & tie | (s_a > s_b)

    @triton.jit
    def _postprocess_kernel(
        boxes_ptr, scores_ptr, classes_ptr, image_ptr, valid_ptr, M,
        to_frame_ptr, views_ptr, inner_ptr, view_frame_ptr, roi_ptr,
        box_s, area_s, score_s, class_s, image_s, frame_s, source_s, flag_s,
        rbox_s, rarea_s, rscore_s, rclass_s, rframe_s, rsource_s, kept_s,
        packed_ptr, members_ptr, R, capacity, num_frames, max_detections, needed_cap,
        threshold, min_box, max_box, margin_px, min_cover, min_ratio,
        IOU: tl.constexpr, AGNOSTIC: tl.constexpr, SEAMS: tl.constexpr, ROI: tl.constexpr,
        SIZES: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    ):  # fmt: skip
        lanes = tl.arange(0, ROWS)
        # 1. compact the valid rows (index order), in frame pixels, with their seam flags
        count = tl.sum(tl.zeros((ROWS,), tl.int32), axis=0)
        for start in range(0, M, ROWS):
            i = start + lanes
            inside = i < M
            ok = (tl.load(valid_ptr + i, mask=inside, other=0) != 0) & inside
            at = count + tl.cumsum(ok.to(tl.int32), axis=0) - 1
            view = tl.load(image_ptr + i, mask=ok, other=0)
            x1 = tl.load(boxes_ptr + i * 4 + 0, mask=ok, other=0.0)
            y1 = tl.load(boxes_ptr + i * 4 + 1, mask=ok, other=0.0)
            x2 = tl.load(boxes_ptr + i * 4 + 2, mask=ok, other=0.0)
            y2 = tl.load(boxes_ptr + i * 4 + 3, mask=ok, other=0.0)
            sx = tl.load(to_frame_ptr + view * 12 + 0, mask=ok, other=1.0)
            sy = tl.load(to_frame_ptr + view * 12 + 1, mask=ok, other=1.0)
            ox = tl.load(to_frame_ptr + view * 12 + 4, mask=ok, other=0.0)
            oy = tl.load(to_frame_ptr + view * 12 + 5, mask=ok, other=0.0)
            bw = tl.load(to_frame_ptr + view * 12 + 8, mask=ok, other=0.0)
            bh = tl.load(to_frame_ptr + view * 12 + 9, mask=ok, other=0.0)
            x1 = tl.minimum(tl.maximum(x1 * sx + ox, 0.0), bw)
            y1 = tl.minimum(tl.maximum(y1 * sy + oy, 0.0), bh)
            x2 = tl.minimum(tl.maximum(x2 * sx + ox, 0.0), bw)
            y2 = tl.minimum(tl.maximum(y2 * sy + oy, 0.0), bh)
            cut = tl.zeros((ROWS,), tl.int1)
            if SEAMS:
                margin = margin_px * tl.maximum(sx, 1.0)
                vx1 = tl.load(views_ptr + view * 4 + 0, mask=ok, other=0.0)
                vy1 = tl.load(views_ptr + view * 4 + 1, mask=ok, other=0.0)
                vx2 = tl.load(views_ptr + view * 4 + 2, mask=ok, other=0.0)
                vy2 = tl.load(views_ptr + view * 4 + 3, mask=ok, other=0.0)
                left = tl.load(inner_ptr + view * 4 + 0, mask=ok, other=0) != 0
                top = tl.load(inner_ptr + view * 4 + 1, mask=ok, other=0) != 0
                right = tl.load(inner_ptr + view * 4 + 2, mask=ok, other=0) != 0
                bottom = tl.load(inner_ptr + view * 4 + 3, mask=ok, other=0) != 0
                cut = left & (x1 <= vx1 + margin) | top & (y1 <= vy1 + margin)
                cut = cut | right & (x2 >= vx2 - margin) | bottom & (y2 >= vy2 - margin)
            tl.store(box_s + at * 4 + 0, x1, mask=ok)
            tl.store(box_s + at * 4 + 1, y1, mask=ok)
            tl.store(box_s + at * 4 + 2, x2, mask=ok)
            tl.store(box_s + at * 4 + 3, y2, mask=ok)
            tl.store(area_s + at, (x2 - x1) * (y2 - y1), mask=ok)
            tl.store(score_s + at, tl.load(scores_ptr + i, mask=ok, other=0.0), mask=ok)
            tl.store(class_s + at, tl.load(classes_ptr + i, mask=ok, other=0).to(tl.int32), mask=ok)
            tl.store(image_s + at, view.to(tl.int32), mask=ok)
            tl.store(frame_s + at, tl.load(view_frame_ptr + view, mask=ok, other=0).to(tl.int32), mask=ok)
            tl.store(source_s + at, i, mask=ok)
            tl.store(flag_s + at, cut.to(tl.int8), mask=ok)
            count += tl.sum(ok.to(tl.int32), axis=0)
        needed = tl.minimum(count, needed_cap)
        rows = tl.where(count <= capacity, count, 0)  # past the capacity the host redoes the batch exactly
        tl.debug_barrier()
        # 2. the seam rule: flag 1 = truncated, 2 = dropped (a whole view of another image covers it)
        ri = tl.arange(0, BLOCK)
        if SEAMS:
            for i0 in range(0, rows, BLOCK):
                i = i0 + ri
                mi = i < rows
                cut_i = tl.load(flag_s + i, mask=mi, other=0) == 1
                if tl.max(cut_i.to(tl.int32), axis=0) > 0:
                    ax1 = tl.load(box_s + i * 4 + 0, mask=mi, other=0.0)[:, None]
                    ay1 = tl.load(box_s + i * 4 + 1, mask=mi, other=0.0)[:, None]
                    ax2 = tl.load(box_s + i * 4 + 2, mask=mi, other=0.0)[:, None]
                    ay2 = tl.load(box_s + i * 4 + 3, mask=mi, other=0.0)[:, None]
                    need = min_cover * tl.maximum(tl.load(area_s + i, mask=mi, other=0.0), 1e-9)
                    score_i = tl.load(score_s + i, mask=mi, other=0.0)
                    class_i = tl.load(class_s + i, mask=mi, other=0)[:, None]
                    frame_i = tl.load(frame_s + i, mask=mi, other=0)[:, None]
                    image_i = tl.load(image_s + i, mask=mi, other=0)[:, None]
                    least = (min_ratio * score_i)[:, None]
                    covered = tl.zeros((BLOCK,), tl.int32)
                    for j0 in range(0, rows, BLOCK):
                        j = j0 + ri
                        mj = j < rows
                        whole = (tl.load(flag_s + j, mask=mj, other=1) == 0) & mj
                        bx1 = tl.load(box_s + j * 4 + 0, mask=mj, other=0.0)[None, :]
                        by1 = tl.load(box_s + j * 4 + 1, mask=mj, other=0.0)[None, :]
                        bx2 = tl.load(box_s + j * 4 + 2, mask=mj, other=0.0)[None, :]
                        by2 = tl.load(box_s + j * 4 + 3, mask=mj, other=0.0)[None, :]
                        inter = _intersection(ax1, ay1, ax2, ay2, bx1, by1, bx2, by2)
                        hit = (inter >= need[:, None]) & whole[None, :]
                        hit = hit & (tl.load(frame_s + j, mask=mj, other=-1)[None, :] == frame_i)
                        if not AGNOSTIC:
                            hit = hit & (tl.load(class_s + j, mask=mj, other=-1)[None, :] == class_i)
                        hit = hit & (tl.load(image_s + j, mask=mj, other=-1)[None, :] != image_i)
                        hit = hit & (tl.load(score_s + j, mask=mj, other=0.0)[None, :] >= least)
                        covered = tl.maximum(covered, tl.max(hit.to(tl.int32), axis=1))
                    tl.debug_barrier()
                    dropped = cut_i & (covered > 0)
                    tl.store(flag_s + i, tl.full((BLOCK,), 2, tl.int8), mask=mi & dropped)
            tl.debug_barrier()
        # 3. rank the rows the seam rule kept (by counting the kept rows before each) and write them in rank order
        ranked = tl.sum(tl.zeros((ROWS,), tl.int32), axis=0)
        for i0 in range(0, rows, BLOCK):
            i = i0 + ri
            mi = i < rows
            keep_i = (tl.load(flag_s + i, mask=mi, other=2) != 2) & mi
            s_i = tl.load(score_s + i, mask=mi, other=0.0)
            x1_i = tl.load(box_s + i * 4 + 0, mask=mi, other=0.0)
            y1_i = tl.load(box_s + i * 4 + 1, mask=mi, other=0.0)
            x2_i = tl.load(box_s + i * 4 + 2, mask=mi, other=0.0)
            y2_i = tl.load(box_s + i * 4 + 3, mask=mi, other=0.0)
            src_i = tl.load(source_s + i, mask=mi, other=0)
            rank = tl.zeros((BLOCK,), tl.int32)
            for j0 in range(0, rows, BLOCK):
                j = j0 + ri
                mj = j < rows
                keep_j = (tl.load(flag_s + j, mask=mj, other=2) != 2) & mj
                first = _before(
                    tl.load(score_s + j, mask=mj, other=0.0)[None, :],
                    tl.load(box_s + j * 4 + 0, mask=mj, other=0.0)[None, :],
                    tl.load(box_s + j * 4 + 1, mask=mj, other=0.0)[None, :],
                    tl.load(box_s + j * 4 + 2, mask=mj, other=0.0)[None, :],
                    tl.load(box_s + j * 4 + 3, mask=mj, other=0.0)[None, :],
                    tl.load(source_s + j, mask=mj, other=0)[None, :],
                    s_i[:, None],
                    x1_i[:, None],
                    y1_i[:, None],
                    x2_i[:, None],
                    y2_i[:, None],
                    src_i[:, None],
                )
                rank += tl.sum((first & keep_j[None, :]).to(tl.int32), axis=1)
            tl.store(rbox_s + rank * 4 + 0, x1_i, mask=keep_i)
            tl.store(rbox_s + rank * 4 + 1, y1_i, mask=keep_i)
            tl.store(rbox_s + rank * 4 + 2, x2_i, mask=keep_i)
            tl.store(rbox_s + rank * 4 + 3, y2_i, mask=keep_i)
            tl.store(rarea_s + rank, tl.load(area_s + i, mask=mi, other=0.0), mask=keep_i)
            tl.store(rscore_s + rank, s_i, mask=keep_i)
            tl.store(rclass_s + rank, tl.load(class_s + i, mask=mi, other=0), mask=keep_i)
            tl.store(rframe_s + rank, tl.load(frame_s + i, mask=mi, other=0), mask=keep_i)
            tl.store(rsource_s + rank, src_i, mask=keep_i)
            ranked += tl.sum(keep_i.to(tl.int32), axis=0)
        tl.debug_barrier()
        # 4. NMS in rank order, a block at a time: rows a kept earlier row suppresses, then the block's fixed point
        rj = tl.arange(0, BLOCK)
        for b0 in range(0, ranked, BLOCK):
            r = b0 + rj
            mr = r < ranked
            cx1 = tl.load(rbox_s + r * 4 + 0, mask=mr, other=0.0)
            cy1 = tl.load(rbox_s + r * 4 + 1, mask=mr, other=0.0)
            cx2 = tl.load(rbox_s + r * 4 + 2, mask=mr, other=0.0)
            cy2 = tl.load(rbox_s + r * 4 + 3, mask=mr, other=0.0)
            c_area = tl.load(rarea_s + r, mask=mr, other=0.0)
            c_class = tl.load(rclass_s + r, mask=mr, other=-1)
            c_frame = tl.load(rframe_s + r, mask=mr, other=-1)
            suppressed = tl.zeros((BLOCK,), tl.int32)
            for q0 in range(0, b0, BLOCK):
                q = q0 + ri
                on = tl.load(kept_s + q) != 0
                if tl.max(on.to(tl.int32), axis=0) > 0:
                    near = (
                        _overlap(
                            tl.load(rbox_s + q * 4 + 0)[:, None],
                            tl.load(rbox_s + q * 4 + 1)[:, None],
                            tl.load(rbox_s + q * 4 + 2)[:, None],
                            tl.load(rbox_s + q * 4 + 3)[:, None],
                            tl.load(rarea_s + q)[:, None],
                            cx1[None, :],
                            cy1[None, :],
                            cx2[None, :],
                            cy2[None, :],
                            c_area[None, :],
                            IOU,
                        )
                        >= threshold
                    )
                    near = near & on[:, None] & (tl.load(rframe_s + q)[:, None] == c_frame[None, :])
                    if not AGNOSTIC:
                        near = near & (tl.load(rclass_s + q)[:, None] == c_class[None, :])
                    suppressed = tl.maximum(suppressed, tl.max(near.to(tl.int32), axis=0))
            alive = mr & (suppressed == 0)
            # the block's own pairs: row q (rank before) may suppress column r
            inside = (
                _overlap(
                    tl.load(rbox_s + r * 4 + 0, mask=mr, other=0.0)[:, None],
                    tl.load(rbox_s + r * 4 + 1, mask=mr, other=0.0)[:, None],
                    tl.load(rbox_s + r * 4 + 2, mask=mr, other=0.0)[:, None],
                    tl.load(rbox_s + r * 4 + 3, mask=mr, other=0.0)[:, None],
                    tl.load(rarea_s + r, mask=mr, other=0.0)[:, None],
                    cx1[None, :],
                    cy1[None, :],
                    cx2[None, :],
                    cy2[None, :],
                    c_area[None, :],
                    IOU,
                )
                >= threshold
            )
            inside = inside & (ri[:, None] < rj[None, :])
            inside = inside & (tl.load(rframe_s + r, mask=mr, other=-2)[:, None] == c_frame[None, :])
            if not AGNOSTIC:
                inside = inside & (tl.load(rclass_s + r, mask=mr, other=-2)[:, None] == c_class[None, :])
            settled = alive.to(tl.int32)
            changed = tl.sum(settled, axis=0) > 0
            while changed:
                hit = tl.max((inside & (settled[:, None] != 0)).to(tl.int32), axis=0)
                new = (alive & (hit == 0)).to(tl.int32)
                changed = tl.sum((new != settled).to(tl.int32), axis=0) > 0
                settled = new
            tl.store(kept_s + r, settled.to(tl.int8), mask=mr)
            tl.debug_barrier()
        tl.debug_barrier()
        # 5. the policy and the best `max_detections` of each frame, grouped by frame, in rank order; the status
        written = tl.sum(tl.zeros((ROWS,), tl.int32), axis=0)
        for frame in range(0, num_frames):
            taken = tl.sum(tl.zeros((ROWS,), tl.int32), axis=0)
            for start in range(0, ranked, ROWS):
                r = start + lanes
                mr = r < ranked
                x1 = tl.load(rbox_s + r * 4 + 0, mask=mr, other=0.0)
                y1 = tl.load(rbox_s + r * 4 + 1, mask=mr, other=0.0)
                x2 = tl.load(rbox_s + r * 4 + 2, mask=mr, other=0.0)
                y2 = tl.load(rbox_s + r * 4 + 3, mask=mr, other=0.0)
                on = mr & (tl.load(kept_s + r, mask=mr, other=0) != 0)
                on = on & (tl.load(rframe_s + r, mask=mr, other=-1) == frame)
                if ROI:
                    cx = (x1 + x2) / 2
                    cy = (y1 + y2) / 2
                    on = (
                        on
                        & (cx >= tl.load(roi_ptr + frame * 4 + 0))
                        & (cy >= tl.load(roi_ptr + frame * 4 + 1))
                    )
                    on = (
                        on
                        & (cx <= tl.load(roi_ptr + frame * 4 + 2))
                        & (cy <= tl.load(roi_ptr + frame * 4 + 3))
                    )
                if SIZES:
                    side = tl.minimum(x2 - x1, y2 - y1)
                    on = on & (side >= min_box) & ((side <= max_box) | (max_box <= 0))
                place = taken + tl.cumsum(on.to(tl.int32), axis=0) - 1
                on = on & (place < max_detections)
                out = (written + place) * 8
                tl.store(packed_ptr + out + 0, x1, mask=on)
                tl.store(packed_ptr + out + 1, y1, mask=on)
                tl.store(packed_ptr + out + 2, x2, mask=on)
                tl.store(packed_ptr + out + 3, y2, mask=on)
                tl.store(packed_ptr + out + 4, tl.load(rscore_s + r, mask=mr, other=0.0), mask=on)
                tl.store(
                    packed_ptr + out + 5, tl.load(rclass_s + r, mask=mr, other=0).to(tl.float32), mask=on
                )
                tl.store(packed_ptr + out + 6, tl.full((ROWS,), 1.0, tl.float32), mask=on)
                tl.store(packed_ptr + out + 7, tl.zeros((ROWS,), tl.float32) + frame, mask=on)
                tl.store(
                    members_ptr + written + place,
                    tl.load(rsource_s + r, mask=mr, other=0).to(tl.int64),
                    mask=on,
                )
                taken += tl.sum(on.to(tl.int32), axis=0)
            written += taken
        for start in range(written, R, ROWS):  # the rows no result takes
            r = start + lanes
            mr = r < R
            for column in range(0, 8):
                tl.store(packed_ptr + r * 8 + column, tl.zeros((ROWS,), tl.float32), mask=mr)
            tl.store(members_ptr + r, tl.full((ROWS,), -1, tl.int64), mask=mr)
        status = tl.where(lanes == 0, needed.to(tl.float32), 0.0)
        status = tl.where((lanes == 1) | (lanes == 2), 1.0, status)  # exact; largest group 1 (nms)
        tl.store(packed_ptr + R * 8 + lanes, status, mask=lanes < 8)  # degenerate rows: 0


def supports(found: PaddedDecoded, plan: BatchPlan, settings: FrameSettings, limits: Limits | None) -> bool:
    """Whether the kernel computes this batch's `postprocess_rows`: the sync-free path, axis-aligned boxes, `nms`
    settled to its fixed point, no ignore mask, on a device where the kernels run."""
    rule = settings.merge_rule
    return (
        limits is not None
        and found.boxes.shape[1] == 4
        and rule.method is MergeMethod.NMS
        and rule.rounds == 0
        and all(p.ignored is None for p in plan.plans)
        and kernels.enabled(found.boxes.device)
    )


def postprocess_rows(found: PaddedDecoded, plan: BatchPlan, settings: FrameSettings, limits: Limits) -> Rows:
    """`postprocess.postprocess_rows` (sync-free: fixed shapes, no host read) in one kernel launch, where
    `supports` says so: the packed (R + 1, 8) rows and status, and each result row's candidate (R, 1) (-1 where
    none: nms merges nothing into a row)."""
    device = found.boxes.device
    count = len(found.valid)
    rows = min(count, limits.capacity)
    result_rows = min(rows, plan.num_frames * settings.max_detections)
    tensors = plan.tensors(device)
    rule = settings.merge_rule
    n = max(count, 1)
    floats = torch.empty(12 * n, dtype=torch.float32, device=device)
    ints = torch.empty(7 * n, dtype=torch.int32, device=device)
    flags = torch.empty(2 * n, dtype=torch.int8, device=device)
    f32 = [floats[a * n : b * n] for a, b in ((0, 4), (4, 5), (5, 6), (6, 10), (10, 11), (11, 12))]
    i32 = [ints[k * n : (k + 1) * n] for k in range(7)]
    packed = torch.empty((result_rows + 1, COLUMNS), dtype=torch.float32, device=device)
    members = torch.empty((result_rows, 1), dtype=torch.int64, device=device)
    _postprocess_kernel[(1,)](
        found.boxes.float().contiguous(),
        found.scores.float().contiguous(),
        found.class_ids.contiguous(),
        found.image_index.contiguous(),
        found.valid.contiguous(),
        count,
        tensors.to_frame.contiguous(),
        tensors.views.contiguous(),
        tensors.inner_edges.contiguous(),
        tensors.frame.contiguous(),
        tensors.roi.contiguous(),
        *f32[:3],  # compacted rows: boxes, areas, scores
        *i32[:4],  # their classes, views, frames, sources
        flags[:n],
        *f32[3:],  # ranked rows: boxes, areas, scores
        *i32[4:],  # their classes, frames, sources
        flags[n:],
        packed,
        members,
        result_rows,
        rows,
        plan.num_frames,
        settings.max_detections,
        MAX_CANDIDATES * plan.num_frames,
        float(rule.threshold),
        float(settings.min_box_size),
        float(settings.max_box_size),
        SEAM_MARGIN_PX,
        SEAM_MIN_COVER,
        SEAM_MIN_SCORE_RATIO,
        IOU=rule.metric is MatchMetric.IOU,
        AGNOSTIC=settings.class_agnostic,
        SEAMS=settings.seam_suppression,
        ROI=any(p.roi != FULL_FRAME_ROI for p in plan.plans),
        SIZES=settings.min_box_size > 0 or settings.max_box_size > 0,
        BLOCK=BLOCK,
        ROWS=ROWS,
        num_warps=4,
        **kernels.launch_options(),
    )
    return Rows(packed, members)
