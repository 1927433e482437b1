"""What the peers run, to measure against them with the same weights: each model family's own pre- and
post-processing, ported to numpy from its source, and a SAHI `DetectionModel` that drives a model of that family with
them through one of our engines (so SAHI and we run the same file on the same runtime):

- YOLOX: its demo's `preproc`, `demo_postprocess` and class-agnostic NMS (yolox/data/data_augment.py,
  yolox/utils/demo_utils.py);
- PP-PicoDet: PaddleDetection v2.3.0 (commit 37be934f), the release its files were exported from: the reader of
  configs/picodet/_base_/picodet_416_reader.yml (`Decode` to RGB, `Resize` interp 2 = cubic without keeping the
  aspect ratio, `NormalizeImage` with ImageNet's mean / std after /255), `GFLHead.get_bboxes_single`
  (ppdet/modeling/heads/gfl_head.py: the `cell_offset` 0.5 of configs/picodet/_base_/picodet_esnet.yml, top 1000
  per stride, `distance2bbox` clipped to the input, rescaled by the scale factor) and `MultiClassNMS` (score 0.025,
  top 1000 per class, IoU 0.6, keep 100: Paddle's multiclass_nms, per class, areas without +1);
- NanoDet (0.x, GFLHead): its ncnn / ONNX demos' `resize_uniform` (demo_ncnn/main.cpp at commit d7caaca: aspect
  kept, floor sizes, centred on black, cv2's bilinear resize), (x - mean) / std on BGR, `GFLHead.get_bboxes_single`
  (nanodet/model/head/gfl_head.py at d7caaca: centres at (i + 0.5) x stride, top 1000 per stride, `distance2bbox`
  clipped to the input) and `multiclass_nms` (nanodet/model/module/nms.py: every class score above 0.05, NMS per
  class at IoU 0.6, the best 100).

The GFL families' outputs are taken as their demos take them (hpc203/picodet-onnxruntime,
hpc203/nanodet-opncv-dnn-cpp-python, the repositories the files come from): the first half class scores, the second
half box distributions, stride 8 doubling per output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from tiled_detector.config import DetectorConfig
from tiled_detector.engines.base import Engine, ModelFormat, load_engine, model_format
from tiled_detector.engines.rebatch import dynamic_batch_model
from tiled_detector.model_files.engine_setup import load_config_engine
from tiled_detector.model_files.resolve import engine_view, resolve
from tiled_detector.pipeline.layouts import YOLOX_STRIDES

YOLOX_NMS = 0.45  # YOLOX's demo: nms_thr


def yolox_preprocess(
    image_bgr: np.ndarray, input_hw: tuple[int, int], pad: int = 114
) -> tuple[np.ndarray, float]:
    """YOLOX's `preproc`: the image resized by r = min(in_h / h, in_w / w) (cv2 INTER_LINEAR, sizes truncated),
    placed at the top-left of a `pad`-grey input, BGR, 0-255, CHW float32; and r."""
    height, width = image_bgr.shape[:2]
    ratio = min(input_hw[0] / height, input_hw[1] / width)
    size = (int(width * ratio), int(height * ratio))
    padded = np.full((*input_hw, 3), pad, np.uint8)
    padded[: size[1], : size[0]] = cv2.resize(image_bgr, size, interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(padded.transpose(2, 0, 1), dtype=np.float32), ratio


def yolox_demo_postprocess(outputs: np.ndarray, input_hw: tuple[int, int]) -> np.ndarray:
    """YOLOX's `demo_postprocess`: raw rows (B, A, 5 + C) -> the same rows with boxes cx, cy, w, h in input
    pixels (a copy)."""
    grids, strides = [], []
    for stride in YOLOX_STRIDES:
        hsize, wsize = input_hw[0] // stride, input_hw[1] // stride
        xv, yv = np.meshgrid(np.arange(wsize), np.arange(hsize))
        grid = np.stack((xv, yv), 2).reshape(1, -1, 2)
        grids.append(grid)
        strides.append(np.full((*grid.shape[:2], 1), stride))
    grid, stride = np.concatenate(grids, 1), np.concatenate(strides, 1)
    decoded = outputs.copy()
    decoded[..., :2] = (outputs[..., :2] + grid) * stride
    decoded[..., 2:4] = np.exp(outputs[..., 2:4]) * stride
    return decoded


def _nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    """YOLOX's `nms` (demo_utils.py): greedy, areas with the +1 pixel convention."""
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(int(i))
        xx1, yy1 = np.maximum(x1[i], x1[order[1:]]), np.maximum(y1[i], y1[order[1:]])
        xx2, yy2 = np.minimum(x2[i], x2[order[1:]]), np.minimum(y2[i], y2[order[1:]])
        inter = np.maximum(0.0, xx2 - xx1 + 1) * np.maximum(0.0, yy2 - yy1 + 1)
        overlap = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[np.where(overlap <= threshold)[0] + 1]
    return keep


def yolox_detections(
    rows: np.ndarray, ratio: float, score_threshold: float, nms_threshold: float = YOLOX_NMS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """YOLOX's demo after `demo_postprocess` for one image's decoded rows (A, 5 + C): scores objectness x class,
    boxes to x1, y1, x2, y2 divided by the preprocessing ratio, `multiclass_nms` (class-agnostic, its default):
    boxes (N, 4), scores (N,), class ids (N,), best first."""
    scores = rows[:, 4:5] * rows[:, 5:]
    boxes = np.concatenate([rows[:, :2] - rows[:, 2:4] / 2, rows[:, :2] + rows[:, 2:4] / 2], 1) / ratio
    classes = scores.argmax(1)
    best = scores[np.arange(len(scores)), classes]
    valid = best > score_threshold
    boxes, best, classes = boxes[valid], best[valid], classes[valid]
    keep = _nms(boxes, best, nms_threshold) if len(best) else []
    return boxes[keep].astype(np.float32), best[keep].astype(np.float32), classes[keep].astype(np.int64)


PICODET_MEAN, PICODET_STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])  # RGB, on 0-1
# BGR, 0-255
NANODET_MEAN, NANODET_STD = (
    np.array([103.53, 116.28, 123.675]),
    np.array([57.375, 57.12, 58.395]),
)
GFL_NMS_PRE = 1000  # anchors kept per stride before NMS (both families)


def picodet_preprocess(
    image_bgr: np.ndarray, input_hw: tuple[int, int]
) -> tuple[np.ndarray, tuple[float, float]]:
    """PaddleDetection's PicoDet reader: RGB, resized to the input by cv2's cubic interpolation without keeping
    the aspect ratio, /255, ImageNet's mean / std, CHW float32; and the scale factor (y, x)."""
    scale_y, scale_x = input_hw[0] / image_bgr.shape[0], input_hw[1] / image_bgr.shape[1]
    rgb = cv2.cvtColor(image_bgr, cv2.COLOR_BGR2RGB)
    resized = cv2.resize(rgb, None, None, fx=scale_x, fy=scale_y, interpolation=cv2.INTER_CUBIC)
    normalised = (resized.astype(np.float32) / 255.0 - PICODET_MEAN) / PICODET_STD
    return np.ascontiguousarray(normalised.transpose(2, 0, 1), dtype=np.float32), (scale_y, scale_x)


def nanodet_preprocess(
    image_bgr: np.ndarray, input_hw: tuple[int, int]
) -> tuple[np.ndarray, tuple[int, ...]]:
    """NanoDet's demos' `resize_uniform` and normalisation: the image resized keeping its aspect (floor sizes),
    centred on black, (x - mean) / std on BGR 0-255, CHW float32; and the effect area (x, y, w, h)."""
    (height, width), (dst_h, dst_w) = image_bgr.shape[:2], input_hw
    canvas = np.zeros((dst_h, dst_w, 3), np.uint8)
    if width / height > dst_w / dst_h:
        size = (dst_w, math.floor(dst_w / width * height))
    elif width / height < dst_w / dst_h:
        size = (math.floor(dst_h / height * width), dst_h)
    else:
        size = (dst_w, dst_h)
    x, y = math.floor((dst_w - size[0]) / 2), math.floor((dst_h - size[1]) / 2)
    canvas[y : y + size[1], x : x + size[0]] = cv2.resize(image_bgr, size)
    normalised = (canvas.astype(np.float32) - NANODET_MEAN) / NANODET_STD
    return np.ascontiguousarray(normalised.transpose(2, 0, 1), dtype=np.float32), (x, y, *size)


def _distances(dist: np.ndarray) -> np.ndarray:
    """GFL's `Integral`: per side the softmax over its bins, times the bin values 0..bins-1 -> (N, 4)."""
    bins = dist.reshape(len(dist), 4, -1).astype(np.float64)
    weights = np.exp(bins - bins.max(axis=2, keepdims=True))
    weights /= weights.sum(axis=2, keepdims=True)
    return (weights * np.arange(bins.shape[2])).sum(axis=2)


def _gfl_levels(
    scores: Sequence[np.ndarray], dists: Sequence[np.ndarray], input_hw: tuple[int, int], cell_offset: float
) -> tuple[np.ndarray, np.ndarray]:
    """Both families' `get_bboxes_single` for one image: per stride (8, doubling; ceil(H / s) x ceil(W / s)
    cells) the centres (i + cell_offset) x stride, distances x stride, the best `GFL_NMS_PRE` anchors by their
    best class score, `distance2bbox` clipped to the input; boxes (N, 4) x1, y1, x2, y2 and scores (N, C)."""
    boxes, kept = [], []
    for level, (level_scores, dist) in enumerate(zip(scores, dists, strict=True)):
        stride = 8 << level
        ys, xs = np.meshgrid(
            np.arange(math.ceil(input_hw[0] / stride)),
            np.arange(math.ceil(input_hw[1] / stride)),
            indexing="ij",
        )
        centres = (np.stack([xs.ravel(), ys.ravel()], 1) + cell_offset) * stride
        distance, score = _distances(dist) * stride, level_scores
        if len(score) > GFL_NMS_PRE:
            top = np.argsort(-score.max(axis=1), kind="stable")[:GFL_NMS_PRE]
            centres, distance, score = centres[top], distance[top], score[top]
        xyxy = np.concatenate([centres - distance[:, :2], centres + distance[:, 2:]], axis=1)
        boxes.append(np.clip(xyxy, 0, [input_hw[1], input_hw[0]] * 2))
        kept.append(score)
    return np.concatenate(boxes), np.concatenate(kept).astype(np.float64)


def _class_nms(
    boxes: np.ndarray, scores: np.ndarray, threshold: float, score_threshold: float, top_k: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NMS per class over every class score above `score_threshold` (each class's best `top_k` first): greedy,
    IoU above `threshold` suppressed, areas without +1; boxes, scores and classes of what is kept, best first."""
    found = []
    for cls in range(scores.shape[1]):
        idx = np.nonzero(scores[:, cls] > score_threshold)[0]
        idx = idx[np.argsort(-scores[idx, cls], kind="stable")][:top_k]
        x1, y1, x2, y2 = boxes[idx].T
        areas = (x2 - x1) * (y2 - y1)
        alive = np.ones(len(idx), bool)
        for i in range(len(idx)):
            if not alive[i]:
                continue
            found.append((scores[idx[i], cls], cls, idx[i]))
            w = np.maximum(0.0, np.minimum(x2[i], x2[i + 1 :]) - np.maximum(x1[i], x1[i + 1 :]))
            h = np.maximum(0.0, np.minimum(y2[i], y2[i + 1 :]) - np.maximum(y1[i], y1[i + 1 :]))
            inter = w * h
            union = areas[i] + areas[i + 1 :] - inter
            iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
            alive[i + 1 :] &= iou <= threshold
    found.sort(key=lambda row: -row[0])
    rows = np.array([r[2] for r in found], np.int64)
    return (
        boxes[rows].astype(np.float32).reshape(-1, 4),
        np.array([r[0] for r in found], np.float32),
        np.array([r[1] for r in found], np.int64),
    )


def _separate_levels(
    outputs: Sequence[np.ndarray], input_hw: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes and class scores of one image's separate outputs (class scores per stride, then box distributions),
    anchor centres at (i + 0.5) x stride, as PicoDet and NanoDet 0.x export them."""
    half = len(outputs) // 2
    scores = [o.reshape(o.shape[-2:]) for o in outputs[:half]]
    return _gfl_levels(scores, [o.reshape(o.shape[-2:]) for o in outputs[half:]], input_hw, 0.5)


def picodet_postprocess(
    outputs: Sequence[np.ndarray],
    input_hw: tuple[int, int],
    scale_factor: tuple[float, float],
    score_threshold: float = 0.025,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PaddleDetection's PicoDet post-processing of one image's outputs (class scores per stride, then box
    distributions): boxes in image pixels, scores, classes, best first (`MultiClassNMS`: keep the best 100)."""
    boxes, scores = _separate_levels(outputs, input_hw)
    boxes /= np.array([scale_factor[1], scale_factor[0]] * 2)
    found = _class_nms(boxes, scores, 0.6, score_threshold, top_k=1000)
    return tuple(f[:100] for f in found)  # type: ignore[return-value]


def nanodet_postprocess(
    outputs: Sequence[np.ndarray],
    input_hw: tuple[int, int],
    effect: tuple[int, ...],
    image_hw: tuple[int, int],
    score_threshold: float = 0.05,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NanoDet's post-processing of one image's outputs (class scores per stride, then box distributions): boxes
    mapped from the effect area back to the image (clipped to it), scores, classes, best first (the best 100)."""
    boxes, scores = _separate_levels(outputs, input_hw)
    boxes, scores, classes = (f[:100] for f in _class_nms(boxes, scores, 0.6, score_threshold))
    x, y, w, h = effect
    scale = np.array([image_hw[1] / w, image_hw[0] / h] * 2)
    boxes = np.clip((boxes - np.array([x, y, x, y])) * scale, 0, [image_hw[1], image_hw[0]] * 2)
    return boxes.astype(np.float32), scores, classes


FAMILIES = ("yolox", "picodet", "nanodet")


class PeerRunner:
    """A family's own pipeline (`FAMILIES`) on one image through one of our engines (`load_engine`, batch 1): BGR
    image -> boxes, scores, classes in image pixels. A batch-1 ONNX file runs as the pipeline's engine runs it
    (its proven rewrite, `engines.rebatch`), so that both time the same graph."""

    def __init__(
        self, model: str | Path, family: str, backend: str = "auto", device: str = "cpu", **options: Any
    ) -> None:
        if family not in FAMILIES:
            raise ValueError(f"no peer pipeline for family {family!r}: one of {', '.join(FAMILIES)}")
        self.family = family
        if model_format(model) is ModelFormat.ONNX:
            model = dynamic_batch_model(Path(model))
        self.engine: Engine = load_engine(model, backend, device, max_batch=1, **options)

    def _run(self, views: np.ndarray) -> list[np.ndarray]:
        engine = self.engine
        batch = torch.from_numpy(views[None]).to(engine.device, engine.input.dtype)
        outputs = engine.infer(batch.contiguous(memory_format=engine.memory_format)).values()
        return [o.float().cpu().numpy() for o in outputs]

    def __call__(self, image_bgr: np.ndarray, score_threshold: float) -> tuple[np.ndarray, ...]:
        input_hw = self.engine.input_hw
        if self.family == "picodet":
            views, factor = picodet_preprocess(image_bgr, input_hw)
            return picodet_postprocess(self._run(views), input_hw, factor, score_threshold)
        if self.family == "nanodet":
            views, effect = nanodet_preprocess(image_bgr, input_hw)
            return nanodet_postprocess(
                self._run(views), input_hw, effect, image_bgr.shape[:2], score_threshold
            )
        views, ratio = yolox_preprocess(image_bgr, input_hw)
        rows = yolox_demo_postprocess(self._run(views)[0], input_hw)[0]
        return yolox_detections(rows, ratio, score_threshold)


class YoloxRunner(PeerRunner):
    """YOLOX's demo pipeline (`PeerRunner` of the yolox family)."""

    def __init__(self, model: str | Path, backend: str = "auto", device: str = "cpu", **options: Any) -> None:
        super().__init__(model, "yolox", backend, device, **options)


def model_family(
    model: str | Path, backend: str = "auto", device: str = "cpu", layout: str = "auto"
) -> tuple[str | None, tuple[int, int]]:
    """The family of a model file as the detector reads it (`resolve`; its engine loaded once, batch 1): yolox,
    picodet, nanodet, or None (ultralytics-like, or not readable); and its input (height, width)."""
    config = DetectorConfig(model=model, backend=backend, device=device, layout=layout, max_batch=1)
    engine = load_config_engine(config)
    try:
        return resolve(config, engine_view(engine)).family, engine.input_hw
    except ValueError:
        return None, engine.input_hw


def sahi_model(
    model: str | Path,
    family: str,
    labels: Sequence[str],
    device: str = "cpu",
    confidence_threshold: float = 0.25,
    backend: str = "auto",
) -> Any:
    """A SAHI `DetectionModel` running a model of `family` with its own pre- and post-processing (`PeerRunner`;
    SAHI hands it RGB slices). Imports sahi (an optional extra)."""
    from sahi.models.base import DetectionModel
    from sahi.prediction import ObjectPrediction
    from sahi.utils.compatibility import fix_full_shape_list, fix_shift_amount_list

    class FamilyDetectionModel(DetectionModel):  # type: ignore[misc]
        def load_model(self) -> None:
            self.set_model(PeerRunner(model, family, backend, device))

        def set_model(self, runner: Any, **kwargs: Any) -> None:
            self.model = runner
            self.category_mapping = {str(i): name for i, name in enumerate(labels)}

        def perform_inference(self, image: np.ndarray) -> None:
            self._shape = list(image.shape[:2])
            self._original_predictions = self.model(
                np.ascontiguousarray(image[..., ::-1]), self.confidence_threshold
            )

        @property
        def num_categories(self) -> int:
            return len(labels)

        @property
        def has_mask(self) -> bool:
            return False

        @property
        def category_names(self) -> list[str]:
            return list(labels)

        def _create_object_prediction_list_from_original_predictions(
            self, shift_amount_list: Any = None, full_shape_list: Any = None
        ) -> None:
            shifts = fix_shift_amount_list(shift_amount_list if shift_amount_list is not None else [[0, 0]])
            fulls = fix_full_shape_list(full_shape_list)
            shift = [int(v) for v in shifts[0]]
            full = [int(v) for v in fulls[0]] if fulls else None
            boxes, scores, classes = self._original_predictions
            if full is not None:  # SAHI's ultralytics model clips to the full image the same way
                boxes = np.minimum(boxes, np.array([full[1], full[0], full[1], full[0]], np.float32))
            found = [
                ObjectPrediction(
                    bbox=box,
                    category_id=int(class_id),
                    score=float(score),
                    category_name=labels[class_id],
                    shift_amount=shift,
                    full_shape=full or self._shape,
                )
                for box, score, class_id in zip(
                    np.maximum(boxes, 0.0).tolist(), scores.tolist(), classes.tolist(), strict=True
                )
                if box[0] < box[2] and box[1] < box[3]
            ]
            self._object_prediction_list_per_image = [found]

    return FamilyDetectionModel(device=device, confidence_threshold=confidence_threshold, load_at_init=True)
