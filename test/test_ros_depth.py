"""Tests for tiled_detector.messages.depth: depth images (16UC1 / mono16 / 32FC1) -> arrays, CameraInfo and
camera_calibration YAML files -> the camera matrix (P of a rectified image, else K)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rclpy")
from sensor_msgs.msg import CameraInfo, Image

from tiled_detector.messages.depth import camera_info_intrinsics, depth_to_array, read_camera_calibration
from tiled_detector.messages.images import ImageConversionError
from tiled_detector.pipeline.depth import DepthError, Intrinsics

# camera_calibration's output for a RealSense-like 1280 x 720 colour camera (K and a different, rectified P)
CALIBRATION = """image_width: 1280
image_height: 720
camera_name: color
camera_matrix:
  rows: 3
  cols: 3
  data: [910.0, 0.0, 640.5, 0.0, 908.0, 361.2, 0.0, 0.0, 1.0]
distortion_model: plumb_bob
distortion_coefficients:
  rows: 1
  cols: 5
  data: [0.1, -0.2, 0.0, 0.0, 0.0]
rectification_matrix:
  rows: 3
  cols: 3
  data: [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
projection_matrix:
  rows: 3
  cols: 4
  data: [900.0, 0.0, 641.0, 0.0, 0.0, 899.0, 360.0, 0.0, 0.0, 0.0, 1.0, 0.0]
"""


def _image(values: np.ndarray, encoding: str, step: int | None = None, bigendian: bool = False) -> Image:
    height, width = values.shape
    data = values.astype(values.dtype.newbyteorder(">" if bigendian else "<"))
    row = width * values.itemsize
    step = step or row
    padded = np.zeros((height, step), np.uint8)
    padded[:, :row] = data.view(np.uint8).reshape(height, row)
    return Image(
        height=height,
        width=width,
        encoding=encoding,
        step=step,
        is_bigendian=int(bigendian),
        data=padded.tobytes(),
    )


@pytest.mark.parametrize("encoding", ["16UC1", "mono16"])
def test_16uc1_is_an_unsigned_view_in_units(encoding: str) -> None:
    values = np.array([[0, 1500], [65535, 7]], np.uint16)
    depth = depth_to_array(_image(values, encoding, step=6))  # padded rows
    assert depth.dtype == np.uint16 and depth.shape == (2, 2)
    np.testing.assert_array_equal(depth, values)
    np.testing.assert_array_equal(depth_to_array(_image(values, encoding, bigendian=True)), values)


def test_32fc1_keeps_metres_and_holes() -> None:
    values = np.array([[1.25, np.nan], [0.0, 40.0]], np.float32)
    depth = depth_to_array(_image(values, "32FC1"))
    assert depth.dtype == np.float32
    np.testing.assert_array_equal(depth, values)
    swapped = depth_to_array(_image(values, "32FC1", bigendian=True))
    assert swapped.dtype == np.float32 and swapped.dtype.isnative
    np.testing.assert_array_equal(swapped, values)


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (Image(height=1, width=1, encoding="rgb8", step=3, data=bytes(3)), "unknown depth encoding 'rgb8'"),
        (Image(height=1, width=1, encoding="16SC1", step=2, data=bytes(2)), "unknown depth encoding '16SC1'"),
        (Image(height=2, width=2, encoding="32FC1", step=8, data=bytes(8)), "data has 8 bytes"),
        (Image(height=2, width=2, encoding="16UC1", step=2, data=bytes(8)), "step 2 < width"),
        (Image(height=0, width=2, encoding="16UC1", step=4, data=b""), "zero size"),
    ],
)
def test_bad_depth_images_are_one_line_errors(image: Image, message: str) -> None:
    with pytest.raises(ImageConversionError, match=message) as raised:
        depth_to_array(image)
    assert "\n" not in str(raised.value)


def test_camera_info_gives_p_of_a_rectified_image_else_k() -> None:
    info = CameraInfo(width=640, height=480)
    info.k = [500.0, 0.0, 320.0, 0.0, 510.0, 240.0, 0.0, 0.0, 1.0]
    assert camera_info_intrinsics(info) == Intrinsics(500.0, 510.0, 320.0, 240.0, 640, 480)  # P all zero: K
    info.p = [490.0, 0.0, 318.0, 0.0, 0.0, 495.0, 241.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert camera_info_intrinsics(info) == Intrinsics(490.0, 495.0, 318.0, 241.0, 640, 480)


def test_a_camera_info_without_a_focal_length_is_refused() -> None:
    with pytest.raises(DepthError, match="camera info: camera matrix has a zero or negative focal length"):
        camera_info_intrinsics(CameraInfo(width=640, height=480))


def test_camera_calibration_yaml_is_read_as_camera_info_manager_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "color.yaml"
    path.write_text(CALIBRATION)
    assert read_camera_calibration(path) == Intrinsics(900.0, 899.0, 641.0, 360.0, 1280, 720)
    path.write_text(
        CALIBRATION.replace(
            "data: [900.0, 0.0, 641.0, 0.0, 0.0, 899.0", "data: [0.0, 0.0, 641.0, 0.0, 0.0, 0.0"
        )
    )
    assert read_camera_calibration(path) == Intrinsics(910.0, 908.0, 640.5, 361.2, 1280, 720)  # no P: K


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("image_width: 640\n", "not a camera_calibration YAML"),
        ("camera_matrix: {rows: 3, cols: 3, data: [1, 2]}\n", "K must hold 9 finite numbers, got 2"),
        ("camera_matrix: {data: [0, 0, 1, 0, 0, 1, 0, 0, 1]}\n", "zero or negative focal length"),
        ("camera_matrix: [1, 2\n", "cannot read a camera calibration"),
        (
            "image_width: -3\ncamera_matrix: {data: [1, 0, 1, 0, 1, 1, 0, 0, 1]}\n",
            "image_width and image_height",
        ),
    ],
)
def test_bad_calibration_files_are_one_line_errors_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "info.yaml"
    path.write_text(text)
    with pytest.raises(DepthError, match=message) as raised:
        read_camera_calibration(path)
    assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)
    with pytest.raises(DepthError, match="cannot read a camera calibration"):
        read_camera_calibration(tmp_path / "missing.yaml")
