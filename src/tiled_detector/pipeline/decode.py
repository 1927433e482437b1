"""Decoding detector outputs into flat per-batch detections, fully vectorised over the batch.

Confidence threshold and per-image top-k run first (on (B, A) scores), so nothing pairwise ever sees the
candidate flood. Boxes stay in model-input pixels; `TilePlan.to_frame` maps them to the frame. Which layout the
outputs are in is `pipeline.layouts`' to tell.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from tiled_detector.pipeline import gfl
from tiled_detector.pipeline.layouts import (
    KEYPOINT_LAYOUTS,
    OBB_END2END_COLUMNS,
    YOLOX_STRIDES,
    OutputLayout,
    anchor_points,
    detect_layout,
    efficient_nms_names,
    main_output,
    mask_output,
    shape_of,
)


@functools.lru_cache(maxsize=16)
def _yolox_grid(input_hw: tuple[int, int], device: torch.device) -> torch.Tensor:
    """(A, 3) float32 on `device`: each anchor point's grid x, y and stride, in YOLOX's order (stride by stride,
    cells row by row: yolox/models/yolo_head.py `decode_outputs`), built once per input size and device."""
    rows = []
    for stride in YOLOX_STRIDES:
        ys, xs = torch.meshgrid(
            torch.arange(input_hw[0] // stride), torch.arange(input_hw[1] // stride), indexing="ij"
        )
        rows.append(torch.stack([xs.reshape(-1), ys.reshape(-1), torch.full_like(xs.reshape(-1), stride)], 1))
    return torch.cat(rows).float().to(device)


def yolox_boxes(raw: torch.Tensor, anchors: torch.Tensor, input_hw: tuple[int, int]) -> torch.Tensor:
    """(M, 4) cx, cy, w, h in input pixels of raw YOLOX rows (M, 4) at anchor points `anchors` (M,):
    centre = (offset + grid) x stride, size = exp(log size) x stride."""
    grid = _yolox_grid(input_hw, raw.device)[anchors]  # (M, 3)
    raw = raw.float()
    return torch.cat([(raw[:, :2] + grid[:, :2]) * grid[:, 2:], raw[:, 2:4].exp() * grid[:, 2:]], dim=1)


def yolox_decoded(head: torch.Tensor, input_hw: tuple[int, int]) -> bool:
    """Whether a YOLOX head (B, A, 5 + C) already holds boxes in input pixels (an export with
    `--decode_in_inference`) rather than raw offsets: its x column lies near the anchor points' pixel centres,
    not near the cells' offsets (0..1)."""
    grid = _yolox_grid(input_hw, head.device)
    x = head[0, :, 0].float()
    to_pixels = (x - (grid[:, 0] + 0.5) * grid[:, 2]).abs().mean()
    return bool(to_pixels < (x - 0.5).abs().mean())


class Decoded(NamedTuple):
    """Flat detections of a whole batch: boxes (M, 4) x1, y1, x2, y2 (rotated layouts: (M, 5) cx, cy, w, h, angle)
    in model-input pixels, scores (M,) float32, class_ids (M,) int64, image_index (M,) int64 (batch image each
    detection came from)."""

    boxes: torch.Tensor
    scores: torch.Tensor
    class_ids: torch.Tensor
    image_index: torch.Tensor


class Prototypes(NamedTuple):
    """What a segmentation head gives per view rather than per candidate: `values` (V, P, h, w), one set of mask
    prototypes per engine image in batch order, and `views` (V,) int64, the batch plan's view of each (None: the
    engine ran every view of the plan, in order)."""

    values: torch.Tensor
    views: torch.Tensor | None = None

    def rows(self, image_index: torch.Tensor, views: int) -> torch.Tensor:
        """The `values` row of each candidate's view (`image_index`, the plan's views; `views`: how many it has):
        fixed shapes, no host read."""
        if self.views is None:
            return image_index
        inverse = torch.zeros(views, dtype=torch.int64, device=image_index.device)
        inverse[self.views] = torch.arange(len(self.views), device=image_index.device)
        return inverse[image_index]


class PaddedDecoded(NamedTuple):
    """`Decoded` with a fixed number of rows, B * min(top_k, A): each image's top-k candidates in rank order,
    and `valid` (M,) bool marking those above the threshold. Its shapes depend only on the input shapes, so no
    host synchronisation is needed; `Decoded` equals the valid rows, in order. `extra` (M, E): each candidate's
    payload, carried with it by index (None: none); `prototypes`: a segmentation head's per-view prototypes the
    candidates' mask coefficients (`extra`) apply to (None: not a segmentation head)."""

    boxes: torch.Tensor
    scores: torch.Tensor
    class_ids: torch.Tensor
    image_index: torch.Tensor
    valid: torch.Tensor
    extra: torch.Tensor | None = None
    prototypes: Prototypes | None = None

    def compact(self) -> Decoded:
        """The valid rows (a data-dependent shape: synchronises on an accelerator)."""
        keep = self.valid.nonzero().squeeze(1)
        return Decoded(self.boxes[keep], self.scores[keep], self.class_ids[keep], self.image_index[keep])

    def take(self, index: torch.Tensor) -> PaddedDecoded:
        """The candidates at `index` (rows and their payload; the per-view prototypes as they are)."""
        rows = (t[index] for t in self[:5])
        return PaddedDecoded(*rows, None if self.extra is None else self.extra[index], self.prototypes)


def joined(parts: Sequence[PaddedDecoded]) -> PaddedDecoded:
    """The candidates of several engine calls (consecutive images of one batch) as one set (one call: as it is);
    their prototypes joined in batch order."""
    if len(parts) == 1:
        return parts[0]
    rows = (torch.cat(field) for field in zip(*(p[:5] for p in parts), strict=True))
    extra = None if parts[0].extra is None else torch.cat([p.extra for p in parts])  # type: ignore[misc]
    prototypes = None
    if parts[0].prototypes is not None:
        views = [p.prototypes.views for p in parts]  # type: ignore[union-attr]
        prototypes = Prototypes(
            torch.cat([p.prototypes.values for p in parts]),  # type: ignore[union-attr]
            None if views[0] is None else torch.cat(views),  # type: ignore[arg-type]
        )
    return PaddedDecoded(*rows, extra, prototypes)


def _select(
    conf: torch.Tensor, conf_threshold: float, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat (image, column) indices of each image's `top_k` best scores (conf: (B, A)), row-major, and whether
    each is above `conf_threshold`: fixed shapes (B * min(top_k, A),)."""
    values, columns = conf.topk(min(top_k, conf.shape[1]), dim=1)
    image = torch.arange(conf.shape[0], device=conf.device)[:, None].expand(columns.shape).reshape(-1)
    return image, columns.reshape(-1), (values > conf_threshold).reshape(-1)


def _filter_key(class_filter: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted({int(c) for c in class_filter}))


@functools.lru_cache(maxsize=64)
def _cached_mask(ids: tuple[int, ...], num_classes: int, device: torch.device) -> torch.Tensor:
    mask = torch.zeros(num_classes, dtype=torch.bool)
    mask[[i for i in ids if 0 <= i < num_classes]] = True
    return mask.to(device)  # built and copied once per (filter, class count, device), not per frame


@functools.lru_cache(maxsize=64)
def _cached_ids(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64, device=device)


def _allowed(
    class_filter: Iterable[int] | None, num_classes: int, device: torch.device
) -> torch.Tensor | None:
    """(C,) bool mask of kept classes on `device` (cached), or None for all."""
    if class_filter is None:
        return None
    return _cached_mask(_filter_key(class_filter), num_classes, device)


Thresholds = tuple[tuple[int, float], ...]


@functools.lru_cache(maxsize=64)
def _cached_thresholds(pairs: Thresholds, conf_threshold: float, device: torch.device) -> torch.Tensor:
    """(L,) float32 on `device`: the threshold of classes 0..L-2 (`conf_threshold` where not listed), and
    `conf_threshold` last, for every class beyond (built and copied once per setting and device)."""
    values = torch.full((max(c for c, _ in pairs) + 2,), float(conf_threshold), dtype=torch.float32)
    for class_id, threshold in pairs:
        values[class_id] = threshold
    return values.to(device)


def _thresholds(
    pairs: Sequence[tuple[int, float]], conf_threshold: float, device: torch.device
) -> torch.Tensor | None:
    """The per-class thresholds on `device` (`_cached_thresholds`), or None when no class has its own."""
    if not pairs:
        return None
    return _cached_thresholds(tuple((int(c), float(t)) for c, t in pairs), float(conf_threshold), device)


def _above(scores: torch.Tensor, classes: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """`scores` (any shape, float32) where above their class's threshold, else -inf."""
    limit = thresholds[classes.clamp(0, len(thresholds) - 1)]
    return scores.masked_fill(scores <= limit, float("-inf"))


def _cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    half = boxes[:, 2:] / 2
    return torch.cat([boxes[:, :2] - half, boxes[:, :2] + half], dim=1)


def _decode_raw(
    head: torch.Tensor,
    layout: OutputLayout,
    conf_threshold: float,
    top_k: int,
    class_filter: Iterable[int] | None,
    thresholds: torch.Tensor | None,
    input_hw: tuple[int, int] | None = None,
    coefficients: int = 0,
) -> PaddedDecoded:
    """YOLOv5 / YOLOX / YOLOv8 / transposed-v8 / OBB heads: best class per anchor, then threshold (the class's own,
    where `thresholds` gives them) and top-k; YOLOX's raw boxes are decoded for the kept anchors only; OBB rows keep
    cx, cy, w, h and their angle (the last row). A YOLOv8 segmentation head's last `coefficients` rows are the kept
    anchors' payload (`extra`), not classes."""
    objectness = None
    extra_of = None
    if layout is OutputLayout.YOLOV8:  # (B, 4 + C, A): reduce over the channel dimension in place
        end = head.shape[1] - coefficients
        class_scores, channel_dim = head[:, 4:end], 1
        if coefficients:
            extra_of = lambda i, a: head[i, end:, a].float()  # noqa: E731
    elif layout is OutputLayout.OBB:  # (B, 4 + C + 1, A): the angle row after the class scores
        class_scores, channel_dim = head[:, 4:-1], 1
    else:
        with_objectness = layout in (OutputLayout.YOLOV5, OutputLayout.YOLOX)
        class_scores, channel_dim = head[..., 5 if with_objectness else 4 :], 2
        # objectness >= 0: the best of (class x objectness) is the best class x objectness
        if with_objectness:
            objectness = head[..., 4].float()
    allowed = _allowed(class_filter, class_scores.shape[channel_dim], head.device)
    if allowed is not None:
        shape = [1, -1, 1] if channel_dim == 1 else [1, 1, -1]
        class_scores = class_scores.masked_fill(~allowed.view(shape), float("-inf"))
    if layout is OutputLayout.YOLOX:
        if input_hw is None or head.shape[1] != anchor_points(input_hw):
            raise ValueError(
                f"a YOLOX head has one row per anchor point of strides 8, 16, 32 "
                f"({anchor_points(input_hw) if input_hw else '?'} for input {input_hw}), "
                f"got {tuple(head.shape)}"
            )
        boxes_of = lambda i, a: yolox_boxes(gfl.rows_at(head, i, a)[:, :4], a, input_hw)  # noqa: E731
    elif layout in (OutputLayout.YOLOV8, OutputLayout.OBB):
        boxes_of = lambda i, a: head[i, :4, a]  # noqa: E731
    else:
        boxes_of = lambda i, a: gfl.rows_at(head, i, a)[:, :4]  # noqa: E731
    if channel_dim == 1:
        scores_of = lambda i, a: class_scores[i, :, a]  # noqa: E731
    else:

        def scores_of(i: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
            """The kept anchors' class scores (x objectness), as the whole head's would be."""
            rows = gfl.rows_at(head, i, a)
            scores = rows[:, 5 if objectness is not None else 4 :].float()
            scores = scores if objectness is None else scores * rows[:, 4:5].float()
            return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))

    if layout is OutputLayout.OBB:
        xyxy_of = lambda i, a: torch.cat([head[i, :4, a], head[i, -1:, a]], 1).float()  # noqa: E731
    else:
        xyxy_of = lambda i, a: _cxcywh_to_xyxy(boxes_of(i, a).float())  # noqa: E731
    best_class = None
    if thresholds is not None:  # every anchor's class is needed before the cut: the max with its index
        best, best_class = class_scores.max(dim=channel_dim)
        conf = best.float()
    else:
        conf = class_scores.amax(dim=channel_dim).float()  # exact in any float dtype
    # (an anchor of objectness 0 whose classes are all filtered out: nan, not kept)
    if objectness is not None:
        conf = (conf * objectness).nan_to_num(nan=float("-inf"))
    return _pick(conf, best_class, scores_of, xyxy_of, conf_threshold, top_k, thresholds, extra_of)


Rows = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (image, anchor) indices -> (M, D) values


def _pick(
    conf: torch.Tensor,
    best_class: torch.Tensor | None,
    scores_of: Rows,
    boxes_of: Rows,
    conf_threshold: float,
    top_k: int,
    thresholds: torch.Tensor | None,
    extra_of: Rows | None = None,
) -> PaddedDecoded:
    """Each image's top-k anchors of `conf` (B, A) above the threshold (the class's own, with `thresholds` and
    every anchor's `best_class`), their boxes (`boxes_of`: x1, y1, x2, y2 rows) and classes (`best_class`, else the
    argmax of `scores_of` for the kept anchors only: a max with indices over every anchor is slow on CPUs; argmax,
    like max, takes the first of equal scores), and their payload (`extra_of`, None: none)."""
    if thresholds is not None:
        image, anchor, valid = _select(_above(conf, best_class, thresholds), float("-inf"), top_k)
    else:
        image, anchor, valid = _select(conf, conf_threshold, top_k)
    classes = best_class[image, anchor] if best_class is not None else scores_of(image, anchor).argmax(dim=1)
    extra = None if extra_of is None else extra_of(image, anchor)
    return PaddedDecoded(boxes_of(image, anchor), conf[image, anchor], classes, image, valid, extra)


@functools.lru_cache(maxsize=16)
def _gfl_head(
    shapes: tuple[tuple[str, tuple[int, ...]], ...], input_hw: tuple[int, int], num_classes: int | None
) -> gfl.GflHead:
    """The GFL head of outputs of these shapes (past the batch), read once per shapes, input and class count."""
    return gfl.gfl_head({n: (1, *s) for n, s in shapes}, input_hw, num_classes)


def _decode_gfl(
    outputs: Mapping[str, torch.Tensor],
    head: gfl.GflHead,
    conf_threshold: float,
    top_k: int,
    class_filter: Iterable[int] | None,
    thresholds: torch.Tensor | None,
    input_hw: tuple[int, int],
) -> PaddedDecoded:
    """A GFL head: the best class per anchor (its score as exported, already sigmoid) over every stride's part,
    threshold and top-k, then the kept anchors' boxes (`gfl.boxes`)."""
    columns = gfl.part_values(outputs, head.scores)
    parts = [tensor[..., first:end] for tensor, (first, end) in columns]
    allowed = _allowed(class_filter, head.classes, parts[0].device)
    if allowed is not None:
        parts = [p.masked_fill(~allowed, float("-inf")) for p in parts]
        columns = [(p, (0, head.classes)) for p in parts]
    boxes_of = lambda i, a: gfl.boxes(outputs, head, i, a, input_hw)  # noqa: E731
    scores_of = lambda i, a: gfl.gather(columns, i, a)  # noqa: E731
    if thresholds is not None:
        best = [p.max(dim=2) for p in parts]
        conf = torch.cat([b.values for b in best], dim=1).float()
        best_class = torch.cat([b.indices for b in best], dim=1)
        return _pick(conf, best_class, scores_of, boxes_of, conf_threshold, top_k, thresholds)
    conf = torch.cat([p.amax(dim=2) for p in parts], dim=1).float()
    return _pick(conf, None, scores_of, boxes_of, conf_threshold, top_k, None)


def _decode_nms_done(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    classes: torch.Tensor,
    conf_threshold: float,
    top_k: int,
    class_filter: Iterable[int] | None,
    thresholds: torch.Tensor | None,
    extra: torch.Tensor | None = None,
) -> PaddedDecoded:
    """Heads that already ran NMS (x1, y1, x2, y2 boxes (B, K, 4), scores and classes (B, K); `extra` (B, K, E):
    each row's payload, or None)."""
    scores = scores.float()
    classes = classes.long()
    if class_filter is not None:
        ids = _cached_ids(_filter_key(class_filter), classes.device)
        scores = scores.masked_fill(~torch.isin(classes, ids), float("-inf"))
    if thresholds is not None:
        scores, conf_threshold = _above(scores, classes, thresholds), float("-inf")
    image, row, valid = _select(scores, conf_threshold, top_k)
    taken = None if extra is None else extra[image, row].float()
    return PaddedDecoded(
        boxes[image, row].float(), scores[image, row], classes[image, row], image, valid, taken
    )


def decode_outputs(
    outputs: Mapping[str, torch.Tensor], layout: str | OutputLayout, *args: Any, **kwargs: Any
) -> Decoded:
    """Decode engine outputs (name -> tensor, batch first) into flat detections on the outputs' device: the valid
    rows of `decode_padded`, which takes the same arguments."""
    return decode_padded(outputs, layout, *args, **kwargs).compact()


def decode_padded(
    outputs: Mapping[str, torch.Tensor],
    layout: str | OutputLayout,
    conf_threshold: float,
    top_k: int,
    class_filter: Iterable[int] | None = None,
    num_classes: int | None = None,
    class_thresholds: Sequence[tuple[int, float]] = (),
    input_hw: tuple[int, int] | None = None,
) -> PaddedDecoded:
    """Decode engine outputs (name -> tensor, batch first) into fixed-size candidates on the outputs' device,
    with no host synchronisation (invalid rows are masked, not removed); `input_hw` (the model input's height and
    width) places YOLOX's and GFL heads' anchor points.

    Rotated layouts (`ROTATED_LAYOUTS`) give (M, 5) boxes cx, cy, w, h, angle as the model wrote them (degenerate
    ones included: `postprocess` drops and counts them). Keeps, per image, the `top_k` highest scores above
    `conf_threshold` (strictly, like ultralytics), or above
    their class's own threshold where `class_thresholds` ((class id, threshold) pairs) lists one: a candidate
    below it never takes a top-k place; `class_filter` keeps only those class ids (a raw head then picks each
    anchor's best allowed class).
    YOLOv5 and YOLOX scores are objectness * class score (in float32). Raw heads take the per-anchor class maximum in
    the output's dtype (exact) and convert only the result, so fp16 outputs are never copied whole.
    A segmentation head (YOLOv8 or end-to-end rows with mask coefficients, `mask_output`): each candidate's
    coefficients are its `extra`, and the prototypes of every image its `prototypes` (the output itself).
    """
    if top_k <= 0:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    chosen = detect_layout(outputs, num_classes, layout, input_hw)
    thresholds = _thresholds(class_thresholds, conf_threshold, next(iter(outputs.values())).device)
    if chosen is OutputLayout.EFFICIENT_NMS:
        names = efficient_nms_names(outputs)
        if names is None:
            raise ValueError(
                f"EfficientNMS needs num_detections/boxes/scores/classes outputs, got {list(outputs)}"
            )
        scores = outputs[names["score"]]
        valid = torch.arange(scores.shape[1], device=scores.device) < outputs[names["num"]].reshape(-1, 1)
        scores = scores.float().masked_fill(~valid, float("-inf"))
        return _decode_nms_done(
            outputs[names["box"]],
            scores,
            outputs[names["class"]],
            conf_threshold,
            top_k,
            class_filter,
            thresholds,
        )
    if chosen is OutputLayout.GFL:
        if input_hw is None:
            raise ValueError("a GFL head's anchor points need the model input's size (input_hw)")
        head = _gfl_head(tuple((n, shape_of(v)[1:]) for n, v in outputs.items()), input_hw, num_classes)
        return _decode_gfl(outputs, head, conf_threshold, top_k, class_filter, thresholds, input_hw)
    head = outputs[main_output(outputs)]
    if chosen is OutputLayout.OBB_END2END:
        if head.shape[-1] != OBB_END2END_COLUMNS:
            raise ValueError(
                f"obb_end2end rows are cx, cy, w, h, score, class, angle (7 columns), got {tuple(head.shape)}"
            )
        return _decode_nms_done(
            torch.cat([head[..., :4], head[..., 6:7]], -1),  # no list index: it would copy to the device
            head[..., 4],
            head[..., 5],
            conf_threshold,
            top_k,
            class_filter,
            thresholds,
        )
    if chosen in KEYPOINT_LAYOUTS:
        return _decode_pose(head, chosen, conf_threshold, top_k, class_filter, num_classes, thresholds)
    masks = mask_output(outputs)
    coefficients = 0 if masks is None else int(outputs[masks].shape[1])
    if chosen is OutputLayout.END2END:
        found = _decode_nms_done(
            head[..., :4],
            head[..., 4],
            head[..., 5],
            conf_threshold,
            top_k,
            class_filter,
            thresholds,
            head[..., 6 : 6 + coefficients] if coefficients else None,
        )
    else:
        coefficients = coefficients if chosen is OutputLayout.YOLOV8 else 0
        found = _decode_raw(
            head, chosen, conf_threshold, top_k, class_filter, thresholds, input_hw, coefficients
        )
    if found.extra is None:
        return found
    return found._replace(prototypes=Prototypes(outputs[masks]))  # type: ignore[index]


def _decode_pose(
    head: torch.Tensor,
    layout: OutputLayout,
    conf_threshold: float,
    top_k: int,
    class_filter: Iterable[int] | None,
    num_classes: int | None,
    thresholds: torch.Tensor | None,
) -> PaddedDecoded:
    """A pose head: YOLOv8's rows (the rows after the `num_classes` class scores are the joints) or end-to-end rows
    (the columns after the sixth); each kept candidate's joint columns (K x D, input pixels) are its `extra`."""
    if layout is OutputLayout.POSE_END2END:
        extra = head[..., 6:]
        return _decode_nms_done(
            head[..., :4], head[..., 4], head[..., 5], conf_threshold, top_k, class_filter, thresholds, extra
        )
    if num_classes is None:
        raise ValueError(f"a pose head {tuple(head.shape)} needs its class count to tell classes from joints")
    columns = head.shape[1] - 4 - num_classes
    return _decode_raw(
        head, OutputLayout.YOLOV8, conf_threshold, top_k, class_filter, thresholds, None, columns
    )
