"""Merging detections across tiles: SAHI's nms / nmm / greedy_nmm as torch kernels, plus the seam rule.

Semantics equal SAHI 0.12.8 (`sahi.postprocess.combine`):
- boxes are ranked by score descending, ties broken by x1, y1, x2, y2 ascending, then by input index;
- two boxes match when their IoU or IoS (intersection over the smaller area), computed in float32, is
  >= threshold; class-aware merging only matches boxes of the same class;
- nms keeps a box unless a kept higher-ranked box matches it;
- greedy_nmm has the same keepers as nms; every other box joins the first keeper (by rank) that matches it;
- nmm is transitive: each box, in rank order, claims the unclaimed lower-ranked boxes it matches into its own
  group (a box never claims one of equal score unless both have identical coordinates);
- a group is merged like SAHI's `_apply_merge`: members in SAHI's order are re-checked (float64) against the
  growing union box; a member that still matches widens the box (union), the score is the keeper's (the max),
  and the class becomes the member's when its score equals the keeper's; a member that no longer matches is
  dropped. Results come out in rank order (SAHI's class-aware output is grouped by class instead).
The seam rule (`suppress_truncated`) runs before the merge: a box cut by an inner tile edge yields to a whole
view of the same object from another batch image.
Only the nms keep order and group membership are sequential; both are computed with matrix fixed points. The
merge itself is one vectorised pass when every member passes SAHI's re-check, else a walk over group positions.

`merge_padded` and `suppress_truncated(..., valid=...)` are the same computations on a fixed-size candidate set
with a validity mask: no data-dependent shape, no host synchronisation (for accelerators). Their sequential
parts run a fixed number of rounds and report, as a device flag, whether the result is proven exact.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from tiled_detector.options import Option

if TYPE_CHECKING:
    from tiled_detector.tiling import TilePlan


class MergeMethod(Option):
    """How overlapping detections are combined."""

    NMS = "nms"
    NMM = "nmm"
    GREEDY_NMM = "greedy_nmm"


class MatchMetric(Option):
    """Overlap measure deciding whether two boxes match."""

    IOU = "iou"
    IOS = "ios"


@functools.cache
def _torchvision_ops() -> Any | None:
    """torchvision.ops when torchvision imports with its compiled nms kernel, else None."""
    try:
        import torchvision.ops

        torch.ops.torchvision.nms  # noqa: B018 -- raises when the compiled ops are missing
    except (ImportError, AttributeError, RuntimeError):
        return None
    return torchvision.ops


def overlap(a: torch.Tensor, b: torch.Tensor, metric: MatchMetric) -> torch.Tensor:
    """IoU or IoS of broadcastable (..., 4) x1, y1, x2, y2 boxes (0 where the denominator is 0).

    Use `overlap(a[:, None], b[None], m)` for the pairwise matrix. Same float operations as SAHI's numpy backend.
    """
    iw = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp_min(0)
    ih = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp_min(0)
    inter = iw * ih
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    denom = area_a + area_b - inter if metric is MatchMetric.IOU else torch.minimum(area_a, area_b)
    positive = denom > 0
    return torch.where(positive, inter / torch.where(positive, denom, torch.ones_like(denom)), 0.0)


def rank_order(boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Permutation sorting by score descending, then x1, y1, x2, y2 ascending, then index (SAHI's lexsort)."""
    order = torch.arange(len(scores), device=scores.device)
    for column in (3, 2, 1, 0):
        order = order[torch.sort(boxes[order, column], stable=True).indices]
    return order[torch.sort(scores[order], stable=True, descending=True).indices]


def _match_matrix(
    boxes: torch.Tensor, class_ids: torch.Tensor, metric: MatchMetric, threshold: float, class_agnostic: bool
) -> torch.Tensor:
    """(N, N) bool: row i matches column j, for i ranked before j (inputs already in rank order)."""
    rank = torch.arange(len(boxes), device=boxes.device)
    match = overlap(boxes[:, None], boxes[None], metric) >= threshold
    match &= rank[:, None] < rank[None]
    if not class_agnostic:
        match &= class_ids[:, None] == class_ids[None]
    return match


def _nms_keep(match: torch.Tensor) -> torch.Tensor:
    """Greedy NMS keep mask from a rank-ordered upper-triangular match matrix.

    The fixed point of keep[j] = not any(keep[i] and match[i, j]) is unique on a triangular system, and each
    iteration fixes at least one more rank, so the loop ends after at most N + 1 rounds (in practice the depth
    of the longest suppression chain).
    """
    keep = torch.ones(len(match), dtype=torch.bool, device=match.device)
    for _ in range(len(match) + 1):
        new_keep = ~(match & keep[:, None]).any(0)
        if torch.equal(new_keep, keep):
            break
        keep = new_keep
    return keep


def _nms_keep_rounds(match: torch.Tensor, rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`_nms_keep` with a fixed number of rounds (no host sync), and a 0-dim bool tensor: True when the result
    is the fixed point (one more round changes nothing), hence exact."""
    keep = torch.ones(len(match), dtype=torch.bool, device=match.device)
    for _ in range(min(rounds, len(match) + 1)):
        keep = ~(match & keep[:, None]).any(0)
    return keep, (~(match & keep[:, None]).any(0) == keep).all()


def _nms_keep_torchvision(
    ops: Any, boxes: torch.Tensor, class_ids: torch.Tensor, threshold: float, class_agnostic: bool
) -> torch.Tensor:
    """The same keep mask through torchvision's IoU kernel (inputs in rank order).

    Scores are replaced by the rank so that torchvision's sort reproduces our tie-breaking, and the threshold
    by the next float32 below it, because torchvision suppresses on IoU > threshold where SAHI uses >=.
    Boxes of different classes are kept apart by torchvision's coordinate offsets, which can move IoU values
    by float32 rounding; keep sets only differ from the pure-torch path for IoUs within that rounding.
    """
    n = len(boxes)
    rank_scores = torch.arange(n, 0, -1, dtype=torch.float32, device=boxes.device)
    below = float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))
    if class_agnostic:
        kept = ops.nms(boxes, rank_scores, below)
    else:
        kept = ops.batched_nms(boxes, rank_scores, class_ids, below)
    keep = torch.zeros(n, dtype=torch.bool, device=boxes.device)
    keep[kept] = True
    return keep


def _first_true_row(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per column: index of the first True row, and whether there is one."""
    return mask.to(torch.uint8).argmax(0), mask.any(0)


def _roots(parent: torch.Tensor) -> torch.Tensor:
    """Root of every node of a forest given as parent pointers (roots point to themselves): pointer jumping."""
    root = parent
    while True:
        jumped = root[root]
        if torch.equal(jumped, root):
            return root
        root = jumped


def _roots_fixed(parent: torch.Tensor) -> torch.Tensor:
    """`_roots` with ceil(log2(N)) jumps: enough for any forest of N nodes (depth < N), so exact, no sync."""
    root = parent
    for _ in range(max(1, (len(parent) - 1).bit_length())):
        root = root[root]
    return root


def _absorb(
    merged: torch.Tensor,
    merged_class: torch.Tensor,
    member: torch.Tensor,
    member_class: torch.Tensor,
    present: torch.Tensor,
    takes_class: torch.Tensor,
    metric: MatchMetric,
    threshold: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of SAHI's `_apply_merge` for every group at once: a present member that still matches the
    group's union box widens it, and gives the group its class where `takes_class`."""
    ok = present & (overlap(merged, member, metric) >= threshold)
    grown = torch.cat(
        [torch.minimum(merged[:, :2], member[:, :2]), torch.maximum(merged[:, 2:], member[:, 2:])], 1
    )
    return torch.where(ok[:, None], grown, merged), torch.where(ok & takes_class, member_class, merged_class)


def _merge_groups(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    keeper: torch.Tensor,
    member_order: torch.Tensor,
    metric: MatchMetric,
    threshold: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAHI's `_apply_merge` for all groups at once (inputs in rank order).

    keeper (N,) is each box's group keeper (itself for keepers); member_order (N,) int64 sorts the members of a
    group in SAHI's merge order. Returns the merged boxes, scores and classes of the keepers, in rank order.
    Groups are laid out on a (groups, slots) grid, slot 0 being the keeper. First every member is assumed to
    pass SAHI's re-check against the growing union (prefix unions by cummin / cummax) and all re-checks are
    evaluated at once; only if one fails are the slots walked in order (vectorised over the groups).
    """
    n = len(boxes)
    positions = torch.arange(n, device=boxes.device)
    is_keeper = keeper == positions
    order = torch.sort(torch.where(is_keeper, -1, member_order), stable=True).indices
    order = order[torch.sort(keeper[order], stable=True).indices]  # grouped: keeper, then its members
    groups = keeper[order]
    slot = positions - torch.searchsorted(groups, groups)
    group = torch.cumsum(slot == 0, 0) - 1
    num_groups, num_slots = len(scores[is_keeper]), int(slot.max()) + 1

    def grid(values: torch.Tensor, fill: float | bool) -> torch.Tensor:
        out = values.new_full((num_groups, num_slots, *values.shape[1:]), fill)
        out[group, slot] = values
        return out

    present = grid(torch.ones(n, dtype=torch.bool, device=boxes.device), False)
    gboxes = grid(boxes.double()[order], float("nan"))
    gclass = grid(class_ids[order], 0)
    takes_class = grid(scores[order] >= scores[groups], False)  # SAHI: not (keeper score > member score)
    takes_class[:, 0] = True

    lo = torch.where(present[..., None], gboxes[..., :2], float("inf")).cummin(1).values
    hi = torch.where(present[..., None], gboxes[..., 2:], float("-inf")).cummax(1).values
    prefix = torch.cat([lo, hi], dim=2)  # union of slots 0..s, if every member passes
    passes = overlap(prefix[:, :-1], gboxes[:, 1:], metric) >= threshold
    if bool((passes | ~present[:, 1:]).all()):
        merged = prefix[:, -1]
        last_taker = torch.where(present & takes_class, positions[:num_slots], 0).amax(1, keepdim=True)
        merged_class = gclass.gather(1, last_taker).squeeze(1)
    else:
        merged, merged_class = gboxes[:, 0], gclass[:, 0]
        for s in range(1, num_slots):
            merged, merged_class = _absorb(
                merged,
                merged_class,
                gboxes[:, s],
                gclass[:, s],
                present[:, s],
                takes_class[:, s],
                metric,
                threshold,
            )
    return merged.to(boxes.dtype), scores[is_keeper], merged_class


def merge(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    method: str | MergeMethod = MergeMethod.GREEDY_NMM,
    metric: str | MatchMetric = MatchMetric.IOS,
    threshold: float = 0.5,
    class_agnostic: bool = False,
    use_torchvision: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Combine overlapping detections like SAHI (see the module docstring), on the inputs' device.

    boxes (N, 4) x1, y1, x2, y2, scores (N,), class_ids (N,) int64 -> the same, float32 / int64, score-ranked.
    `use_torchvision=False` forces the pure-torch NMS (torchvision is only used for nms with IoU and a
    threshold above 0).
    """
    method, metric = MergeMethod.from_value(method), MatchMetric.from_value(metric)
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"merge threshold must be in [0, 1], got {threshold!r}")
    if not len(boxes) == len(scores) == len(class_ids) or boxes.shape[1:] != (4,):
        raise ValueError(
            f"merge needs (N, 4) boxes and N scores and class ids, got {tuple(boxes.shape)}, "
            f"{tuple(scores.shape)} and {tuple(class_ids.shape)}"
        )
    order = rank_order(boxes.float(), scores.float())
    boxes, scores, class_ids = boxes.float()[order], scores.float()[order], class_ids.long()[order]
    if len(boxes) == 0:
        return boxes, scores, class_ids

    ops = _torchvision_ops() if use_torchvision else None
    # torchvision separates classes by offsetting boxes (IoU 0), so it cannot express "every pair matches"
    if method is MergeMethod.NMS and metric is MatchMetric.IOU and ops is not None and threshold > 0:
        keep = _nms_keep_torchvision(ops, boxes, class_ids, threshold, class_agnostic)
        return boxes[keep], scores[keep], class_ids[keep]
    match = _match_matrix(boxes, class_ids, metric, threshold, class_agnostic)
    if method is MergeMethod.NMS:
        keep = _nms_keep(match)
        return boxes[keep], scores[keep], class_ids[keep]

    positions = torch.arange(len(boxes), device=boxes.device)
    if method is MergeMethod.GREEDY_NMM:
        keep = _nms_keep(match)
        parent, _ = _first_true_row(match & keep[:, None])
        keeper = torch.where(keep, positions, parent)
        member_order = positions  # SAHI appends a keeper's members in rank order
    else:
        # nmm: a box claims lower-ranked matches, except equal-score boxes with different coordinates
        same = (scores[:, None] == scores[None]) & ~(boxes[:, None] == boxes[None]).all(-1)
        parent, claimed = _first_true_row(match & ~same)
        keeper = _roots(torch.where(claimed, parent, positions))
        # members are appended claimer by claimer (rank order), each claimer's in input-index order
        member_order = parent * len(boxes) + order
    return _merge_groups(boxes, scores, class_ids, keeper, member_order, metric, threshold)


class PaddedMerge(NamedTuple):
    """Result of `merge_padded`: N rows in rank order (invalid rows last), `valid` (N,) marks the merged
    detections, `exact` is a 0-dim bool tensor, False when a fixed-round step did not reach its fixed point or a
    group is larger than the slots walked (then use `merge` on the valid rows, or more rounds / slots)."""

    boxes: torch.Tensor
    scores: torch.Tensor
    class_ids: torch.Tensor
    valid: torch.Tensor
    exact: torch.Tensor
    largest: torch.Tensor  # 0-dim int64: the largest merge group (1 for nms)


def _merge_groups_padded(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    keeper: torch.Tensor,
    member_order: torch.Tensor,
    valid: torch.Tensor,
    metric: MatchMetric,
    threshold: float,
    slots: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_merge_groups`' walk over group positions on fixed shapes: merged boxes and classes on the keepers'
    rows, the keeper mask, and the largest group size (exact when it is at most `slots`)."""
    n = len(boxes)
    positions = torch.arange(n, device=boxes.device)
    own = keeper == positions
    key = torch.where(own, -1, member_order)  # merge order within a group: keeper first, ties by position
    same = (keeper[:, None] == keeper[None]) & valid[:, None] & valid[None]
    before = same & (
        (key[:, None] < key[None]) | ((key[:, None] == key[None]) & (positions[:, None] < positions))
    )
    slot = before.sum(0)  # position of each box in its group's merge order (the keeper's is 0)
    # table[g, s]: the box at position s of the group kept by g, or n (a padding row) where there is none
    fits = valid & (slot < slots)
    table = torch.full((n + 1, slots), n, dtype=torch.int64, device=boxes.device)
    table[torch.where(fits, keeper, n), torch.where(fits, slot, 0)] = torch.where(fits, positions, n)
    table = table[:n]
    b64 = torch.cat([boxes.double(), boxes.new_zeros(1, 4, dtype=torch.float64)])
    takes_class = torch.cat([scores >= scores[keeper], scores.new_zeros(1, dtype=torch.bool)])
    classes = torch.cat([class_ids, class_ids.new_zeros(1)])
    present = torch.cat([valid, valid.new_zeros(1)])
    merged, merged_class = b64[:n], class_ids
    for s in range(1, slots):
        index = table[:, s]
        merged, merged_class = _absorb(
            merged,
            merged_class,
            b64[index],
            classes[index],
            present[index],
            takes_class[index],
            metric,
            threshold,
        )
    largest = torch.where(valid, slot, 0).amax() + 1
    return merged.to(boxes.dtype), merged_class, own & valid, largest


def merge_padded(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    valid: torch.Tensor,
    method: str | MergeMethod = MergeMethod.GREEDY_NMM,
    metric: str | MatchMetric = MatchMetric.IOS,
    threshold: float = 0.5,
    class_agnostic: bool = False,
    nms_rounds: int = 16,
    slots: int = 16,
) -> PaddedMerge:
    """`merge` of the rows where `valid` (N,) bool, with fixed shapes and no host synchronisation.

    When `exact` is True the valid output rows, in order, equal `merge` of the valid input rows with
    `use_torchvision=False`. NMS keep masks run `nms_rounds` rounds (the depth of the longest suppression chain
    is needed); the merge walks `slots` positions of each group (the largest group size is needed; it is
    reported as `largest`). nmm group membership is always exact.
    """
    method, metric = MergeMethod.from_value(method), MatchMetric.from_value(metric)
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"merge threshold must be in [0, 1], got {threshold!r}")
    if not len(boxes) == len(scores) == len(class_ids) == len(valid) or boxes.shape[1:] != (4,):
        raise ValueError(
            f"merge_padded needs (N, 4) boxes and N scores, class ids and valid flags, got {tuple(boxes.shape)}, "
            f"{tuple(scores.shape)}, {tuple(class_ids.shape)} and {tuple(valid.shape)}"
        )
    valid = valid.bool()
    boxes = torch.where(valid[:, None], boxes.float(), 0.0)  # invalid rows: harmless values, ranked last
    scores = torch.where(valid, scores.float(), float("-inf"))
    order = rank_order(boxes, scores)
    order = order[torch.sort((~valid[order]).to(torch.int32), stable=True).indices]
    boxes, scores, class_ids, valid = boxes[order], scores[order], class_ids.long()[order], valid[order]
    exact = torch.ones((), dtype=torch.bool, device=boxes.device)
    one = torch.ones((), dtype=torch.int64, device=boxes.device)
    if len(boxes) == 0:
        return PaddedMerge(boxes, scores, class_ids, valid, exact, one)
    match = _match_matrix(boxes, class_ids, metric, threshold, class_agnostic) & valid[:, None] & valid[None]
    positions = torch.arange(len(boxes), device=boxes.device)
    if method is MergeMethod.NMM:
        same = (scores[:, None] == scores[None]) & ~(boxes[:, None] == boxes[None]).all(-1)
        parent, claimed = _first_true_row(match & ~same)
        keeper = _roots_fixed(torch.where(claimed, parent, positions))
        member_order = parent * len(boxes) + order
    else:
        keep, exact = _nms_keep_rounds(match, nms_rounds)
        if method is MergeMethod.NMS:
            return PaddedMerge(boxes, scores, class_ids, keep & valid, exact, one)
        parent, _ = _first_true_row(match & keep[:, None])
        keeper = torch.where(keep, positions, parent)
        member_order = positions
    merged, merged_class, is_keeper, largest = _merge_groups_padded(
        boxes, scores, class_ids, keeper, member_order, valid, metric, threshold, slots
    )
    return PaddedMerge(merged, scores, merged_class, is_keeper, exact & (largest <= slots), largest)


def merge_detections(
    boxes: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    method: str | MergeMethod = "greedy_nmm",
    metric: str | MatchMetric = "ios",
    threshold: float = 0.5,
    class_agnostic: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy wrapper of `merge`: (N, 4) boxes, (N,) scores, (N,) class ids -> float32, float32, int64 arrays."""
    out = merge(
        torch.as_tensor(np.asarray(boxes, np.float32).reshape(-1, 4)),
        torch.as_tensor(np.asarray(scores, np.float32).reshape(-1)),
        torch.as_tensor(np.asarray(class_ids, np.int64).reshape(-1)),
        method,
        metric,
        threshold,
        class_agnostic,
    )
    return out[0].numpy(), out[1].numpy(), out[2].numpy()


def truncated_sides(
    boxes_in_frame: torch.Tensor, image_index: torch.Tensor, plan: TilePlan, margin_px: float = 2.0
) -> torch.Tensor:
    """(M, 4) bool: box touches (within `margin_px` frame pixels) the left, top, right, bottom edge of its view
    where that edge is an inner seam. Full-frame boxes are never truncated."""
    t = plan.tensors(boxes_in_frame.device)
    views, inner = t.views[image_index], t.inner_edges[image_index]
    near_start = boxes_in_frame[:, :2] <= views[:, :2] + margin_px
    near_end = boxes_in_frame[:, 2:] >= views[:, 2:] - margin_px
    return inner & torch.cat([near_start, near_end], dim=1)


def _covers(part: torch.Tensor, whole: torch.Tensor, min_cover: float) -> torch.Tensor:
    """Broadcast (..., 4) boxes: `whole` covers at least `min_cover` of the area of `part`."""
    iw = (torch.minimum(part[..., 2], whole[..., 2]) - torch.maximum(part[..., 0], whole[..., 0])).clamp_min(
        0
    )
    ih = (torch.minimum(part[..., 3], whole[..., 3]) - torch.maximum(part[..., 1], whole[..., 1])).clamp_min(
        0
    )
    area = ((part[..., 2] - part[..., 0]) * (part[..., 3] - part[..., 1])).clamp_min(1e-9)
    return iw * ih >= min_cover * area


def suppress_truncated(
    boxes_in_frame: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    image_index: torch.Tensor,
    plan: TilePlan,
    margin_px: float = 2.0,
    min_cover: float = 0.6,
    min_score_ratio: float = 0.5,
    class_agnostic: bool = False,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Keep mask (M,) bool of the seam rule, applied before merging.

    A box touching an inner seam of its tile (see `truncated_sides`) is dropped when a box from another batch
    image (a neighbouring tile or the full-frame view) that is not truncated on any side, of the same class
    (unless `class_agnostic`), covers at least `min_cover` of its area and scores at least `min_score_ratio`
    times its score. Boxes cut in every view they appear in are kept and left to the merge (whose union
    restores the whole extent).
    With `valid` (M,) bool, only valid rows take part and the result is `valid` & keep, computed with fixed
    (M, M) matrices and no host synchronisation.
    """
    if valid is not None:
        return _suppress_truncated_padded(
            boxes_in_frame,
            scores,
            class_ids,
            image_index,
            plan,
            margin_px,
            min_cover,
            min_score_ratio,
            class_agnostic,
            valid.bool(),
        )
    keep = torch.ones(len(boxes_in_frame), dtype=torch.bool, device=boxes_in_frame.device)
    truncated = truncated_sides(boxes_in_frame, image_index, plan, margin_px).any(1)
    cut = truncated.nonzero().squeeze(1)
    if len(cut) == 0:
        return keep
    part, whole = boxes_in_frame[cut, None], boxes_in_frame[None]
    covered = _covers(part, whole, min_cover)
    covered &= ~truncated[None] & (image_index[cut, None] != image_index[None])
    covered &= scores[None] >= min_score_ratio * scores[cut, None]
    if not class_agnostic:
        covered &= class_ids[cut, None] == class_ids[None]
    keep[cut] = ~covered.any(1)
    return keep


def _suppress_truncated_padded(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    image_index: torch.Tensor,
    plan: TilePlan,
    margin_px: float,
    min_cover: float,
    min_score_ratio: float,
    class_agnostic: bool,
    valid: torch.Tensor,
) -> torch.Tensor:
    """`suppress_truncated` on all rows at once (the same float operations per pair)."""
    truncated = truncated_sides(boxes, image_index, plan, margin_px).any(1)
    part, whole = boxes[:, None], boxes[None]
    covered = _covers(part, whole, min_cover)
    covered &= (valid & ~truncated)[None] & (image_index[:, None] != image_index[None])
    covered &= scores[None] >= min_score_ratio * scores[:, None]
    if not class_agnostic:
        covered &= class_ids[:, None] == class_ids[None]
    return valid & ~(truncated & covered.any(1))
