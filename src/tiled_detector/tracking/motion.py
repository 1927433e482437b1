"""Camera motion between a camera's consecutive frames (global motion compensation, as BoT-SORT's GMC), estimated
from the frames themselves on the engine's device.

The estimate (`estimate`): each frame becomes a small grey thumbnail (one channel, average-pooled to about
`THUMB_PX` on its long side: `thumbnail`); the previous and the current thumbnail are cut into a grid of `PATCH` x
`PATCH` patches, each patch's shift is found by phase correlation (one batched FFT; sub-pixel by a parabola through
the peak), and a similarity (scale, rotation, translation) is fitted to the patch shifts by weighted least squares,
reweighted `REFITS` times to set aside the patches that disagree (objects that move on their own). Fixed shapes and
no branch on the data: the same kernels every frame, and no host sync until the caller reads the result (the
stream reads it after the frame's one download, when the device has finished).

A frame's estimate falls back to the identity (and is counted) when fewer than `MIN_PATCHES` patches have a clear
peak (low texture, a cut to another scene, a covered lens), when fewer than half of those agree with the fit, or
when the motion is implausible for one frame (scale outside `SCALE_RANGE`, rotation above `MAX_ROTATION_DEG`, a
shift above `MAX_SHIFT` of the frame). An estimate that moves the frame's corners by `STILL_PX` or less (mean) is the
identity (a still camera's estimate is noise of ~0.2 px: with it, a still camera's output is the same as without
compensation).

A frame whose thumbnail holds fewer than `MIN_PATCHES` patches (a thin 3840 x 480 strip keeps them by a smaller
thumbnail scale; a 64 x 48 frame cannot) is not estimated: the identity, counted as a fallback.

State (`CameraMotion`): one camera's last thumbnail and its frame size, and the last estimate (the motion the next
frame is predicted to have: the schedule plans a frame before its own motion is measured); the stream holds one per
camera and starts it over with the camera's other state over time (`stream.py`). The box geometry that uses the
motion is numpy (`tracking.geometry`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from tiled_detector.runtime.devices import cuda_graph
from tiled_detector.settings.options import Option
from tiled_detector.tracking.geometry import corner_error

THUMB_PX = 480  # the thumbnail's long side, about
PATCH = 64  # phase-correlation patches (thumbnail pixels); a patch follows shifts up to half of it
MIN_PEAK = 0.06  # a patch's correlation peak (of 1) above which it counts as textured
MIN_PATCHES = 6
REFITS = 2
INLIER_PX = 1.5  # thumbnail pixels: a patch's shift within this of the fit agrees with it
SCALE_RANGE = (0.8, 1.25)
MAX_ROTATION_DEG = 10.0
MAX_SHIFT = 0.25  # of the frame's long side, per frame
# an estimate that moves the frame's corners by this or less (mean) is a still camera (its noise: ~0.2 px)
STILL_PX = 0.5


class MotionCompensation(Option):
    """Whether the stream compensates the camera's own motion."""

    NONE = "none"
    IMAGE = "image"


IDENTITY = np.eye(3)[:2]


def thumbnail(frame: torch.Tensor) -> torch.Tensor:
    """(h, w) float32 on the frame's device: one channel of an (H, W, C) frame (the second, green in RGB / BGR),
    every other pixel, average-pooled to about `THUMB_PX` on the long side (`thumb_factor`)."""
    factor = thumb_factor(frame.shape[0], frame.shape[1])
    step = 2 if factor % 2 == 0 else 1
    height, width = frame.shape[0] // factor * factor, frame.shape[1] // factor * factor
    channel = frame[:height:step, :width:step, min(1, frame.shape[2] - 1)].float()
    return torch.nn.functional.avg_pool2d(channel[None, None], factor // step)[0, 0]


def thumb_factor(height: int, width: int) -> int:
    """Frame pixels per thumbnail pixel: about `THUMB_PX` on the long side, but a thin frame's short side keeps a
    patch's height where it can (a 3840 x 480 frame: 7, not 8)."""
    return max(1, min(round(max(height, width) / THUMB_PX), min(height, width) // PATCH))


def patch_count(height: int, width: int) -> int:
    """How many patches a thumbnail of this size is cut into (`_patches`)."""
    stride = PATCH // 2
    rows, cols = (height - PATCH) // stride + 1, (width - PATCH) // stride + 1
    return max(rows, 0) * max(cols, 0)


def _hann(size: int, device: torch.device) -> torch.Tensor:
    window = torch.hann_window(size, periodic=False, device=device)
    return window[:, None] * window[None, :]


def _patches(thumb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The thumbnail's patches (K, PATCH, PATCH), half-overlapping, centred on the thumbnail, and their centres
    (K, 2) x, y."""
    stride = PATCH // 2
    rows, cols = (thumb.shape[0] - PATCH) // stride + 1, (thumb.shape[1] - PATCH) // stride + 1
    top = (thumb.shape[0] - (rows - 1) * stride - PATCH) // 2
    left = (thumb.shape[1] - (cols - 1) * stride - PATCH) // 2
    patches = thumb[top:, left:].unfold(0, PATCH, stride).unfold(1, PATCH, stride)[:rows, :cols]
    ys, xs = torch.meshgrid(
        torch.arange(rows, device=thumb.device), torch.arange(cols, device=thumb.device), indexing="ij"
    )
    centres = torch.stack([left + xs * stride + PATCH / 2, top + ys * stride + PATCH / 2], dim=-1)
    return patches.reshape(-1, PATCH, PATCH), centres.reshape(-1, 2).float()


def patch_shifts(
    previous: torch.Tensor, current: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per patch of the two thumbnails: its centre (K, 2), the shift of its content from `previous` to `current`
    (K, 2) x, y in thumbnail pixels (phase correlation, sub-pixel) and the correlation peak (K,) (0..1)."""
    before, centres = _patches(previous)
    after, _ = _patches(current)
    window = _hann(PATCH, previous.device)

    def spectrum(patches: torch.Tensor) -> torch.Tensor:
        centred = patches - patches.mean(dim=(1, 2), keepdim=True)
        return torch.fft.rfft2(centred * window)

    cross = spectrum(after) * spectrum(before).conj()
    surface = torch.fft.irfft2(cross / cross.abs().clamp_min(1e-6), s=(PATCH, PATCH))  # (K, P, P)
    flat = surface.reshape(len(surface), -1)
    peak, where = flat.max(dim=1)
    y, x = where // PATCH, where % PATCH
    rows = torch.arange(len(surface), device=surface.device)

    def offset(minus: torch.Tensor, plus: torch.Tensor) -> torch.Tensor:
        """The peak's sub-pixel offset from its neighbours, for phase correlation's sinc-shaped peak (Foroosh,
        Zerubia and Berthod, 2002): p / (p + peak) towards the larger neighbour p."""
        minus, plus = minus.clamp_min(0), plus.clamp_min(0)
        return torch.where(plus >= minus, plus / (plus + peak), -minus / (minus + peak))

    dx = offset(surface[rows, y, (x - 1) % PATCH], surface[rows, y, (x + 1) % PATCH])
    dy = offset(surface[rows, (y - 1) % PATCH, x], surface[rows, (y + 1) % PATCH, x])
    wrap = lambda v: (v + PATCH // 2) % PATCH - PATCH // 2  # noqa: E731 - shifts past half a patch are negative
    shifts = torch.stack([wrap(x).float() + dx, wrap(y).float() + dy], dim=1)
    return centres, shifts, peak


def fit_similarity(
    centres: torch.Tensor, shifts: torch.Tensor, peak: torch.Tensor, size_hw: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The similarity (2, 3) that moves `centres` by `shifts`, and whether it passes the module's checks.

    Thumbnail pixels, float64; least squares weighted by the peaks of the textured patches and reweighted `REFITS`
    times (patches off the fit by more than `INLIER_PX` set aside); the checks' result is a 0-d bool tensor."""
    # the centre as python numbers: no host-to-device copy (the estimate is captured as a CUDA graph)
    ox, oy = size_hw[1] / 2, size_hw[0] / 2
    x, y = centres[:, 0].double() - ox, centres[:, 1].double() - oy
    one, zero = torch.ones_like(x), torch.zeros_like(x)
    # shift = [[s - 1, -r], [r, s - 1]] (x, y) + (tx, ty): linear in (s - 1, r, tx, ty)
    # (K, 2, 4)
    design = torch.stack([torch.stack([x, -y, one, zero], 1), torch.stack([y, x, zero, one], 1)], 1)
    target = shifts.double()
    textured = (peak > MIN_PEAK).double()
    weight = textured * peak.double()
    for _ in range(REFITS + 1):
        w = weight[:, None, None]
        ridge = 1e-9 * torch.eye(4, device=x.device, dtype=torch.float64)
        normal = (design.transpose(1, 2) @ (w * design)).sum(0) + ridge
        rhs = (design.transpose(1, 2) @ (w * target[:, :, None])).sum(0)
        params = torch.linalg.solve_ex(normal, rhs)[0][:, 0]
        error = (target - (design @ params)).norm(dim=1)
        agree = (error < INLIER_PX).double()
        weight = textured * peak.double() * agree
    a, b, tx, ty = 1 + params[0], params[1], params[2], params[3]
    linear = torch.stack([torch.stack([a, -b]), torch.stack([b, a])])
    offset = torch.stack([tx + ox - (a * ox - b * oy), ty + oy - (b * ox + a * oy)])
    matrix = torch.cat([linear, offset[:, None]], dim=1)
    scale, angle = torch.sqrt(a * a + b * b), torch.atan2(b, a).abs()
    confident = textured.sum()
    ok = (
        (confident >= MIN_PATCHES)
        & ((textured * agree).sum() >= 0.5 * confident)
        & (scale >= SCALE_RANGE[0])
        & (scale <= SCALE_RANGE[1])
        & (angle <= math.radians(MAX_ROTATION_DEG))
        & (torch.stack([tx, ty]).abs().max() <= MAX_SHIFT * max(size_hw))
    )
    return matrix, ok


def estimate(previous: torch.Tensor, current: torch.Tensor, factor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The camera motion from the previous thumbnail's frame to the current one's, and whether it passed the checks.

    A (2, 3) float64 similarity in frame pixels (a thumbnail pixel is `factor` frame pixels) and a 0-d bool tensor,
    both on the thumbnails' device, nothing read back."""
    centres, shifts, peak = patch_shifts(previous, current)
    matrix, ok = fit_similarity(centres, shifts, peak, (previous.shape[0], previous.shape[1]))
    # frame pixel p = factor x (thumbnail pixel q + 1/2) - 1/2: conjugate the thumbnail's similarity into frames
    half = (factor - 1) / 2
    linear = matrix[:, :2]
    offset = factor * matrix[:, 2] + half - linear @ torch.full_like(matrix[:, 2], half)
    return torch.cat([linear, offset[:, None]], dim=1), ok


class _Captured:
    """`estimate` for thumbnails of one shape on a CUDA device, captured once as a CUDA graph and replayed (about a
    hundred small kernels: launched one by one they cost the host more than the device)."""

    def __init__(self, shape: tuple[int, int], device: torch.device, factor: int) -> None:
        self.previous = torch.zeros(shape, device=device)
        self.current = torch.zeros(shape, device=device)
        self.replay, self.outputs = cuda_graph(lambda: estimate(self.previous, self.current, factor))

    def __call__(self, previous: torch.Tensor, current: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.previous.copy_(previous)
        self.current.copy_(current)
        self.replay()
        return self.outputs[0].clone(), self.outputs[1].clone()  # the next camera's replay overwrites them


@dataclass(frozen=True)
class Measured:
    """A frame's camera motion: (2, 3) previous frame's pixels -> this frame's, whether it was estimated (False: the
    first frame of a camera, or after it started over) and whether the estimate failed (too few patches fit the
    frame, or its checks failed: the identity is used)."""

    matrix: np.ndarray
    estimated: bool
    fallback: bool


class Estimator:
    """`estimate` for any camera; on a CUDA device replayed from a graph captured once per thumbnail shape and
    scale (1080p and 4K frames both give 480 x 270 thumbnails). Holds no camera's state."""

    def __init__(self) -> None:
        self._captured: dict[tuple[tuple[int, int], torch.device, int], _Captured] = {}

    def __call__(
        self, previous: torch.Tensor, current: torch.Tensor, factor: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if current.device.type != "cuda":
            return estimate(previous, current, factor)
        key = ((int(current.shape[0]), int(current.shape[1])), current.device, factor)
        if key not in self._captured:
            self._captured[key] = _Captured(key[0], current.device, factor)
        return self._captured[key](previous, current)


class CameraMotion:
    """One camera's motion between its consecutive frames: the last thumbnail and its frame size, the estimate in
    flight, and the last estimate (the motion its next frame is predicted to have: the schedule plans a frame
    before its own motion is measured). Its owner starts it over (a new object) when the camera's stream breaks."""

    def __init__(self) -> None:
        self._thumb: torch.Tensor | None = None  # of the last frame measured
        self._frame_hw = (0, 0)
        self._next: tuple[torch.Tensor, tuple[int, int]] | None = None  # the frame observed, not yet measured
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.motion = IDENTITY

    def observe(self, frame: torch.Tensor, estimator: Estimator) -> None:
        """Start estimating the motion of `frame` (H, W, C, on the engine's device) against the last frame
        measured, on the device; `measured` reads it (a frame observed again before that replaces it: a retry)."""
        hw = (int(frame.shape[0]), int(frame.shape[1]))
        thumb = thumbnail(frame)
        self._next, self._pending = (thumb, hw), None
        fits = patch_count(thumb.shape[0], thumb.shape[1]) >= MIN_PATCHES
        if self._thumb is not None and self._frame_hw == hw and fits:
            self._pending = estimator(self._thumb, thumb, thumb_factor(*hw))

    def measured(self) -> Measured:
        """The motion of the frame `observe` last took (read back from the device); it becomes the last frame."""
        if self._next is None:
            raise RuntimeError("measured() without a frame observed")
        first = self._thumb is None or self._frame_hw != self._next[1]
        (self._thumb, self._frame_hw), self._next = self._next, None
        pending, self._pending = self._pending, None
        self.motion = IDENTITY
        if first:
            return Measured(IDENTITY, False, False)
        if pending is None:  # too few patches fit this frame's thumbnail
            return Measured(IDENTITY, True, True)
        matrix, ok = pending
        both = torch.cat([matrix.reshape(-1), ok.reshape(1).to(matrix.dtype)]).cpu().numpy()  # one read
        if not both[6]:
            return Measured(IDENTITY, True, True)
        matrix = both[:6].reshape(2, 3)
        if corner_error(matrix, IDENTITY, self._frame_hw) > STILL_PX:
            self.motion = matrix
        return Measured(self.motion, True, False)
