"""A camera stand-in: publishes synthetic sensor_msgs/Image frames at a rate, with the given reliability, once a
subscriber has matched, and prints `{"sent": N}`. Run as its own process by the node tests and the transport
benchmarks (benchmarks/transport_check.py, soak.py, camera_share_probe.py), in the environment they give it.

    python test/support/publisher.py --topic /image --size 3840x2160 --rate 10 --count 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    return int(width), int(height)


def publish(args: argparse.Namespace) -> int:
    """Publish `count` frames at `rate` Hz once a subscriber has matched; print how many went out."""
    import numpy as np
    import rclpy
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    width, height = _size(args.size)
    rclpy.init()
    node = rclpy.create_node("transport_check_publisher")
    reliability = (
        ReliabilityPolicy.RELIABLE if args.reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT
    )
    qos = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=reliability)
    publisher = node.create_publisher(Image, args.topic, qos)
    deadline = time.monotonic() + args.match_timeout
    while publisher.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the subscriber's side of the match
    msg = Image(height=height, width=width, encoding=args.encoding, step=width * 3)
    msg.header.frame_id = "transport_check"
    msg.data.frombytes(np.random.default_rng(0).integers(0, 255, height * width * 3, np.uint8).data)
    small = Image(height=4, width=4, encoding=args.encoding, step=12, data=bytes(48))  # between the frames
    # malformed: the frame's size with its data cut short
    bad = Image(height=height, width=width, encoding=args.encoding, step=width * 3, data=bytes(48))
    sent, start = 0, time.monotonic()
    for index in range(args.count):
        time.sleep(max(0.0, start + index / args.rate - time.monotonic()))
        msg.header.stamp.sec, msg.header.stamp.nanosec = 1000 + index, 0
        for frame in (msg, *[small] * args.between, *[bad] * args.malformed):
            try:
                publisher.publish(frame)
                sent += 1
            except Exception as error:  # rclpy raises RCLError when a reliable history is full
                print(f"publish failed: {error}", file=sys.stderr)
    time.sleep(0.5)  # let the last samples leave before the participant goes away
    print(json.dumps({"sent": sent}))
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topic", default="image")
    parser.add_argument("--size", default="1920x1080", help="WxH")
    parser.add_argument("--encoding", default="rgb8", choices=("rgb8", "bgr8"))
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--reliability", default="reliable", choices=("reliable", "best_effort"))
    parser.add_argument("--match-timeout", type=float, default=20.0)
    parser.add_argument("--between", type=int, default=0, help="tiny 4x4 frames published after each frame")
    parser.add_argument(
        "--malformed",
        type=int,
        default=0,
        help="malformed frames (data cut short) published after each frame",
    )
    return publish(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
