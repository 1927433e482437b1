"""Merging detections across tiles: SAHI's nms / nmm / greedy_nmm as torch kernels.

Semantics equal SAHI 0.12.8 (`sahi.postprocess.combine`) on (N, 4) x1, y1, x2, y2 boxes; (N, 5) rotated boxes
(cx, cy, w, h, angle) merge by the same rules in their own geometry (`groups.geometry_of`: exact intersection
polygons; a group's box is the rectangle at its keeper's angle covering every member, never an average angle):
- boxes are ranked by score descending, ties broken by their columns ascending (x1, y1, x2, y2), then by input
  index;
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
Boxes of different frames (`frame_index`) never match: groups are frame x class (frame with class_agnostic).
Only the nms keep order and group membership are sequential; both are matrix fixed points, and the merge walks
the positions of every group at once.

Each method is a kernel of `KERNELS` (method -> function of the ranked candidates); one implementation,
`merge_padded`, ranks them and calls it. It works on a fixed-size candidate set with a validity mask: no data-dependent
shape, no host synchronisation (for accelerators). Its sequential parts run a fixed number of rounds and report,
as a device flag, whether the result is proven exact. `merge` is the same computation on all rows with the
rounds chosen from the data (until the fixed point; the largest group), so it is always exact.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from tiled_detector.pipeline import groups
from tiled_detector.pipeline.groups import Geometry, geometry_of, group_key
from tiled_detector.settings.options import Option

# rows settled together by the NMS fixed point (see `_nms_keep`): small blocks do the least work (CPU), large
# ones launch the fewest kernels (GPU: up to 1024 candidates take one block)
NMS_BLOCK = {"cpu": 256, "cuda": 1024}


class MergeMethod(Option):
    """How overlapping detections are combined."""

    NMS = "nms"
    NMM = "nmm"
    GREEDY_NMM = "greedy_nmm"


class MatchMetric(Option):
    """Overlap measure deciding whether two boxes match."""

    IOU = "iou"
    IOS = "ios"


DEFAULT_MERGE = MergeMethod.NMS  # the default everywhere: the node, the CLI, the Python API


@dataclass(frozen=True)
class MergeRule:
    """How overlapping detections are merged: the method, the overlap measure and threshold at which two boxes
    are one object, whether classes are merged together, and `rounds`: 0 settles the suppression of nms and
    greedy_nmm to its fixed point (SAHI's result), N > 0 runs at most N matrix rounds over all candidates (a
    bounded cost; a box whose chain of higher-ranked boxes suppressing one another is longer than N may be
    settled otherwise than SAHI settles it)."""

    method: MergeMethod = DEFAULT_MERGE
    metric: MatchMetric = MatchMetric.IOS
    threshold: float = 0.5
    class_agnostic: bool = False
    rounds: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", MergeMethod.from_value(self.method))
        object.__setattr__(self, "metric", MatchMetric.from_value(self.metric))
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"merge threshold must be in [0, 1], got {self.threshold!r}")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 0:
            raise ValueError(f"merge rounds must be an integer >= 0, got {self.rounds!r}")


DEFAULT_RULE = MergeRule()


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
    return groups.overlap(a, b, MatchMetric.from_value(metric).value)


def rank_order(boxes: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Permutation sorting by score descending, then the box columns ascending (x1, y1, x2, y2), then index (SAHI's
    lexsort); with `valid` (N,) bool the invalid rows come last (NaN scores rank last too)."""
    order = torch.arange(len(scores), device=scores.device)
    for column in reversed(range(boxes.shape[1])):
        order = order[torch.sort(boxes[order, column], stable=True).indices]
    # ascending on -score equals descending on score, and puts NaN (here: every invalid row) last
    key = -scores[order] if valid is None else torch.where(valid[order], -scores[order], float("nan"))
    return order[torch.sort(key, stable=True).indices]


def _match_matrix(
    boxes: torch.Tensor,
    class_ids: torch.Tensor,
    frame_index: torch.Tensor | None,
    valid: torch.Tensor | None,
    metric: MatchMetric,
    threshold: float,
    class_agnostic: bool,
    pairs: int | None = None,
) -> torch.Tensor:
    """(N, N) bool: valid row i matches valid column j of the same frame, for i ranked before j (inputs already
    in rank order; None: one frame, every row valid); `pairs`: at most that many pairs of valid rows measured
    (a rotated box form's bounded pair list: `groups.Geometry.pairwise`)."""
    on = None if valid is None else (valid, valid)
    match = (geometry_of(boxes).pairwise(boxes, boxes, metric.value, pairs, on) >= threshold).triu_(1)
    key = group_key(None if class_agnostic else class_ids, frame_index)
    if valid is not None:  # an invalid row matches nothing: a key below every valid one, different per side
        base = 0 if key is None else key
        match &= torch.where(valid, base, -1)[:, None] == torch.where(valid, base, -2)[None]
    elif key is not None:
        match &= key[:, None] == key[None]
    return match


def _nms_keep(match: Tensor, rounds: int | None) -> tuple[Tensor, Tensor]:
    """Greedy NMS keep mask of a rank-ordered upper-triangular match matrix, and a 0-dim bool: True when it is
    the fixed point (one more round changes nothing), hence exact. Rows are settled a block (`NMS_BLOCK`) at a
    time: rows before a block are final, so one step finds the block's rows a kept earlier row suppresses, then
    the block's own fixed point (unique: the system is triangular) takes as many rounds as its longest chain.
    `rounds` None runs to each fixed point (a host read per round), an int that many rounds per block.
    A round is one matrix-vector product on 0/1 floats, `alive - (settled rows matching each column)` clamped at 0,
    exact in float16 (integers up to NMS_BLOCK <= 2048): two kernels instead of a masked (B, B) copy, a reduction and
    casts.
    """
    keep = torch.ones(len(match), dtype=torch.bool, device=match.device)
    exact = torch.ones((), dtype=torch.bool, device=match.device)
    block = NMS_BLOCK.get(match.device.type, NMS_BLOCK["cuda"])
    dtype = torch.float16 if match.device.type == "cuda" else torch.float32
    for start in range(0, len(match), block):
        stop = min(start + block, len(match))
        # rows no kept earlier row suppresses (bool a > b is a & ~b: one kernel)
        alive = ~(match[:start, start:stop] & keep[:start, None]).any(0) if start else keep[start:stop]
        alive = alive.to(dtype)
        across = match[start:stop, start:stop].to(dtype).T  # across[j, i]: row i would suppress row j
        settled = alive
        for _ in range(stop - start + 1 if rounds is None else min(rounds, stop - start + 1)):
            new = _nms_round(alive, across, settled)
            if rounds is None and torch.equal(new, settled):
                break
            settled = new
        else:
            exact = exact & (_nms_round(alive, across, settled) == settled).all()
        keep[start:stop] = settled.bool()
    return keep, exact


def _capped_keep(match: Tensor, rounds: int) -> Tensor:
    """`rounds` fixed-point rounds over the whole rank-ordered match matrix from every row alive (`MergeRule.rounds`;
    1: a row is dropped when any higher-ranked row matches it): the same result on every device, whatever the
    block sizes of the exact fixed point."""
    dtype = torch.float16 if match.device.type == "cuda" else torch.float32
    alive = torch.ones(len(match), dtype=dtype, device=match.device)
    across = match.to(dtype).T
    settled = alive
    for _ in range(rounds):
        settled = _nms_round(alive, across, settled)
    return settled.bool()


def _nms_round(alive: Tensor, across: Tensor, settled: Tensor) -> Tensor:
    """One fixed-point round on 0/1 floats: the alive rows that no settled row suppresses."""
    return torch.addmv(alive, across, settled, alpha=-1).clamp_min_(0)


def _listed_nms_keep(rows: _Ranked, rule: MergeRule) -> Tensor | None:
    """The CPU's exact path: the NMS keep mask of the ranked rows from the pairs whose boxes meet
    (`Geometry.meeting`), the overlaps and fixed point of the (N, N) match matrix on the few pairs that can match
    (threshold > 0). None elsewhere, or where the geometry cannot list them."""
    if not rows.exact_path or rows.boxes.device.type != "cpu" or rule.threshold <= 0:
        return None
    boxes, geometry, numbers = rows.boxes, geometry_of(rows.boxes), torch.arange(len(rows.boxes))
    key = group_key(None if rule.class_agnostic else rows.class_ids, rows.frames)
    listed = geometry.meeting(boxes, torch.where(rows.valid, key, -1 - numbers))  # invalid rows: no pair
    if listed is None:
        return None
    first, second = listed  # first ranked before second
    pair = (boxes.index_select(0, first), boxes.index_select(0, second))
    match = (geometry.overlap(*pair, rule.metric.value) >= rule.threshold).numpy()
    first, second, keep = first.numpy()[match], second.numpy()[match], np.ones(len(boxes), bool)
    for _ in range(len(boxes) + 1):  # each round settles the next row of the longest chain (numpy: a few µs)
        settled = np.ones_like(keep)
        settled[second[keep[first]]] = False
        if np.array_equal(settled, keep):
            break
        keep = settled
    return torch.from_numpy(keep)


def _nms_keep_torchvision(
    ops: Any, boxes: Tensor, class_ids: Tensor, frame_index: Tensor, threshold: float, class_agnostic: bool
) -> Tensor:
    """The same keep mask through torchvision's IoU kernel (inputs in rank order, all valid).

    Scores are replaced by the rank so that torchvision's sort reproduces our tie-breaking, and the threshold
    by the next float32 below it, because torchvision suppresses on IoU > threshold where SAHI uses >=.
    Boxes of different classes or frames are kept apart by torchvision's coordinate offsets, which can move IoU
    values by float32 rounding; keep sets only differ from the pure-torch path for IoUs within that rounding.
    """
    n = len(boxes)
    rank_scores = torch.arange(n, 0, -1, dtype=torch.float32, device=boxes.device)
    below = float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))
    groups = frame_index if class_agnostic else frame_index * (int(class_ids.max()) + 1) + class_ids
    if bool((groups == groups[0]).all()):
        kept = ops.nms(boxes, rank_scores, below)
    else:
        kept = ops.batched_nms(boxes, rank_scores, groups, below)
    keep = torch.zeros(n, dtype=torch.bool, device=boxes.device)
    keep[kept] = True
    return keep


def _first_true_row(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per column: index of the first True row, and whether there is one."""
    return mask.to(torch.uint8).argmax(0), mask.any(0)


def _roots(parent: torch.Tensor) -> torch.Tensor:
    """Root of every node of a forest given as parent pointers (roots point to themselves): ceil(log2(N))
    pointer jumps, enough for any forest of N nodes (depth < N), so exact with no host read."""
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
    geometry: Geometry,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of SAHI's `_apply_merge` for every group at once: a present member that still matches the
    group's union box widens it, and gives the group its class where `takes_class`; and which members did."""
    ok = present & (geometry.overlap(merged, member, metric.value) >= threshold)
    grown = geometry.grown(merged, member)
    merged_class = torch.where(ok & takes_class, member_class, merged_class)
    return torch.where(ok[:, None], grown, merged), merged_class, ok


def _merge_groups(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    keeper: torch.Tensor,
    member_order: torch.Tensor,
    valid: torch.Tensor,
    metric: MatchMetric,
    threshold: float,
    slots: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAHI's `_apply_merge` for all groups at once (inputs in rank order): merged boxes and classes on the
    keepers' rows, the keeper mask, the largest group size, and the members merged into each row (N, slots):
    their positions (slot 0 the row itself), N where none.

    keeper (N,) is each box's group keeper (itself for keepers); member_order (N,) int64 sorts the members of a
    group in SAHI's merge order. Every group walks `slots` positions (slot 0 is the keeper), so the result is
    exact when the largest group fits; `slots` None walks the largest group (read on the host).
    """
    n = len(boxes)
    positions = torch.arange(n, device=boxes.device)
    own = keeper == positions
    group = torch.where(valid, keeper, n)  # invalid rows sort last, in no group
    order = torch.sort(torch.where(own, -1, member_order), stable=True).indices
    order = order[torch.sort(group[order], stable=True).indices]  # grouped: keeper, then members in order
    grouped = group[order]
    slot = torch.empty_like(positions)
    slot[order] = positions - torch.searchsorted(grouped, grouped)  # position in its group's merge order
    largest = torch.where(valid, slot, 0).amax() + 1
    slots = int(largest) if slots is None else slots
    # table[g, s]: the box at position s of the group kept by g, or n (a padding row) where there is none
    fits = valid & (slot < slots)
    table = torch.full((n + 1, slots), n, dtype=torch.int64, device=boxes.device)
    table[torch.where(fits, keeper, n), torch.where(fits, slot, 0)] = torch.where(fits, positions, n)
    table = table[:n]
    b64 = torch.cat([boxes.double(), boxes.new_zeros(1, boxes.shape[1], dtype=torch.float64)])
    takes_class = torch.cat([scores >= scores[keeper], scores.new_zeros(1, dtype=torch.bool)])
    classes = torch.cat([class_ids, class_ids.new_zeros(1)])
    present = torch.cat([valid, valid.new_zeros(1)])
    merged, merged_class = b64[:n], class_ids
    members = [positions]
    for s in range(1, slots):
        index = table[:, s]
        merged, merged_class, ok = _absorb(
            merged,
            merged_class,
            b64[index],
            classes[index],
            present[index],
            takes_class[index],
            metric,
            threshold,
            geometry_of(boxes),
        )
        members.append(torch.where(ok, index, n))
    return merged.to(boxes.dtype), merged_class, own & valid, largest, torch.stack(members, 1)


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
    frame_index: torch.Tensor  # (N,) int64: the frame of each row
    # (N,) int64: the input row each row is (its keeper's, for a merged group): anything else a candidate carries
    # (its view, mask coefficients, ...) follows it by this index
    index: torch.Tensor
    # (N, S) int64: the input rows merged into each row (slot 0 the row itself; nms: S = 1), -1 where none: the
    # group map a payload of the candidates (mask coefficients) follows
    members: torch.Tensor


class _Ranked(NamedTuple):
    """The candidates in rank order (invalid rows last, with harmless values) and the permutation that ranked them;
    `rounds` / `slots` None: the exact path (taken from the data, host reads allowed)."""

    boxes: Tensor
    scores: Tensor
    class_ids: Tensor
    valid: Tensor
    frames: Tensor
    order: Tensor
    rounds: int | None
    slots: int | None
    pairs: int | None = None  # the bounded pair list's capacity (rotated boxes, sync-free), None: every pair

    @property
    def exact_path(self) -> bool:
        return self.rounds is None and self.slots is None

    def kept(self, keep: Tensor, exact: Tensor) -> PaddedMerge:
        """The result of a method that only keeps rows (nms)."""
        members = self.order[:, None]
        return PaddedMerge(
            self.boxes,
            self.scores,
            self.class_ids,
            keep & self.valid,
            exact,
            self.one,
            self.frames,
            self.order,
            members,
        )

    @property
    def one(self) -> Tensor:
        return torch.ones((), dtype=torch.int64, device=self.boxes.device)

    def matches(self, rule: MergeRule) -> Tensor:
        """The (N, N) match matrix; the exact path skips the masks that change nothing (one frame, all valid)."""
        one_frame = self.exact_path and bool((self.frames == self.frames[0]).all())
        all_valid = self.exact_path and bool(self.valid.all())
        return _match_matrix(
            self.boxes,
            self.class_ids,
            None if one_frame else self.frames,
            None if all_valid else self.valid,
            rule.metric,
            rule.threshold,
            rule.class_agnostic,
            self.pairs,
        )

    def grouped(self, rule: MergeRule, keeper: Tensor, member_order: Tensor, exact: Tensor) -> PaddedMerge:
        """The result of a method that merges each group into its keeper (SAHI's `_apply_merge`)."""
        merged, merged_class, is_keeper, largest, members = _merge_groups(
            self.boxes,
            self.scores,
            self.class_ids,
            keeper,
            member_order,
            self.valid,
            rule.metric,
            rule.threshold,
            self.slots,
        )
        fits = largest <= self.slots if self.slots is not None else exact
        order = torch.cat([self.order, self.order.new_full((1,), -1)])  # position N: none
        return PaddedMerge(
            merged,
            self.scores,
            merged_class,
            is_keeper,
            exact & fits,
            largest,
            self.frames,
            self.order,
            order[members],
        )


def _nms(rows: _Ranked, rule: MergeRule, torchvision: Any | None) -> PaddedMerge:
    """Keep a box unless a kept higher-ranked box matches it: torchvision's kernel (exact path, IoU), the pairs whose
    boxes meet (the CPU's exact path), else one fixed-point over the match matrix."""
    exact = torch.ones((), dtype=torch.bool, device=rows.boxes.device)
    aligned = rows.boxes.shape[1] == groups.AXIS_ALIGNED.columns
    if rule.rounds:  # the rule's own rounds: its result, on both paths
        keep = _capped_keep(rows.matches(rule), rule.rounds)
    # torchvision separates groups by offsetting boxes (IoU 0), so it cannot express "every pair matches"
    elif torchvision is not None and aligned and rule.metric is MatchMetric.IOU and rule.threshold > 0:
        keep = _nms_keep_torchvision(
            torchvision, rows.boxes, rows.class_ids, rows.frames, rule.threshold, rule.class_agnostic
        )
    elif (listed := _listed_nms_keep(rows, rule)) is not None:
        keep = listed
    else:
        keep, exact = _nms_keep(rows.matches(rule), rows.rounds)
    return rows.kept(keep, exact)


def _greedy_nmm(rows: _Ranked, rule: MergeRule, torchvision: Any | None) -> PaddedMerge:
    """nms's keepers; every other box joins the first keeper (by rank) that matches it."""
    match = rows.matches(rule)
    if rule.rounds:  # the rule's own rounds: its result, on both paths
        keep, exact = _capped_keep(match, rule.rounds), torch.ones((), dtype=torch.bool, device=match.device)
    else:
        keep, exact = _nms_keep(match, rows.rounds)
    parent, _ = _first_true_row(match & keep[:, None])
    positions = torch.arange(len(rows.boxes), device=rows.boxes.device)
    # SAHI appends a keeper's members in rank order
    return rows.grouped(rule, torch.where(keep, positions, parent), positions, exact)


def _nmm(rows: _Ranked, rule: MergeRule, torchvision: Any | None) -> PaddedMerge:
    """Transitive: each box, in rank order, claims the unclaimed lower-ranked boxes it matches."""
    boxes, scores = rows.boxes, rows.scores
    # a box claims lower-ranked matches, except equal-score boxes with different coordinates
    same = (scores[:, None] == scores[None]) & ~(boxes[:, None] == boxes[None]).all(-1)
    parent, claimed = _first_true_row(rows.matches(rule) & ~same)
    positions = torch.arange(len(boxes), device=boxes.device)
    keeper = _roots(torch.where(claimed, parent, positions))
    # members are appended claimer by claimer (rank order), each claimer's in input-index order
    exact = torch.ones((), dtype=torch.bool, device=boxes.device)
    return rows.grouped(rule, keeper, parent * len(boxes) + rows.order, exact)


# method -> kernel: (ranked candidates, rule, torchvision.ops or None) -> the merged rows
KERNELS: dict[MergeMethod, Callable[[_Ranked, MergeRule, Any | None], PaddedMerge]] = {
    MergeMethod.NMS: _nms,
    MergeMethod.NMM: _nmm,
    MergeMethod.GREEDY_NMM: _greedy_nmm,
}


def merge_padded(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    valid: torch.Tensor,
    rule: MergeRule = DEFAULT_RULE,
    *,
    nms_rounds: int | None = 16,
    slots: int | None = 16,
    frame_index: torch.Tensor | None = None,
    use_torchvision: bool = False,
    pairs: int | None = None,
) -> PaddedMerge:
    """Combine overlapping detections among the rows where `valid` (N,) bool, like SAHI (module docstring), with
    the kernel of `rule.method` (`KERNELS`).

    Fixed shapes and no host synchronisation: NMS keep masks run `nms_rounds` rounds (the depth of the longest
    suppression chain is needed); the merge walks `slots` positions of each group (the largest group size is
    needed; it is reported as `largest`). nmm group membership is always exact. When `exact` is True the valid
    output rows, in order, equal `merge` of the valid input rows with `use_torchvision=False`. None for
    `nms_rounds` / `slots` takes them from the data (host reads): always exact. `frame_index` (N,) keeps frames
    apart (default: one frame). `use_torchvision` (with `nms_rounds` None) runs nms with IoU through
    torchvision's kernel when it is installed. `pairs`: rotated boxes compare at most that many pairs whose
    hulls meet (`groups.Geometry.pairwise`; the caller checks they sufficed: `Geometry.pairs_needed`).
    """
    if not len(boxes) == len(scores) == len(class_ids) == len(valid) or boxes.shape[1:] not in ((4,), (5,)):
        raise ValueError(
            f"merge needs (N, 4) or (N, 5) boxes and N scores, class ids and valid flags, got {tuple(boxes.shape)}, "
            f"{tuple(scores.shape)}, {tuple(class_ids.shape)} and {tuple(valid.shape)}"
        )
    valid = valid.bool()
    frames = torch.zeros_like(valid, dtype=torch.int64) if frame_index is None else frame_index.long()
    boxes = torch.where(valid[:, None], boxes.float(), 0.0)  # invalid rows: harmless values, ranked last
    scores = torch.where(valid, scores.float(), float("-inf"))
    order = rank_order(boxes, scores, valid)
    rows = _Ranked(
        boxes[order],
        scores[order],
        class_ids.long()[order],
        valid[order],
        frames[order],
        order,
        nms_rounds,
        slots,
        pairs,
    )
    if len(boxes) == 0:
        return rows.kept(rows.valid, torch.ones((), dtype=torch.bool, device=boxes.device))
    torchvision = _torchvision_ops() if use_torchvision and nms_rounds is None else None
    return KERNELS[rule.method](rows, rule, torchvision)


def merge(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    class_ids: torch.Tensor,
    method: str | MergeMethod = DEFAULT_RULE.method,
    metric: str | MatchMetric = DEFAULT_RULE.metric,
    threshold: float = DEFAULT_RULE.threshold,
    class_agnostic: bool = DEFAULT_RULE.class_agnostic,
    use_torchvision: bool = True,
    frame_index: torch.Tensor | None = None,
    rounds: int = DEFAULT_RULE.rounds,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Combine overlapping detections like SAHI (see the module docstring), on the inputs' device: the valid
    rows of `merge_padded` over all rows with the rounds and slots the data needs (so always exact; `rounds` > 0:
    the rule's capped suppression, `MergeRule.rounds`).

    boxes (N, 4) x1, y1, x2, y2 or (N, 5) cx, cy, w, h, angle, scores (N,), class_ids (N,) int64 -> the same,
    float32 / int64, score-ranked.
    `use_torchvision=False` forces the pure-torch NMS (torchvision is only used for nms with IoU and a
    threshold above 0).
    """
    valid = torch.ones(len(scores), dtype=torch.bool, device=scores.device)
    rule = MergeRule(method, metric, threshold, class_agnostic, rounds)
    out = merge_padded(
        boxes,
        scores,
        class_ids,
        valid,
        rule,
        nms_rounds=None,
        slots=None,
        frame_index=frame_index,
        use_torchvision=use_torchvision,
    )
    keep = out.valid.nonzero().squeeze(1)
    return out.boxes[keep], out.scores[keep], out.class_ids[keep]


def merge_detections(
    boxes: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    method: str | MergeMethod = DEFAULT_RULE.method,
    metric: str | MatchMetric = DEFAULT_RULE.metric,
    threshold: float = DEFAULT_RULE.threshold,
    class_agnostic: bool = DEFAULT_RULE.class_agnostic,
    rounds: int = DEFAULT_RULE.rounds,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy wrapper of `merge`: (N, 4) x1, y1, x2, y2 or (N, 5) rotated cx, cy, w, h, angle boxes (angle in
    radians, turning +x toward +y: ultralytics' xywhr), (N,) scores, (N,) class ids -> boxes of the same form,
    float32 scores, int64 class ids."""
    boxes = np.asarray(boxes, np.float32)
    columns = 5 if boxes.ndim == 2 and boxes.shape[1] == 5 else 4
    tensors = (
        torch.as_tensor(boxes.reshape(-1, columns)),
        torch.as_tensor(np.asarray(scores, np.float32).reshape(-1)),
        torch.as_tensor(np.asarray(class_ids, np.int64).reshape(-1)),
    )
    out = merge(*tensors, method, metric, threshold, class_agnostic, rounds=rounds)
    return out[0].numpy(), out[1].numpy(), out[2].numpy()
