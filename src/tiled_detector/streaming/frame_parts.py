"""A frame run in parts (`stream.Stream` under a `view_cap`) reported as the frame run whole would be: its parts'
detections meet the seam rule across parts (`tracking.looks.across_parts`), then the merge rule over all of them (as
the frame program merges views), the best `max_detections` by score; with instance masks, a merged group's mask is
the union of its members' masks (as `pipeline.masks` makes it in a whole frame) and the label image ranks them by
score (`label_image`: the higher score wins an overlap), as a whole frame's does."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tiled_detector.geometry.polygons import corners, hulls
from tiled_detector.pipeline.merge import MergeRule, merge_padded
from tiled_detector.tracking.looks import across_parts
from tiled_detector.types import Detections, InstanceMasks


def merged(
    found: Sequence[Detections], whole: Sequence[np.ndarray], rule: MergeRule, max_detections: int
) -> Detections:
    """The detections of a frame's parts (`found`, each part's; `whole`, per part whether its part saw each box
    whole) as one frame's (module docstring); rotated boxes merge as rotated boxes, reported with their hulls."""
    boxes = np.concatenate([f.boxes for f in found])
    scores = np.concatenate([f.scores for f in found])
    class_ids = np.concatenate([f.class_ids for f in found])
    part = np.concatenate([np.full(len(f.boxes), k) for k, f in enumerate(found)])
    keep = np.flatnonzero(
        across_parts(
            boxes, scores, class_ids, np.concatenate(whole), part, class_agnostic=rule.class_agnostic
        )
    )
    rotated = found[0].obb is not None
    if rotated:
        boxes = np.concatenate([f.obb for f in found])
    out = merge_padded(
        torch.as_tensor(np.asarray(boxes[keep], np.float32)),
        torch.as_tensor(scores[keep]),
        torch.as_tensor(class_ids[keep]),
        torch.ones(len(keep), dtype=torch.bool),
        rule,
        nms_rounds=None,
        slots=None,
        use_torchvision=True,
    )
    rows = out.valid.nonzero().squeeze(1)
    boxes, scores, class_ids, members = (
        t[rows].numpy() for t in (out.boxes, out.scores, out.class_ids, out.members)
    )
    best = np.argsort(-scores, kind="stable")[:max_detections]
    timings = {k: sum(f.timings.get(k, 0.0) for f in found) for k in found[-1].timings}
    obb = boxes[best] if rotated else None
    boxes = hulls(corners(obb)) if obb is not None else boxes[best]
    masks = None
    if all(f.masks is not None for f in found):
        groups = np.where(
            members[best] >= 0, keep[members[best].clip(0)], -1
        )  # rows of the parts' detections
        masks = InstanceMasks.joined([f.masks for f in found]).merged(groups, boxes)  # type: ignore[misc]
    return Detections(boxes, scores[best], class_ids[best], timings, obb=obb, masks=masks)
