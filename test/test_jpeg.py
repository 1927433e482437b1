"""JPEG frames decoded on the GPU (torchvision's nvJPEG) or, for anything else, left to OpenCV on the CPU."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from tiled_detector.pipeline.jpeg import GpuJpegDecoder, is_jpeg
from tiled_detector.tools.worlds.synthetic import make_scene


def _encoded(ext: str, width: int = 320, height: int = 240) -> tuple[np.ndarray, np.ndarray]:
    rgb = make_scene(3, width, height).image
    ok, data = cv2.imencode(ext, np.ascontiguousarray(rgb[..., ::-1]))
    assert ok
    return rgb, data.reshape(-1)


def test_jpeg_is_told_from_png_by_its_first_bytes() -> None:
    assert is_jpeg(_encoded(".jpg")[1]) and not is_jpeg(_encoded(".png")[1])
    assert not is_jpeg(np.zeros(2, np.uint8))


def test_no_gpu_decoder_off_cuda() -> None:
    decoder = GpuJpegDecoder("cpu")
    assert not decoder.available and decoder.decode(_encoded(".jpg")[1]) is None  # the CPU path decodes


needs_nvjpeg = pytest.mark.skipif(
    not GpuJpegDecoder("cuda").available if torch.cuda.is_available() else True,
    reason="needs CUDA and torchvision",
)


@pytest.mark.gpu
@needs_nvjpeg
@pytest.mark.parametrize("size", [(320, 240), (1920, 1080)])
def test_gpu_decode_equals_opencv_within_jpeg_tolerance(size) -> None:
    _, data = _encoded(".jpg", *size)
    frame = GpuJpegDecoder("cuda").decode(data)
    assert frame is not None and frame.device.type == "cuda" and frame.shape == (size[1], size[0], 3)
    reference = cv2.imdecode(data, cv2.IMREAD_COLOR)[..., ::-1].astype(np.int16)
    difference = np.abs(frame.cpu().numpy().astype(np.int16) - reference)
    # decoders differ in IDCT rounding and chroma upsampling (largest at sharp colour edges), not in content
    assert difference.mean() < 1.5 and np.percentile(difference, 99) <= 16, (
        difference.mean(),
        difference.max(),
    )


@pytest.mark.gpu
@needs_nvjpeg
def test_gpu_decoder_leaves_png_and_broken_jpeg_to_the_cpu() -> None:
    decoder = GpuJpegDecoder("cuda")
    assert decoder.decode(_encoded(".png")[1]) is None
    assert decoder.decode(_encoded(".jpg")[1][:200]) is None  # truncated
