"""Fuzzing the running node: a few thousand generated Image messages (every sensor_msgs encoding, sizes from 0
to huge, step/data mismatches, big-endian, odd stamps and frame_ids) with valid frames interleaved."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.ros, pytest.mark.slow]

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tiled_detector.harness.bags import stamp_ns  # noqa: E402
from tiled_detector.harness.client import DetectorClient  # noqa: E402
from tiled_detector.harness.process import NodeProcess, pick_domain_id  # noqa: E402

# every encoding of sensor_msgs/image_encodings.hpp, plus junk
ENCODINGS = (
    "rgb8",
    "rgba8",
    "rgb16",
    "rgba16",
    "bgr8",
    "bgra8",
    "bgr16",
    "bgra16",
    "mono8",
    "mono16",
    "8UC1",
    "8UC2",
    "8UC3",
    "8UC4",
    "8SC1",
    "8SC3",
    "16UC1",
    "16UC3",
    "16SC1",
    "32SC1",
    "32FC1",
    "32FC3",
    "64FC1",
    "bayer_rggb8",
    "bayer_bggr8",
    "bayer_gbrg8",
    "bayer_grbg8",
    "bayer_rggb16",
    "bayer_bggr16",
    "yuv422",
    "uyvy",
    "yuyv",
    "yuv422_yuy2",
    "nv21",
    "nv24",
    "",
    "RGB8",
    "hsv_magic",
    "rgb8\x00",
    "\u00e9\u00e8",
)
BYTES_PER_PIXEL = {  # as stored, by encoding
    **dict.fromkeys(("mono8", "8UC1", "bayer_rggb8"), 1),
    **dict.fromkeys(("mono16", "16UC1", "yuv422", "uyvy", "yuyv", "yuv422_yuy2"), 2),
    **dict.fromkeys(("rgb8", "bgr8", "8UC3"), 3),
    **dict.fromkeys(("rgba8", "bgra8"), 4),
}
SIZES = (0, 1, 2, 3, 7, 16, 33, 64, 640, 4096, 65535, 100_000, 2**31 - 1, 2**32 - 1)
VALID = (  # degenerate but legal frames, answered like any other
    ("rgb8", 48, 64, 0),
    ("bgr8", 1, 1280, 0),
    ("rgb8", 1300, 1, 0),
    ("rgb8", 2, 30000, 0),
    ("mono16", 40, 50, 1),
    ("mono8", 30, 20, 3),
    ("16UC1", 31, 17, 0),
    ("bgra8", 5, 700, 4),
    ("yuv422", 10, 12, 0),
    ("bayer_rggb8", 16, 16, 0),
)


def _junk(rng: random.Random, index: int) -> Image:
    """A generated message: mostly malformed, some accidentally valid."""
    encoding = rng.choice(ENCODINGS)
    height, width = rng.choice(SIZES), rng.choice(SIZES)
    bpp = BYTES_PER_PIXEL.get(encoding, rng.choice((1, 2, 3, 4, 8)))
    step = rng.choice((width * bpp, width * bpp + rng.randint(-3, 5), rng.choice(SIZES), 0))
    step = min(max(step, 0), 2**32 - 1)
    length = rng.choice((0, 1, rng.randint(0, 5000), min(step * height, 20_000), rng.randint(0, 200)))
    msg = Image(height=height, width=width, encoding=encoding, step=step, is_bigendian=rng.randint(0, 1))
    msg.data.frombytes(rng.randbytes(length))
    msg.header.frame_id = rng.choice(("", "cam", "x" * 300, "\u2603 camera", "a/b/c"))
    msg.header.stamp.sec, msg.header.stamp.nanosec = (
        rng.choice((0, 1, 2**31 - 1)),
        rng.randint(0, 999_999_999),
    )
    return msg


def _valid(index: int, encoding: str, height: int, width: int, pad: int) -> Image:
    row = width * BYTES_PER_PIXEL[encoding] + pad
    msg = Image(height=height, width=width, encoding=encoding, step=row, is_bigendian=0)
    msg.data.frombytes(np.random.default_rng(index).integers(0, 256, row * height, np.uint8).tobytes())
    msg.header.frame_id = f"valid_{index}_{encoding}"
    msg.header.stamp.sec, msg.header.stamp.nanosec = 5000 + index, 777
    return msg


def _counts(diagnostics: list[Any]) -> dict[str, int]:
    values = {kv.key: kv.value for kv in diagnostics[-1].status[0].values} if diagnostics else {}
    return {k[len("frames_") :]: int(v) for k, v in values.items() if k.startswith("frames_")}


def test_fuzzed_images_never_kill_the_node_and_every_valid_frame_is_answered(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(
        "/**:\n  ros__parameters:\n    image_reliability: reliable\n    diagnostics_period: 0.5\n"
    )
    domain = pick_domain_id()
    rng = random.Random(20261122)
    sent = answered = 0
    with NodeProcess(params, domain_id=domain) as node:
        client = DetectorClient(domain_id=domain, image_reliable=True)
        diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
        try:
            assert client.wait_for_node(timeout=60), node.log_text()
            started = time.monotonic()
            for index in range(40):
                encoding, height, width, pad = VALID[index % len(VALID)]
                valid = _valid(index, encoding, height, width, pad)
                deadline = time.monotonic() + 30
                client.publish(valid)
                sent += 1
                while client.wait_for_stamp(stamp_ns(valid.header.stamp), 0.5) is None:
                    assert time.monotonic() < deadline and node.alive(), (
                        index,
                        encoding,
                        node.log_text()[-2000:],
                    )
                    client.publish(valid)  # (re)sent until answered: the first ones race DDS discovery
                    sent += 1
                reply = client.detections[stamp_ns(valid.header.stamp)]
                assert reply.header.frame_id == valid.header.frame_id
                answered += 1
                for _ in range(60):
                    client.publish(_junk(rng, index))
                    sent += 1
                    time.sleep(0.001)
            elapsed = time.monotonic() - started

            def settled() -> bool:
                c = _counts(diagnostics)
                return (
                    bool(c) and c["received"] == c["processed"] + c["malformed"] + c["dropped"] + c["failed"]
                )

            assert client.wait_until(settled, timeout=10), _counts(diagnostics)
            counts = _counts(diagnostics)
        finally:
            client.close()
    assert node.returncode == 0, node.log_text()[-3000:]
    assert "Traceback" not in node.log_text()
    assert node.log_text().count("the model takes colour") == 1  # mono8 / 16UC1 frames: said once
    assert answered == 40
    assert counts["failed"] == 0, node.log_text()[-3000:]
    assert counts["malformed"] > 1000 and counts["processed"] >= 40, counts
    assert counts["received"] <= sent
    assert elapsed < 120, elapsed
