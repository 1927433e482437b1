"""sensor_msgs/Image read from its serialized bytes (`messages.cdr`): the same fields and the same frame as the
deserialised message, for the bytes rclpy puts on the wire (alignment after frame_ids and encodings of every length,
row padding, big-endian flags) and for big-endian CDR (rosbags); bytes ending inside the fields and encapsulations it
does not parse are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("rclpy")
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import Image

from tiled_detector.harness.bags import typestore
from tiled_detector.messages.cdr import UnreadableCdrError, read_image
from tiled_detector.messages.images import ImageConversionError, imgmsg_to_array

BYTES_PER_PIXEL = {"rgb8": 3, "bgr8": 3, "mono8": 1, "mono16": 2, "rgba8": 4, "yuv422": 2}


@st.composite
def images(draw: st.DrawFn) -> Image:
    encoding = draw(st.sampled_from(sorted(BYTES_PER_PIXEL)))
    width = draw(st.integers(1, 9)) * (2 if encoding == "yuv422" else 1)
    height = draw(st.integers(1, 7))
    step = width * BYTES_PER_PIXEL[encoding] + draw(st.integers(0, 5))
    msg = Image(height=height, width=width, encoding=encoding, step=step)
    msg.is_bigendian = draw(st.integers(0, 1))
    msg.header.frame_id = draw(st.text("abc_/", max_size=9))
    msg.header.stamp.sec = draw(st.integers(-(2**31), 2**31 - 1))
    msg.header.stamp.nanosec = draw(st.integers(0, 999_999_999))
    msg.data.frombytes(draw(st.binary(min_size=step * height, max_size=step * height)))
    return msg


def _same(raw, msg: Image) -> None:
    fields = ("height", "width", "encoding", "is_bigendian", "step")
    assert [getattr(raw, f) for f in fields] == [getattr(msg, f) for f in fields]
    assert (raw.sec, raw.nanosec, raw.frame_id) == (
        msg.header.stamp.sec,
        msg.header.stamp.nanosec,
        msg.header.frame_id,
    )
    assert bytes(raw.data) == msg.data.tobytes()
    ours, encoding = imgmsg_to_array(raw)
    theirs, expected = imgmsg_to_array(msg)
    assert encoding == expected and np.array_equal(ours, theirs)


@settings(max_examples=150, deadline=None)
@given(images())
def test_the_bytes_rclpy_sends_read_as_the_deserialised_message(msg: Image) -> None:
    data = serialize_message(msg)
    raw = read_image(data)
    _same(raw, deserialize_message(data, Image))
    if raw.data.nbytes:  # a view of the message's bytes, not a copy
        assert np.shares_memory(np.frombuffer(raw.data, np.uint8), np.frombuffer(data, np.uint8))


@settings(max_examples=30, deadline=None)
@given(images())
def test_big_endian_cdr_reads_alike(msg: Image) -> None:
    store = typestore()
    kind = store.types["sensor_msgs/msg/Image"]
    header = store.types["std_msgs/msg/Header"]
    time = store.types["builtin_interfaces/msg/Time"]
    theirs = kind(
        header=header(
            stamp=time(msg.header.stamp.sec, msg.header.stamp.nanosec), frame_id=msg.header.frame_id
        ),
        height=msg.height,
        width=msg.width,
        encoding=msg.encoding,
        is_bigendian=msg.is_bigendian,
        step=msg.step,
        data=np.frombuffer(msg.data.tobytes(), np.uint8),
    )
    data = bytes(store.serialize_cdr(theirs, "sensor_msgs/msg/Image", little_endian=False))
    assert data[:2] == b"\x00\x00"
    _same(read_image(data), msg)


def test_bytes_it_cannot_read_are_refused() -> None:
    msg = Image(height=2, width=2, encoding="rgb8", step=6, data=bytes(12))
    msg.header.frame_id = "camera"
    data = serialize_message(msg)
    with pytest.raises(ImageConversionError, match="ends after"):
        read_image(data[:30])
    with pytest.raises(UnreadableCdrError, match="encapsulation 0003"):
        read_image(b"\x00\x03" + data[2:])
    with pytest.raises(UnreadableCdrError):
        read_image(b"")
    # a short data field is a malformed message, refused when converted (as a deserialised one is)
    short = read_image(serialize_message(Image(height=2, width=2, encoding="rgb8", step=6, data=bytes(5))))
    with pytest.raises(ImageConversionError, match="data has 5 bytes"):
        imgmsg_to_array(short)
