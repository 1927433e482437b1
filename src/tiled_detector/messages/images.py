"""sensor_msgs/Image and CompressedImage <-> numpy arrays, without cv_bridge.

Incoming images become views of the message buffer whenever the layout allows (padded rows and
little-endian 16-bit included); a copy is made only for a real conversion (big-endian 16-bit, YUV 4:2:2,
Bayer). The returned "pipeline encoding" is one of rgb8, bgr8, rgba8, bgra8, mono8, mono16. A view shares
memory with `msg.data`: copy it before writing to it. Every malformed or unsupported message raises
`ImageConversionError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from tiled_detector.pipeline.encodings import Encoding

PIPELINE_ENCODINGS = tuple(encoding.value for encoding in Encoding)


class ImageConversionError(ValueError):
    """A message that cannot be converted; the text states why."""


@dataclass(frozen=True)
class _Layout:
    """How one ROS encoding is laid out in memory and what it becomes for the pipeline."""

    channels: int  # channels per pixel as stored (2 for YUV 4:2:2)
    itemsize: int  # bytes per channel
    pipeline: str  # pipeline encoding handed on
    cv_code: int | None = None  # cv2.cvtColor code for encodings that need a conversion

    @property
    def bytes_per_pixel(self) -> int:
        return self.channels * self.itemsize


# OpenCV names Bayer patterns after the 2x2 block starting at the second row and column, so ROS
# bayer_rggb8 (R at pixel 0,0) is OpenCV's BG pattern; test_ros_images checks this on a synthetic mosaic.
_LAYOUTS: dict[str, _Layout] = {
    **{
        e.value: _Layout(e.channels, e.itemsize, e.value) for e in Encoding
    },  # the pipeline's own, as they are
    "8UC1": _Layout(1, 1, "mono8"),
    # 8UC3 carries no channel order; like cv_bridge we assume OpenCV's native BGR.
    "8UC3": _Layout(3, 1, "bgr8"),
    "16UC1": _Layout(1, 2, "mono16"),
    "yuv422": _Layout(2, 1, "rgb8", cv2.COLOR_YUV2RGB_UYVY),
    "uyvy": _Layout(2, 1, "rgb8", cv2.COLOR_YUV2RGB_UYVY),
    "yuv422_yuy2": _Layout(2, 1, "rgb8", cv2.COLOR_YUV2RGB_YUY2),
    "yuyv": _Layout(2, 1, "rgb8", cv2.COLOR_YUV2RGB_YUY2),
    "bayer_rggb8": _Layout(1, 1, "rgb8", cv2.COLOR_BayerBG2RGB),
    "bayer_bggr8": _Layout(1, 1, "rgb8", cv2.COLOR_BayerRG2RGB),
    "bayer_gbrg8": _Layout(1, 1, "rgb8", cv2.COLOR_BayerGR2RGB),
    "bayer_grbg8": _Layout(1, 1, "rgb8", cv2.COLOR_BayerGB2RGB),
}
SUPPORTED_ENCODINGS = tuple(_LAYOUTS)

_YUV422 = frozenset(name for name, layout in _LAYOUTS.items() if layout.channels == 2)
_BAYER = frozenset(name for name in _LAYOUTS if name.startswith("bayer_"))
# Compressions named in CompressedImage.format (image_transport writes e.g. "rgb8; jpeg compressed bgr8").
_COMPRESSION_FORMATS = ("jpeg", "jpg", "png")
# (pipeline encoding, format) -> cv2 conversion before cv2.imencode, and the encoding that is compressed;
# pairs not listed are compressed as they are.
_ENCODE_CONVERSIONS = {
    ("rgb8", "jpeg"): (cv2.COLOR_RGB2BGR, "bgr8"),
    ("rgb8", "png"): (cv2.COLOR_RGB2BGR, "bgr8"),
    ("rgba8", "jpeg"): (cv2.COLOR_RGBA2BGR, "bgr8"),
    ("rgba8", "png"): (cv2.COLOR_RGBA2BGRA, "bgra8"),
    ("bgra8", "jpeg"): (cv2.COLOR_BGRA2BGR, "bgr8"),
}
# (channels, dtype) of an image decoded by cv2.imdecode -> pipeline encoding.
_DECODED_ENCODINGS = {
    (1, np.uint8): "mono8",
    (1, np.uint16): "mono16",
    (3, np.uint8): "bgr8",
    (4, np.uint8): "bgra8",
}


def _layout(encoding: Any) -> _Layout:
    layout = _LAYOUTS.get(encoding) if isinstance(encoding, str) else None
    if layout is None:
        raise ImageConversionError(
            f"unknown encoding {encoding!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}"
        )
    return layout


def byte_view(data: Any) -> np.ndarray:
    """`data` (array.array, bytes, memoryview, numpy array or a list of ints) as a 1-D uint8 array.

    Everything that exposes the buffer protocol is viewed, not copied; only a plain list is copied.
    """
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        pass  # not a buffer (a list or tuple of ints): copied below
    except (ValueError, BufferError) as exc:  # e.g. a non-contiguous memoryview
        raise ImageConversionError(f"data is not a contiguous buffer: {exc}") from None
    try:
        values = np.asarray(data)
    except (TypeError, ValueError) as exc:
        raise ImageConversionError(f"data is not a byte sequence: {exc}") from None
    in_range = values.dtype.kind in "iu" and (values.size == 0 or (values.min() >= 0 and values.max() <= 255))
    if values.ndim != 1 or not in_range:
        raise ImageConversionError(
            f"data must be a flat sequence of bytes, got {values.dtype} values of shape {values.shape}"
        )
    return values.astype(np.uint8)


def _checked_int(msg: Any, name: str) -> int:
    value = getattr(msg, name, None)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ImageConversionError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def imgmsg_to_array(msg: Any) -> tuple[np.ndarray, str]:
    """sensor_msgs/Image -> (HxWxC or HxW uint8/uint16 array, pipeline encoding).

    Raises ImageConversionError for malformed or unsupported messages.
    """
    layout, height, width, step, buffer = _checked(msg)
    big_endian = layout.itemsize == 2 and bool(getattr(msg, "is_bigendian", 0))
    dtype = np.dtype(">u2" if big_endian else "<u2") if layout.itemsize == 2 else np.dtype(np.uint8)
    shape: tuple[int, ...] = (height, width, layout.channels)
    strides: tuple[int, ...] = (step, layout.bytes_per_pixel, layout.itemsize)
    if layout.channels == 1:
        shape, strides = shape[:2], strides[:2]
    image = np.ndarray(shape, dtype=dtype, buffer=buffer, strides=strides)
    if big_endian:
        image = image.astype(np.uint16)
    if layout.cv_code is not None:
        image = cv2.cvtColor(image, layout.cv_code)
    return image, layout.pipeline


def _checked(msg: Any) -> tuple[_Layout, int, int, int, np.ndarray]:
    """An Image message's layout, height, width, step and bytes, checked (ImageConversionError: why not)."""
    encoding = getattr(msg, "encoding", None)
    layout = _layout(encoding)
    height, width, step = (_checked_int(msg, name) for name in ("height", "width", "step"))
    if height == 0 or width == 0:
        raise ImageConversionError(f"zero size {width}x{height}")
    row_bytes = width * layout.bytes_per_pixel
    if step < row_bytes:
        raise ImageConversionError(
            f"step {step} < width*bytes_per_pixel {row_bytes} for {width} pixels of {encoding}"
        )
    buffer = byte_view(getattr(msg, "data", None))
    if buffer.size < step * height:
        raise ImageConversionError(
            f"data has {buffer.size} bytes, expected at least step*height = {step * height}"
        )
    if encoding in _YUV422 and width % 2:
        raise ImageConversionError(f"{encoding} needs an even width, got {width}")
    if encoding in _BAYER and (width < 2 or height < 2):
        raise ImageConversionError(f"{encoding} needs at least 2x2 pixels, got {width}x{height}")
    return layout, height, width, step, buffer


def check_image(msg: Any) -> None:
    """Raise the ImageConversionError `imgmsg_to_array` would raise for this message, without converting it (the
    node rejects a malformed frame as it arrives)."""
    _checked(msg)


def compressed_to_array(msg: Any) -> tuple[np.ndarray, str]:
    """sensor_msgs/CompressedImage (JPEG or PNG) -> (decoded array, pipeline encoding).

    Colour images decode to bgr8 (bgra8 with alpha), single-channel ones to mono8 / mono16.
    """
    fmt = str(getattr(msg, "format", "")).lower()
    if "compresseddepth" in fmt:
        raise ImageConversionError(f"format {fmt!r} (compressedDepth) is not supported")
    if fmt and not any(name in fmt for name in _COMPRESSION_FORMATS):
        raise ImageConversionError(f"unsupported format {fmt!r}; supported: jpeg, png")
    buffer = byte_view(getattr(msg, "data", None))
    if buffer.size == 0:
        raise ImageConversionError("data is empty")
    what = f"cannot decode {buffer.size} bytes as {fmt or 'an image'}"
    try:
        image = cv2.imdecode(buffer, cv2.IMREAD_UNCHANGED)
    except cv2.error as exc:
        raise ImageConversionError(f"{what}: {exc}") from None
    if image is None:
        raise ImageConversionError(what)
    channels = 1 if image.ndim == 2 else image.shape[2]
    encoding = _DECODED_ENCODINGS.get((channels, image.dtype.type))
    if encoding is None:
        raise ImageConversionError(f"decoded image has {channels} channels of {image.dtype}: not supported")
    return image, encoding


def _checked_array(image: np.ndarray, encoding: str) -> tuple[np.ndarray, _Layout]:
    """Validate a pipeline image against its encoding; returns it as HxWxC (C >= 1) and the layout."""
    if encoding not in PIPELINE_ENCODINGS:
        supported = ", ".join(PIPELINE_ENCODINGS)
        raise ImageConversionError(f"cannot publish encoding {encoding!r}; supported: {supported}")
    layout = _LAYOUTS[encoding]
    image = np.asarray(image)
    expected_dtype = np.uint16 if layout.itemsize == 2 else np.uint8
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] != layout.channels or image.dtype != expected_dtype:
        raise ImageConversionError(
            f"{encoding} needs an HxWx{layout.channels} {np.dtype(expected_dtype)} array, "
            f"got shape {image.shape} of {image.dtype}"
        )
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ImageConversionError(f"zero size {image.shape[1]}x{image.shape[0]}")
    return image, layout


def _header_or_default(header: Any) -> Any:
    from std_msgs.msg import Header

    return Header() if header is None else header


def _with_data(msg: Any, values: np.ndarray) -> Any:
    """`msg` with the bytes of `values` (C order) appended to its data, in one copy.

    rclpy keeps uint8[] fields as array.array('B') and its setter copies whatever it is given, so the
    bytes go straight into the message's own array instead.
    """
    msg.data.frombytes(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data)
    return msg


def array_to_imgmsg(image: np.ndarray, encoding: str, header: Any = None) -> Any:
    """HxWxC (or HxW) array -> sensor_msgs/Image with step = width * bytes per pixel, little-endian."""
    from sensor_msgs.msg import Image

    image, layout = _checked_array(image, encoding)
    height, width = image.shape[:2]
    msg = Image(
        header=_header_or_default(header),
        height=height,
        width=width,
        encoding=encoding,
        is_bigendian=0,
        step=width * layout.bytes_per_pixel,
    )
    return _with_data(msg, image.astype(image.dtype.newbyteorder("<"), copy=False))


def array_to_compressed(image: np.ndarray, encoding: str, fmt: str = "jpeg", header: Any = None) -> Any:
    """HxWxC (or HxW) array -> sensor_msgs/CompressedImage in image_transport's format string.

    Colour is encoded as BGR (BGRA for PNG with alpha); JPEG drops alpha and cannot hold mono16.
    """
    from sensor_msgs.msg import CompressedImage

    fmt = fmt.lower()
    if fmt not in ("jpeg", "png"):
        raise ImageConversionError(f"unsupported format {fmt!r}; supported: jpeg, png")
    image, layout = _checked_array(image, encoding)
    if fmt == "jpeg" and layout.itemsize == 2:
        raise ImageConversionError(f"jpeg cannot hold {encoding}; use png")
    code, compressed_encoding = _ENCODE_CONVERSIONS.get((encoding, fmt), (None, encoding))
    if code is not None:
        image = cv2.cvtColor(image, code)
    ok, encoded = cv2.imencode(f".{'jpg' if fmt == 'jpeg' else 'png'}", image)
    if not ok:
        raise ImageConversionError(f"OpenCV could not encode {encoding} as {fmt}")
    msg = CompressedImage(
        header=_header_or_default(header), format=f"{encoding}; {fmt} compressed {compressed_encoding}"
    )
    return _with_data(msg, encoded)


def stamp_ns(stamp: Any) -> int:
    """A builtin_interfaces/Time (rosbags or rclpy) as integer nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)
