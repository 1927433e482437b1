"""The seam rule: a box cut by an inner tile edge yields to a whole view of the same object from another view.

It runs before the merge, on a fixed-size candidate set with a validity mask (no data-dependent shape, no host
synchronisation); the exact result is the same computation with every row valid. Rotated boxes (N, 5) follow the
same rule in their geometry (`groups.geometry_of`): a rotated box is cut when its hull (a corner) reaches an inner
seam, and is covered by the exact intersection of the two rotated rectangles.
"""

from __future__ import annotations

import torch

from tiled_detector.pipeline.groups import area, geometry_of, group_key, intersection
from tiled_detector.pipeline.tiling import BatchPlan, TilePlan, batch_plan


def _as_batch(plan: TilePlan | BatchPlan) -> BatchPlan:
    return plan if isinstance(plan, BatchPlan) else batch_plan((plan,))


def truncated_sides(
    boxes_in_frame: torch.Tensor,
    image_index: torch.Tensor,
    plan: TilePlan | BatchPlan,
    margin_px: float = 4.0,
) -> torch.Tensor:
    """(M, 4) bool: box touches the left, top, right, bottom edge of its view where that edge is an inner seam:
    within `margin_px` pixels of the model's input, mapped to the frame (a tile shrunk into the model input has a
    wider margin in frame pixels; never less than `margin_px`). Full-frame boxes are never truncated. Rotated
    boxes (M, 5): their hulls."""
    boxes_in_frame = geometry_of(boxes_in_frame).hulls(boxes_in_frame)
    t = _as_batch(plan).tensors(boxes_in_frame.device)
    views, inner = t.views[image_index], t.inner_edges[image_index]
    margin = margin_px * t.to_frame[image_index, 0, :1].clamp_min(1.0)  # (M, 1): frame pixels per input pixel
    near_start = boxes_in_frame[:, :2] <= views[:, :2] + margin
    near_end = boxes_in_frame[:, 2:] >= views[:, 2:] - margin
    return inner & torch.cat([near_start, near_end], dim=1)


def suppress_truncated(
    boxes_in_frame: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    image_index: torch.Tensor,
    plan: TilePlan | BatchPlan,
    margin_px: float = 4.0,
    min_cover: float = 0.6,
    min_score_ratio: float = 0.5,
    class_agnostic: bool = False,
    valid: torch.Tensor | None = None,
    pairs: int | None = None,
) -> torch.Tensor:
    """Keep mask (M,) bool of the seam rule, applied before merging.

    A box touching an inner seam of its tile (see `truncated_sides`) is dropped when a box of the same frame
    from another batch image (a neighbouring tile or the full-frame view) that is not truncated on any side, of
    the same class (unless `class_agnostic`), covers at least `min_cover` of its area and scores at least
    `min_score_ratio` times its score. Boxes cut in every view they appear in are kept and left to the merge
    (whose union restores the whole extent). With `valid` (M,) bool only valid rows take part and the result is
    `valid` & keep, with fixed (M, M) matrices and no host synchronisation; without `valid` only the truncated
    rows are compared (a data-dependent shape: the exact path). `pairs`: at most that many (truncated, whole)
    pairs of a rotated box form measured (its bounded pair list).
    """
    batch = _as_batch(plan)
    exact = valid is None
    valid = torch.ones_like(scores, dtype=torch.bool) if valid is None else valid.bool()
    frame = batch.tensors(boxes_in_frame.device).frame[image_index]
    truncated = truncated_sides(boxes_in_frame, image_index, batch, margin_px).any(1)
    key = group_key(None if class_agnostic else class_ids, frame)
    listed = geometry_of(boxes_in_frame).meeting(boxes_in_frame, key) if exact and min_cover > 0 else None
    if listed is not None:  # the CPU's exact path: only the pairs whose boxes meet can cover
        return _listed_keep(
            boxes_in_frame, scores, image_index, truncated, listed, min_cover, min_score_ratio
        )
    # the rows that may yield: every row (fixed shape), or on the exact path only the truncated ones (fewer)
    cut = truncated.nonzero().squeeze(1) if exact else torch.arange(len(scores), device=scores.device)
    # one (M, N) comparison for "same frame, same class, and the column may cover": -1 (no row's key) for every
    # column that may not cover
    on = (valid[cut] & truncated[cut], valid & ~truncated)
    covered = geometry_of(boxes_in_frame).covers(boxes_in_frame[cut], boxes_in_frame, min_cover, pairs, on)
    covered &= key[cut, None] == torch.where(valid & ~truncated, key, -1)[None]
    covered &= image_index[cut, None] != image_index[None]
    covered &= scores[None] >= min_score_ratio * scores[cut, None]
    keep = valid.clone()
    keep[cut] &= ~(truncated[cut] & covered.any(1))
    return keep


def _listed_keep(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    image_index: torch.Tensor,
    truncated: torch.Tensor,
    listed: tuple[torch.Tensor, torch.Tensor],
    min_cover: float,
    min_score_ratio: float,
) -> torch.Tensor:
    """`suppress_truncated`'s keep mask of all-valid (N, 4) boxes from the pairs of the same key whose boxes meet
    (`Geometry.meeting`: every other pair's intersection is 0, which covers nothing): the matrix path's float
    operations pair by pair."""
    first, second = listed
    # a pair counts one way at most: its truncated box yielding to its whole one from another view
    first_cut = truncated.index_select(0, first)
    on = first_cut != truncated.index_select(0, second)
    on &= image_index.index_select(0, first) != image_index.index_select(0, second)
    on = on.nonzero().squeeze(1)
    first, second, first_cut = (t.index_select(0, on) for t in (first, second, first_cut))
    part, whole = torch.where(first_cut, first, second), torch.where(first_cut, second, first)
    cut = boxes.index_select(0, part)
    inside = intersection(cut, boxes.index_select(0, whole)) >= min_cover * area(cut).clamp_min(1e-9)
    inside &= scores.index_select(0, whole) >= min_score_ratio * scores.index_select(0, part)
    return torch.ones_like(truncated).index_fill_(0, part.masked_select(inside), False)
