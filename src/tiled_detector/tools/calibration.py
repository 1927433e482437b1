"""INT8 calibration images for the TensorRT builder: frames from a folder or a rosbag2 bag, tiled exactly as the
detector tiles them at run time, as engine batches (`BuildOptions.calib_batches`). The engines only take batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from tiled_detector.pipeline.preprocess import Preprocessor
from tiled_detector.pipeline.tiling import make_plan
from tiled_detector.tools.frames import file_frames


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
        return (tiling(frame.image, frame.encoding) for frame in file_frames(source))

    return batches
