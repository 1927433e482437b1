"""Keypoints of the kept detections, fused per joint across the views of each object, on the engine's device after
the merge.

A pose head gives each candidate K joints of D values (`PaddedDecoded.extra`: x, y in model-input pixels and, where
D is 3, a visibility score; D 2: score 1). A kept detection's keypoints in frame pixels (each view's joints mapped
by its scale and offset, clipped to the frame as ultralytics clips them):

- `keeper` (`keypoint_fusion: keeper`): the kept candidate's own joints (its merge group's slot 0).
- `joints` (the default): the joints of every candidate of the same object, joint by joint. The object's candidates
  are its merge group (`postprocess.Rows.members`) and every other valid candidate of the same frame and class
  (any class with `class_agnostic`) that the kept box covers for at least `MIN_COVER` of the candidate's area and
  that scores at least `MIN_SCORE_RATIO` of its score (the seam rule's terms: the views the seam rule or nms let
  go, such as a tile that saw the object cut), each candidate given to the one kept detection it overlaps most
  (IoU). For each joint, the candidates whose view saw it whole (inside the view, at least `JOINT_MARGIN_PX`
  model-input pixels from an inner tile edge) count; where none did, all of them. Among those, the joint is the
  mean of their positions weighted by score x resolution (the view's model-input pixels per frame pixel: a tile
  at full resolution outweighs the downscaled full-frame view), and its score the mean of their scores with the
  same weights.

Fixed shapes, no host read and no loop per detection or view (one (R, M) assignment matrix and a few matrix
products), so it runs inside the captured frame program. The result is (R, K, 3) x, y, score per result row, packed
as 3 K columns of the downloaded rows (`columns`, `unpack`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from tiled_detector.pipeline.decode import PaddedDecoded
from tiled_detector.pipeline.depth import DepthImage, robust_depth
from tiled_detector.pipeline.frame_settings import KeypointFusion
from tiled_detector.pipeline.groups import area, intersection
from tiled_detector.pipeline.tiling import BatchPlan

MIN_COVER = (
    0.6  # a candidate's area the kept box must cover for it to be of the same object (the seam rule's)
)
MIN_SCORE_RATIO = 0.5  # the least score, relative to the kept detection's, of a candidate of the same object
JOINT_MARGIN_PX = (
    8.0  # model-input pixels from an inner tile edge within which a view did not see a joint whole
)


def joints_in_frame(
    found: PaddedDecoded, plan: BatchPlan, shape: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every candidate's joints in frame pixels: x, y (M, K) (unclipped), scores (M, K) (1 where D is 2) and
    whether its view saw each joint whole (M, K) bool (module docstring)."""
    assert found.extra is not None
    joints, values = shape
    raw = found.extra.float().reshape(len(found.extra), joints, values)
    tensors = plan.tensors(raw.device)
    mapping = tensors.to_frame[found.image_index]  # (M, 3, 4)
    x = raw[..., 0] * mapping[:, 0, :1] + mapping[:, 1, :1]
    y = raw[..., 1] * mapping[:, 0, 1:2] + mapping[:, 1, 1:2]
    scores = raw[..., 2] if values == 3 else torch.ones_like(x)
    view = tensors.views[found.image_index]  # (M, 4) frame pixels
    inner = tensors.inner_edges[found.image_index].float()
    margin = JOINT_MARGIN_PX * mapping[:, 0, :2].repeat(1, 2) * inner  # (M, 4) frame pixels, 0 at outer edges
    whole = (
        (x >= view[:, :1] + margin[:, :1])
        & (y >= view[:, 1:2] + margin[:, 1:2])
        & (x <= view[:, 2:3] - margin[:, 2:3])
        & (y <= view[:, 3:4] - margin[:, 3:4])
    )
    return x, y, scores, whole


def _owners(
    rows: torch.Tensor, members: torch.Tensor, found: PaddedDecoded, plan: BatchPlan, class_agnostic: bool
) -> torch.Tensor:
    """(R, M) float: 1 where candidate m is of result row r's object (module docstring), each candidate of at most
    one row."""
    count, device = len(rows), rows.device
    kept = rows[:, 6] > 0
    boxes = plan.to_frame(found.boxes.float(), found.image_index)  # (M, 4)
    frame = plan.tensors(device).frame[found.image_index]
    inter = intersection(rows[:, None, :4], boxes[None])  # (R, M)
    own = area(boxes).clamp_min(1e-6)
    iou = inter / (area(rows[:, :4])[:, None] + own[None] - inter).clamp_min(1e-6)
    same = (frame[None] == rows[:, 7].long()[:, None]) & found.valid[None] & kept[:, None]
    if not class_agnostic:
        same &= found.class_ids[None] == rows[:, 5].long()[:, None]
    eligible = same & (inter >= MIN_COVER * own[None])
    eligible &= found.scores.float()[None] >= MIN_SCORE_RATIO * rows[:, 4:5]
    best = torch.where(eligible, iou, -1.0).argmax(0)  # (M,): the row each candidate overlaps most
    owner = torch.where(eligible.any(0), best, count)
    # the merge's members are their group's, whatever they overlap
    slot = torch.where((members >= 0) & kept[:, None], members, len(owner))
    index = torch.arange(count, device=device)[:, None].expand_as(slot)
    owner = torch.cat([owner, owner.new_zeros(1)]).scatter(0, slot.reshape(-1), index.reshape(-1))[:-1]
    return (owner[None] == torch.arange(count, device=device)[:, None]).float()


def build(
    packed: torch.Tensor,
    members: torch.Tensor,
    found: PaddedDecoded,
    plan: BatchPlan,
    shape: tuple[int, int],
    fusion: KeypointFusion = KeypointFusion.JOINTS,
    class_agnostic: bool = False,
) -> torch.Tensor:
    """(R, K, 3) x, y, score of the keypoints of the result rows of `packed` (`postprocess` rows) whose merged
    candidates are `members` (rows of `found`, -1 where none), `shape` the head's (joints, values per joint), in
    frame pixels (module docstring); zeros for a row that is not a result."""
    rows = packed[: len(members)].float()
    x, y, scores, whole = joints_in_frame(found, plan, shape)
    if fusion is KeypointFusion.KEEPER or not len(members) or not len(x):
        keeper = members[:, 0].clamp_min(0) if len(members) else members.new_zeros(0)
        fused = torch.stack([x[keeper], y[keeper], scores[keeper]], -1) if len(x) else None
    else:
        owners = _owners(rows, members, found, plan, class_agnostic)
        resolution = 1.0 / plan.tensors(x.device).to_frame[found.image_index, 0, :1].clamp_min(1e-6)  # (M, 1)
        weight = scores.clamp_min(0.0) * resolution
        parts = []
        for w in (weight * whole, weight):  # the views that saw each joint whole; all of them
            sums = owners @ torch.cat([w, w * x, w * y, w * scores], 1)  # (R, 4 K)
            parts.append(sums.reshape(len(rows), 4, -1))
        seen, every = parts
        chosen = torch.where(seen[:, :1] > 0, seen, every)
        total = chosen[:, 0]
        keeper = members[:, 0].clamp_min(0)
        own = torch.stack([x[keeper], y[keeper], scores[keeper]], -1)
        ratio = chosen[:, 1:] / total[:, None].clamp_min(1e-12)  # (R, 3, K)
        fused = torch.where((total > 0)[..., None], ratio.transpose(1, 2), own)
    if fused is None:
        return rows.new_zeros((len(members), shape[0], 3))
    size = _frame_sizes(tuple((p.frame_hw[1], p.frame_hw[0]) for p in plan.plans), rows.device)
    xy = torch.minimum(
        fused[..., :2].clamp_min(0.0), size[rows[:, 7].long().clamp(0, len(size) - 1)][:, None]
    )
    fused = torch.cat([xy, fused[..., 2:]], -1)
    return torch.where((rows[:, 6] > 0)[:, None, None], fused, 0.0)


@functools.lru_cache(maxsize=64)
def _frame_sizes(sizes: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """(F, 2) float32 each frame's width and height on `device` (made once per sizes and device: before a capture,
    in its warm-up run)."""
    return torch.tensor(sizes, dtype=torch.float32, device=device).reshape(-1, 2)


def columns(keypoints: torch.Tensor) -> torch.Tensor:
    """(R, K, 3) keypoints as (R + 1, 3 K) columns for the packed rows (a zero row beside the status row)."""
    flat = keypoints.reshape(len(keypoints), keypoints.shape[1] * 3)
    return torch.cat([flat, flat.new_zeros((1, flat.shape[1]))])


def unpack(host: np.ndarray, num_frames: int, start: int, joints: int) -> list[np.ndarray]:
    """Each frame's (N, K, 3) float32 keypoints (or their positions, `locate_joints`) from the downloaded rows
    (their columns from column `start` on), in the order of `postprocess.unpack`."""
    rows = host[:-1]
    rows = rows[rows[:, 6] > 0]
    flat = rows[:, start : start + 3 * joints].astype(np.float32)
    return [flat[rows[:, 7] == k].reshape(-1, joints, 3) for k in range(num_frames)]


JOINT_WINDOW = (
    5  # depth pixels per side of the window read around a joint (its robust depth: `depth.robust_depth`)
)


def locate_joints(
    joints: torch.Tensor,
    frame: torch.Tensor,
    frames_hw: Sequence[tuple[int, int]],
    depths: Sequence[DepthImage | None],
    depth_scale: float,
    depth_min: float,
    depth_max: float,
) -> torch.Tensor:
    """(R, K, 3) positions in metres (the colour camera's optical frame) of rows' joints (R, K, 3) x, y, score in
    the pixels of frames `frame` (R,): each joint's depth from the `JOINT_WINDOW` x `JOINT_WINDOW` depth pixels
    around it (the nearest dense cluster of the valid ones, as a box's: `depth.robust_depth`), back-projected with
    its frame's camera matrix; NaN where it has none (no depth image, too few valid depths). Fixed shapes."""
    count, joints_n = joints.shape[:2]
    device = joints.device
    half = JOINT_WINDOW // 2
    steps = torch.arange(-half, half + 1, device=device)
    found = torch.zeros((count, joints_n, JOINT_WINDOW * JOINT_WINDOW), dtype=torch.float32, device=device)
    fx, fy, cx, cy = (torch.ones((count, 1), dtype=torch.float32, device=device) for _ in range(4))
    usable = torch.zeros((count, 1), dtype=torch.bool, device=device)
    for k, (frame_hw, depth) in enumerate(zip(frames_hw, depths, strict=True)):
        if depth is None:
            continue
        image = depth.image
        dh, dw = image.shape
        u = (joints[..., 0] * (dw / frame_hw[1])).floor().long()  # (R, K)
        v = (joints[..., 1] * (dh / frame_hw[0])).floor().long()
        us = (u[..., None, None] + steps[None, None, None, :]).clamp(0, dw - 1)
        vs = (v[..., None, None] + steps[None, None, :, None]).clamp(0, dh - 1)
        index = (vs * dw + us).reshape(count, joints_n, -1)
        flat = image.reshape(-1)
        if image.dtype == torch.uint16:  # gathered as int16 (uint16 has no indexing), read back unsigned
            taken = (flat.view(torch.int16)[index].to(torch.int32) & 0xFFFF).float() * depth_scale
        else:
            taken = flat[index].float()
        mine = (frame == k)[:, None]
        found = torch.where(mine[..., None], taken, found)
        m = depth.intrinsics
        fx, fy = torch.where(mine, m.fx, fx), torch.where(mine, m.fy, fy)
        cx, cy = torch.where(mine, m.cx, cx), torch.where(mine, m.cy, cy)
        usable |= mine
    z, _, ok = robust_depth(found.reshape(count * joints_n, -1), depth_min, depth_max)
    z, ok = z.reshape(count, joints_n), ok.reshape(count, joints_n) & usable
    x = (joints[..., 0] - 0.5 - cx) * z / fx  # pixel edges -> pixel-centre coordinates
    y = (joints[..., 1] - 0.5 - cy) * z / fy
    return torch.where(ok[..., None], torch.stack([x, y, z], -1), float("nan"))
