"""INT8 calibration images for the TensorRT builder: frames from a folder or a rosbag2 bag, tiled exactly as the
detector tiles them at run time, as engine batches (`BuildOptions.calib_batches`). The engines only take batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from rosbags.highlevel import AnyReader

from tiled_detector.harness.recording import image_folder_frames
from tiled_detector.preprocess import Preprocessor
from tiled_detector.ros.images import compressed_to_array, imgmsg_to_array
from tiled_detector.tiling import make_plan


def _is_bag(source: Path) -> bool:
    return source.suffix in {".mcap", ".db3"} or (source.is_dir() and (source / "metadata.yaml").exists())


def calibration_frames(source: Path) -> Iterator[tuple[np.ndarray, str]]:
    """(image, encoding) pairs from a folder of images or from the image topics of a rosbag2 bag."""
    if not source.exists():
        raise FileNotFoundError(f"calibration source {source} does not exist")
    if _is_bag(source):
        yield from _bag_frames(source)
        return
    for frame in image_folder_frames(source):
        yield frame.image, "rgb8"


def _bag_frames(bag: Path) -> Iterator[tuple[np.ndarray, str]]:
    convert = {
        "sensor_msgs/msg/Image": imgmsg_to_array,
        "sensor_msgs/msg/CompressedImage": compressed_to_array,
    }
    with AnyReader([bag]) as reader:
        connections = [c for c in reader.connections if c.msgtype in convert]
        if not connections:
            raise ValueError(f"no sensor_msgs Image / CompressedImage topic in {bag}")
        for connection, _, raw in reader.messages(connections=connections):
            yield convert[connection.msgtype](reader.deserialize(raw, connection.msgtype))


def runtime_tiling(
    device: torch.device,
    dtype: torch.dtype,
    input_hw: tuple[int, int],
    tile_hw: tuple[int, int] | None = None,
    overlap: float = 0.2,
    full_frame: bool = True,
) -> Callable[[np.ndarray, str], torch.Tensor]:
    """frame -> engine batch, through the same `make_plan` + `Preprocessor` the detector runs."""
    preprocessor = Preprocessor(device, dtype, input_hw)

    def tile(frame: np.ndarray, encoding: str) -> torch.Tensor:
        plan = make_plan(frame.shape[:2], tile_hw or input_hw, overlap, input_hw, full_frame)
        return preprocessor.run(frame, plan, encoding).clone()

    return tile


def calibration_batches(
    source: Path,
    device: torch.device,
    tile_hw: tuple[int, int] | None = None,
    overlap: float = 0.2,
    full_frame: bool = True,
) -> Callable[[tuple[int, int]], Iterator[torch.Tensor]]:
    """input (height, width) -> the engine batches of every frame of `source`, tiled as at run time (tiles of
    `tile_hw`, default the input size), read lazily when the builder asks for them."""

    def batches(input_hw: tuple[int, int]) -> Iterator[torch.Tensor]:
        tiling = runtime_tiling(device, torch.float32, input_hw, tile_hw, overlap, full_frame)
        return (tiling(frame, encoding) for frame, encoding in calibration_frames(source))

    return batches
