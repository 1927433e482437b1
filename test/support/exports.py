"""Model files written the way the exporters users have write them, without the exporters: small networks with the
same file layouts, metadata files and keys as ultralytics 8.4 (`ultralytics/engine/exporter.py`: TorchScript
`config.txt`, ONNX `metadata_props`, the TensorRT file header) and YOLOv5 (`export.py`: TorchScript `config.txt`
with `shape`), so the tests need no ultralytics. The network is `SquareDetector` (64x64 input, 8-pixel cells, 2
classes red / blue: a known answer), wrapped to give each head's output layout.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from support.networks import SquareDetector

INPUT_HW = (64, 64)
NAMES = {0: "red", 1: "blue"}


class V5Head(nn.Module):
    """YOLOv5's layout (B, A, 5 + C): the YOLOv8-layout network transposed, objectness 1."""

    def __init__(self) -> None:
        super().__init__()
        self.net = SquareDetector(INPUT_HW, 8)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.net(images).transpose(1, 2)
        return torch.cat([out[..., :4], torch.ones_like(out[..., :1]), out[..., 4:]], dim=2)


class EndToEndHead(nn.Module):
    """An end-to-end head (YOLO26, or an nms=True export): (B, K, 6) rows x1, y1, x2, y2, score, class, best
    scores first (here every anchor: K = 64)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = SquareDetector(INPUT_HW, 8)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.net(images).transpose(1, 2)  # (B, A, 4 + C)
        xy, wh = out[..., :2], out[..., 2:4]
        scores, classes = out[..., 4:].max(dim=2)
        rows = torch.cat([xy - wh / 2, xy + wh / 2, scores[..., None], classes[..., None].float()], dim=2)
        order = scores.argsort(dim=1, descending=True)
        return rows.gather(1, order[..., None].expand(-1, -1, 6))


class ObbHead(nn.Module):
    """ultralytics' OBB layout (B, 4 + C + 1, A) (`task: obb`): the squares (cx, cy, w, h, class scores) and an
    angle row after the scores: `angle` radians everywhere, w scaled by `stretch` (a long side), and the anchors
    listed in `degenerate` given w 0 and a NaN angle (rows a model may emit that are no rectangle)."""

    def __init__(
        self,
        input_hw: tuple[int, int] = INPUT_HW,
        angle: float = 0.0,
        stretch: float = 1.0,
        degenerate: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.net = SquareDetector(input_hw, 8)
        self.angle, self.stretch, self.degenerate = angle, stretch, list(degenerate)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.net(images)
        angle = torch.full_like(out[:, :1], self.angle)
        box = torch.cat([out[:, :2], out[:, 2:3] * self.stretch, out[:, 3:4]], 1)
        if self.degenerate:
            box[:, 2, self.degenerate] = 0.0
            angle[:, 0, self.degenerate] = float("nan")
        return torch.cat([box, out[:, 4:], angle], 1)


class ObbEndToEndHead(ObbHead):
    """YOLO26's end-to-end OBB rows (B, K, 7) cx, cy, w, h, score, class, angle, best scores first (here every
    anchor)."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = super().forward(images).transpose(1, 2)  # (B, A, 4 + C + 1)
        scores, classes = out[..., 4:-1].max(dim=2)
        rows = torch.cat([out[..., :4], scores[..., None], classes[..., None].float(), out[..., -1:]], dim=2)
        order = scores.argsort(dim=1, descending=True)
        return rows.gather(1, order[..., None].expand(-1, -1, 7))


class PoseHead(nn.Module):
    """ultralytics' pose layout (B, 4 + C + K x D, A) (`task: pose`, `kpt_shape` [K, D]): the squares (cx, cy, w,
    h, class scores), then K = 5 joints of each anchor's square, a known answer: its corners x1 y1, x2 y1, x2 y2,
    x1 y2 and its centre, each x, y in input pixels and, where D is 3, a visibility score (the square's best class
    score: a pure square 1). `end2end`: YOLO26's rows (B, A, 6 + K x D) x1, y1, x2, y2, score, class, joints, best
    scores first."""

    JOINTS = 5

    def __init__(self, input_hw: tuple[int, int] = INPUT_HW, values: int = 3, end2end: bool = False) -> None:
        super().__init__()
        self.net = SquareDetector(input_hw, 8)
        self.values, self.end2end = values, end2end

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.net(images)  # (B, 6, A)
        cx, cy, half_w, half_h = out[:, 0], out[:, 1], out[:, 2] / 2, out[:, 3] / 2
        score = out[:, 4:].amax(1)
        xs = [cx - half_w, cx + half_w, cx + half_w, cx - half_w, cx]
        ys = [cy - half_h, cy - half_h, cy + half_h, cy + half_h, cy]
        joints = []
        for x, y in zip(xs, ys, strict=True):
            joints += [x, y, score][: self.values]
        rows = torch.cat([out, torch.stack(joints, 1)], 1)  # (B, 4 + 2 + K x D, A)
        if not self.end2end:
            return rows
        rows = rows.transpose(1, 2)
        xy, wh = rows[..., :2], rows[..., 2:4]
        scores, classes = rows[..., 4:6].max(dim=2)
        rows = torch.cat(
            [xy - wh / 2, xy + wh / 2, scores[..., None], classes[..., None].float(), rows[..., 6:]], 2
        )
        order = scores.argsort(dim=1, descending=True)
        return rows.gather(1, order[..., None].expand(-1, -1, rows.shape[2]))


def ultralytics_metadata(
    batch: int = 1,
    end2end: bool = False,
    imgsz: list[int] | None = None,
    names: dict[int, str] | None = None,
    task: str = "detect",
    kpt_shape: list[int] | None = None,
    kpt_names: dict[int, list[str]] | None = None,
    **args: object,
) -> dict:
    """The metadata dict ultralytics 8.4.190's exporter writes (`Exporter.__call__`), for this network (`args`:
    the export arguments: nms, dynamic, quantize, ...); a pose model's `kpt_shape` and, where its dataset named
    them, `kpt_names` ({class id: names}) after the others."""
    pose = {} if kpt_shape is None else {"kpt_shape": kpt_shape}
    if kpt_names is not None:
        pose["kpt_names"] = kpt_names
    return {
        "description": "Ultralytics YOLOv8n model",
        "author": "Ultralytics",
        "date": "2026-11-24T10:00:00+00:00",
        "version": "8.4.190",
        "license": "AGPL-3.0 License (https://ultralytics.com/license)",
        "docs": "https://docs.ultralytics.com",
        "stride": 32,
        "task": task,
        "head": {"obb": "OBB", "segment": "Segment", "pose": "Pose", "classify": "Classify"}.get(
            task, "Detect"
        ),
        "batch": batch,
        "imgsz": imgsz or list(INPUT_HW),
        "names": names or dict(NAMES),
        "args": {"batch": batch, "quantize": None, "nms": False, "dynamic": False, **args},
        "channels": 3,
        "end2end": end2end,
        **pose,
    }


def ultralytics_torchscript(
    path: Path, model: nn.Module | None = None, input_hw: tuple[int, int] = INPUT_HW, **metadata: object
) -> Path:
    """As `yolo export format=torchscript`: traced at the export batch (and `input_hw`), metadata as JSON in
    `config.txt`."""
    meta = ultralytics_metadata(**metadata)
    traced = torch.jit.trace(
        (model or SquareDetector(INPUT_HW, 8)).eval(), torch.zeros(meta["batch"], 3, *input_hw)
    )
    traced.save(str(path), _extra_files={"config.txt": json.dumps(meta)})
    return path


def ultralytics_onnx(
    path: Path, model: nn.Module | None = None, dynamic: bool = False, outputs: int = 1, **metadata: object
) -> Path:
    """As `yolo export format=onnx`: input `images`, output `output0` (a segmentation model's `outputs=2`: and
    `output1`, its prototypes), a static batch unless `dynamic` (then batch, height and width are symbolic), every
    metadata key as `str(value)` in metadata_props."""
    meta = ultralytics_metadata(**metadata, dynamic=dynamic)
    names = ["output0", "output1"][:outputs]
    axes = (
        {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}}
        if dynamic
        else None
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            (model or SquareDetector(INPUT_HW, 8)).eval(),
            (torch.zeros(meta["batch"], 3, *INPUT_HW),),
            str(path),
            input_names=["images"],
            output_names=names,
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    exported = onnx.load(str(path))
    for key, value in meta.items():
        prop = exported.metadata_props.add()
        prop.key, prop.value = key, str(value)
    onnx.save(exported, str(path))
    return path


def yolov5_torchscript(path: Path) -> Path:
    """As YOLOv5's `export.py --include torchscript`: `config.txt` {"shape", "stride", "names"}."""
    traced = torch.jit.trace(V5Head().eval(), torch.zeros(1, 3, *INPUT_HW))
    config = {"shape": [1, 3, *INPUT_HW], "stride": 32, "names": dict(NAMES)}
    traced.save(str(path), _extra_files={"config.txt": json.dumps(config)})
    return path


def ultralytics_engine_file(path: Path, engine_bytes: bytes, **metadata: object) -> Path:
    """As `yolo export format=engine`: a 4-byte little-endian length, the metadata JSON, then the engine."""
    meta = json.dumps(ultralytics_metadata(**metadata))
    path.write_bytes(len(meta).to_bytes(4, byteorder="little", signed=True) + meta.encode() + engine_bytes)
    return path
