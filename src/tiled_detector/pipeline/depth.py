"""Positions from an aligned depth image: per detection a robust depth, and its box back-projected through the
camera matrix, on the engine's device inside the frame program (fixed shapes, no host read: capturable).

The depth image is registered to the colour camera (each depth pixel lies on the colour pixel at the same
relative position; it may have another size, but not another aspect ratio). Per box, `SAMPLES` x `SAMPLES`
depths on a grid over the inner part of the box (`INNER` of its width and height about its centre, scaled to the
depth image); holes (0, NaN) and depths outside [depth_min, depth_max] are invalid. The valid depths go into a
histogram of log depth (`BIN` wide bins) whose runs of occupied bins are clusters: a surface's depths are dense,
while the background beside a small object, or an occluder before it, is a jump away (an empty bin). The object
is the nearest cluster holding at least `SHARE` of the valid depths: its depth the mean of that cluster's depths,
its depth extent `EXTENT` standard deviations of them (the extent of depths spread evenly: a surface receding
from the camera). Its centre and its width and height back-project with the camera matrix:
X = (u - cx) Z / fx, Y = (v - cy) Z / fy, in the optical frame (x right, y down, z forward), metres. A box with
fewer than `MIN_VALID` of its samples valid, or no such cluster, has no position.

A detection with an instance mask (`RowMasks`, a segmentation model's) takes its depths from its mask's pixels
instead: the grid covers its whole box, and only the samples on the mask count (a thin or hollow object's box is
mostly what lies behind it; `MIN_VALID` of those must be valid); a mask with fewer than `MASK_SAMPLES` of the grid's
points on it falls back to the box's inner part.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from tiled_detector.pipeline import rotated

SAMPLES = 12  # depths per side of the grid over a box's inner part
INNER = 0.5  # the sampled part of a box: this fraction of its width and height, about its centre
BIN = 0.04  # the depth histogram's bins: each this fraction of its depth wide (log-spaced); a run of occupied
# bins is one surface, an empty bin between two separates them (a jump of 4-8 % of the depth)
BINNED = 0.01  # metres: the histogram starts here (or at depth_min); nearer valid depths are in its first bin
HOLE = 1e-6  # metres: depths at or below are holes whatever depth_min is
SHARE = 0.2  # the object: the nearest cluster holding at least this fraction of the box's valid depths
MIN_VALID = 0.1  # a box needs at least this fraction of its samples valid
MASK_SAMPLES = 8  # a mask with fewer of its box's grid points on it gives way to the box's inner part
EXTENT = math.sqrt(12.0)  # depth extent per standard deviation: that of depths spread evenly over the extent
ASPECT_TOLERANCE = 0.01  # relative difference of aspect ratios still taken as the same
COLUMNS = 7  # x, y, z, size x, size y, size z (metres, optical frame), valid


class DepthError(ValueError):
    """A depth image or camera matrix that cannot give positions; the text says why in one line."""


@dataclass(frozen=True)
class Intrinsics:
    """The colour camera's pinhole matrix: focal lengths and principal point in pixels (pixel centres at integer
    coordinates, as ROS's CameraInfo has them), for images of `width` x `height` (0: whatever size comes)."""

    fx: float
    fy: float
    cx: float
    cy: float
    width: int = 0
    height: int = 0

    def __post_init__(self) -> None:
        values = (self.fx, self.fy, self.cx, self.cy)
        if not all(math.isfinite(v) for v in values):
            raise DepthError(f"camera matrix has a value that is not finite: fx, fy, cx, cy = {values}")
        if not (self.fx > 0 and self.fy > 0):
            raise DepthError(
                f"camera matrix has a zero or negative focal length: fx {self.fx:g}, fy {self.fy:g}"
            )

    def for_frame(self, height: int, width: int) -> Intrinsics:
        """The matrix for frames of this size: as it is when it was made for that size (or no size), scaled when
        the frames have another size of the same aspect ratio; DepthError for another aspect ratio."""
        if not self.width or not self.height or (self.width, self.height) == (width, height):
            return self
        problem = aspect_problem((self.height, self.width), (height, width), "the camera info")
        if problem:
            raise DepthError(problem)
        sx, sy = width / self.width, height / self.height
        # pixel centres sit at integer coordinates: scale the edges (centre + 0.5), not the centres
        return Intrinsics(
            self.fx * sx, self.fy * sy, (self.cx + 0.5) * sx - 0.5, (self.cy + 0.5) * sy - 0.5, width, height
        )


def aspect_problem(
    frame_hw: tuple[int, int], other_hw: tuple[int, int], what: str = "the depth image"
) -> str | None:
    """Why an image of `other_hw` is not aligned with colour frames of `frame_hw` (another aspect ratio), or None."""
    (h, w), (oh, ow) = frame_hw, other_hw
    if min(h, w, oh, ow) <= 0:
        return f"{what} is empty ({ow}x{oh})"
    if abs((ow / oh) / (w / h) - 1.0) > ASPECT_TOLERANCE:
        return (
            f"{what} ({ow}x{oh}) has another aspect ratio than the {w}x{h} colour frames: it is not aligned "
            "(registered) to the colour camera"
        )
    return None


class RowMasks(NamedTuple):
    """The rows' instance masks, as the masks stage made them: per row its box in label pixels (R, 4) x0, y0, x1,
    y1 (end exclusive; empty: no mask), where its bits start (R,) and every row's bits (row-major in its box), at
    `scale` of the frame's pixels."""

    boxes: torch.Tensor
    starts: torch.Tensor
    bits: torch.Tensor
    scale: float


class DepthImage(NamedTuple):
    """One colour frame's aligned depth: (H, W) uint16 (units of depth_scale metres; 16UC1) or float32 (metres;
    32FC1), a numpy array or a tensor (in the frame program: on the engine's device), and the colour camera's
    matrix (in the frame program: for that frame's size)."""

    image: np.ndarray | torch.Tensor
    intrinsics: Intrinsics


def depth_tensor(depth: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A depth image as an (H, W) uint16 or float32 tensor (a view where possible); DepthError for anything
    else."""
    tensor = depth
    if isinstance(depth, np.ndarray):
        with warnings.catch_warnings():  # a read-only buffer (a message's) is only read here
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(np.ascontiguousarray(depth))
    if not isinstance(tensor, torch.Tensor):
        raise DepthError(f"a depth image must be a numpy array or a torch tensor, got {type(depth).__name__}")
    if tensor.dim() == 3 and tensor.shape[2] == 1:
        tensor = tensor[..., 0]
    if tensor.dim() != 2 or tensor.dtype not in (torch.uint16, torch.float32) or not tensor.numel():
        raise DepthError(
            f"a depth image must be (H, W) uint16 (16UC1) or float32 (32FC1), got {tuple(tensor.shape)} "
            f"{tensor.dtype}"
        )
    return tensor.contiguous()


def aligned(depth: DepthImage, frame_hw: tuple[int, int]) -> DepthImage:
    """`depth` for a colour frame of `frame_hw`: its image as a tensor (`depth_tensor`) and the camera matrix for
    that size (`Intrinsics.for_frame`); DepthError when the image or the matrix is not for frames of that aspect
    ratio."""
    image = depth_tensor(depth.image)
    problem = aspect_problem(frame_hw, (int(image.shape[0]), int(image.shape[1])))
    if problem:
        raise DepthError(problem)
    return DepthImage(image, depth.intrinsics.for_frame(*frame_hw))


def _grid(device: torch.device, inner: float = INNER) -> torch.Tensor:
    """(SAMPLES,) offsets of the grid's points from a box's centre, in box widths (over `inner` of it)."""
    return ((torch.arange(SAMPLES, device=device, dtype=torch.float32) + 0.5) / SAMPLES - 0.5) * inner


def _points(rows: torch.Tensor, inner: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, SAMPLES) x and y of every row's grid over `inner` of its box, frame pixels."""
    grid = _grid(rows.device, inner)
    centre = (rows[:, :2] + rows[:, 2:4]) / 2
    extent = rows[:, 2:4] - rows[:, :2]
    return centre[:, 0:1] + grid[None] * extent[:, 0:1], centre[:, 1:2] + grid[None] * extent[:, 1:2]


def _on_mask(masks: RowMasks, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(R, SAMPLES^2) whether each point of every row's grid (x, y (R, SAMPLES) frame pixels) is on its mask."""
    lx = (x * masks.scale).floor().long()[:, None, :]  # (R, 1, S): columns
    ly = (y * masks.scale).floor().long()[:, :, None]  # (R, S, 1): lines
    box = masks.boxes.long()
    x0, y0, x1, y1 = (box[:, k, None, None] for k in range(4))
    inside = (lx >= x0) & (lx < x1) & (ly >= y0) & (ly < y1)
    index = masks.starts[:, None, None] + (ly - y0) * (x1 - x0) + (lx - x0)
    index = torch.where(inside, index, 0).clamp(0, max(len(masks.bits) - 1, 0)).reshape(len(box), -1)
    taken = masks.bits[index] if len(masks.bits) else torch.zeros_like(index, dtype=torch.bool)
    return inside.reshape(len(box), -1) & taken


def _samples(
    rows: torch.Tensor,
    frame_hw: tuple[int, int],
    image: torch.Tensor,
    scale: float,
    obb: torch.Tensor | None = None,
    inner: float = INNER,
) -> torch.Tensor:
    """(R, SAMPLES^2) float32 metres: the depths of every row's grid (over `inner` of its box) read from one frame's
    depth image (with rotated boxes `obb` (R, 5), the grid turned with each rectangle: depth pixels inside the
    rotated box)."""
    height, width = frame_hw
    dh, dw = image.shape
    if obb is not None:
        grid = _grid(rows.device, inner)
        along_h, along_w = torch.meshgrid(grid, grid, indexing="ij")
        points = rotated.inner_points(obb.float(), along_w.reshape(-1), along_h.reshape(-1))
        u = (points[..., 0] * (dw / width)).floor().clamp(0, dw - 1).long()
        v = (points[..., 1] * (dh / height)).floor().clamp(0, dh - 1).long()
        index = v * dw + u
    else:
        x, y = _points(rows, inner)
        u = (x * (dw / width)).floor().clamp(0, dw - 1).long()
        v = (y * (dh / height)).floor().clamp(0, dh - 1).long()
        index = (v[:, :, None] * dw + u[:, None, :]).reshape(len(rows), SAMPLES * SAMPLES)
    flat = image.reshape(-1)
    if image.dtype == torch.uint16:  # gathered as int16 (uint16 has no indexing), read back unsigned
        return (flat.view(torch.int16)[index].to(torch.int32) & 0xFFFF).float() * scale
    return flat[index]


def locate(
    rows: torch.Tensor,
    frames_hw: Sequence[tuple[int, int]],
    depths: Sequence[DepthImage | None],
    depth_scale: float,
    depth_min: float,
    depth_max: float,
    obb: torch.Tensor | None = None,
    masks: RowMasks | None = None,
) -> torch.Tensor:
    """(R, COLUMNS) positions of packed result rows (x1, y1, x2, y2 in frame pixels in columns 0-3, the frame
    index in column 7; the status row too, which gets nothing): x, y, z, size x, size y, size z, valid (module
    docstring). Frames whose depth is None, and rows without a valid depth, are 0 with valid 0. With `obb`
    (R, 5), the rows' rotated boxes: the depth is read inside each rotated box (its sizes stay its hull's). With
    `masks` (the first rows' instance masks), a masked row's depth from its mask's pixels."""
    count, device = len(rows), rows.device
    found = torch.zeros((count, SAMPLES * SAMPLES), dtype=torch.float32, device=device)
    on = None
    if (
        masks is not None
    ):  # the whole box's grid, the samples on the mask (too few on it: the box's inner part)
        on = torch.zeros((count, SAMPLES * SAMPLES), dtype=torch.bool, device=device)
        mine = len(masks.boxes)
        on[:mine] = _on_mask(masks, *_points(rows[:mine], 1.0))
        on &= (on.sum(dim=1) >= MASK_SAMPLES)[:, None]
    # per row its frame's fx, fy, cx, cy (scalars into kernels: nothing is copied to the device)
    fx, fy, cx, cy = (torch.ones(count, dtype=torch.float32, device=device) for _ in range(4))
    usable = torch.zeros(count, dtype=torch.bool, device=device)
    for k, (frame_hw, depth) in enumerate(zip(frames_hw, depths, strict=True)):
        if depth is None:
            continue
        mine = rows[:, 7] == k
        taken = _samples(rows, frame_hw, depth.image, depth_scale, obb)
        if on is not None:
            whole = _samples(rows, frame_hw, depth.image, depth_scale, obb, 1.0)
            masked = on.any(dim=1, keepdim=True)
            taken = torch.where(masked, torch.where(on, whole, float("nan")), taken)
        found = torch.where(mine[:, None], taken, found)
        m = depth.intrinsics
        fx, fy = torch.where(mine, m.fx, fx), torch.where(mine, m.fy, fy)
        cx, cy = torch.where(mine, m.cx, cx), torch.where(mine, m.cy, cy)
        usable |= mine
    considered = None if on is None else torch.where(on.any(dim=1), on.sum(dim=1), SAMPLES * SAMPLES)
    z, spread, ok = robust_depth(found, depth_min, depth_max, considered)
    ok &= usable
    u = (rows[:, 0] + rows[:, 2]) / 2 - 0.5  # box edges -> pixel-centre coordinates
    v = (rows[:, 1] + rows[:, 3]) / 2 - 0.5
    out = torch.stack(
        [
            (u - cx) * z / fx,
            (v - cy) * z / fy,
            z,
            (rows[:, 2] - rows[:, 0]) * z / fx,
            (rows[:, 3] - rows[:, 1]) * z / fy,
            spread,
            ok.float(),
        ],
        dim=1,
    )
    return torch.where(ok[:, None], out, 0.0)


def robust_depth(
    samples: torch.Tensor, depth_min: float, depth_max: float, considered: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of (R, N) depth samples (metres; holes 0 or NaN): the object's depth, its depth extent and whether
    it has one (module docstring), from a histogram of log depths in bins `BIN` wide (sorting rows is slow on a
    CPU; a histogram is one scatter). `considered` (R,): how many of a row's samples are its object's to begin
    with (a mask's; default all N): `MIN_VALID` of them must be valid."""
    count = len(samples)
    valid = (samples >= max(depth_min, HOLE)) & (samples <= depth_max)  # (NaN compares false)
    origin, step = max(depth_min, BINNED), math.log1p(BIN)
    bins = math.floor(math.log(depth_max / origin) / step) + 1
    at = ((samples.clamp(origin, depth_max).log() - math.log(origin)) * (1.0 / step)).long()
    at = torch.where(valid, at, bins)  # invalid samples into a last bin that is dropped
    hist = torch.zeros((count, bins + 1), dtype=torch.float32, device=samples.device)
    hist = hist.scatter_add_(1, at, torch.ones_like(samples))[:, :bins]
    valid_count = valid.sum(dim=1)
    near = hist > 0  # a cluster: a run of occupied bins (numbered from the nearest)
    starts = near & ~torch.cat([near.new_zeros((count, 1)), near[:, :-1]], dim=1)
    run = torch.where(near, starts.long().cumsum(dim=1), 0)
    members = hist.new_zeros((count, bins + 1)).scatter_add_(1, run, hist)
    # (run 0 gathers the bins outside every cluster: empty, never dense)
    dense = members >= torch.clamp(SHARE * valid_count, min=1)[:, None]
    chosen = dense.byte().argmax(dim=1)  # the first dense run (0 when there is none, which is not dense)
    wanted = samples.shape[1] if considered is None else considered
    ok = dense.gather(1, chosen[:, None])[:, 0] & (valid_count >= MIN_VALID * wanted)
    inside = run == chosen[:, None]  # (R, bins): the bins of the chosen cluster
    picked = valid & inside.gather(1, at.clamp(max=bins - 1))
    taken = picked.sum(dim=1).clamp(min=1)
    z = torch.where(picked, samples, 0.0).sum(dim=1) / taken
    variance = torch.where(picked, (samples - z[:, None]).square(), 0.0).sum(dim=1) / taken
    spread = EXTENT * variance.sqrt()
    return torch.where(ok, z, 0.0), torch.where(ok, spread, 0.0), ok


def unpack_positions(host: np.ndarray, first: int, num_frames: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per frame, (M, 3) positions and (M, 3) sizes of the result rows `postprocess.unpack` gives (same rows, same
    order) from a download whose position columns start at `first`; NaN where a row has no position."""
    rows = host[:-1]
    rows = rows[rows[:, 6] > 0]
    located = rows[:, first : first + COLUMNS]
    values = np.where(located[:, 6:7] > 0, located[:, :6], np.nan).astype(np.float32)
    return [(values[rows[:, 7] == k, :3], values[rows[:, 7] == k, 3:6]) for k in range(num_frames)]
