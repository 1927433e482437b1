"""Small synthetic networks with known layouts, and their exports, for the tests (the benchmarks use them too).

`SquareDetector` has an exact right answer (YOLOv8's output layout), `SquareSegmenter` its masks too; `GflLike` has PP-PicoDet's / NanoDet's GFL
head layouts (random weights). `save_onnx` / `save_torchscript` write them as the exporters users have would.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class SquareDetector(nn.Module):
    """A hand-set "detector" with a known answer: every `cell` x `cell` grid cell of the input is an anchor whose
    box is the cell itself; class 0 scores how red the cell is (mean of R - G), class 1 how blue (B - G).

    A pure red or blue square covering exactly one cell scores 1.0 there and 0 elsewhere; grey padding and white
    or black background score 0, so frames of coloured squares on a dark background have exact detections.

    `dynamic_anchors` computes the anchors from the input's shape in every forward, as ultralytics' `dynamic=True`
    export does: traced, `torch.arange` runs on the CPU (its device a constant of the graph) and is copied to the
    input's device, and the box size is read on the host from a tensor constant (`aten::ScalarImplicit`).
    """

    def __init__(
        self, input_hw: tuple[int, int] = (64, 64), cell: int = 8, dynamic_anchors: bool = False
    ) -> None:
        super().__init__()
        height, width = input_hw
        if height % cell or width % cell:
            raise ValueError(f"input size {input_hw} must be a multiple of the cell size {cell}")
        self.cell, self.dynamic_anchors = cell, dynamic_anchors
        self.cell_size = torch.tensor([float(cell)])  # a plain attribute: a constant of the traced graph
        ys, xs = torch.meshgrid(torch.arange(height // cell), torch.arange(width // cell), indexing="ij")
        centres = torch.stack([xs.flatten(), ys.flatten()]).float() * cell + cell / 2
        sizes = torch.full_like(centres, float(cell))
        self.register_buffer("anchors", torch.cat([centres, sizes]).unsqueeze(0))  # (1, 4, A)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> (B, 6, A)."""
        red, green, blue = images[:, 0:1], images[:, 1:2], images[:, 2:3]
        colour = torch.cat([red - green, blue - green], dim=1).clamp_min(0.0)
        grid = F.avg_pool2d(colour, self.cell)
        anchors = self._anchors(grid) if self.dynamic_anchors else self.anchors
        return torch.cat([anchors.expand(images.shape[0], -1, -1), grid.flatten(2)], dim=1)

    def _anchors(self, grid: torch.Tensor) -> torch.Tensor:
        """(1, 4, A) from the shape of the cells' map (ultralytics' `make_anchors`: no `device=`, `type_as`)."""
        rows, cols = grid.shape[2:]
        ys, xs = torch.meshgrid(
            torch.arange(rows).type_as(grid), torch.arange(cols).type_as(grid), indexing="ij"
        )
        sizes = grid.new_full((2, rows * cols), self.cell_size[0])
        centres = torch.stack([xs.flatten(), ys.flatten()]) * sizes + sizes / 2
        return torch.cat([centres, sizes]).unsqueeze(0)


class SquareSegmenter(nn.Module):
    """`SquareDetector` with a segmentation head, as ultralytics' YOLOv8-seg exports it: `output0` (B, 4 + 2 + 2, A)
    = boxes, class scores, then 2 mask coefficients per anchor, and `output1` (B, 2, H / 4, W / 4) = 2 mask
    prototypes: how red and how blue each 4 x 4 block is. A red cell's coefficients are (1, -1) (red - blue), a
    blue cell's (-1, 1): its mask (logit above 0, cropped to its box) is exactly its square, a known answer."""

    def __init__(self, input_hw: tuple[int, int] = (64, 64), cell: int = 8) -> None:
        super().__init__()
        self.net = SquareDetector(input_hw, cell)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(images)  # (B, 6, A)
        red, blue = out[:, 4:5], out[:, 5:6]
        coefficients = torch.cat([red - blue, blue - red], dim=1)
        colour = torch.cat([images[:, 0:1] - images[:, 1:2], images[:, 2:3] - images[:, 1:2]], 1).clamp_min(
            0.0
        )
        return torch.cat([out, coefficients], dim=1), F.avg_pool2d(colour, 4)


class Conv(nn.Sequential):
    """Conv + SiLU (batch norm folded away, as in an exported YOLO)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, k, s, k // 2), nn.SiLU())


class _Separable(nn.Sequential):
    """A depthwise 3 x 3 conv (stride `s`) + a pointwise conv, each with SiLU."""

    def __init__(self, c_in: int, c_out: int, s: int) -> None:
        super().__init__(nn.Conv2d(c_in, c_in, 3, s, 1, groups=c_in), nn.SiLU(), Conv(c_in, c_out))


class GflLike(nn.Module):
    """A small detector with a GFL head, as PP-PicoDet and NanoDet export theirs (random weights): depthwise-separable
    stages down to each stride (8, 16, 32, 64 when `levels` is 4; a stride's map ceil(H / s) x ceil(W / s)), per
    stride class scores after a sigmoid (B, N, classes) and 4 x `bins` distribution logits (B, N, 4 x bins); all
    class scores first, then all distributions (Paddle2ONNX's and NanoDet 0.x's order), or `joined`: one
    (B, A, classes + 4 x bins) tensor over every stride (NanoDet 1.x / NanoDet-Plus)."""

    def __init__(
        self, classes: int = 80, bins: int = 8, levels: int = 3, width: int = 32, joined: bool = False
    ) -> None:
        super().__init__()
        self.joined, self.classes = joined, classes
        widths = [width * 2 ** min(i, 3) for i in range(levels + 2)]  # 32, 64, 128, 256, 256, ...
        self.stem = nn.Sequential(Conv(3, widths[0], 3, 2), _Separable(widths[0], widths[1], 2))  # stride 4
        self.stages = nn.ModuleList(
            nn.Sequential(
                _Separable(widths[i + 1], widths[i + 2], 2), _Separable(widths[i + 2], widths[i + 2], 1)
            )
            for i in range(levels)
        )
        self.heads = nn.ModuleList(
            nn.Sequential(_Separable(w, 2 * width, 1), nn.Conv2d(2 * width, classes + 4 * bins, 1))
            for w in widths[2:]
        )

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor:
        x, outs = self.stem(images), []
        for stage, head in zip(self.stages, self.heads, strict=True):
            x = stage(x)
            outs.append(head(x).flatten(2).transpose(1, 2))  # (B, N, classes + 4 x bins)
        scores = [o[..., : self.classes].sigmoid() for o in outs]
        boxes = [o[..., self.classes :] for o in outs]
        if self.joined:
            return torch.cat([torch.cat([s, b], dim=2) for s, b in zip(scores, boxes, strict=True)], dim=1)
        return (*scores, *boxes)


def save_onnx(
    model: nn.Module, path: Path, input_hw: tuple[int, int], batch: int | None = None, outputs: int = 1
) -> Path:
    """Export `model` to ONNX: input `images` (B, 3, H, W), outputs `output0` (.. `output{outputs - 1}`); B dynamic
    unless `batch` is given."""
    example = torch.zeros(batch or 1, 3, *input_hw)
    names = [f"output{k}" for k in range(outputs)]
    dynamic = None if batch else {"images": {0: "batch"}, **{n: {0: "batch"} for n in names}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model.eval(),
            (example,),
            str(path),
            input_names=["images"],
            output_names=names,
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )
    return path


def save_torchscript(
    model: nn.Module, path: Path, input_hw: tuple[int, int], labels: Sequence[str] | None = None
) -> Path:
    """Trace `model` to TorchScript with the engine's metadata (`input_shape` with a dynamic batch, `labels`); a
    model with YOLOv8's output layout also gets ultralytics' (`config.txt`), so that SAHI's ultralytics model loads
    the same file (`bench --peer sahi`)."""
    example = torch.zeros(2, 3, *input_hw)
    traced = torch.jit.trace(model.eval(), example)
    extra = {"input_shape": f"-1,3,{input_hw[0]},{input_hw[1]}"}
    if labels:
        extra["labels"] = "\n".join(labels)
    output = traced(example[:1])
    if isinstance(output, torch.Tensor) and output.dim() == 3:  # (B, 4 + classes, anchors)
        names = list(labels) if labels else [f"class{i}" for i in range(output.shape[1] - 4)]
        meta = {
            "task": "detect",
            "stride": 32,
            "batch": 1,
            "imgsz": list(input_hw),
            "names": dict(enumerate(names)),
        }
        extra["config.txt"] = json.dumps(meta)
    torch.jit.save(traced, str(path), _extra_files=extra)
    return path
