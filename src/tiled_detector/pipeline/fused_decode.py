"""`decode.decode_padded` of the raw heads in three launches: each anchor's best class and score (one Triton kernel,
the class filter and objectness folded in), torch's top-k per image, and the kept anchors' rows (one Triton kernel:
boxes in x1, y1, x2, y2 or rotated cx, cy, w, h, angle, YOLOX's grid decoded, classes, validity, a segmentation
head's coefficients). The torch decode runs a dozen small kernels for the same; it stays the reference and the
fallback (`decode_padded` here returns None for what it does not cover: per-class thresholds, end-to-end rows,
EfficientNMS and GFL heads).

Equal to the torch decode: the best score is the largest class score in the output's dtype (times objectness in
float32), its class the first of the largest (for objectness heads, of the float32 products, as `argmax` takes
them), the top-k the same `torch.topk`; YOLOX's exp is Triton's (within float32 rounding of torch's).
"""

# ruff: noqa: N803  (Triton kernels: compile-time constants and sizes are named in capitals)

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from tiled_detector.pipeline import kernels
from tiled_detector.pipeline.decode import PaddedDecoded, Prototypes, _allowed
from tiled_detector.pipeline.layouts import (
    YOLOX_STRIDES,
    OutputLayout,
    anchor_points,
    detect_layout,
    main_output,
    mask_output,
)

ANCHORS = 256  # anchors per program of the best-class kernel
GATHER = 256  # kept rows per program of the gather kernel
# layouts whose rows are anchors (B, A, D) and whether they carry objectness
ROW_LAYOUTS = {OutputLayout.YOLOV5: True, OutputLayout.YOLOX: True, OutputLayout.YOLOV8_TRANSPOSED: False}
CHANNEL_LAYOUTS = (OutputLayout.YOLOV8, OutputLayout.OBB)  # (B, D, A): classes along the channels

_found = kernels.triton()
if _found is not None:
    triton, tl = _found

    @triton.jit
    def _best_kernel(
        head_ptr,
        allowed_ptr,
        conf_ptr,
        best_ptr,
        A,
        C,
        stride_b,
        stride_c,
        stride_a,
        first,
        objectness_at,
        FILTER: tl.constexpr,
        OBJECTNESS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0)
        a = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = a < A
        row = head_ptr + b * stride_b + a * stride_a
        best = tl.full((BLOCK,), float("-inf"), tl.float32)  # the largest class score, as the output holds it
        ranked = tl.full((BLOCK,), float("-inf"), tl.float32)  # the largest score argmax compares
        best_class = tl.zeros((BLOCK,), tl.int32)
        if OBJECTNESS:
            objectness = tl.load(row + objectness_at * stride_c, mask=inside, other=0.0).to(tl.float32)
        for c in range(0, C):
            value = tl.load(row + (first + c) * stride_c, mask=inside, other=0.0).to(tl.float32)
            if FILTER:
                value = tl.where(tl.load(allowed_ptr + c) != 0, value, float("-inf"))
            score = value
            if OBJECTNESS:
                score = tl.where(value == float("-inf"), value, value * objectness)
            higher = score > ranked
            best_class = tl.where(higher, c, best_class)
            ranked = tl.where(higher, score, ranked)
            best = tl.maximum(best, value)
        conf = best
        if OBJECTNESS:
            conf = (
                best * objectness
            )  # then `nan_to_num(nan=-inf)`'s values: NaN (-inf x 0) -inf, +-inf finite
            conf = tl.where(conf == float("inf"), 3.4028234663852886e38, conf)
            conf = tl.where(conf == float("-inf"), -3.4028234663852886e38, conf)
            conf = tl.where(conf != conf, float("-inf"), conf)  # noqa: PLR0124 (NaN)
        tl.store(conf_ptr + b * A + a, conf, mask=inside)
        tl.store(best_ptr + b * A + a, best_class, mask=inside)

    @triton.jit
    def _gather_kernel(
        head_ptr,
        values_ptr,
        anchors_ptr,
        best_ptr,
        boxes_ptr,
        scores_ptr,
        classes_ptr,
        image_ptr,
        valid_ptr,
        extra_ptr,
        total,
        K,
        A,
        stride_b,
        stride_c,
        stride_a,
        threshold,
        extra_first,
        P,
        grid_w0,
        grid_n0,
        grid_w1,
        grid_n1,
        grid_w2,
        BOX_COLUMNS: tl.constexpr,
        ROTATED: tl.constexpr,
        YOLOX: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = r < total
        b = r // K
        a = tl.load(anchors_ptr + r, mask=inside, other=0)
        value = tl.load(values_ptr + r, mask=inside, other=0.0)
        row = head_ptr + b * stride_b + a * stride_a
        x = tl.load(row, mask=inside, other=0.0).to(tl.float32)
        y = tl.load(row + stride_c, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(row + 2 * stride_c, mask=inside, other=0.0).to(tl.float32)
        h = tl.load(row + 3 * stride_c, mask=inside, other=0.0).to(tl.float32)
        if YOLOX:  # the anchor's grid cell and stride (strides 8, 16, 32, cells row by row)
            level1 = a >= grid_n0
            level2 = a >= grid_n0 + grid_n1
            local = tl.where(level2, a - grid_n0 - grid_n1, tl.where(level1, a - grid_n0, a))
            width = tl.where(level2, grid_w2, tl.where(level1, grid_w1, grid_w0))
            stride = tl.where(level2, 32.0, tl.where(level1, 16.0, 8.0))
            x = (x + (local % width).to(tl.float32)) * stride
            y = (y + (local // width).to(tl.float32)) * stride
            w = tl.exp(w) * stride
            h = tl.exp(h) * stride
        out = boxes_ptr + r * BOX_COLUMNS
        if ROTATED:
            tl.store(out, x, mask=inside)
            tl.store(out + 1, y, mask=inside)
            tl.store(out + 2, w, mask=inside)
            tl.store(out + 3, h, mask=inside)
            tl.store(
                out + 4,
                tl.load(row + extra_first * stride_c, mask=inside, other=0.0).to(tl.float32),
                mask=inside,
            )
        else:
            half_w = w * 0.5  # (x / 2 exactly, without Triton's approximate division)
            half_h = h * 0.5
            tl.store(out, x - half_w, mask=inside)
            tl.store(out + 1, y - half_h, mask=inside)
            tl.store(out + 2, x + half_w, mask=inside)
            tl.store(out + 3, y + half_h, mask=inside)
        tl.store(scores_ptr + r, value, mask=inside)
        tl.store(
            classes_ptr + r, tl.load(best_ptr + b * A + a, mask=inside, other=0).to(tl.int64), mask=inside
        )
        tl.store(image_ptr + r, b.to(tl.int64), mask=inside)
        tl.store(valid_ptr + r, (value > threshold).to(tl.int1), mask=inside)
        for p in range(0, P):
            coefficient = tl.load(row + (extra_first + p) * stride_c, mask=inside, other=0.0).to(tl.float32)
            tl.store(extra_ptr + r * P + p, coefficient, mask=inside)


def decode_padded(
    outputs: Mapping[str, torch.Tensor],
    layout: str | OutputLayout,
    conf_threshold: float,
    top_k: int,
    class_filter: Iterable[int] | None = None,
    num_classes: int | None = None,
    class_thresholds: Sequence[tuple[int, float]] = (),
    input_hw: tuple[int, int] | None = None,
) -> PaddedDecoded | None:
    """`decode.decode_padded` of the same arguments through the kernels, or None where they do not cover the head
    (the caller then runs the torch decode, which also raises for bad input)."""
    if class_thresholds or top_k <= 0:
        return None
    chosen = detect_layout(outputs, num_classes, layout, input_hw)
    if chosen not in ROW_LAYOUTS and chosen not in CHANNEL_LAYOUTS:
        return None
    head = outputs[main_output(outputs)]
    if head.dim() != 3 or not kernels.enabled(head.device):
        return None
    masks = mask_output(outputs)
    coefficients = 0 if masks is None or chosen is not OutputLayout.YOLOV8 else int(outputs[masks].shape[1])
    batch = head.shape[0]
    if chosen in CHANNEL_LAYOUTS:
        anchors = head.shape[2]
        stride_b, stride_c, stride_a = head.stride()
        classes = head.shape[1] - 4 - coefficients - (1 if chosen is OutputLayout.OBB else 0)
        first, objectness_at = 4, 0
    else:
        anchors = head.shape[1]
        stride_b, stride_a, stride_c = head.stride()
        objectness = ROW_LAYOUTS[chosen]
        classes = head.shape[2] - (5 if objectness else 4)
        first, objectness_at = (5 if objectness else 4), 4
    grid = (0, 0, 0, 0, 0)
    if chosen is OutputLayout.YOLOX:
        if input_hw is None or anchors != anchor_points(input_hw):
            return None  # the torch decode says why
        w0, w1, w2 = (input_hw[1] // s for s in YOLOX_STRIDES)
        grid = (w0, w0 * (input_hw[0] // 8), w1, w1 * (input_hw[0] // 16), w2)
    if classes < 1 or anchors < 1:
        return None
    device = head.device
    allowed = _allowed(class_filter, classes, device)
    conf = torch.empty((batch, anchors), dtype=torch.float32, device=device)
    best = torch.empty((batch, anchors), dtype=torch.int32, device=device)
    _best_kernel[(batch, triton.cdiv(anchors, ANCHORS))](
        head,
        conf if allowed is None else allowed,
        conf,
        best,
        anchors,
        classes,
        stride_b,
        stride_c,
        stride_a,
        first,
        objectness_at,
        FILTER=allowed is not None,
        OBJECTNESS=chosen in ROW_LAYOUTS and ROW_LAYOUTS[chosen],
        BLOCK=ANCHORS,
        **kernels.launch_options(),
    )
    k = min(top_k, anchors)
    values, columns = conf.topk(k, dim=1)
    total = batch * k
    rotated = chosen is OutputLayout.OBB
    box_columns = 5 if rotated else 4
    boxes = torch.empty((total, box_columns), dtype=torch.float32, device=device)
    scores = torch.empty(total, dtype=torch.float32, device=device)
    class_ids = torch.empty(total, dtype=torch.int64, device=device)
    image = torch.empty(total, dtype=torch.int64, device=device)
    valid = torch.empty(total, dtype=torch.bool, device=device)
    extra = torch.empty((total, coefficients), dtype=torch.float32, device=device) if coefficients else None
    extra_first = head.shape[1] - 1 if rotated else 4 + classes
    _gather_kernel[(triton.cdiv(total, GATHER),)](
        head,
        values,
        columns,
        best,
        boxes,
        scores,
        class_ids,
        image,
        valid,
        scores if extra is None else extra,
        total,
        k,
        anchors,
        stride_b,
        stride_c,
        stride_a,
        float(conf_threshold),
        extra_first,
        coefficients,
        *grid,
        BOX_COLUMNS=box_columns,
        ROTATED=rotated,
        YOLOX=chosen is OutputLayout.YOLOX,
        BLOCK=GATHER,
        **kernels.launch_options(),
    )
    found = PaddedDecoded(boxes, scores, class_ids, image, valid, extra)
    if extra is None:
        return found
    return found._replace(prototypes=Prototypes(outputs[masks]))  # type: ignore[index]
