"""Instance masks with real weights on real photos (`../shared`: the YOLOv8n-seg int8 file and MOT17 frames;
skipped where they are absent; `TILED_DETECTOR_SHARED` names another folder): the full-frame view's masks equal
ultralytics' own mask post-processing of the same view (its `process_mask_native`, ported below: the logits
upsampled, the letterbox cut off, resized to the frame, cropped to the box), and an object cut by a tile seam comes
out as one detection with one whole mask."""

from __future__ import annotations

import math
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from tiled_detector import TiledDetector
from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.postprocess import postprocess_rows
from tiled_detector.pipeline.tiling import batch_plan

SHARED = Path(os.environ.get("TILED_DETECTOR_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
MODEL = SHARED / "models" / "yolov8n-seg_int8.onnx"
PHOTOS = [
    SHARED / "data" / "mot17_mini" / sequence / "img1" / "000001.jpg"
    for sequence in ("MOT17-02-FRCNN", "MOT17-04-FRCNN")
]
pytestmark = pytest.mark.skipif(
    not (MODEL.is_file() and all(p.is_file() for p in PHOTOS)),
    reason=f"no YOLOv8n-seg / MOT17-mini in {SHARED}",
)


def ultralytics_native(
    protos: torch.Tensor, coefficients: torch.Tensor, boxes: torch.Tensor, shape
) -> np.ndarray:
    """ultralytics 8.4's `ops.process_mask_native` (utils/ops.py; its `scale_masks` with the letterbox computed from
    the shapes): coefficients . prototypes, upsampled by the smallest factor that cuts the padding on whole pixels,
    the letterbox's padding cut off, bilinear to the frame, above 0, cropped to the boxes (frame pixels)."""
    c, mh, mw = protos.shape
    h, w = shape
    logits = (coefficients @ protos.float().view(c, -1)).view(1, -1, mh, mw)
    gain = min(4 * mh / h, 4 * mw / w)
    pad = (4 * mh - max(round(h * gain), 1)) | (4 * mw - max(round(w * gain), 1))
    f = 4 // math.gcd(4, pad | pad // 2)
    masks = F.interpolate(logits, scale_factor=f, mode="bilinear") if f > 1 else logits
    im1_h, im1_w = masks.shape[2:]
    gain = min(im1_h / h, im1_w / w)
    pad_w, pad_h = (im1_w - max(round(w * gain), 1)) / 2, (im1_h - max(round(h * gain), 1)) / 2
    top, left = round(pad_h - 0.1), round(pad_w - 0.1)
    bottom, right = top + max(round(h * gain), 1), left + max(round(w * gain), 1)
    masks = F.interpolate(masks[..., top:bottom, left:right], (h, w), mode="bilinear")[0] > 0
    x1, y1, x2, y2 = boxes[:, :, None, None].unbind(1)
    columns, rows = torch.arange(w)[None, None], torch.arange(h)[None, :, None]
    return (masks & (columns >= x1) & (columns < x2) & (rows >= y1) & (rows < y2)).numpy()


def _photo(path: Path) -> np.ndarray:
    return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)


@pytest.mark.slow
def test_full_frame_masks_equal_ultralytics_post_processing_of_the_same_view():
    ious = []
    for path in PHOTOS:
        frame = _photo(path)
        height, width = frame.shape[:2]
        detector = TiledDetector(MODEL, tile_size=(width, height), full_frame=False, conf_threshold=0.25)
        found = detector.detect(frame)
        assert len(found) >= 3 and found.masks is not None
        # the same view's candidates and merge, as the frame program had them: each kept row's coefficients
        plan = batch_plan([detector.plan_for(height, width)])
        candidates = detector._program.candidates(
            [torch.from_numpy(frame)], [Encoding.RGB8], plan, detector.frame_settings
        )
        rows = postprocess_rows(candidates, plan, detector.frame_settings, None)
        kept = rows.packed[:-1, 6] > 0
        member = rows.members[kept, 0]
        boxes = rows.packed[:-1][kept, :4]
        np.testing.assert_allclose(boxes.numpy(), found.boxes, atol=1e-4)
        protos = candidates.prototypes.values[0]
        want = ultralytics_native(protos, candidates.extra[member], boxes, (height, width))
        for k in range(len(found)):
            mine = found.masks.mask(k)
            union = (mine | want[k]).sum()
            if want[k].sum() >= 32 * 32 or (found.boxes[k, 2:] - found.boxes[k, :2]).min() >= 32:
                ious.append((mine & want[k]).sum() / max(union, 1))
    assert len(ious) >= 6 and min(ious) >= 0.95, sorted(ious)[:5]


@pytest.mark.slow
@pytest.mark.parametrize("merge", ["nms", "greedy_nmm"])
def test_an_object_cut_by_a_tile_seam_is_one_detection_with_one_whole_mask(merge):
    frame = _photo(PHOTOS[0])
    detector = TiledDetector(MODEL, conf_threshold=0.3, merge=merge, classes=["person"])
    found = detector.detect(frame)
    plan = detector.plan_for(*frame.shape[:2])
    seams = sorted({int(x) for x in plan.tiles[:, [0, 2]].reshape(-1)} - {0, frame.shape[1]})
    cut = 0
    for k, (x1, y1, x2, y2) in enumerate(found.boxes):
        crossing = [s for s in seams if x1 + 8 < s < x2 - 8]
        if not crossing or y2 - y1 < 48:
            continue
        cut += 1
        mask = found.masks.mask(k)
        seam = crossing[0]
        assert mask[:, :seam].any() and mask[:, seam:].any(), (k, found.boxes[k])  # one mask across the seam
        others = np.delete(np.arange(len(found)), k)
        a = found.boxes[others]
        inter = (np.minimum(a[:, 2], x2) - np.maximum(a[:, 0], x1)).clip(0) * (
            np.minimum(a[:, 3], y2) - np.maximum(a[:, 1], y1)
        ).clip(0)
        smaller = np.minimum((a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]), (x2 - x1) * (y2 - y1))
        piece = (np.abs(a[:, 2] - seam) < 3) | (np.abs(a[:, 0] - seam) < 3)  # a box cut at this seam
        if merge == "nms":  # (greedy_nmm's grown boxes may come to overlap a neighbour: SAHI's semantics)
            assert not (piece & (inter / smaller >= 0.5)).any(), (k, found.boxes[k])  # no second, cut one
    assert cut >= 3
