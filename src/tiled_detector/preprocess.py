"""Frame -> engine input batch on the engine's device: one upload, then tile crops and a letterboxed frame.

The raw frame crosses to the device once (through a reused pinned staging buffer on CUDA). All the rest runs
on the device: one batched gather crops all tiles (channel reorder and mono -> 3 channels folded into the same
gather), tiles past the frame border are padded with YOLO's grey (114/255), tiles are letterboxed in one
`F.interpolate` call when the tile size differs from the model input, and the full frame is resized and padded
into the last slot. Results are written in place into a batch tensor (B, 3, H, W) reused across frames.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from tiled_detector.tiling import Letterbox, TilePlan

PAD_VALUE = 114.0 / 255.0


class Encoding(str, enum.Enum):
    """Pixel encodings accepted as input (ROS sensor_msgs/Image names)."""

    RGB8 = "rgb8"
    BGR8 = "bgr8"
    RGBA8 = "rgba8"
    BGRA8 = "bgra8"
    MONO8 = "mono8"
    MONO16 = "mono16"

    @classmethod
    def from_value(cls, value: str | Encoding) -> Encoding:
        """Case-insensitive lookup that lists the valid values on error."""
        try:
            return cls(str(value.value if isinstance(value, Encoding) else value).lower())
        except ValueError:
            valid = ", ".join(e.value for e in cls)
            raise ValueError(f"unknown encoding {value!r}; expected one of: {valid}") from None

    @property
    def channels(self) -> int:
        """Channels per pixel in the raw frame."""
        return {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4}.get(self.value, 1)

    @property
    def dtype(self) -> torch.dtype:
        """Element type of the raw frame."""
        return torch.uint16 if self is Encoding.MONO16 else torch.uint8

    @property
    def rgb_order(self) -> tuple[int, int, int]:
        """Source channel of each of the model's R, G, B channels."""
        if self.channels == 1:
            return (0, 0, 0)
        return (2, 1, 0) if self.value.startswith("bgr") else (0, 1, 2)

    @property
    def scale(self) -> float:
        """Factor that maps raw values to [0, 1]."""
        return 1.0 / 65535.0 if self is Encoding.MONO16 else 1.0 / 255.0


@dataclass(frozen=True)
class _TileIndex:
    """Precomputed gather indices of one plan on one device."""

    rows: torch.Tensor  # (N, 1, th, 1) int64, clamped into the frame
    cols: torch.Tensor  # (N, 1, 1, tw) int64, clamped into the frame
    outside: torch.Tensor | None  # (N, 1, th, tw) bool, True where a tile lies past the border; None if never


def as_frame_tensor(frame: np.ndarray | torch.Tensor, encoding: str | Encoding) -> torch.Tensor:
    """View `frame` as an (H, W, C) tensor (no copy where possible) after checking it against `encoding`."""
    enc = Encoding.from_value(encoding)
    if isinstance(frame, np.ndarray):
        if any(s < 0 for s in frame.strides):
            frame = np.ascontiguousarray(frame)
        if frame.flags.writeable:
            tensor = torch.from_numpy(frame)
        else:  # read-only buffers (e.g. ROS message data) are only read here
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                tensor = torch.from_numpy(frame)
    elif isinstance(frame, torch.Tensor):
        tensor = frame
    else:
        raise TypeError(f"frame must be a numpy array or a torch tensor, got {type(frame).__name__}")
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(-1)
    if tensor.dim() != 3 or tensor.shape[2] != enc.channels or tensor.dtype != enc.dtype:
        raise ValueError(
            f"encoding {enc.value} needs an HxWx{enc.channels} {enc.dtype} frame, "
            f"got shape {tuple(frame.shape)} of {tensor.dtype}"
        )
    if tensor.shape[0] == 0 or tensor.shape[1] == 0:
        raise ValueError(f"frame must not be empty, got shape {tuple(frame.shape)}")
    return tensor


class Preprocessor:
    """Turns frames into the engine's input batch on `device` (not thread-safe: it owns reused buffers)."""

    def __init__(self, device: str | torch.device, dtype: torch.dtype, input_hw: tuple[int, int]) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.input_hw = (int(input_hw[0]), int(input_hw[1]))
        self._batch: torch.Tensor | None = None
        self._plan: TilePlan | None = None
        self._index: _TileIndex | None = None
        self._order: dict[tuple[int, int, int], torch.Tensor] = {}
        self._pinned: torch.Tensor | None = None
        self._staged: torch.Tensor | None = None
        self._uploaded: torch.cuda.Event | None = None

    def run(
        self,
        frame: np.ndarray | torch.Tensor,
        plan: TilePlan,
        encoding: str | Encoding = Encoding.RGB8,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Upload `frame`, write its tiles (+ full-frame view) into the batch and return it (B, 3, H, W)."""
        return self.prepare(self.upload(frame, encoding), plan, encoding, out)

    def upload(
        self, frame: np.ndarray | torch.Tensor, encoding: str | Encoding = Encoding.RGB8
    ) -> torch.Tensor:
        """The frame as an (H, W, C) tensor on the device: one host-to-device copy, none if already there."""
        tensor = as_frame_tensor(frame, encoding)
        if tensor.device == self.device:
            return tensor
        if self.device.type != "cuda" or tensor.device.type != "cpu":
            return tensor.to(self.device)
        if self._pinned is None or self._pinned.shape != tensor.shape or self._pinned.dtype != tensor.dtype:
            self._pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._staged = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
            self._uploaded = torch.cuda.Event()
        else:
            self._uploaded.synchronize()  # the previous frame's copy out of the pinned buffer is done
        self._pinned.copy_(tensor)
        self._staged.copy_(self._pinned, non_blocking=True)
        self._uploaded.record()
        return self._staged

    def prepare(
        self,
        frame: torch.Tensor,
        plan: TilePlan,
        encoding: str | Encoding = Encoding.RGB8,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write the tiles and the full-frame view of a device frame (H, W, C) into the batch and return it.

        `out` is a buffer to write into (e.g. an engine's bound input, at least `plan.batch_size` long);
        without it the preprocessor's own batch tensor is reused across calls.
        """
        enc = Encoding.from_value(encoding)
        frame = as_frame_tensor(frame, enc)
        if frame.device != self.device:
            raise ValueError(f"frame is on {frame.device}, the preprocessor writes on {self.device}")
        batch = self._batch_view(plan.batch_size, out)
        n_tiles = len(plan.tiles)
        order = self._channel_order(enc)
        if n_tiles:
            self._write_tiles(frame, plan, order, enc.scale, batch[:n_tiles])
        if plan.full_frame:
            self._write_full_frame(frame, plan, order, enc.scale, batch[n_tiles])
        return batch

    def _batch_view(self, batch_size: int, out: torch.Tensor | None) -> torch.Tensor:
        shape = (3, *self.input_hw)
        if out is not None:
            if out.dim() != 4 or tuple(out.shape[1:]) != shape or out.shape[0] < batch_size:
                raise ValueError(
                    f"out must be (>={batch_size}, {', '.join(map(str, shape))}), got {tuple(out.shape)}"
                )
            if out.dtype != self.dtype or out.device != self.device or not out.is_contiguous():
                raise ValueError(
                    f"out must be a contiguous {self.dtype} tensor on {self.device}, "
                    f"got {out.dtype} on {out.device}"
                )
            return out[:batch_size]
        if self._batch is None or self._batch.shape[0] != batch_size:
            self._batch = torch.empty((batch_size, *shape), dtype=self.dtype, device=self.device)
        return self._batch

    def _channel_order(self, enc: Encoding) -> torch.Tensor:
        key = enc.rgb_order
        if key not in self._order:
            self._order[key] = torch.tensor(key, dtype=torch.int64, device=self.device)
        return self._order[key]

    def _tile_index(self, plan: TilePlan, height: int, width: int) -> _TileIndex:
        if plan is self._plan and self._index is not None:
            return self._index
        tiles = torch.tensor(plan.tiles, dtype=torch.int64, device=self.device)
        tile_h = int(tiles[0, 3] - tiles[0, 1])
        tile_w = int(tiles[0, 2] - tiles[0, 0])
        rows = tiles[:, 1:2] + torch.arange(tile_h, device=self.device)  # (N, th)
        cols = tiles[:, 0:1] + torch.arange(tile_w, device=self.device)  # (N, tw)
        rows_in = (rows >= 0) & (rows < height)
        cols_in = (cols >= 0) & (cols < width)
        inside = rows_in[:, None, :, None] & cols_in[:, None, None, :]
        self._index = _TileIndex(
            rows=rows.clamp(0, height - 1)[:, None, :, None],
            cols=cols.clamp(0, width - 1)[:, None, None, :],
            outside=None if bool(inside.all()) else ~inside,
        )
        self._plan = plan
        return self._index

    def _write_tiles(
        self, frame: torch.Tensor, plan: TilePlan, order: torch.Tensor, scale: float, dst: torch.Tensor
    ) -> None:
        index = self._tile_index(plan, frame.shape[0], frame.shape[1])
        crops = frame[
            index.rows, index.cols, order[None, :, None, None]
        ]  # (N, 3, th, tw) raw dtype, one gather
        same_size = tuple(crops.shape[2:]) == self.input_hw
        tiles = dst if same_size else torch.empty(crops.shape, dtype=self.dtype, device=self.device)
        torch.mul(crops, scale, out=tiles)
        if index.outside is not None:
            tiles.masked_fill_(index.outside, PAD_VALUE)
        if not same_size:
            _letterbox_into(tiles, plan.tile_letterbox, dst)

    def _write_full_frame(
        self, frame: torch.Tensor, plan: TilePlan, order: torch.Tensor, scale: float, dst: torch.Tensor
    ) -> None:
        color = frame[..., : 1 if frame.shape[2] == 1 else 3].permute(2, 0, 1).unsqueeze(0)
        scaled = torch.empty_like(color, dtype=self.dtype)  # keeps the channels-last strides of the view
        torch.mul(color, scale, out=scaled)  # scale before any fp16 cast: mono16 values overflow fp16
        _letterbox_into(scaled, plan.frame_letterbox, dst.unsqueeze(0), order)


def _letterbox_into(
    images: torch.Tensor, box: Letterbox, dst: torch.Tensor, order: torch.Tensor | None = None
) -> None:
    """Resize (N, C, h, w) `images` to `box.resized_hw` (one bilinear call), pick channels `order` of the
    result (reorder / mono -> 3 channels on the small image) and write them padded into `dst` (N, 3, H, W)."""
    resized = F.interpolate(images, size=box.resized_hw, mode="bilinear", align_corners=False)
    if order is not None:
        resized = resized.index_select(1, order)
    (rh, rw), py, px = box.resized_hw, box.pad_y, box.pad_x
    if (rh, rw) != tuple(dst.shape[2:]):
        dst.fill_(PAD_VALUE)
    dst[:, :, py : py + rh, px : px + rw].copy_(resized)
