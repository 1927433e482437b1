"""`postprocess_rows` of the default box form in five Triton launches: candidates -> packed rows + status row.

The torch stages (`postprocess.postprocess_rows`: frame pixels, seam rule, merge, policy, the per-frame cut) run
some two hundred small kernels a frame on fixed-size tensors; this is the same function in five launches, for
axis-aligned boxes merged by `nms` (class-aware or not, IoU or IoS, `nms_rounds` 0), the seam rule, the region of
interest and the size limits (other settings: `supports` says no and the torch stages run). The candidates still in
play are counted on the device and every launch reads that count, so the work follows the valid rows, not the
padded ones, and nothing is read on the host (a captured graph replays it):

1. (one program) the valid rows compacted in index order, mapped to frame pixels, with their seam flags;
2. (a program per 64 rows) the seam rule: a truncated row yields to a covering whole view of another image;
3. (a program per 64 rows) the rows the seam rule kept ranked (score descending, then x1, y1, x2, y2, then index:
   SAHI's lexsort) by counting the rows before each, and written in rank order;
4. (a program per pair of 64-row blocks) which later row each row would suppress, 64 columns a 64-bit word;
5. (one program) NMS, a block of 64 rows at a time in rank order: the rows a kept earlier row suppresses (one OR
   over their words), then the block's own fixed point (a loop until nothing changes: always the exact greedy
   result, never a round limit); then the policy (region of interest, size limits) and the best `max_detections`
   of each frame, written grouped by frame in rank order, and the status row.

The result equals the torch stages' exact result wherever the valid candidates fit the limits' capacity; when
they do not, the status row says so as the torch stages' does (`needed` above the capacity: the host redoes the
batch on the exact path and grows the capacity). Floats are rounded operation by operation as torch's kernels
round them (no multiply-add contraction: `kernels.launch_options`; IEEE division), so threshold decisions are
the same.
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
        return tl.where(denom > 0, tl.math.div_rn(inter, tl.where(denom > 0, denom, 1.0)), 0.0)

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
    def _or(a, b):
        return a | b

    @triton.jit
    def _compact_kernel(
        boxes_ptr,
        scores_ptr,
        classes_ptr,
        image_ptr,
        valid_ptr,
        M,
        to_frame_ptr,
        views_ptr,
        inner_ptr,
        view_frame_ptr,
        f32,
        i32,
        i8,
        n,
        capacity,
        margin_px,
        SEAMS: tl.constexpr,
        ROWS: tl.constexpr,
    ):
        """Phase 1: the valid rows compacted (index order), in frame pixels, with their seam flags (1: cut by an
        inner seam); their count and how many are taken (0 past the capacity)."""
        lanes = tl.arange(0, ROWS)
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
            tl.store(f32 + at * 4 + 0, x1, mask=ok)
            tl.store(f32 + at * 4 + 1, y1, mask=ok)
            tl.store(f32 + at * 4 + 2, x2, mask=ok)
            tl.store(f32 + at * 4 + 3, y2, mask=ok)
            tl.store(f32 + 4 * n + at, (x2 - x1) * (y2 - y1), mask=ok)
            tl.store(f32 + 5 * n + at, tl.load(scores_ptr + i, mask=ok, other=0.0), mask=ok)
            tl.store(i32 + at, tl.load(classes_ptr + i, mask=ok, other=0).to(tl.int32), mask=ok)
            tl.store(i32 + n + at, view.to(tl.int32), mask=ok)
            tl.store(i32 + 2 * n + at, tl.load(view_frame_ptr + view, mask=ok, other=0).to(tl.int32), mask=ok)
            tl.store(i32 + 3 * n + at, i, mask=ok)
            tl.store(i8 + at, cut.to(tl.int8), mask=ok)
            count += tl.sum(ok.to(tl.int32), axis=0)
        counts = tl.where(lanes == 0, count, tl.where(lanes == 1, tl.where(count <= capacity, count, 0), 0))
        tl.store(i32 + 7 * n + lanes, counts, mask=lanes < 3)

    @triton.jit
    def _seam_kernel(f32, i32, i8, n, min_cover, min_ratio, AGNOSTIC: tl.constexpr, BLOCK: tl.constexpr):
        """Phase 2, 64 rows a program: a cut row (flag 1) that a whole row (flag 0) of the same frame (and class),
        another image and at least `min_ratio` of its score covers by `min_cover` of its area becomes flag 2."""
        rows = tl.load(i32 + 7 * n + 1)
        ri = tl.arange(0, BLOCK)
        i = tl.program_id(0) * BLOCK + ri
        mi = i < rows
        cut_i = (tl.load(i8 + i, mask=mi, other=0) == 1) & mi
        if tl.max(cut_i.to(tl.int32), axis=0) > 0:
            ax1 = tl.load(f32 + i * 4 + 0, mask=mi, other=0.0)[:, None]
            ay1 = tl.load(f32 + i * 4 + 1, mask=mi, other=0.0)[:, None]
            ax2 = tl.load(f32 + i * 4 + 2, mask=mi, other=0.0)[:, None]
            ay2 = tl.load(f32 + i * 4 + 3, mask=mi, other=0.0)[:, None]
            need = (min_cover * tl.maximum(tl.load(f32 + 4 * n + i, mask=mi, other=0.0), 1e-9))[:, None]
            least = (min_ratio * tl.load(f32 + 5 * n + i, mask=mi, other=0.0))[:, None]
            class_i = tl.load(i32 + i, mask=mi, other=0)[:, None]
            image_i = tl.load(i32 + n + i, mask=mi, other=0)[:, None]
            frame_i = tl.load(i32 + 2 * n + i, mask=mi, other=0)[:, None]
            covered = tl.zeros((BLOCK,), tl.int32)
            for j0 in range(0, rows, BLOCK):
                j = j0 + ri
                mj = j < rows
                whole = (tl.load(i8 + j, mask=mj, other=1) == 0) & mj  # (a cut row's 1 or 2: never whole)
                w = tl.maximum(
                    tl.minimum(ax2, tl.load(f32 + j * 4 + 2, mask=mj, other=0.0)[None, :])
                    - tl.maximum(ax1, tl.load(f32 + j * 4 + 0, mask=mj, other=0.0)[None, :]),
                    0.0,
                )
                h = tl.maximum(
                    tl.minimum(ay2, tl.load(f32 + j * 4 + 3, mask=mj, other=0.0)[None, :])
                    - tl.maximum(ay1, tl.load(f32 + j * 4 + 1, mask=mj, other=0.0)[None, :]),
                    0.0,
                )
                hit = (w * h >= need) & whole[None, :]
                hit = hit & (tl.load(i32 + 2 * n + j, mask=mj, other=-1)[None, :] == frame_i)
                if not AGNOSTIC:
                    hit = hit & (tl.load(i32 + j, mask=mj, other=-1)[None, :] == class_i)
                hit = hit & (tl.load(i32 + n + j, mask=mj, other=-1)[None, :] != image_i)
                hit = hit & (tl.load(f32 + 5 * n + j, mask=mj, other=0.0)[None, :] >= least)
                covered = tl.maximum(covered, tl.max(hit.to(tl.int32), axis=1))
            tl.store(i8 + i, tl.full((BLOCK,), 2, tl.int8), mask=cut_i & (covered > 0))

    @triton.jit
    def _rank_kernel(f32, i32, i8, n, BLOCK: tl.constexpr):
        """Phase 3, 64 rows a program: each row the seam rule kept (flag 0 or 1) written at its rank among them;
        program 0 stores how many there are."""
        rows = tl.load(i32 + 7 * n + 1)
        ri = tl.arange(0, BLOCK)
        i = tl.program_id(0) * BLOCK + ri
        mi = i < rows
        if tl.program_id(0) * BLOCK < rows:
            keep_i = (tl.load(i8 + i, mask=mi, other=2) != 2) & mi
            s_i = tl.load(f32 + 5 * n + i, mask=mi, other=0.0)
            x1_i = tl.load(f32 + i * 4 + 0, mask=mi, other=0.0)
            y1_i = tl.load(f32 + i * 4 + 1, mask=mi, other=0.0)
            x2_i = tl.load(f32 + i * 4 + 2, mask=mi, other=0.0)
            y2_i = tl.load(f32 + i * 4 + 3, mask=mi, other=0.0)
            src_i = tl.load(i32 + 3 * n + i, mask=mi, other=0)
            rank = tl.zeros((BLOCK,), tl.int32)
            total = tl.sum(tl.zeros((BLOCK,), tl.int32), axis=0)
            for j0 in range(0, rows, BLOCK):
                j = j0 + ri
                mj = j < rows
                keep_j = (tl.load(i8 + j, mask=mj, other=2) != 2) & mj
                first = _before(
                    tl.load(f32 + 5 * n + j, mask=mj, other=0.0)[None, :],
                    tl.load(f32 + j * 4 + 0, mask=mj, other=0.0)[None, :],
                    tl.load(f32 + j * 4 + 1, mask=mj, other=0.0)[None, :],
                    tl.load(f32 + j * 4 + 2, mask=mj, other=0.0)[None, :],
                    tl.load(f32 + j * 4 + 3, mask=mj, other=0.0)[None, :],
                    tl.load(i32 + 3 * n + j, mask=mj, other=0)[None, :],
                    s_i[:, None],
                    x1_i[:, None],
                    y1_i[:, None],
                    x2_i[:, None],
                    y2_i[:, None],
                    src_i[:, None],
                )
                rank += tl.sum((first & keep_j[None, :]).to(tl.int32), axis=1)
                total += tl.sum(keep_j.to(tl.int32), axis=0)
            tl.store(f32 + 6 * n + rank * 4 + 0, x1_i, mask=keep_i)
            tl.store(f32 + 6 * n + rank * 4 + 1, y1_i, mask=keep_i)
            tl.store(f32 + 6 * n + rank * 4 + 2, x2_i, mask=keep_i)
            tl.store(f32 + 6 * n + rank * 4 + 3, y2_i, mask=keep_i)
            tl.store(f32 + 10 * n + rank, tl.load(f32 + 4 * n + i, mask=mi, other=0.0), mask=keep_i)
            tl.store(f32 + 11 * n + rank, s_i, mask=keep_i)
            tl.store(i32 + 4 * n + rank, tl.load(i32 + i, mask=mi, other=0), mask=keep_i)
            tl.store(i32 + 5 * n + rank, tl.load(i32 + 2 * n + i, mask=mi, other=0), mask=keep_i)
            tl.store(i32 + 6 * n + rank, src_i, mask=keep_i)
            if tl.program_id(0) == 0:
                tl.store(i32 + 7 * n + 2, total)

    @triton.jit
    def _match_kernel(
        f32, i32, words, n, blocks, threshold, IOU: tl.constexpr, AGNOSTIC: tl.constexpr, BLOCK: tl.constexpr
    ):
        """Phase 4, one program per (row block, column block at or after it): the columns each ranked row would
        suppress (a match of a later row, same frame and class), as one 64-bit word per row and column block."""
        ranked = tl.load(i32 + 7 * n + 2)
        row_block = tl.program_id(0)
        column_block = tl.program_id(1)
        if (column_block >= row_block) & (column_block * BLOCK < ranked):
            ri = tl.arange(0, BLOCK)
            q = row_block * BLOCK + ri
            r = column_block * BLOCK + ri
            mq = q < ranked
            mr = r < ranked
            near = (
                _overlap(
                    tl.load(f32 + 6 * n + q * 4 + 0, mask=mq, other=0.0)[:, None],
                    tl.load(f32 + 6 * n + q * 4 + 1, mask=mq, other=0.0)[:, None],
                    tl.load(f32 + 6 * n + q * 4 + 2, mask=mq, other=0.0)[:, None],
                    tl.load(f32 + 6 * n + q * 4 + 3, mask=mq, other=0.0)[:, None],
                    tl.load(f32 + 10 * n + q, mask=mq, other=0.0)[:, None],
                    tl.load(f32 + 6 * n + r * 4 + 0, mask=mr, other=0.0)[None, :],
                    tl.load(f32 + 6 * n + r * 4 + 1, mask=mr, other=0.0)[None, :],
                    tl.load(f32 + 6 * n + r * 4 + 2, mask=mr, other=0.0)[None, :],
                    tl.load(f32 + 6 * n + r * 4 + 3, mask=mr, other=0.0)[None, :],
                    tl.load(f32 + 10 * n + r, mask=mr, other=0.0)[None, :],
                    IOU,
                )
                >= threshold
            )
            near = near & mq[:, None] & mr[None, :] & (q[:, None] < r[None, :])
            near = near & (
                tl.load(i32 + 5 * n + q, mask=mq, other=-1)[:, None]
                == tl.load(i32 + 5 * n + r, mask=mr, other=-2)[None, :]
            )
            if not AGNOSTIC:
                near = near & (
                    tl.load(i32 + 4 * n + q, mask=mq, other=-1)[:, None]
                    == tl.load(i32 + 4 * n + r, mask=mr, other=-2)[None, :]
                )
            bit = tl.full((BLOCK,), 1, tl.int64) << ri.to(tl.int64)
            word = tl.sum(tl.where(near, bit[None, :], 0), axis=1)  # distinct bits: the sum is their OR
            tl.store(words + q * blocks + column_block, word, mask=mq)

    @triton.jit
    def _keep_kernel(
        f32,
        i32,
        i8,
        words,
        n,
        blocks,
        roi_ptr,
        packed_ptr,
        members_ptr,
        R,
        num_frames,
        max_detections,
        needed_cap,
        min_box,
        max_box,
        ROI: tl.constexpr,
        SIZES: tl.constexpr,
        BLOCK: tl.constexpr,
        ROWS: tl.constexpr,
    ):
        """Phase 5 (one program): NMS a block at a time, then the policy, the per-frame cut and the status row."""
        ranked = tl.load(i32 + 7 * n + 2)
        lanes = tl.arange(0, ROWS)
        ri = tl.arange(0, BLOCK)
        bit = tl.full((BLOCK,), 1, tl.int64) << ri.to(tl.int64)
        for b0 in range(0, ranked, BLOCK):
            column_block = b0 // BLOCK
            suppressed = tl.sum(
                tl.zeros((BLOCK,), tl.int64), axis=0
            )  # the columns kept earlier rows suppress
            for q0 in range(0, b0, ROWS):
                q = q0 + lanes
                mq = q < b0
                on = (tl.load(i8 + n + q, mask=mq, other=0) != 0) & mq
                word = tl.load(words + q * blocks + column_block, mask=on, other=0)
                suppressed = suppressed | tl.reduce(word, 0, _or)
            r = b0 + ri
            mr = r < ranked
            own = tl.load(words + r * blocks + column_block, mask=mr, other=0)  # within the block
            alive = tl.sum(tl.where(mr, bit, 0), axis=0) & ~suppressed
            settled = alive
            changed = alive != 0
            while changed:
                hit = tl.reduce(tl.where(((settled >> ri.to(tl.int64)) & 1) != 0, own, 0), 0, _or)
                new = alive & ~hit
                changed = new != settled
                settled = new
            tl.store(i8 + n + r, (((settled >> ri.to(tl.int64)) & 1) != 0).to(tl.int8), mask=mr)
            tl.debug_barrier()
        written = tl.sum(tl.zeros((ROWS,), tl.int32), axis=0)
        for frame in range(0, num_frames):
            taken = tl.sum(tl.zeros((ROWS,), tl.int32), axis=0)
            for start in range(0, ranked, ROWS):
                r = start + lanes
                mr = r < ranked
                x1 = tl.load(f32 + 6 * n + r * 4 + 0, mask=mr, other=0.0)
                y1 = tl.load(f32 + 6 * n + r * 4 + 1, mask=mr, other=0.0)
                x2 = tl.load(f32 + 6 * n + r * 4 + 2, mask=mr, other=0.0)
                y2 = tl.load(f32 + 6 * n + r * 4 + 3, mask=mr, other=0.0)
                on = mr & (tl.load(i8 + n + r, mask=mr, other=0) != 0)
                on = on & (tl.load(i32 + 5 * n + r, mask=mr, other=-1) == frame)
                if ROI:
                    cx = (x1 + x2) * 0.5
                    cy = (y1 + y2) * 0.5
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
                tl.store(packed_ptr + out + 4, tl.load(f32 + 11 * n + r, mask=mr, other=0.0), mask=on)
                classes = tl.load(i32 + 4 * n + r, mask=mr, other=0).to(tl.float32)
                tl.store(packed_ptr + out + 5, classes, mask=on)
                tl.store(packed_ptr + out + 6, tl.full((ROWS,), 1.0, tl.float32), mask=on)
                tl.store(packed_ptr + out + 7, tl.zeros((ROWS,), tl.float32) + frame, mask=on)
                source = tl.load(i32 + 6 * n + r, mask=mr, other=0).to(tl.int64)
                tl.store(members_ptr + written + place, source, mask=on)
                taken += tl.sum(on.to(tl.int32), axis=0)
            written += taken
        for start in range(written, R, ROWS):  # the rows no result takes
            r = start + lanes
            mr = r < R
            for column in range(0, 8):
                tl.store(packed_ptr + r * 8 + column, tl.zeros((ROWS,), tl.float32), mask=mr)
            tl.store(members_ptr + r, tl.full((ROWS,), -1, tl.int64), mask=mr)
        needed = tl.minimum(tl.load(i32 + 7 * n), needed_cap)
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
    """`postprocess.postprocess_rows` (sync-free: fixed shapes, no host read) in five launches, where `supports`
    says so: the packed (R + 1, 8) rows and status, and each result row's candidate (R, 1) (-1 where none: nms
    merges nothing into a row)."""
    device = found.boxes.device
    count = len(found.valid)
    rows = min(count, limits.capacity)  # the most rows the phases after the compaction take
    result_rows = min(rows, plan.num_frames * settings.max_detections)
    tensors = plan.tensors(device)
    rule = settings.merge_rule
    n = max(count, 1)
    blocks = max(triton.cdiv(rows, BLOCK), 1)
    f32 = torch.empty(12 * n, dtype=torch.float32, device=device)  # boxes, areas, scores; ranked likewise
    i32 = torch.empty(
        7 * n + 4, dtype=torch.int32, device=device
    )  # classes, views, frames, sources; ranked; counts
    i8 = torch.empty(2 * n, dtype=torch.int8, device=device)  # seam flags, kept
    words = torch.empty(max(rows, 1) * blocks, dtype=torch.int64, device=device)
    packed = torch.empty((result_rows + 1, COLUMNS), dtype=torch.float32, device=device)
    members = torch.empty((result_rows, 1), dtype=torch.int64, device=device)
    options = kernels.launch_options()
    agnostic, iou = settings.class_agnostic, rule.metric is MatchMetric.IOU
    _compact_kernel[(1,)](
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
        f32,
        i32,
        i8,
        n,
        rows,
        SEAM_MARGIN_PX,
        SEAMS=settings.seam_suppression,
        ROWS=ROWS,
        num_warps=4,
        **options,
    )
    if settings.seam_suppression:
        _seam_kernel[(blocks,)](
            f32, i32, i8, n, SEAM_MIN_COVER, SEAM_MIN_SCORE_RATIO, AGNOSTIC=agnostic, BLOCK=BLOCK, **options
        )
    _rank_kernel[(blocks,)](f32, i32, i8, n, BLOCK=BLOCK, **options)
    _match_kernel[(blocks, blocks)](
        f32, i32, words, n, blocks, float(rule.threshold), IOU=iou, AGNOSTIC=agnostic, BLOCK=BLOCK, **options
    )
    _keep_kernel[(1,)](
        f32,
        i32,
        i8,
        words,
        n,
        blocks,
        tensors.roi.contiguous(),
        packed,
        members,
        result_rows,
        plan.num_frames,
        settings.max_detections,
        MAX_CANDIDATES * plan.num_frames,
        float(settings.min_box_size),
        float(settings.max_box_size),
        ROI=any(p.roi != FULL_FRAME_ROI for p in plan.plans),
        SIZES=settings.min_box_size > 0 or settings.max_box_size > 0,
        BLOCK=BLOCK,
        ROWS=ROWS,
        num_warps=4,
        **options,
    )
    return Rows(packed, members)
