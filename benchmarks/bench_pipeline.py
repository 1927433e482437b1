"""Per-frame time of `TiledDetector.detect` vs the bare ONNX Runtime `session.run` on the same tile batch.

    .venv/bin/python scripts/bench_pipeline.py [--model M.onnx] [--runs 10] [--no-full-frame] [--conf 0.25]

Without --model a YOLOv8n-sized network (random weights, the YOLOv8n layer widths and head) is exported to a
temporary ONNX file. Both measurements alternate in one loop so machine load affects them alike; medians and
their ratio are printed. The synthetic models used by the tests and scripts/gpu_check.py live here too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

# ---------------------------------------------------------------------------------------------------------------
# Synthetic models (YOLOv8 output layout: (B, 4 + classes, anchors), boxes cx, cy, w, h in input pixels)


class SquareDetector(nn.Module):
    """A hand-set "detector" with a known answer: every `cell` x `cell` grid cell of the input is an anchor whose
    box is the cell itself; class 0 scores how red the cell is (mean of R - G), class 1 how blue (B - G).

    A pure red or blue square covering exactly one cell scores 1.0 there and 0 elsewhere; grey padding and white
    or black background score 0, so frames of coloured squares on a dark background have exact detections.
    """

    def __init__(self, input_hw: tuple[int, int] = (64, 64), cell: int = 8) -> None:
        super().__init__()
        height, width = input_hw
        if height % cell or width % cell:
            raise ValueError(f"input size {input_hw} must be a multiple of the cell size {cell}")
        self.cell = cell
        ys, xs = torch.meshgrid(torch.arange(height // cell), torch.arange(width // cell), indexing="ij")
        centres = torch.stack([xs.flatten(), ys.flatten()]).float() * cell + cell / 2
        sizes = torch.full_like(centres, float(cell))
        self.register_buffer("anchors", torch.cat([centres, sizes]).unsqueeze(0))  # (1, 4, A)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> (B, 6, A)."""
        red, green, blue = images[:, 0:1], images[:, 1:2], images[:, 2:3]
        colour = torch.cat([red - green, blue - green], dim=1).clamp_min(0.0)
        scores = F.avg_pool2d(colour, self.cell).flatten(2)
        return torch.cat([self.anchors.expand(images.shape[0], -1, -1), scores], dim=1)


class _Conv(nn.Sequential):
    """Conv + SiLU (batch norm folded away, as in an exported YOLO)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, k, s, k // 2), nn.SiLU())


class _C2f(nn.Module):
    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = c_out // 2
        self.cv1 = _Conv(c_in, 2 * self.c)
        self.cv2 = _Conv((2 + n) * self.c, c_out)
        self.m = nn.ModuleList(
            nn.Sequential(_Conv(self.c, self.c, 3), _Conv(self.c, self.c, 3)) for _ in range(n)
        )
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            y.append(y[-1] + block(y[-1]) if self.shortcut else block(y[-1]))
        return self.cv2(torch.cat(y, 1))


class _SPPF(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.cv1 = _Conv(c_in, c_in // 2)
        self.cv2 = _Conv(c_in * 2, c_out)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.pool(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class YoloV8nLike(nn.Module):
    """YOLOv8n's layer widths, depths, neck and decoupled DFL head (~3.2 M parameters, ~8.7 GFLOPs at 640).

    Random weights; the class bias starts at -10 like a fresh YOLO head (scores ~5e-5), so thresholds decide
    how many candidates reach decoding. `host_anchors` builds the anchor grid on the host in every forward and
    copies it over (`torch.arange(..., device="cpu").type_as(x)`, as a traced ultralytics head does): such a
    model cannot be captured in a CUDA graph.
    """

    def __init__(
        self, classes: int = 80, input_hw: tuple[int, int] = (640, 640), host_anchors: bool = False
    ) -> None:
        super().__init__()
        self.host_anchors, self.input_hw = host_anchors, input_hw
        self.backbone = nn.ModuleList(
            [
                _Conv(3, 16, 3, 2),
                _Conv(16, 32, 3, 2),
                _C2f(32, 32, 1, True),
                _Conv(32, 64, 3, 2),
                _C2f(64, 64, 2, True),
                _Conv(64, 128, 3, 2),
                _C2f(128, 128, 2, True),
                _Conv(128, 256, 3, 2),
                _C2f(256, 256, 1, True),
                _SPPF(256, 256),
            ]
        )
        self.up4, self.up3 = _C2f(384, 128, 1, False), _C2f(192, 64, 1, False)
        self.down3, self.out4 = _Conv(64, 64, 3, 2), _C2f(192, 128, 1, False)
        self.down4, self.out5 = _Conv(128, 128, 3, 2), _C2f(384, 256, 1, False)
        self.box = nn.ModuleList(
            nn.Sequential(_Conv(c, 64, 3), _Conv(64, 64, 3), nn.Conv2d(64, 64, 1)) for c in (64, 128, 256)
        )
        self.cls = nn.ModuleList(
            nn.Sequential(_Conv(c, 80, 3), _Conv(80, 80, 3), nn.Conv2d(80, classes, 1))
            for c in (64, 128, 256)
        )
        for head in self.cls:
            nn.init.constant_(head[-1].bias, -10.0)
        anchors, strides = _anchor_grid(input_hw)
        self.register_buffer("anchors", anchors)  # (1, 2, A)
        self.register_buffer("strides", strides)  # (1, 1, A)
        self.register_buffer("bins", torch.arange(16, dtype=torch.float32).view(1, 1, 16, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, 4 + classes, A)."""
        x, feats = images, []
        for layer in self.backbone:
            x = layer(x)
            feats.append(x)
        p3, p4, p5 = feats[4], feats[6], feats[9]
        n4 = self.up4(torch.cat([F.interpolate(p5, scale_factor=2.0), p4], 1))
        n3 = self.up3(torch.cat([F.interpolate(n4, scale_factor=2.0), p3], 1))
        m4 = self.out4(torch.cat([self.down3(n3), n4], 1))
        m5 = self.out5(torch.cat([self.down4(m4), p5], 1))
        levels = (n3, m4, m5)
        b = images.shape[0]
        dist = torch.cat([head(f).view(b, 64, -1) for head, f in zip(self.box, levels, strict=True)], 2)
        logits = torch.cat([head(f).flatten(2) for head, f in zip(self.cls, levels, strict=True)], 2)
        ltrb = (dist.view(b, 4, 16, -1).softmax(2) * self.bins).sum(2)  # DFL: expected distance per side
        anchors, strides = self.anchors, self.strides
        if self.host_anchors:  # made on the host and copied over at every call (a host-to-device copy)
            anchors, strides = (t.type_as(ltrb) for t in _anchor_grid(self.input_hw))
        xy = (anchors + (ltrb[:, 2:] - ltrb[:, :2]) / 2) * strides
        wh = (ltrb[:, :2] + ltrb[:, 2:]) * strides
        return torch.cat([xy, wh, logits.sigmoid()], 1)


class _Separable(nn.Sequential):
    """A depthwise 3 x 3 conv (stride `s`) + a pointwise conv, each with SiLU."""

    def __init__(self, c_in: int, c_out: int, s: int) -> None:
        super().__init__(nn.Conv2d(c_in, c_in, 3, s, 1, groups=c_in), nn.SiLU(), _Conv(c_in, c_out))


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
        self.stem = nn.Sequential(_Conv(3, widths[0], 3, 2), _Separable(widths[0], widths[1], 2))  # stride 4
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


def _anchor_grid(input_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """YOLOv8's anchor centres (1, 2, A) and strides (1, 1, A) for the three levels, on the host."""
    anchors, strides = [], []
    for stride in (8, 16, 32):
        h, w = input_hw[0] // stride, input_hw[1] // stride
        ys, xs = torch.meshgrid(torch.arange(h, device="cpu"), torch.arange(w, device="cpu"), indexing="ij")
        anchors.append(torch.stack([xs.flatten(), ys.flatten()]).float() + 0.5)
        strides.append(torch.full((h * w,), float(stride)))
    return torch.cat(anchors, 1).unsqueeze(0), torch.cat(strides).view(1, 1, -1)


def save_onnx(model: nn.Module, path: Path, input_hw: tuple[int, int], batch: int | None = None) -> Path:
    """Export `model` to ONNX: input `images` (B, 3, H, W), output `output0`; B dynamic unless `batch` is given."""
    import warnings

    example = torch.zeros(batch or 1, 3, *input_hw)
    dynamic = None if batch else {"images": {0: "batch"}, "output0": {0: "batch"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model.eval(),
            (example,),
            str(path),
            input_names=["images"],
            output_names=["output0"],
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


# ---------------------------------------------------------------------------------------------------------------
# Benchmark


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="ONNX model (default: a YOLOv8n-sized random network)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each (after 2 warm-up runs)")
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--tile", type=int, default=640)
    parser.add_argument("--overlap", type=float, default=0.2)
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads")
    parser.add_argument("--no-full-frame", dest="full_frame", action="store_false")
    parser.add_argument("--scene", action="store_true", help="a synthetic scene (real detections), not noise")
    args = parser.parse_args(argv)

    import onnxruntime as ort

    from tiled_detector.detector import TiledDetector

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or save_onnx(YoloV8nLike(), Path(tmp) / "yolov8n_like.onnx", (640, 640))
        detector = TiledDetector(
            model,
            backend="onnxruntime",
            tile_size=(args.tile, args.tile),
            overlap=args.overlap,
            full_frame=args.full_frame,
            conf_threshold=args.conf,
            engine_options={} if args.threads is None else {"threads": args.threads},
        )
        # configured like the engine's session: with ONNX Runtime's default spinning, the idle threads of one
        # session keep spinning into the next measurement of the loop and slow it on 2 cores
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = args.threads or 0
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        plan = detector.plan_for(args.height, args.width)
        rng = np.random.default_rng(0)
        if args.scene:
            from tiled_detector.tools.synthetic import make_scene

            frame = make_scene(3, args.width, args.height).image
        else:
            frame = rng.integers(0, 256, (args.height, args.width, 3), dtype=np.uint8)
        batch = rng.random((plan.batch_size, 3, *detector.engine.input_hw), dtype=np.float32)
        feed = {session.get_inputs()[0].name: batch}
        bare, pipeline, stages = [], [], []
        for i in range(args.runs + 2):
            start = time.perf_counter()
            session.run(None, feed)
            middle = time.perf_counter()
            dets = detector.detect(frame)
            end = time.perf_counter()
            if i >= 2:
                bare.append(middle - start)
                pipeline.append(end - middle)
                stages.append(dets.timings)
    bare_ms, pipe_ms = _median_ms(bare), _median_ms(pipeline)
    print(
        f"{args.width}x{args.height}, {plan.num_tiles} tiles of {args.tile} (+{int(args.full_frame)} full frame), "
        f"overlap {args.overlap}, conf {args.conf}, torch threads {torch.get_num_threads()}, median of {args.runs}"
    )
    print(f"bare session.run, batch {plan.batch_size}: {bare_ms:8.1f} ms")
    print(f"TiledDetector.detect:            {pipe_ms:8.1f} ms  ({len(dets)} detections)")
    print(f"ratio: {pipe_ms / bare_ms:.3f}; pipeline {1000.0 / pipe_ms:.2f} frames/s")
    names = list(stages[0])
    print(
        "stages (median ms): "
        + ", ".join(f"{n} {statistics.median(s[n] for s in stages):.1f}" for n in names)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
