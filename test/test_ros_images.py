"""Tests for tiled_detector.messages.images: sensor_msgs/Image and CompressedImage <-> numpy, no cv_bridge."""

from __future__ import annotations

import array
import timeit
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

pytest.importorskip("rclpy")
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from tiled_detector.messages.images import (
    PIPELINE_ENCODINGS,
    SUPPORTED_ENCODINGS,
    ImageConversionError,
    array_to_compressed,
    array_to_imgmsg,
    compressed_to_array,
    imgmsg_to_array,
)

# Independent of the module's table: bytes per pixel as stored, and the extra size rules.
BYTES_PER_PIXEL = {
    "rgb8": 3,
    "bgr8": 3,
    "rgba8": 4,
    "bgra8": 4,
    "mono8": 1,
    "mono16": 2,
    "8UC1": 1,
    "8UC3": 3,
    "16UC1": 2,
    "yuv422": 2,
    "uyvy": 2,
    "yuv422_yuy2": 2,
    "yuyv": 2,
    "bayer_rggb8": 1,
    "bayer_bggr8": 1,
    "bayer_gbrg8": 1,
    "bayer_grbg8": 1,
}
CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "mono16": 1}
RNG = np.random.default_rng(7)


def make_image(
    raw: np.ndarray, encoding: str, step: int | None = None, bigendian: bool = False, data_type: str = "array"
) -> Image | SimpleNamespace:
    """An Image message holding `raw` (H x row bytes uint8) with rows padded to `step` bytes.

    data_type "array" builds a real message (array.array data, as rclpy delivers it); "bytes", "memoryview"
    and "numpy" build a look-alike whose data is that type (hand-made messages, rosbags deserialisation).
    """
    height, row_bytes = raw.shape
    step = row_bytes if step is None else step
    padded = np.zeros((height, step), np.uint8)
    padded[:, :row_bytes] = raw
    fields = {
        "height": height,
        "width": 0,
        "encoding": encoding,
        "is_bigendian": int(bigendian),
        "step": step,
    }
    fields["width"] = row_bytes // BYTES_PER_PIXEL[encoding]
    if data_type == "array":
        data = array.array("B")
        data.frombytes(padded.tobytes())
        return Image(data=data, **fields)
    data = {
        "bytes": padded.tobytes(),
        "memoryview": memoryview(padded.tobytes()),
        "numpy": padded.reshape(-1),
    }
    return SimpleNamespace(data=data[data_type], **fields)


def random_image(encoding: str, height: int = 6, width: int = 8) -> np.ndarray:
    dtype = np.uint16 if encoding == "mono16" else np.uint8
    shape = (height, width) if CHANNELS[encoding] == 1 else (height, width, CHANNELS[encoding])
    return RNG.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)


def shares_message_buffer(image: np.ndarray, msg: object) -> bool:
    return np.shares_memory(image, np.frombuffer(msg.data, np.uint8))


# --- round trips and zero copy ---


@pytest.mark.parametrize("encoding", PIPELINE_ENCODINGS)
def test_round_trip_is_exact_and_zero_copy(encoding: str) -> None:
    image = random_image(encoding)
    msg = array_to_imgmsg(image, encoding)
    assert (msg.height, msg.width, msg.encoding, msg.is_bigendian) == (6, 8, encoding, 0)
    assert msg.step == 8 * BYTES_PER_PIXEL[encoding]
    assert isinstance(msg.data, array.array) and len(msg.data) == msg.step * msg.height
    back, pipeline = imgmsg_to_array(msg)
    assert pipeline == encoding
    assert back.dtype == image.dtype and back.shape == image.shape
    np.testing.assert_array_equal(back, image)
    assert shares_message_buffer(back, msg)


@pytest.mark.parametrize("encoding", PIPELINE_ENCODINGS)
def test_round_trip_through_serialization(encoding: str) -> None:
    image = random_image(encoding, 5, 7)
    header = Header(frame_id="camera_optical")
    header.stamp.sec, header.stamp.nanosec = 12, 345
    msg = deserialize_message(serialize_message(array_to_imgmsg(image, encoding, header)), Image)
    back, pipeline = imgmsg_to_array(msg)
    assert pipeline == encoding
    np.testing.assert_array_equal(back, image)
    assert (msg.header.frame_id, msg.header.stamp.sec, msg.header.stamp.nanosec) == (
        "camera_optical",
        12,
        345,
    )


@pytest.mark.parametrize(("encoding", "pipeline"), [("8UC1", "mono8"), ("8UC3", "bgr8"), ("16UC1", "mono16")])
def test_opencv_type_encodings_map_to_pipeline_encodings(encoding: str, pipeline: str) -> None:
    image = random_image(pipeline)
    msg = array_to_imgmsg(image, pipeline)
    msg.encoding = encoding
    back, got = imgmsg_to_array(msg)
    assert got == pipeline
    np.testing.assert_array_equal(back, image)
    assert shares_message_buffer(back, msg)


@pytest.mark.parametrize("data_type", ["bytes", "memoryview", "numpy"])
def test_other_buffer_types_are_viewed_not_copied(data_type: str) -> None:
    image = random_image("rgb8")
    msg = make_image(image.reshape(6, -1), "rgb8", data_type=data_type)
    back, _ = imgmsg_to_array(msg)
    np.testing.assert_array_equal(back, image)
    assert shares_message_buffer(back, msg)


def test_list_data_is_accepted() -> None:
    image = random_image("mono8", 2, 3)
    msg = SimpleNamespace(
        height=2, width=3, encoding="mono8", is_bigendian=0, step=3, data=image.ravel().tolist()
    )
    back, _ = imgmsg_to_array(msg)
    np.testing.assert_array_equal(back, image)


@pytest.mark.parametrize("encoding", ["rgb8", "bgra8", "mono8", "mono16"])
def test_padded_rows_give_a_strided_view(encoding: str) -> None:
    image = random_image(encoding, 5, 9)
    row_bytes = 9 * BYTES_PER_PIXEL[encoding]
    msg = make_image(image.view(np.uint8).reshape(5, row_bytes), encoding, step=row_bytes + 7)
    back, _ = imgmsg_to_array(msg)
    np.testing.assert_array_equal(back, image)
    assert back.strides[0] == row_bytes + 7
    assert shares_message_buffer(back, msg)


def test_big_endian_mono16_is_byteswapped() -> None:
    image = random_image("mono16", 4, 5)
    msg = make_image(image.astype(">u2").view(np.uint8).reshape(4, 10), "mono16", step=12, bigendian=True)
    back, pipeline = imgmsg_to_array(msg)
    assert pipeline == "mono16" and back.dtype == np.uint16 and back.dtype.isnative
    np.testing.assert_array_equal(back, image)


def test_big_endian_flag_is_ignored_for_8_bit() -> None:
    image = random_image("rgb8")
    msg = make_image(image.reshape(6, -1), "rgb8", bigendian=True)
    back, _ = imgmsg_to_array(msg)
    np.testing.assert_array_equal(back, image)


# --- YUV 4:2:2 ---


def yuv_to_rgb_reference(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """BT.601 limited-range YUV -> RGB in floating point (what OpenCV's YUV422 conversions implement)."""
    c, d, e = y.astype(np.float64) - 16, u.astype(np.float64) - 128, v.astype(np.float64) - 128
    rgb = np.stack([1.164 * c + 1.596 * e, 1.164 * c - 0.391 * d - 0.813 * e, 1.164 * c + 2.018 * d], axis=-1)
    return np.clip(np.rint(rgb), 0, 255)


def yuv_planes(height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Luma per pixel, chroma per pixel pair (repeated to full width): a synthetic 4:2:2 image."""
    y = RNG.integers(16, 236, (height, width), dtype=np.uint8)
    u, v = (RNG.integers(16, 241, (height, width // 2), dtype=np.uint8) for _ in range(2))
    return y, u, v


@pytest.mark.parametrize(
    ("encoding", "order", "code"),
    [
        ("yuv422", "UYVY", cv2.COLOR_YUV2RGB_UYVY),
        ("uyvy", "UYVY", cv2.COLOR_YUV2RGB_UYVY),
        ("yuv422_yuy2", "YUYV", cv2.COLOR_YUV2RGB_YUY2),
        ("yuyv", "YUYV", cv2.COLOR_YUV2RGB_YUY2),
    ],
)
def test_yuv422_matches_opencv_and_a_numpy_reference(encoding: str, order: str, code: int) -> None:
    height, width = 6, 10
    y, u, v = yuv_planes(height, width)
    packed = np.empty((height, width // 2, 4), np.uint8)
    planes = {"Y0": y[:, 0::2], "Y1": y[:, 1::2], "U": u, "V": v}
    names = ["U", "Y0", "V", "Y1"] if order == "UYVY" else ["Y0", "U", "Y1", "V"]
    for index, name in enumerate(names):
        packed[:, :, index] = planes[name]
    msg = make_image(packed.reshape(height, -1), encoding, step=2 * width + 4)
    rgb, pipeline = imgmsg_to_array(msg)
    assert pipeline == "rgb8" and rgb.shape == (height, width, 3) and rgb.dtype == np.uint8
    np.testing.assert_array_equal(rgb, cv2.cvtColor(packed.reshape(height, width, 2), code))
    reference = yuv_to_rgb_reference(y, np.repeat(u, 2, axis=1), np.repeat(v, 2, axis=1))
    assert np.abs(rgb - reference).max() <= 2
    # the reference tells the two byte orders apart, so a swapped cv2 code would fail the check above
    other = cv2.COLOR_YUV2RGB_YUY2 if code == cv2.COLOR_YUV2RGB_UYVY else cv2.COLOR_YUV2RGB_UYVY
    assert np.abs(cv2.cvtColor(packed.reshape(height, width, 2), other) - reference).max() > 20


# --- Bayer ---


def smooth_rgb(height: int, width: int) -> np.ndarray:
    """Linear ramps, different per channel: bilinear demosaicing recovers them away from the border."""
    yy, xx = np.mgrid[0:height, 0:width]
    channels = [40 + 3 * xx + 2 * yy, 200 - 2 * xx + yy, 90 + xx - 3 * yy]
    return np.stack(channels, axis=-1).astype(np.uint8)


def mosaic(rgb: np.ndarray, pattern: str) -> np.ndarray:
    """Sample `rgb` with a Bayer pattern named as in ROS: colours of the top-left 2x2 block, row by row."""
    out = np.empty(rgb.shape[:2], np.uint8)
    for index, colour in enumerate(pattern.upper()):
        dy, dx = divmod(index, 2)
        out[dy::2, dx::2] = rgb[dy::2, dx::2, "RGB".index(colour)]
    return out


@pytest.mark.parametrize(
    ("pattern", "code"),
    [
        ("rggb", cv2.COLOR_BayerRGGB2RGB),
        ("bggr", cv2.COLOR_BayerBGGR2RGB),
        ("gbrg", cv2.COLOR_BayerGBRG2RGB),
        ("grbg", cv2.COLOR_BayerGRBG2RGB),
    ],
)
def test_bayer_matches_the_scene_and_opencv(pattern: str, code: int) -> None:
    height, width = 12, 16
    scene = smooth_rgb(height, width)
    raw = mosaic(scene, pattern)
    msg = make_image(raw, f"bayer_{pattern}8", step=width + 3)
    rgb, pipeline = imgmsg_to_array(msg)
    assert pipeline == "rgb8" and rgb.shape == (height, width, 3)
    # independent reference: the scene the mosaic was sampled from
    np.testing.assert_allclose(rgb[2:-2, 2:-2], scene[2:-2, 2:-2], atol=1)
    # OpenCV's explicitly named (RGGB...) alias of the same conversion
    np.testing.assert_array_equal(rgb, cv2.cvtColor(raw, code))


def test_every_bayer_pattern_gives_a_different_result() -> None:
    scene = smooth_rgb(8, 8)
    raw = mosaic(scene, "rggb")
    results = []
    for pattern in ("rggb", "bggr", "gbrg", "grbg"):
        results.append(imgmsg_to_array(make_image(raw, f"bayer_{pattern}8"))[0])
    assert all(not np.array_equal(results[0], other) for other in results[1:])


# --- malformed messages ---


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"encoding": "foo"}, "unknown encoding 'foo'; supported: rgb8"),
        ({"width": 0}, "zero size 0x4"),
        ({"height": 0}, "zero size 6x0"),
        ({"step": 10}, "step 10 < width*bytes_per_pixel 18"),
        ({"data": bytes(71)}, "data has 71 bytes, expected at least step*height = 72"),
        ({"encoding": "yuv422", "width": 9}, "needs an even width, got 9"),
        ({"encoding": "bayer_rggb8", "width": 1, "step": 1}, "needs at least 2x2 pixels"),
        ({"step": -1}, "step must be a non-negative integer"),
        ({"width": 2.5}, "width must be a non-negative integer"),
        ({"data": [1, 2, 300]}, "flat sequence of bytes"),
        ({"data": memoryview(bytes(144))[::2]}, "not a contiguous buffer"),
        ({"data": None}, "flat sequence of bytes"),
        ({"encoding": None}, "unknown encoding None"),
    ],
)
def test_malformed_messages_state_the_reason(fields: dict, reason: str) -> None:
    msg = SimpleNamespace(height=4, width=6, encoding="rgb8", is_bigendian=0, step=18, data=bytes(72))
    for name, value in fields.items():
        setattr(msg, name, value)
    with pytest.raises(ImageConversionError, match=reason.replace("*", r"\*")):
        imgmsg_to_array(msg)


@st.composite
def image_messages(draw: st.DrawFn) -> SimpleNamespace:
    """Image look-alikes near the valid/invalid boundary: step and data size are drawn around their minimum."""
    encoding = draw(st.sampled_from([*SUPPORTED_ENCODINGS, "RGB8", "rgb16", "bayer_rggb16", "32FC1", ""]))
    height, width = draw(st.integers(-1, 9)), draw(st.integers(-1, 9))
    step = max(width, 0) * BYTES_PER_PIXEL.get(encoding, 1) + draw(st.integers(-2, 6))
    size = max(step * height + draw(st.integers(-3, 6)), 0)
    data_type = draw(st.sampled_from(["array", "bytes", "memoryview", "list"]))
    data = {
        "array": array.array("B", bytes(size)),
        "bytes": bytes(size),
        "memoryview": memoryview(bytes(size)),
    }
    return SimpleNamespace(
        height=height,
        width=width,
        encoding=encoding,
        is_bigendian=draw(st.integers(0, 1)),
        step=step,
        data=data.get(data_type, [0] * size),
    )


@settings(max_examples=300, deadline=None)
@given(msg=image_messages())
def test_generated_messages_convert_or_raise_image_conversion_error(msg: SimpleNamespace) -> None:
    encoding, height, width, step = msg.encoding, msg.height, msg.width, msg.step
    size = len(msg.data)
    bpp = BYTES_PER_PIXEL.get(encoding)
    valid = (
        bpp is not None
        and height > 0
        and width > 0
        and step >= width * bpp
        and size >= step * height
        and not (encoding in ("yuv422", "uyvy", "yuv422_yuy2", "yuyv") and width % 2)
        and not (encoding.startswith("bayer_") and min(width, height) < 2)
    )
    event("valid" if valid else "invalid")
    if not valid:
        with pytest.raises(ImageConversionError):
            imgmsg_to_array(msg)
        return
    image, pipeline = imgmsg_to_array(msg)
    assert image.shape[:2] == (height, width)
    assert pipeline in PIPELINE_ENCODINGS
    assert image.ndim == (2 if pipeline.startswith("mono") else 3)


@pytest.mark.parametrize(
    ("image", "encoding", "reason"),
    [
        (np.zeros((4, 4, 3), np.uint8), "yuv422", "cannot publish encoding 'yuv422'"),
        (np.zeros((4, 4), np.uint8), "rgb8", r"rgb8 needs an HxWx3 uint8 array, got shape \(4, 4, 1\)"),
        (np.zeros((4, 4), np.uint8), "mono16", "mono16 needs an HxWx1 uint16 array"),
        (np.zeros((0, 4, 3), np.uint8), "rgb8", "zero size 4x0"),
    ],
)
def test_array_to_imgmsg_rejects_mismatched_arrays(image: np.ndarray, encoding: str, reason: str) -> None:
    with pytest.raises(ImageConversionError, match=reason):
        array_to_imgmsg(image, encoding)


def test_array_to_imgmsg_accepts_non_contiguous_arrays() -> None:
    image = random_image("rgb8", 6, 10)[:, ::2]
    back, _ = imgmsg_to_array(array_to_imgmsg(image, "rgb8"))
    np.testing.assert_array_equal(back, image)


# --- compressed ---


@pytest.mark.parametrize(
    ("encoding", "format_string", "expected_encoding"),
    [
        ("rgb8", "rgb8; png compressed bgr8", "bgr8"),
        ("bgr8", "bgr8; png compressed bgr8", "bgr8"),
        ("rgba8", "rgba8; png compressed bgra8", "bgra8"),
        ("bgra8", "bgra8; png compressed bgra8", "bgra8"),
        ("mono8", "mono8; png compressed mono8", "mono8"),
        ("mono16", "mono16; png compressed mono16", "mono16"),
    ],
)
def test_png_round_trip_is_exact(encoding: str, format_string: str, expected_encoding: str) -> None:
    image = random_image(encoding, 7, 9)
    header = Header(frame_id="cam")
    msg = deserialize_message(
        serialize_message(array_to_compressed(image, encoding, "png", header)), CompressedImage
    )
    assert msg.format == format_string and msg.header.frame_id == "cam"
    back, got = compressed_to_array(msg)
    assert got == expected_encoding and back.dtype == image.dtype
    conversions = {"rgb8": cv2.COLOR_RGB2BGR, "rgba8": cv2.COLOR_RGBA2BGRA}
    expected = cv2.cvtColor(image, conversions[encoding]) if encoding in conversions else image
    np.testing.assert_array_equal(back, expected)


@pytest.mark.parametrize(
    ("encoding", "expected_encoding"), [("rgb8", "bgr8"), ("rgba8", "bgr8"), ("mono8", "mono8")]
)
def test_jpeg_round_trip_is_close(encoding: str, expected_encoding: str) -> None:
    scene = smooth_rgb(32, 48)
    image = {
        "rgb8": scene,
        "rgba8": np.dstack([scene, np.full((32, 48), 255, np.uint8)]),
        "mono8": scene[:, :, 1].copy(),
    }[encoding]
    msg = array_to_compressed(image, encoding)
    assert msg.format == f"{encoding}; jpeg compressed {expected_encoding}"
    back, got = compressed_to_array(msg)
    assert got == expected_encoding
    expected = scene[:, :, ::-1] if expected_encoding == "bgr8" else image
    assert np.abs(back.astype(np.int16) - expected).mean() < 3


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"data": b""}, "data is empty"),
        ({"data": b"definitely not an image"}, "cannot decode 23 bytes as jpeg"),
        ({"format": "rgb8; tiff compressed bgr8"}, "unsupported format"),
        ({"format": "16UC1; compressedDepth png"}, "compressedDepth"),
    ],
)
def test_malformed_compressed_messages_raise(fields: dict, reason: str) -> None:
    ok, encoded = cv2.imencode(".jpg", np.zeros((4, 4, 3), np.uint8))
    assert ok
    msg = SimpleNamespace(format="jpeg", data=encoded.tobytes())
    for name, value in fields.items():
        setattr(msg, name, value)
    with pytest.raises(ImageConversionError, match=reason):
        compressed_to_array(msg)


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(["jpeg", "png"]), cut=st.integers(0, 400), noise=st.binary(max_size=64))
def test_truncated_or_corrupt_compressed_data_decodes_or_raises(fmt: str, cut: int, noise: bytes) -> None:
    valid = array_to_compressed(smooth_rgb(16, 16), "rgb8", fmt)
    msg = SimpleNamespace(format=valid.format, data=bytes(valid.data)[:cut] + noise)
    try:
        image, encoding = compressed_to_array(msg)
    except ImageConversionError as error:
        assert str(error)
    else:
        assert encoding in PIPELINE_ENCODINGS and image.size > 0


def test_compressed_without_format_string_is_sniffed() -> None:
    image = random_image("bgr8", 5, 5)
    ok, encoded = cv2.imencode(".png", image)
    assert ok
    back, encoding = compressed_to_array(SimpleNamespace(format="", data=encoded.tobytes()))
    assert encoding == "bgr8"
    np.testing.assert_array_equal(back, image)


@pytest.mark.parametrize(
    ("encoding", "fmt", "reason"),
    [("mono16", "jpeg", "jpeg cannot hold mono16"), ("rgb8", "webp", "unsupported format 'webp'")],
)
def test_array_to_compressed_rejects_unsupported_requests(encoding: str, fmt: str, reason: str) -> None:
    with pytest.raises(ImageConversionError, match=reason):
        array_to_compressed(random_image(encoding), encoding, fmt)


# --- speed ---


def test_full_hd_conversion_is_a_view_and_fast() -> None:
    image = np.zeros((1080, 1920, 3), np.uint8)
    msg = array_to_imgmsg(image, "rgb8")
    back, _ = imgmsg_to_array(msg)
    assert shares_message_buffer(back, msg)
    repeats = 2000
    per_call_us = min(timeit.repeat(lambda: imgmsg_to_array(msg), number=repeats, repeat=3)) / repeats * 1e6
    publish_ms = min(timeit.repeat(lambda: array_to_imgmsg(image, "rgb8"), number=5, repeat=3)) / 5 * 1e3
    print(
        f"\n1920x1080 rgb8: imgmsg_to_array {per_call_us:.1f} us, array_to_imgmsg {publish_ms:.2f} ms per call"
    )
    assert per_call_us < 1000  # a copy of 6 MB alone would take about that long on a slow core


def test_published_message_owns_its_bytes() -> None:
    image = random_image("rgb8")
    msg = array_to_imgmsg(image, "rgb8")
    image[:] = 0
    back, _ = imgmsg_to_array(msg)
    assert back.any()
    assert not np.shares_memory(back, image)
