"""Train the bundled default detector on synthetic crops and export it (ONNX + TorchScript + labels).

The model is a narrow depthwise-separable CNN with a small FPN and one stride-8 anchor-free head. Its exported
output has the YOLOv8 layout: "output0" (B, 4 + C, A) with cx, cy, w, h in input pixels, then per-class scores
after a sigmoid (no objectness), so the pipeline decodes it like any YOLOv8 export.

Training: each cell of the stride-8 grid whose centre lies in a ground-truth box and within 1.5 strides of its
centre (or that holds the centre) is a positive for that box (the smallest box wins); classification uses a
quality focal loss whose target is the IoU of the predicted box, boxes a GIoU loss. Samples are pure functions of
(seed, index) so the data order does not depend on the number of workers.

    .venv/bin/python -m tiled_detector.tools.train.training --device cuda --out OUT_DIR
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from tiled_detector.tools.train.validation import average_precision, box_iou, nms
from tiled_detector.tools.worlds.synthetic import CLASSES, Scene, make_crop

STRIDE = 8
EXPORT_SIZE = 640
FULL_FRAME_SCALE = 3  # a 1920x1080 frame letterboxed into 640x640 is downscaled 3x
# In downscaled samples only objects at least this many input pixels on each side are labelled: smaller ones
# are negatives, so the full-frame view leaves small objects to the tiles instead of boxing them coarsely.
MIN_FULL_FRAME_SIDE = 6.0
GPU_STEPS = 4000  # the bundled model's schedule
CPU_STEPS = 1500  # fits in 45 minutes on a 2-core CPU


def conv_bn(cin: int, cout: int, k: int = 1, s: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    """Convolution ("same" padding for odd k, none for even k), batch norm and (optionally) ReLU."""
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, s, k // 2 if k % 2 else 0, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class SepBlock(nn.Module):
    """Depthwise 3x3 then pointwise 1x1; residual when the shape is kept."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.dw = conv_bn(cin, cin, 3, stride, groups=cin)
        self.pw = conv_bn(cin, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pw(self.dw(x))
        return x + y if self.residual else y


def folded(module: nn.Module) -> nn.Module:
    """A copy of `module` (in eval mode) whose BatchNorms that follow a convolution in a `conv_bn` block are folded
    into it (`torch.nn.utils.fusion.fuse_conv_bn_eval`: one convolution with a bias, the same function to float
    rounding): what the TorchScript exports ship, so no BatchNorm kernel runs."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    result = copy.deepcopy(module).eval()
    for block in result.modules():
        if isinstance(block, nn.Sequential) and len(block) >= 2:
            conv, norm = block[0], block[1]
            if isinstance(conv, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d):
                block[0], block[1] = fuse_conv_bn_eval(conv, norm), nn.Identity()
    return result


def stage(cin: int, cout: int, depth: int) -> nn.Sequential:
    """A stride-2 block followed by `depth` blocks at the same resolution."""
    return nn.Sequential(SepBlock(cin, cout, 2), *[SepBlock(cout, cout) for _ in range(depth)])


class TinyDetector(nn.Module):
    """Backbone 24-32-64-96-128 (4x4 patch stem, strides 4..32), top-down FPN to stride 8, decoupled class / box head."""

    def __init__(self, num_classes: int, width: int = 48) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.stem = nn.Sequential(conv_bn(3, 24, 4, 4), conv_bn(24, 32, 1))  # 4x4 patches: stride 4
        self.s8 = stage(32, 64, 2)
        self.s16 = stage(64, 96, 2)
        self.s32 = stage(96, 128, 1)
        self.lat32 = conv_bn(128, width)
        self.lat16 = conv_bn(96, width)
        self.lat8 = conv_bn(64, width)
        self.fuse16 = SepBlock(width, width)
        self.fuse8 = SepBlock(width, width)
        self.cls_branch = SepBlock(width, width)
        self.box_branch = SepBlock(width, width)
        self.cls_out = nn.Conv2d(width, num_classes, 1)
        self.box_out = nn.Conv2d(width, 4, 1)
        nn.init.constant_(self.cls_out.bias, -4.6)  # prior probability 0.01
        nn.init.constant_(self.box_out.bias, 0.5)

    def neck(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1] -> the stride-8 features (B, width, H/8, W/8) the heads read."""
        c8 = self.s8(self.stem(x))
        c16 = self.s16(c8)
        c32 = self.s32(c16)
        p16 = self.fuse16(self.lat16(c16) + F.interpolate(self.lat32(c32), scale_factor=2.0, mode="nearest"))
        return self.fuse8(self.lat8(c8) + F.interpolate(p16, scale_factor=2.0, mode="nearest"))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (B, 3, H, W) in [0, 1] -> class logits (B, C, H/8, W/8), box distances ltrb in strides."""
        p8 = self.neck(x)
        cls = self.cls_out(self.cls_branch(p8))
        ltrb = F.softplus(self.box_out(self.box_branch(p8)))
        return cls, ltrb


def anchor_centres(h: int, w: int, device: torch.device) -> torch.Tensor:
    """(H*W, 2) x, y pixel centres of the stride-8 cells, row-major."""
    ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    return torch.stack([xs, ys], dim=-1).reshape(-1, 2).float().add(0.5).mul(STRIDE)


def ltrb_to_xyxy(ltrb: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """(B, A, 4) distances in strides + (A, 2) centres -> (B, A, 4) x1, y1, x2, y2 pixels."""
    d = ltrb * STRIDE
    return torch.cat([centres - d[..., :2], centres + d[..., 2:]], dim=-1)


class YoloLayout(nn.Module):
    """Export wrapper: (B, 3, S, S) -> "output0" (B, 4 + C, A), cx cy w h pixels then sigmoid scores."""

    def __init__(self, model: TinyDetector, size: int = EXPORT_SIZE) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("centres", anchor_centres(size // STRIDE, size // STRIDE, torch.device("cpu")))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        cls, ltrb = self.model(images)
        d = ltrb.flatten(2).transpose(1, 2) * STRIDE  # (B, A, 4)
        x1y1 = self.centres - d[..., :2]
        x2y2 = self.centres + d[..., 2:]
        box = torch.cat([(x1y1 + x2y2) * 0.5, x2y2 - x1y1], dim=-1).transpose(1, 2)
        return torch.cat([box, cls.flatten(2).sigmoid()], dim=1)


# ----------------------------------------------------------------------------------------------------------
# data


def sample(seed: int, index: int, crop: int, full_frame_prob: float) -> Scene:
    """Training sample `index`: a tile-scale crop, or (with `full_frame_prob`) a 3x-downscaled frame region."""
    rng = np.random.default_rng([seed, index])
    scene_seed = int(rng.integers(2**62))
    if rng.random() >= full_frame_prob:
        return make_crop(scene_seed, crop)
    big = make_crop(scene_seed, crop * FULL_FRAME_SCALE)
    image = cv2.resize(big.image, (crop, crop), interpolation=cv2.INTER_AREA)
    boxes = big.boxes / FULL_FRAME_SCALE
    keep = ((boxes[:, 2:] - boxes[:, :2]) >= MIN_FULL_FRAME_SIDE).all(axis=1)
    return Scene(image, boxes[keep], big.class_ids[keep])


def labelled(seed: int, index: int, crop: int, full_frame_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """Training sample `index` as (image HWC uint8, targets (N, 5): class, x1, y1, x2, y2)."""
    scene = sample(seed, index, crop, full_frame_prob)
    return scene.image, np.concatenate([scene.class_ids[:, None].astype(np.float32), scene.boxes], axis=1)


Sampler = Callable[[int, int, int, float], tuple[np.ndarray, np.ndarray]]


class CropDataset(torch.utils.data.Dataset):
    """Item i is `sampler(seed, offset + i, crop, full_frame_prob)` as (image CHW uint8, targets (N, 1 + K):
    class, then the K numbers of its box; `labelled`'s x1, y1, x2, y2 by default)."""

    def __init__(
        self,
        seed: int,
        length: int,
        crop: int,
        full_frame_prob: float,
        offset: int = 0,
        sampler: Sampler = labelled,
    ) -> None:
        self.seed, self.length, self.crop, self.full_frame_prob, self.offset = (
            seed,
            length,
            crop,
            full_frame_prob,
            offset,
        )
        self.sampler = sampler

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, target = self.sampler(self.seed, self.offset + i, self.crop, self.full_frame_prob)
        return torch.from_numpy(image).permute(2, 0, 1).contiguous(), torch.from_numpy(target)


def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack images; targets become (M, 2 + K): batch index, class, the K numbers of the box."""
    images = torch.stack([im for im, _ in items])
    targets = [torch.cat([torch.full((len(t), 1), float(i)), t], dim=1) for i, (_, t) in enumerate(items)]
    return images, torch.cat(targets)


# ----------------------------------------------------------------------------------------------------------
# loss


def assign(
    targets: torch.Tensor, batch: int, h: int, w: int, centres: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Centre sampling: per (image, cell) the index of the assigned target (-1 = background)."""
    a = h * w
    assigned = torch.full((batch, a), -1, dtype=torch.long, device=centres.device)
    if len(targets) == 0:
        return (assigned,)
    boxes = targets[:, 2:6]
    gt_centre = (boxes[:, :2] + boxes[:, 2:]) * 0.5
    inside = (
        (centres[None, :, 0] > boxes[:, None, 0])
        & (centres[None, :, 0] < boxes[:, None, 2])
        & (centres[None, :, 1] > boxes[:, None, 1])
        & (centres[None, :, 1] < boxes[:, None, 3])
    )  # (M, A)
    near = (centres[None] - gt_centre[:, None]).abs().amax(dim=-1) < 1.5 * STRIDE
    holds_centre = torch.zeros_like(inside)
    cell = (gt_centre / STRIDE).floor().long()
    cell[:, 0].clamp_(0, w - 1)
    cell[:, 1].clamp_(0, h - 1)
    holds_centre[torch.arange(len(boxes)), cell[:, 1] * w + cell[:, 0]] = True
    candidate = (inside & near) | holds_centre
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    cost = torch.where(candidate, area[:, None], torch.full_like(inside, math.inf, dtype=area.dtype))
    image_of = targets[:, 0].long()
    for b in range(batch):  # a few images per batch: the per-image loop is on the training path only
        mine = (image_of == b).nonzero().squeeze(1)
        if len(mine) == 0:
            continue
        best, idx = cost[mine].min(dim=0)
        assigned[b] = torch.where(torch.isfinite(best), mine[idx], assigned[b])
    return (assigned,)


def giou(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise IoU and GIoU of (N, 4) xyxy boxes."""
    lt, rb = torch.maximum(a[:, :2], b[:, :2]), torch.minimum(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=1)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(dim=1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(dim=1)
    union = area_a + area_b - inter + 1e-7
    iou = inter / union
    hull = (torch.maximum(a[:, 2:], b[:, 2:]) - torch.minimum(a[:, :2], b[:, :2])).prod(dim=1) + 1e-7
    return iou, iou - (hull - union) / hull


def detection_loss(
    cls: torch.Tensor,
    ltrb: torch.Tensor,
    targets: torch.Tensor,
    box_weight: float = 2.0,
    assigned: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Quality focal loss on class scores (target = IoU of the predicted box) + GIoU loss on positives
    (`assigned`: `assign`'s, where the caller made it)."""
    b, _, h, w = cls.shape
    centres = anchor_centres(h, w, cls.device)
    logits = cls.flatten(2).transpose(1, 2).float()  # (B, A, C)
    boxes = ltrb_to_xyxy(ltrb.flatten(2).transpose(1, 2).float(), centres)
    if assigned is None:
        (assigned,) = assign(targets, b, h, w, centres)
    pos = assigned >= 0
    quality = torch.zeros_like(logits)
    n_pos = max(int(pos.sum()), 1)
    box_loss = logits.sum() * 0.0
    if pos.any():
        matched = targets[assigned[pos]]
        iou, g = giou(boxes[pos], matched[:, 2:6])
        box_loss = (1.0 - g).sum() / n_pos
        quality[pos, matched[:, 1].long()] = iou.detach().clamp(min=0.05)
    prob = logits.sigmoid()
    focal = F.binary_cross_entropy_with_logits(logits, quality, reduction="none") * (
        prob - quality
    ).abs().pow(2)
    cls_loss = focal.sum() / n_pos
    total = cls_loss + box_weight * box_loss
    return total, {"cls": cls_loss.item(), "box": box_loss.item(), "pos": float(n_pos)}


# ----------------------------------------------------------------------------------------------------------
# validation (tile level, quick): AP50 over a fixed set of crops, class-aware, greedy NMS


@torch.no_grad()
def validate(
    model: TinyDetector, data: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> float:
    """Mean over classes of AP50 on validation crops (conf > 0.01, class-aware NMS at IoU 0.5)."""
    model.eval()
    per_class: list[list[tuple[float, bool]]] = [[] for _ in CLASSES]
    n_gt = [0] * len(CLASSES)
    for image, target in data:
        cls, ltrb = model(image[None].to(device).float() / 255.0)
        _, c, h, w = cls.shape
        scores = cls.flatten(2)[0].T.sigmoid().float().cpu()  # (A, C)
        boxes = ltrb_to_xyxy(ltrb.flatten(2).transpose(1, 2).float(), anchor_centres(h, w, device))[0].cpu()
        for k in range(c):
            gt = target[target[:, 0] == k, 1:5]
            n_gt[k] += len(gt)
            sel = scores[:, k] > 0.01
            kb, ks = boxes[sel], scores[sel, k]
            keep = nms(kb, ks, 0.5)
            kb, ks = kb[keep], ks[keep]
            taken = torch.zeros(len(gt), dtype=torch.bool)
            ious = box_iou(kb, gt) if len(gt) else torch.zeros(len(kb), 0)
            for j in range(len(kb)):
                if len(gt) == 0:
                    per_class[k].append((float(ks[j]), False))
                    continue
                row = ious[j].masked_fill(taken, -1.0)
                best = int(row.argmax())
                hit = bool(row[best] >= 0.5)
                taken[best] |= hit
                per_class[k].append((float(ks[j]), hit))
    model.train()
    aps = [average_precision(m, n) for m, n in zip(per_class, n_gt, strict=True)]
    return float(np.nanmean(aps))


# ----------------------------------------------------------------------------------------------------------
# export


def export_head(
    wrapper: nn.Module,
    out: Path,
    stem: str,
    rows: int,
    labels: Sequence[str],
    metadata: dict[str, Any] | None = None,
    labels_file: str = "labels.txt",
) -> tuple[Path, Path]:
    """Write an export wrapper's `<stem>.onnx` (dynamic batch; output "output0" (B, `rows`, anchors); `metadata`
    as its metadata_props, each value `str()` as ultralytics writes them), `<stem>.ts` (TorchScript with
    input_shape, labels and, with `metadata`, config.txt: the same as JSON, as ultralytics writes it) and the
    labels file (for the ONNX file)."""
    import onnx

    wrapper = wrapper.cpu().eval()
    example = torch.rand(1, 3, EXPORT_SIZE, EXPORT_SIZE)
    onnx_path, ts_path = out / f"{stem}.onnx", out / f"{stem}.ts"
    torch.onnx.export(
        wrapper,
        (example,),
        str(onnx_path),
        input_names=["images"],
        output_names=["output0"],
        dynamic_axes={"images": {0: "batch"}, "output0": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    graph = onnx.load(str(onnx_path))  # the exporter leaves (rows, A) symbolic: state the static sizes
    dims = graph.graph.output[0].type.tensor_type.shape.dim
    dims[1].dim_value, dims[2].dim_value = rows, (EXPORT_SIZE // STRIDE) ** 2
    for key, value in (metadata or {}).items():
        graph.metadata_props.add(key=key, value=str(value))
    onnx.checker.check_model(graph)
    onnx.save(graph, str(onnx_path))
    text = "\n".join(labels) + "\n"
    with torch.no_grad():
        traced = torch.jit.trace(folded(wrapper), example)
    extra = {"input_shape": f"-1,3,{EXPORT_SIZE},{EXPORT_SIZE}", "labels": text}  # -1: dynamic batch
    if metadata:
        extra["config.txt"] = json.dumps(metadata)
    torch.jit.save(traced, str(ts_path), _extra_files=extra)
    (out / labels_file).write_text(text)
    return onnx_path, ts_path


def export(model: TinyDetector, out: Path, stem: str = "default") -> tuple[Path, Path]:
    """Write `<stem>.onnx` (dynamic batch), `<stem>.ts` (TorchScript with input_shape / labels) and labels.txt."""
    return export_head(YoloLayout(model.cpu().eval()), out, stem, 4 + model.num_classes, CLASSES)


def benchmark_onnx(model_path: Path, batch: int = 9, runs: int = 10) -> dict[str, float]:
    """Median / min ONNX Runtime (CPU) milliseconds of one (batch, 3, 640, 640) call: 8 tiles + 1 full view."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((batch, 3, EXPORT_SIZE, EXPORT_SIZE), dtype=np.float32)
    for _ in range(2):
        session.run(None, {"images": x})
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, {"images": x})
        times.append((time.perf_counter() - start) * 1000.0)
    return {"batch": batch, "median_ms": float(np.median(times)), "min_ms": float(np.min(times))}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class Recipe:
    """What a training run makes: the network (`model()`), its samples (`sampler`, for `CropDataset`), its loss
    (`loss(outputs, targets)`: the network's outputs as floats, `collate`'s targets), its validation
    (`validate(model, data, device)`: a number for the summary, `metric`) and its export (`export(model, out)`)."""

    model: Callable[[], nn.Module]
    sampler: Sampler
    loss: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    validate: Callable[[nn.Module, list[tuple[torch.Tensor, torch.Tensor]], torch.device], float]
    export: Callable[[nn.Module, Path], tuple[Path, Path]]
    description: str = "the bundled default detector"
    metric: str = "AP50"  # what `validate` measures


def train(args: argparse.Namespace, recipe: Recipe | None = None) -> dict:
    """Train, validate and export (`recipe`: the bundled default detector's by default); returns a summary for the
    model card."""
    recipe = recipe or DETECTOR
    seed_everything(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = recipe.model().to(device).to(memory_format=torch.channels_last)
    dataset = CropDataset(
        args.seed, args.steps * args.batch, args.crop, args.full_frame_prob, sampler=recipe.sampler
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=False,
        num_workers=args.workers,
        collate_fn=collate,
        pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
        prefetch_factor=8 if args.workers > 0 else None,
    )
    val_set = CropDataset(args.seed + 1, args.val_crops, 640, 0.0, offset=10**9, sampler=recipe.sampler)
    val_data = [val_set[i] for i in range(len(val_set))]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    warmup = min(300, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            min(1.0, (s + 1) / max(warmup, 1)) * 0.5 * (1 + math.cos(math.pi * min(s / args.steps, 1.0)))
        ),
    )
    use_amp = device.type == "cuda"
    start = time.perf_counter()
    model.train()
    for step, (host_images, host_targets) in enumerate(loader):
        images = host_images.to(device, non_blocking=True).float().div_(255.0)
        images = images.contiguous(memory_format=torch.channels_last)
        targets = host_targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            outputs = model(images)
        loss, parts = recipe.loss(*(output.float() for output in outputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        schedule.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - start
            shown = " ".join(f"{k} {v:.0f}" if k == "pos" else f"{k} {v:.4f}" for k, v in parts.items())
            print(
                f"step {step:5d}/{args.steps} loss {loss.item():.4f} {shown} lr {schedule.get_last_lr()[0]:.2e} "
                f"{elapsed:.0f}s",
                flush=True,
            )
    train_seconds = time.perf_counter() - start
    torch.save(model.state_dict(), out / "checkpoint.pt")
    onnx_path, ts_path = recipe.export(
        copy.deepcopy(model).cpu(), out
    )  # first: a failing validation keeps them
    ap50 = recipe.validate(model, val_data, device)
    print(f"validation {recipe.metric} (tile level, {len(val_data)} crops of 640): {ap50:.4f}", flush=True)
    summary = {
        "seed": args.seed,
        "steps": args.steps,
        "batch": args.batch,
        "crop": args.crop,
        "full_frame_prob": args.full_frame_prob,
        "lr": args.lr,
        "train_seconds": round(train_seconds, 1),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        f"val_{recipe.metric.lower()}_tiles": round(ap50, 4),
        "onnx_bytes": onnx_path.stat().st_size,
        "ts_bytes": ts_path.stat().st_size,
        "command": " ".join(sys.argv),
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)
    return summary


DETECTOR = Recipe(lambda: TinyDetector(len(CLASSES)), labelled, detection_loss, validate, export)


def main(argv: list[str] | None = None, recipe: Recipe | None = None, doc: str | None = None) -> int:
    """The training command of `recipe` (the bundled default detector's by default; `doc`: its help text)."""
    recipe = recipe or DETECTOR
    parser = argparse.ArgumentParser(
        description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help=f"output folder for the files of {recipe.description}")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--seed", type=int, default=0, help="training seed (held-out eval uses another seed)")
    parser.add_argument(
        "--steps",
        type=int,
        help=f"optimizer steps (default {GPU_STEPS} on cuda, {CPU_STEPS} on cpu: < 45 min)",
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--crop", type=int, default=320, help="training crop size (the model is convolutional)"
    )
    parser.add_argument("--full-frame-prob", type=float, default=0.25, help="share of 3x-downscaled samples")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--workers", type=int, default=2, help="data loader processes")
    parser.add_argument("--val-crops", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--export-only", type=Path, help="export a checkpoint.pt instead of training")
    parser.add_argument(
        "--benchmark", type=Path, help="time ONNX Runtime on a (9, 3, 640, 640) batch and exit"
    )
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = CPU_STEPS if torch.device(args.device).type == "cpu" else GPU_STEPS
    if args.benchmark:
        print(json.dumps({"model": str(args.benchmark), **benchmark_onnx(args.benchmark)}))
        return 0
    if args.export_only:
        model = recipe.model()
        model.load_state_dict(torch.load(args.export_only, map_location="cpu"))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        recipe.export(model, Path(args.out))
        return 0
    train(args, recipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
