"""The YOLOv8n architecture with random weights (`YoloV8nLike`), for the measurements; the tests' networks and
exports (`test/support/networks.py`) re-exported beside it, so a benchmark imports every network from here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))
from support.networks import Conv, GflLike, SquareDetector, save_onnx, save_torchscript

__all__ = ["GflLike", "SquareDetector", "YoloV8nLike", "YoloV8nSegLike", "save_onnx", "save_torchscript"]


class _C2f(nn.Module):
    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.c)
        self.cv2 = Conv((2 + n) * self.c, c_out)
        self.m = nn.ModuleList(
            nn.Sequential(Conv(self.c, self.c, 3), Conv(self.c, self.c, 3)) for _ in range(n)
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
        self.cv1 = Conv(c_in, c_in // 2)
        self.cv2 = Conv(c_in * 2, c_out)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.pool(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class YoloV8nLike(nn.Module):
    """YOLOv8n's layer widths, depths, neck and decoupled DFL head (~3.2 M parameters, ~8.7 GFLOPs at 640).

    Random weights; the class bias starts at -10 like a fresh YOLO head (scores ~5e-5), so thresholds decide
    how many candidates reach decoding. `host_anchors` builds the anchor grid on the host in every forward and
    copies it over (`torch.arange(..., device="cpu").type_as(x)`, as a traced ultralytics head does): as traced, such a
    model cannot be captured in a CUDA graph; the torch engine moves that work to the device when it loads the file on
    CUDA (`engines/capture.py`), so it is captured whole there since issue 51.
    """

    def __init__(
        self, classes: int = 80, input_hw: tuple[int, int] = (640, 640), host_anchors: bool = False
    ) -> None:
        super().__init__()
        self.host_anchors, self.input_hw = host_anchors, input_hw
        self.backbone = nn.ModuleList(
            [
                Conv(3, 16, 3, 2),
                Conv(16, 32, 3, 2),
                _C2f(32, 32, 1, True),
                Conv(32, 64, 3, 2),
                _C2f(64, 64, 2, True),
                Conv(64, 128, 3, 2),
                _C2f(128, 128, 2, True),
                Conv(128, 256, 3, 2),
                _C2f(256, 256, 1, True),
                _SPPF(256, 256),
            ]
        )
        self.up4, self.up3 = _C2f(384, 128, 1, False), _C2f(192, 64, 1, False)
        self.down3, self.out4 = Conv(64, 64, 3, 2), _C2f(192, 128, 1, False)
        self.down4, self.out5 = Conv(128, 128, 3, 2), _C2f(384, 256, 1, False)
        self.box = nn.ModuleList(
            nn.Sequential(Conv(c, 64, 3), Conv(64, 64, 3), nn.Conv2d(64, 64, 1)) for c in (64, 128, 256)
        )
        self.cls = nn.ModuleList(
            nn.Sequential(Conv(c, 80, 3), Conv(80, 80, 3), nn.Conv2d(80, classes, 1)) for c in (64, 128, 256)
        )
        for head in self.cls:
            nn.init.constant_(head[-1].bias, -10.0)
        anchors, strides = _anchor_grid(input_hw)
        self.register_buffer("anchors", anchors)  # (1, 2, A)
        self.register_buffer("strides", strides)  # (1, 1, A)
        self.register_buffer("bins", torch.arange(16, dtype=torch.float32).view(1, 1, 16, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, 4 + classes, A)."""
        return self._head(self._levels(images))

    def _levels(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The neck's three levels (strides 8, 16, 32)."""
        x, feats = images, []
        for layer in self.backbone:
            x = layer(x)
            feats.append(x)
        p3, p4, p5 = feats[4], feats[6], feats[9]
        n4 = self.up4(torch.cat([F.interpolate(p5, scale_factor=2.0), p4], 1))
        n3 = self.up3(torch.cat([F.interpolate(n4, scale_factor=2.0), p3], 1))
        m4 = self.out4(torch.cat([self.down3(n3), n4], 1))
        m5 = self.out5(torch.cat([self.down4(m4), p5], 1))
        return n3, m4, m5

    def _head(self, levels: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(B, 4 + classes, A): boxes (cx, cy, w, h in input pixels) and class scores of every anchor point."""
        b = levels[0].shape[0]
        dist = torch.cat([head(f).view(b, 64, -1) for head, f in zip(self.box, levels, strict=True)], 2)
        logits = torch.cat([head(f).flatten(2) for head, f in zip(self.cls, levels, strict=True)], 2)
        ltrb = (dist.view(b, 4, 16, -1).softmax(2) * self.bins).sum(2)  # DFL: expected distance per side
        anchors, strides = self.anchors, self.strides
        if self.host_anchors:  # made on the host and copied over at every call (a host-to-device copy)
            anchors, strides = (t.type_as(ltrb) for t in _anchor_grid(self.input_hw))
        xy = (anchors + (ltrb[:, 2:] - ltrb[:, :2]) / 2) * strides
        wh = (ltrb[:, :2] + ltrb[:, 2:]) * strides
        return torch.cat([xy, wh, logits.sigmoid()], 1)


class YoloV8nSegLike(YoloV8nLike):
    """`YoloV8nLike` with YOLOv8n-seg's segmentation head (random weights): per level a 32-coefficient branch beside
    the box and class ones, and the prototype module on the stride-8 map (conv, x2 upsample, conv, conv to 32
    prototypes at stride 4): outputs (B, 4 + classes + 32, A) and (B, 32, H / 4, W / 4), as ultralytics exports it.
    Its box branch starts near one bin (boxes of about 3 strides: 24 to 96 px), so masks cover what small objects
    would."""

    def __init__(self, classes: int = 80, input_hw: tuple[int, int] = (640, 640)) -> None:
        super().__init__(classes, input_hw)
        self.coefficients = nn.ModuleList(
            nn.Sequential(Conv(c, 32, 3), Conv(32, 32, 3), nn.Conv2d(32, 32, 1)) for c in (64, 128, 256)
        )
        self.proto = nn.Sequential(
            Conv(64, 64, 3), nn.Upsample(scale_factor=2.0, mode="nearest"), Conv(64, 64, 3), Conv(64, 32)
        )
        for head in self.box:
            nn.init.zeros_(head[-1].weight)
            bias = torch.full((4, 16), -4.0)
            bias[:, 1] = 4.0
            head[-1].bias.data.copy_(bias.view(-1))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """(B, 3, H, W) -> ((B, 4 + classes + 32, A), (B, 32, H / 4, W / 4))."""
        levels = self._levels(images)
        coefficients = torch.cat([h(f).flatten(2) for h, f in zip(self.coefficients, levels, strict=True)], 2)
        return torch.cat([self._head(levels), coefficients], 1), self.proto(levels[0])


def _anchor_grid(input_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """YOLOv8's anchor centres (1, 2, A) and strides (1, 1, A) for the three levels, on the host."""
    anchors, strides = [], []
    for stride in (8, 16, 32):
        h, w = input_hw[0] // stride, input_hw[1] // stride
        ys, xs = torch.meshgrid(torch.arange(h, device="cpu"), torch.arange(w, device="cpu"), indexing="ij")
        anchors.append(torch.stack([xs.flatten(), ys.flatten()]).float() + 0.5)
        strides.append(torch.full((h * w,), float(stride)))
    return torch.cat(anchors, 1).unsqueeze(0), torch.cat(strides).view(1, 1, -1)


class YoloV8nPoseLike(YoloV8nLike):
    """`YoloV8nLike` with YOLOv8n-pose's keypoint head (random weights): one class (person) and per level a branch of
    17 x 3 joint values beside the box and class ones, decoded as ultralytics' exported `Pose.kpts_decode` does
    (x, y = (raw x 2 + anchor - 0.5) x stride, visibility = sigmoid): output (B, 4 + 1 + 51, A), as ultralytics
    exports it (`task: pose`, `kpt_shape` [17, 3]: `save_pose_torchscript`). Its box branch starts near one bin
    (boxes of about 3 strides), so the joints lie around small objects."""

    JOINTS = 17

    def __init__(self, input_hw: tuple[int, int] = (640, 640)) -> None:
        super().__init__(1, input_hw)
        self.joints = nn.ModuleList(
            nn.Sequential(Conv(c, 51, 3), Conv(51, 51, 3), nn.Conv2d(51, 51, 1)) for c in (64, 128, 256)
        )
        for head in self.box:
            nn.init.zeros_(head[-1].weight)
            bias = torch.full((4, 16), -4.0)
            bias[:, 1] = 4.0
            head[-1].bias.data.copy_(bias.view(-1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, 4 + 1 + 51, A)."""
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
        raw = torch.cat([head(f).flatten(2) for head, f in zip(self.joints, levels, strict=True)], 2)
        ltrb = (dist.view(b, 4, 16, -1).softmax(2) * self.bins).sum(2)
        xy = (self.anchors + (ltrb[:, 2:] - ltrb[:, :2]) / 2) * self.strides
        wh = (ltrb[:, :2] + ltrb[:, 2:]) * self.strides
        joints = raw.view(b, self.JOINTS, 3, -1)
        at = (joints[:, :, :2] * 2.0 + (self.anchors[:, None] - 0.5)) * self.strides[:, None]
        joints = torch.cat([at, joints[:, :, 2:3].sigmoid()], 2).view(b, self.JOINTS * 3, -1)
        return torch.cat([xy, wh, logits.sigmoid(), joints], 1)


def save_pose_torchscript(model: nn.Module, path: Path, input_hw: tuple[int, int] = (640, 640)) -> Path:
    """Trace a pose network (output (B, 4 + 1 + 51, A)) to TorchScript with ultralytics' metadata for a pose model
    (`config.txt`: task pose, kpt_shape [17, 3], one class `person`; any batch)."""
    import json

    traced = torch.jit.trace(model.eval(), torch.zeros(2, 3, *input_hw))
    meta = {
        "task": "pose",
        "kpt_shape": [17, 3],
        "names": {0: "person"},
        "imgsz": list(input_hw),
        "batch": 1,
        "stride": 32,
        "args": {"batch": 1, "nms": False, "dynamic": False},
    }
    extra = {"config.txt": json.dumps(meta), "input_shape": f"-1,3,{input_hw[0]},{input_hw[1]}"}
    torch.jit.save(traced, str(path), _extra_files=extra)
    return path
