"""GFL heads (Generalized Focal Loss: PP-PicoDet, NanoDet): their outputs' structure read from the shapes, and the
boxes of chosen anchor points decoded on the device.

A GFL head gives, per anchor point of each stride (one per feature-map cell, cells row by row, strides from the
finest up), the class scores (already sigmoid in the families' exports) and a distribution over `bins` distances
for each side (left, top, right, bottom): the distance is the expectation of the softmax over the bins, times the
stride, from the cell's centre. The exports lay them out in one of two ways:

- separate outputs, class scores `(B, N, C)` and box distributions `(B, N, 4 * bins)`, one pair per stride (PP-PicoDet
  as Paddle2ONNX exports it from PaddleDetection 2.3, NanoDet 0.x) or one pair over every stride; the class scores
  are the first of each pair (both exporters list them first, and the distribution's width is a multiple of 4).
  Where C = 4 x bins (32 classes, 8 bins) both have one width: the outputs are then read as every stride's class
  scores followed by every stride's distributions, or as pairs in turn, whichever the anchor counts fit;
  centres at (i + 0.5) x stride: PaddleDetection's `GFLHead.get_single_level_center_point` with the `cell_offset`
  0.5 of PicoDet's configs, NanoDet's `GFLHead.get_single_level_center_point` (0.2 - 0.4);
- one `(B, N, C + 4 * bins)` tensor per stride or over every stride (NanoDet 1.x's `_forward_onnx`, NanoDet-Plus):
  the class count splits the columns, so it must be known (the labels); centres at i x stride: NanoDet-Plus'
  `get_single_level_center_priors` and NanoDet 1.x's own demos, which decode every such export so.

A stride's feature map is ceil(H / stride) x ceil(W / stride) cells (PicoDet's stride 64 at 416: 7 x 7). Outputs of
one width are told apart by the strides their anchor counts imply: one stride per output (or all in one) is joined
columns, repeated counts are separate pairs; with the labels, joined columns need fewer classes than columns and
separate pairs as many. Shapes that both readings fit (only tiny inputs, where strides share a cell count) without
the labels are refused naming both and the labels as what decides (`AmbiguousHeadError`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

STRIDE_STARTS = (8, 4, 16)  # the finest stride of a head (8 for every family's release)
MAX_LEVELS = 6
SEPARATE_CENTRE, JOINED_CENTRE = 0.5, 0.0


class GflError(ValueError):
    """Outputs that are not a GFL head, with what was expected."""


class AmbiguousHeadError(GflError):
    """Outputs two GFL readings fit, named with the setting that decides (`readings`: each in words)."""

    def __init__(self, message: str, readings: tuple[str, ...]) -> None:
        super().__init__(message)
        self.readings = readings


class Part(NamedTuple):
    """Some anchor points' values in one output: its name, the columns they take, how many rows (anchors)."""

    name: str
    columns: tuple[int, int]
    rows: int


@dataclass(frozen=True)
class GflHead:
    """A GFL head's layout: strides and their (h, w) cells, classes, bins per side, the centre's cell offset, and
    where the class scores and the box distributions are (`Part`s in anchor order: stride by stride)."""

    strides: tuple[int, ...]
    grids: tuple[tuple[int, int], ...]
    classes: int
    bins: int
    centre: float
    scores: tuple[Part, ...]
    boxes: tuple[Part, ...]

    @property
    def anchors(self) -> int:
        """Anchor points over every stride."""
        return sum(h * w for h, w in self.grids)

    @property
    def joined(self) -> bool:
        """Class scores and box distributions in the same tensors (NanoDet 1.x / NanoDet-Plus)."""
        return self.scores[0].name == self.boxes[0].name

    def describe(self) -> str:
        """One line: strides, classes, bins, centres, how the outputs hold them."""
        form = "joined class and box columns" if self.joined else "separate class and box outputs"
        centre = "(i + 0.5) x stride" if self.centre else "i x stride"
        return (
            f"GFL head: strides {', '.join(map(str, self.strides))}, {self.classes} classes, {self.bins} bins "
            f"per side, centres at {centre}, {form} ({len(self.scores)} per kind)"
        )


def cells(input_hw: tuple[int, int], stride: int) -> tuple[int, int]:
    """A stride's feature-map (h, w) over an input: ceil(H / stride) x ceil(W / stride)."""
    return math.ceil(input_hw[0] / stride), math.ceil(input_hw[1] / stride)


def _levels(rows: Sequence[int], input_hw: tuple[int, int]) -> tuple[int, ...] | None:
    """The strides whose anchor points `rows` (per output, in order) are: one stride per output, doubling from one
    of `STRIDE_STARTS`, or one output holding every stride from 8 (3 to `MAX_LEVELS` strides); None if neither."""
    for start in STRIDE_STARTS:
        strides = tuple(start << i for i in range(len(rows)))
        if all(math.prod(cells(input_hw, s)) == n for s, n in zip(strides, rows, strict=True)):
            return strides
    if len(rows) == 1:
        for count in range(3, MAX_LEVELS + 1):
            strides = tuple(8 << i for i in range(count))
            if sum(math.prod(cells(input_hw, s)) for s in strides) == rows[0]:
                return strides
    return None


def _expected_rows(input_hw: tuple[int, int]) -> str:
    counts = {s: math.prod(cells(input_hw, s)) for s in (8, 16, 32, 64)}
    per = ", ".join(f"{n} (stride {s})" for s, n in counts.items())
    return f"at its {input_hw[1]}x{input_hw[0]} input a stride's anchor points are {per}"


def gfl_head(
    shapes: Mapping[str, Sequence[int]], input_hw: tuple[int, int], num_classes: int | None = None
) -> GflHead:
    """The GFL head `shapes` (output name -> shape, in the engine's output order) hold over an input of `input_hw`;
    `num_classes` (known from the labels) splits joined columns and picks the class scores. GflError naming the
    shapes and what was expected otherwise."""
    named = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
    shown = ", ".join(f"{n} {list(s)}" for n, s in named.items())
    if not named or any(len(s) != 3 or min(s[1:]) <= 0 for s in named.values()):
        raise GflError(
            f"outputs {shown} are not a GFL head, whose outputs are (batch, anchors, columns) each"
        )
    if len({s[0] for s in named.values()}) > 1:
        raise GflError(f"outputs {shown} do not share a batch dimension, as one head's outputs do")
    widths = list(dict.fromkeys(s[2] for s in named.values()))
    if len(widths) > 2:
        raise GflError(
            f"outputs {shown} mix {len(widths)} column counts: a GFL head has class scores (C) and box "
            "distributions (4 x bins), or both joined (C + 4 x bins)"
        )
    if len(widths) == 1:
        return _one_width(named, widths[0], input_hw, num_classes, shown)
    rows = [s[1] for s in named.values() if s[2] == widths[0]]
    strides = _levels(rows, input_hw)
    if strides is None:
        raise GflError(_no_strides(shown, rows, input_hw))
    scores, boxes, classes, bins = _separate(named, widths, num_classes, shown)
    grids = tuple(cells(input_hw, s) for s in strides)
    return GflHead(strides, grids, classes, bins, SEPARATE_CENTRE, scores, boxes)


def _no_strides(shown: str, rows: Sequence[int], input_hw: tuple[int, int]) -> str:
    return (
        f"outputs {shown}: their anchor points {list(rows)} are not one stride's per output nor all strides' "
        f"together; {_expected_rows(input_hw)}"
    )


def _one_width(
    named: dict[str, tuple[int, ...]],
    width: int,
    input_hw: tuple[int, int],
    num_classes: int | None,
    shown: str,
) -> GflHead:
    """The head of outputs all `width` columns wide: joined columns (one stride per output, or all strides in one;
    the class count splits them) or separate class scores and distributions of as many columns (repeated anchor
    counts: every score output first, or pairs in turn), as the anchor counts fit and the class count allows."""
    rows = [s[1] for s in named.values()]
    joined = _levels(rows, input_hw)
    pairs = _pairs(named, input_hw)
    if num_classes is not None:  # the labels: joined columns hold fewer classes than columns, pairs as many
        if pairs is not None and num_classes != width and (joined is None or num_classes >= width):
            raise GflError(f"outputs {shown}: no output has {num_classes} columns, one per class")
        joined = joined if num_classes < width else None
        pairs = pairs if num_classes == width else None
    if pairs is not None and joined is not None:
        try:
            separate = _separate_head(named, pairs, input_hw, shown).describe()
        except GflError:  # no whole bins: not separate outputs
            pairs = None
        else:
            joint = (
                f"GFL head: strides {', '.join(map(str, joined))}, joined class and box columns ({width} = "
            )
            joint += "classes + 4 x bins)"
            raise AmbiguousHeadError(
                f"outputs {shown} fit two GFL heads: {separate}; or {joint}: the class names (labels) decide "
                f"({width} names: separate outputs; fewer: joined columns)",
                (separate, joint),
            )
    if pairs is not None:
        return _separate_head(named, pairs, input_hw, shown)
    if joined is None:
        raise GflError(_no_strides(shown, rows, input_hw))
    scores, boxes, classes, bins = _joined(named, width, num_classes, shown)
    grids = tuple(cells(input_hw, s) for s in joined)
    return GflHead(joined, grids, classes, bins, JOINED_CENTRE, scores, boxes)


def _pairs(
    named: dict[str, tuple[int, ...]], input_hw: tuple[int, int]
) -> tuple[list[str], list[str], tuple[int, ...]] | None:
    """The class score and distribution outputs of one width, and their strides: every score output first, then
    the distributions (Paddle2ONNX's order), or pairs in turn; None when the anchor counts fit neither."""
    names = list(named)
    if len(names) % 2:
        return None
    half = len(names) // 2
    for scores, boxes in ((names[:half], names[half:]), (names[0::2], names[1::2])):
        rows = [named[n][1] for n in scores]
        strides = _levels(rows, input_hw)
        if strides is not None and rows == [named[n][1] for n in boxes]:
            return scores, boxes, strides
    return None


def _separate_head(
    named: dict[str, tuple[int, ...]],
    pairs: tuple[list[str], list[str], tuple[int, ...]],
    input_hw: tuple[int, int],
    shown: str,
) -> GflHead:
    """Separate class score and distribution outputs of one width (`pairs`: their names and strides)."""
    scores, boxes, strides = pairs
    width = named[scores[0]][2]
    return GflHead(
        strides,
        tuple(cells(input_hw, s) for s in strides),
        width,
        _bins(width, shown),
        SEPARATE_CENTRE,
        tuple(Part(n, (0, width), named[n][1]) for n in scores),
        tuple(Part(n, (0, width), named[n][1]) for n in boxes),
    )


def _bins(width: int, shown: str, classes: int = 0) -> int:
    """Bins per side of a distribution `width` columns wide (after `classes`), at least 2."""
    sides = width - classes
    if sides % 4 or sides < 8:
        what = f"{width} columns less {classes} classes" if classes else f"{width} columns"
        raise GflError(
            f"outputs {shown}: box distributions of {what} do not divide into 4 sides of 2 or more bins"
        )
    return sides // 4


def _joined(
    named: dict[str, tuple[int, ...]], width: int, num_classes: int | None, shown: str
) -> tuple[tuple[Part, ...], tuple[Part, ...], int, int]:
    if num_classes is None:
        raise GflError(
            f"outputs {shown}: class scores and box distributions joined in {width} columns split only "
            "by the class count: give the class names (labels)"
        )
    bins = _bins(width, shown, num_classes)
    scores = tuple(Part(n, (0, num_classes), s[1]) for n, s in named.items())
    boxes = tuple(Part(n, (num_classes, width), s[1]) for n, s in named.items())
    return scores, boxes, num_classes, bins


def _separate(
    named: dict[str, tuple[int, ...]], widths: list[int], num_classes: int | None, shown: str
) -> tuple[tuple[Part, ...], tuple[Part, ...], int, int]:
    classes = widths[0] if num_classes is None else num_classes
    if classes not in widths:
        raise GflError(f"outputs {shown}: no output has {classes} columns, one per class")
    width = widths[1] if classes == widths[0] else widths[0]
    bins = _bins(width, shown)
    scores = tuple(Part(n, (0, classes), s[1]) for n, s in named.items() if s[2] == classes)
    boxes = tuple(Part(n, (0, width), s[1]) for n, s in named.items() if s[2] == width)
    if [p.rows for p in scores] != [p.rows for p in boxes]:
        raise GflError(
            f"outputs {shown}: the class scores' anchor points {[p.rows for p in scores]} do not pair "
            f"with the box distributions' {[p.rows for p in boxes]}"
        )
    return scores, boxes, classes, bins


@functools.lru_cache(maxsize=16)
def _constants(head: GflHead, input_hw: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, ...]:
    """On `device`, built once per head, input and device (nothing is copied to the device per frame): (A, 3)
    float32 each anchor point's centre x, y in input pixels and its stride, in the head's order (stride by stride,
    cells row by row); the bins' values 0..bins-1; the input's x, y, x, y limits."""
    rows = []
    for stride, (h, w) in zip(head.strides, head.grids, strict=True):
        ys, xs = torch.meshgrid(
            torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij"
        )
        centre = torch.stack([xs.reshape(-1), ys.reshape(-1)], 1).add_(head.centre).mul_(stride)
        rows.append(torch.cat([centre, torch.full((h * w, 1), float(stride))], 1))
    project = torch.arange(head.bins, dtype=torch.float32)
    limit = torch.tensor([input_hw[1], input_hw[0]] * 2, dtype=torch.float32)
    return tuple(t.to(device) for t in (torch.cat(rows), project, limit))


Columns = tuple[torch.Tensor, tuple[int, int]]  # an output (B, N, W) and the columns taken from it


def part_values(outputs: Mapping[str, torch.Tensor], parts: Sequence[Part]) -> list[Columns]:
    """Each part's output and columns (no copy)."""
    return [(outputs[p.name], p.columns) for p in parts]


def rows_at(tensor: torch.Tensor, image: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """The (M, D) rows of a (B, A, D) tensor at (image, anchor) pairs: one lookup in its flat rows (advanced
    indexing of the two dimensions costs several times more on a CPU); a strided tensor is indexed as it is."""
    if not tensor.is_contiguous():
        return tensor[image, anchor]
    return tensor.reshape(-1, tensor.shape[2]).index_select(0, image * tensor.shape[1] + anchor)


def gather(values: Sequence[Columns], image: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """(M, D) float32 rows of the parts `values` (outputs (B, n_i, W_i) and their columns; anchors numbered
    across them in order) at (image, anchor) pairs: one row lookup per part, fixed shapes, no host
    synchronisation."""
    result, start = None, 0
    for tensor, (first, end) in values:
        rows = tensor.shape[1]
        flat = tensor.reshape(-1, tensor.shape[2])  # a view of a contiguous output
        picked = flat.index_select(0, image * rows + (anchor - start).clamp(0, rows - 1))[
            :, first:end
        ].float()
        inside = ((anchor >= start) & (anchor < start + rows))[:, None]
        result = picked if result is None else torch.where(inside, picked, result)
        start += rows
    if result is None:
        raise ValueError("a GFL head has at least one part")
    return result


def boxes(
    outputs: Mapping[str, torch.Tensor],
    head: GflHead,
    image: torch.Tensor,
    anchor: torch.Tensor,
    input_hw: tuple[int, int],
) -> torch.Tensor:
    """(M, 4) x1, y1, x2, y2 in input pixels of the anchors (image, anchor): softmax over each side's bins, the
    expected bin times the stride from the centre, clipped to the input (the families' `distance2bbox`)."""
    dist = gather(part_values(outputs, head.boxes), image, anchor).view(-1, 4, head.bins).softmax(dim=2)
    grids, project, limit = _constants(head, input_hw, dist.device)
    grid = grids[anchor]  # (M, 3)
    distance = (dist * project).sum(dim=2) * grid[:, 2:]  # (M, 4): left, top, right, bottom
    xyxy = torch.cat([grid[:, :2] - distance[:, :2], grid[:, :2] + distance[:, 2:]], dim=1)
    return torch.minimum(xyxy.clamp_min(0.0), limit)
