"""What the peers run, to measure against them with the same weights: YOLOX's own pre- and post-processing (its
demo's `preproc`, `demo_postprocess` and class-agnostic NMS, yolox/data/data_augment.py and
yolox/utils/demo_utils.py), and a SAHI `DetectionModel` that drives a YOLOX model with them through one of our
engines (so SAHI and we run the same file on the same runtime)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from tiled_detector.engines.base import Engine, load_engine
from tiled_detector.pipeline.decode import YOLOX_STRIDES, OutputLayout, detect_layout

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


class YoloxRunner:
    """YOLOX's demo pipeline on one image through one of our engines (`load_engine`, batch 1): BGR image ->
    boxes, scores, classes in image pixels."""

    def __init__(self, model: str | Path, backend: str = "auto", device: str = "cpu", **options: Any) -> None:
        self.engine: Engine = load_engine(model, backend, device, max_batch=1, **options)

    def __call__(self, image_bgr: np.ndarray, score_threshold: float) -> tuple[np.ndarray, ...]:
        engine = self.engine
        views, ratio = yolox_preprocess(image_bgr, engine.input_hw)
        batch = torch.from_numpy(views[None]).to(engine.device, engine.input.dtype)
        head = next(iter(engine.infer(batch.contiguous(memory_format=engine.memory_format)).values()))
        rows = yolox_demo_postprocess(head.float().cpu().numpy(), engine.input_hw)[0]
        return yolox_detections(rows, ratio, score_threshold)


def model_family(
    model: str | Path, backend: str = "auto", device: str = "cpu", layout: str = "auto"
) -> OutputLayout:
    """The output layout a model file's head has (its engine loaded once, batch 1)."""
    engine = load_engine(model, backend, device, max_batch=1)
    shapes = {o.name: o.shape for o in engine.outputs}
    try:
        return detect_layout(shapes, len(engine.labels) if engine.labels else None, layout, engine.input_hw)
    except ValueError:
        return OutputLayout.AUTO


def yolox_sahi_model(
    model: str | Path, labels: Sequence[str], device: str = "cpu", confidence_threshold: float = 0.25,
    backend: str = "auto",
) -> Any:  # fmt: skip
    """A SAHI `DetectionModel` running a YOLOX model with YOLOX's own pre- and post-processing (SAHI hands it RGB
    slices; YOLOX takes BGR). Imports sahi (an optional extra)."""
    from sahi.models.base import DetectionModel
    from sahi.prediction import ObjectPrediction
    from sahi.utils.compatibility import fix_full_shape_list, fix_shift_amount_list

    class YoloxDetectionModel(DetectionModel):  # type: ignore[misc]
        def load_model(self) -> None:
            self.set_model(YoloxRunner(model, backend, device))

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
                ObjectPrediction(bbox=box, category_id=int(class_id), score=float(score),
                                 category_name=labels[class_id], shift_amount=shift, full_shape=full or self._shape)
                for box, score, class_id in zip(np.maximum(boxes, 0.0).tolist(), scores.tolist(), classes.tolist(),
                                                strict=True)
                if box[0] < box[2] and box[1] < box[3]
            ]  # fmt: skip
            self._object_prediction_list_per_image = [found]

    return YoloxDetectionModel(device=device, confidence_threshold=confidence_threshold, load_at_init=True)
