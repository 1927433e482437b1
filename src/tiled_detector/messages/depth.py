"""Depth images and camera calibrations -> what the frame program takes (`pipeline.depth`): a sensor_msgs/Image
of depth or a depth file -> an (H, W) array, a sensor_msgs/CameraInfo or a camera_calibration YAML file -> the
camera matrix.

Depth encodings (REP 118): `16UC1` (and `mono16`) hold unsigned integers in units of `depth_scale` metres
(millimetres from RealSense, ZED, Kinect drivers), `32FC1` holds metres; 0 and NaN are holes. The camera matrix is
the projection matrix P's (fx', fy', cx', cy') when P is set, which is what the pixels of a rectified image (and
of a depth image aligned to it) follow, else the intrinsic matrix K's; distortion is not removed (rectify a
distorted camera first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.messages.images import ImageConversionError, byte_view
from tiled_detector.pipeline.depth import DepthError, Intrinsics

DEPTH_ENCODINGS = {"16UC1": np.dtype("<u2"), "mono16": np.dtype("<u2"), "32FC1": np.dtype("<f4")}


def depth_to_array(msg: Any) -> np.ndarray:
    """A sensor_msgs/Image of depth -> (H, W) uint16 (16UC1, mono16) or float32 (32FC1): a view of the message
    buffer where its layout allows. ImageConversionError (one line) for another encoding or a malformed image."""
    encoding = getattr(msg, "encoding", None)
    dtype = DEPTH_ENCODINGS.get(encoding) if isinstance(encoding, str) else None
    if dtype is None:
        raise ImageConversionError(
            f"unknown depth encoding {encoding!r}; expected one of {', '.join(DEPTH_ENCODINGS)}"
        )
    sizes = [getattr(msg, name, None) for name in ("height", "width", "step")]
    if any(isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0 for v in sizes):
        raise ImageConversionError(f"height, width and step must be non-negative integers, got {sizes}")
    height, width, step = (int(v) for v in sizes)
    if not height or not width:
        raise ImageConversionError(f"zero size {width}x{height}")
    if step < width * dtype.itemsize:
        raise ImageConversionError(f"step {step} < width*{dtype.itemsize} for {width} pixels of {encoding}")
    buffer = byte_view(getattr(msg, "data", None))
    if buffer.size < step * height:
        raise ImageConversionError(
            f"data has {buffer.size} bytes, expected at least step*height = {step * height}"
        )
    if bool(getattr(msg, "is_bigendian", 0)):
        dtype = dtype.newbyteorder(">")
    image = np.ndarray((height, width), dtype=dtype, buffer=buffer, strides=(step, dtype.itemsize))
    native = np.uint16 if dtype.kind == "u" else np.float32
    return image if dtype.isnative else image.astype(native)


def _matrix(values: Any, count: int, what: str) -> np.ndarray:
    """`values` as `count` finite float64 numbers, or DepthError naming `what`."""
    try:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise DepthError(f"{what} must hold {count} numbers, got {values!r}") from None
    if array.size != count or not np.isfinite(array).all():
        raise DepthError(f"{what} must hold {count} finite numbers, got {array.size}: {array.tolist()}")
    return array


def intrinsics(k: Any, p: Any, width: int, height: int, source: str = "camera info") -> Intrinsics:
    """The camera matrix of a calibration: P's when its focal lengths are set, else K's (module docstring);
    DepthError (one line naming `source`) for a matrix without a focal length."""
    projection = _matrix(p, 12, f"{source}: P") if p is not None and len(p) else np.zeros(12)
    if projection[0] > 0 and projection[5] > 0:
        fx, fy, cx, cy = projection[[0, 5, 2, 6]]
    else:
        matrix = _matrix(k, 9, f"{source}: K")
        fx, fy, cx, cy = matrix[[0, 4, 2, 5]]
    try:
        return Intrinsics(float(fx), float(fy), float(cx), float(cy), int(width), int(height))
    except DepthError as error:
        raise DepthError(f"{source}: {error}") from None


def camera_info_intrinsics(msg: Any) -> Intrinsics:
    """A sensor_msgs/CameraInfo (rclpy or rosbags; ROS 1's upper-case names too) -> its camera matrix."""

    def field(name: str) -> Any:
        return getattr(msg, name, getattr(msg, name.upper(), None))

    return intrinsics(field("k"), field("p"), int(msg.width), int(msg.height))


def read_camera_calibration(path: str | Path) -> Intrinsics:
    """The camera matrix of a camera_calibration YAML file (what camera_info_manager reads: image_width,
    image_height, camera_matrix, projection_matrix, each matrix as rows / cols / data); DepthError (one line
    naming the file) when it cannot be read or holds no usable matrix."""
    import yaml

    path = Path(path)
    try:
        text = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise DepthError(f"{path}: cannot read a camera calibration: {str(error).splitlines()[0]}") from None
    if not isinstance(text, dict) or "camera_matrix" not in text:
        raise DepthError(f"{path}: not a camera_calibration YAML (no camera_matrix)")

    def data(key: str) -> Any:
        entry = text.get(key)
        return entry.get("data") if isinstance(entry, dict) else None

    width, height = text.get("image_width", 0), text.get("image_height", 0)
    if not all(isinstance(v, int) and v >= 0 for v in (width, height)):
        raise DepthError(
            f"{path}: image_width and image_height must be pixel counts, got {width!r}, {height!r}"
        )
    return intrinsics(data("camera_matrix"), data("projection_matrix"), width, height, str(path))


def read_depth_file(path: str | Path) -> np.ndarray:
    """A depth image file as `depth_to_array` gives a message: a 16-bit PNG (or TIFF) -> uint16 in units of
    depth_scale (millimetres), a 32-bit float TIFF -> float32 metres, a .npy of either. DepthError (one line naming
    the file) for anything else."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".npy":
            image = np.load(path, allow_pickle=False)
        else:
            import cv2

            image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED | cv2.IMREAD_ANYDEPTH)
    except (OSError, ValueError) as error:
        raise DepthError(f"{path}: cannot read a depth image: {str(error).splitlines()[0]}") from None
    if image is None:
        raise DepthError(f"{path}: cannot read a depth image (a 16-bit PNG, a 32-bit float TIFF or a .npy)")
    if image.dtype == np.float64:
        image = image.astype(np.float32)
    if image.ndim != 2 or image.dtype not in (np.uint16, np.float32):
        raise DepthError(
            f"{path}: a depth image must hold one channel of 16-bit integers (millimetres) or 32-bit floats "
            f"(metres), got shape {image.shape} of {image.dtype}"
        )
    return image
