"""The pixel encodings the pipeline takes (sensor_msgs/Image names): the one table of channels, element type,
channel order and value scale, and the check of a frame against its encoding."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from tiled_detector.settings.options import Option


class Encoding(Option):
    """Pixel encodings accepted as input (ROS sensor_msgs/Image names)."""

    RGB8 = "rgb8"
    BGR8 = "bgr8"
    RGBA8 = "rgba8"
    BGRA8 = "bgra8"
    MONO8 = "mono8"
    MONO16 = "mono16"

    @property
    def channels(self) -> int:
        """Channels per pixel in the raw frame."""
        return {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4}.get(self.value, 1)

    @property
    def itemsize(self) -> int:
        """Bytes per channel value."""
        return 2 if self is Encoding.MONO16 else 1

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


def as_frame_tensor(frame: np.ndarray | torch.Tensor, encoding: str | Encoding) -> torch.Tensor:
    """View `frame` as an (H, W, C) tensor (no copy where possible) after checking it against `encoding`."""
    enc = Encoding.from_value(encoding)
    if isinstance(frame, np.ndarray):
        if not frame.flags.aligned or any(s < 0 or s % frame.itemsize for s in frame.strides):
            frame = np.ascontiguousarray(frame)  # torch cannot view these (e.g. 16-bit rows with an odd step)
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
