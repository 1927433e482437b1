"""sensor_msgs/Image read straight from its serialized (CDR) bytes, without deserialising it.

The node subscribes to images raw: rclpy hands over the message's bytes, and this reads the few fields before the
pixels (stamp, frame_id, height, width, encoding, endianness, step) and views the pixels where they lie. Turning an
8K message into a Python `Image` costs the executor about half a second on a small CPU (docs/PERFORMANCE.md); taking
it raw costs a copy, so a frame that is dropped (a newer one replaces it, or it is malformed) costs almost nothing.
The layout is XCDR1's and XCDR2's plain encoding, little- or big-endian (sensor_msgs/Image has no 8-byte field, so
both align alike); any other encapsulation raises `UnreadableCdrError` (the caller deserialises it instead).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from tiled_detector.messages.images import ImageConversionError

# encapsulation identifiers (first two bytes): plain CDR / XCDR2, big- and little-endian
_BIG = {b"\x00\x00", b"\x00\x06"}
_LITTLE = {b"\x00\x01", b"\x00\x07"}
_HEAD = 4  # the encapsulation header: identifier and options


class UnreadableCdrError(ValueError):
    """Bytes in an encapsulation this reader does not parse (the caller deserialises them instead)."""


@dataclass(frozen=True)
class RawImage:
    """A sensor_msgs/Image's fields read from its bytes; `data` views the pixels in those bytes (no copy), so it
    converts like a message (`images.imgmsg_to_array`); `header` is the caller's (e.g. a std_msgs/Header made from
    `sec`, `nanosec` and `frame_id`)."""

    sec: int
    nanosec: int
    frame_id: str
    height: int
    width: int
    encoding: str
    is_bigendian: int
    step: int
    data: memoryview
    header: Any = None


class _Reader:
    """Aligned reads of CDR primitives (alignment relative to the end of the encapsulation header)."""

    def __init__(self, buffer: memoryview, little: bool) -> None:
        self.buffer, self.at = buffer, _HEAD
        self.order = "<" if little else ">"

    def _take(self, size: int, align: int) -> memoryview:
        self.at = _HEAD + -(-(self.at - _HEAD) // align) * align
        if self.at + size > len(self.buffer):
            raise ImageConversionError(
                f"the serialized image ends after {len(self.buffer)} bytes, inside its fields"
            )
        view = self.buffer[self.at : self.at + size]
        self.at += size
        return view

    def uint32(self) -> int:
        return struct.unpack(self.order + "I", self._take(4, 4))[0]

    def int32(self) -> int:
        return struct.unpack(self.order + "i", self._take(4, 4))[0]

    def uint8(self) -> int:
        return self._take(1, 1)[0]

    def string(self) -> str:
        length = self.uint32()  # with its terminating NUL
        text = bytes(self._take(length, 1))
        return text[:-1].decode("utf-8", "replace") if length else ""

    def octets(self) -> memoryview:
        return self._take(self.uint32(), 1)


def read_image(data: bytes | bytearray | memoryview) -> RawImage:
    """The fields of a serialized sensor_msgs/Image (`RawImage`; its `data` a view into `data`). Raises
    `UnreadableCdrError` for an encapsulation other than plain CDR / XCDR2, `ImageConversionError` for bytes that end
    inside the fields."""
    buffer = memoryview(data).cast("B")
    kind = bytes(buffer[:2])
    if len(buffer) < _HEAD or kind not in _BIG | _LITTLE:
        raise UnreadableCdrError(f"unknown CDR encapsulation {kind.hex() or 'none'}")
    read = _Reader(buffer, kind in _LITTLE)
    sec, nanosec, frame_id = read.int32(), read.uint32(), read.string()
    height, width, encoding = read.uint32(), read.uint32(), read.string()
    is_bigendian, step = read.uint8(), read.uint32()
    return RawImage(sec, nanosec, frame_id, height, width, encoding, is_bigendian, step, read.octets())
