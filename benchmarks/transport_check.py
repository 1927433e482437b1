"""How many camera frames reach the detector node over Fast DDS, by size, rate and publisher reliability.

    .venv/bin/python scripts/transport_check.py measure --out /tmp/transport     # the table in docs/TRANSPORT.md
    .venv/bin/python scripts/transport_check.py publish --topic /image --size 3840x2160 --rate 10 --count 20

`measure` starts the detector node (shipped params and Fast DDS profile, best-effort depth-1 subscription) and,
for every (size, encoding, rate, reliability), a separate publisher process (this script's `publish`, with the
same profile unless `--no-profile`); it reads the node's own frames_received / frames_lost from /diagnostics
before and after each stream and writes `transport.md` and `transport.json` (atomically) into `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = ("1920x1080", "2560x1440", "3000x2000", "3840x2160")
RATES = (2.0, 10.0, 30.0)
SECONDS = {2.0: 5.0, 10.0: 2.0, 30.0: 1.0}  # stream length per rate (at least 10 frames)


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
    sent, start = 0, time.monotonic()
    for index in range(args.count):
        time.sleep(max(0.0, start + index / args.rate - time.monotonic()))
        msg.header.stamp.sec, msg.header.stamp.nanosec = 1000 + index, 0
        for frame in (msg, *[small] * args.between):
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


def _counters(diagnostics: list[Any]) -> dict[str, int]:
    values = {kv.key: kv.value for kv in diagnostics[-1].status[0].values} if diagnostics else {}
    return {name: int(values.get(f"frames_{name}", 0)) for name in ("received", "lost", "dropped")}


def measure(args: argparse.Namespace) -> int:
    """Stream every configuration into one node and tabulate what arrived."""
    from diagnostic_msgs.msg import DiagnosticArray

    from tiled_detector.harness.client import DetectorClient
    from tiled_detector.harness.process import NodeProcess, pick_domain_id, ros_environment

    domain = pick_domain_id()
    rows = []
    params = {"diagnostics_period": 0.2, "conf_threshold": 0.9}
    with NodeProcess(parameters=params, remaps={"image": "/transport/image"}, domain_id=domain) as node:
        client = DetectorClient(domain_id=domain, image_topic="/transport/image")
        diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
        try:
            if not client.wait_until(lambda: len(diagnostics) > 0, timeout=60):
                raise SystemExit(f"the node did not start:\n{node.log_text()}")
            env = ros_environment(domain)
            if args.no_profile:
                env.pop("FASTDDS_DEFAULT_PROFILES_FILE")
            for size in args.sizes:
                for encoding in args.encodings:
                    for rate in args.rates:
                        for reliability in args.reliability:
                            count = max(10, round(rate * SECONDS.get(rate, 2.0)))
                            time.sleep(1.5)  # the node catches up: the counters settle
                            before = _counters(diagnostics)
                            command = [sys.executable, __file__, "publish", "--topic", "/transport/image",
                                       "--size", size, "--encoding", encoding, "--rate", str(rate),
                                       "--count", str(count), "--reliability", reliability]  # fmt: skip
                            done = subprocess.run(
                                command, check=False, env=env, capture_output=True, text=True, timeout=120
                            )
                            sent = (
                                json.loads(done.stdout.strip().splitlines()[-1])["sent"] if done.stdout else 0
                            )
                            time.sleep(1.5)
                            after = _counters(diagnostics)
                            row = {"size": size, "encoding": encoding, "rate_hz": rate,
                                   "publisher": reliability, "sent": sent,
                                   "arrived": after["received"] - before["received"],
                                   "lost_reported": after["lost"] - before["lost"]}  # fmt: skip
                            rows.append(row)
                            print(json.dumps(row), flush=True)
        finally:
            client.close()
    _write(Path(args.out), rows, args.no_profile)
    return 0


def _write(out: Path, rows: list[dict[str, Any]], no_profile: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"profile: {'none (Fast DDS defaults)' if no_profile else 'shipped fastdds_large_images.xml'}",
        "",
        "| frame | encoding | rate | publisher | arrived / sent | loss reported by the node |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['size']} | {r['encoding']} | {r['rate_hz']:g} Hz | {r['publisher']} | {r['arrived']}/{r['sent']} "
        f"| {r['lost_reported']} |"
        for r in rows
    ]
    for name, text in (
        ("transport.md", "\n".join(lines) + "\n"),
        ("transport.json", json.dumps(rows, indent=1)),
    ):
        with tempfile.NamedTemporaryFile("w", dir=out, delete=False, suffix=".tmp") as tmp:
            tmp.write(text)
        os.replace(tmp.name, out / name)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("publish", help="publish synthetic frames")
    pub.add_argument("--topic", default="image")
    pub.add_argument("--size", default="1920x1080", help="WxH")
    pub.add_argument("--encoding", default="rgb8", choices=("rgb8", "bgr8"))
    pub.add_argument("--rate", type=float, default=10.0)
    pub.add_argument("--count", type=int, default=10)
    pub.add_argument("--reliability", default="reliable", choices=("reliable", "best_effort"))
    pub.add_argument("--match-timeout", type=float, default=20.0)
    pub.add_argument("--between", type=int, default=0, help="tiny 4x4 frames published after each frame")
    mea = sub.add_parser("measure", help="the transport table")
    mea.add_argument("--out", default="out/transport")
    mea.add_argument("--sizes", nargs="+", default=list(SIZES))
    mea.add_argument("--encodings", nargs="+", default=["rgb8", "bgr8"])
    mea.add_argument("--rates", nargs="+", type=float, default=list(RATES))
    mea.add_argument("--reliability", nargs="+", default=["reliable", "best_effort"])
    mea.add_argument("--no-profile", action="store_true", help="publishers without the Fast DDS profile")
    args = parser.parse_args()
    return publish(args) if args.command == "publish" else measure(args)


if __name__ == "__main__":
    sys.exit(main())
