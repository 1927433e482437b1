"""Several cameras of very different cost into one node (real processes over Fast DDS): how many of each camera's
frames are answered, and their latency, with one camera sending large frames as fast as it can.

    .venv/bin/python benchmarks/camera_share_probe.py [--good 1280x720 --good-rate 4 --frames 120] \
        [--big 7680x4320] [--no-big | --compare] [--malformed N] [--out out/probe.json]

Two "good" cameras send --frames frames at --good-rate Hz; the "big" camera sends --big frames flat out until they
are done (with --malformed, that many malformed frames of its size, data cut short, after each). Prints and writes, per camera: frames sent, answered, received / skipped / lost by the node, its latency
p50 and its engine share. `--compare` runs the good cameras alone first, then beside the flood, in one invocation:
each good camera's answers beside the flood over its own answers alone (issue 59's target: at least 0.6), and
whether every frame is accounted for (sent = received + lost + skipped; received = processed + dropped +
malformed + failed, give or take the frames in flight at the end).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PUBLISHER = (sys.executable, str(ROOT / "test" / "support" / "publisher.py"))
CAMERAS = ("/cam_a/image", "/cam_b/image", "/cam_c/image")


def _publish(
    env: dict[str, str], topic: str, size: str, rate: float, count: int, malformed: int = 0
) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *PUBLISHER,
            "--topic",
            topic,
            "--size",
            size,
            "--rate",
            str(rate),
            "--count",
            str(count),
            "--reliability",
            "best_effort",
            "--malformed",
            str(malformed),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def probe(
    good: str, good_rate: float, frames: int, big: str | None, workdir: Path, malformed: int = 0
) -> dict[str, Any]:
    """Per camera: sent, answered, the node's latency p50 (ms) and engine share, from one run."""
    from diagnostic_msgs.msg import DiagnosticArray

    from tiled_detector.harness.client import DetectorClient
    from tiled_detector.harness.process import NodeProcess, pick_domain_id, ros_environment

    cameras = CAMERAS if big else CAMERAS[:2]
    params = workdir / "params.yaml"
    params.write_text(
        "/**:\n  ros__parameters:\n    cameras: ["
        + ", ".join(f'"{c}"' for c in cameras)
        + "]\n    diagnostics_period: 0.5\n"
    )
    domain = pick_domain_id()
    env = ros_environment(domain)
    with NodeProcess(params, domain_id=domain) as node:
        clients = [
            DetectorClient(domain, topic, topic.rpartition("/")[0] + "/detections", node_name=f"probe_{i}")
            for i, topic in enumerate(cameras)
        ]
        diagnostics = clients[0].subscribe(DiagnosticArray, "/diagnostics")
        try:
            for client in clients:
                assert client.wait_for_node(timeout=60), node.log_text()
            costly = _publish(env, cameras[2], big, 100.0, 100000, malformed) if big else None
            publishers = [_publish(env, topic, good, good_rate, frames) for topic in cameras[:2]]
            sent = [
                json.loads(p.communicate(timeout=frames / good_rate + 120)[0].strip().splitlines()[-1])[
                    "sent"
                ]
                for p in publishers
            ]
            if costly is not None:  # the flood stops with the good cameras' last frame
                costly.kill()
                costly.wait()
            # the last answers, and the counters once the node has taken the good cameras' last frames (a frame
            # replaced in the middleware is counted skipped only when a later one of its publisher is taken)
            deadline = time.monotonic() + 15.0
            while True:
                time.sleep(1.0)
                statuses = {
                    s.name.rpartition(": camera ")[2]: {kv.key: kv.value for kv in s.values}
                    for s in diagnostics[-1].status[1:]
                }
                seen = [
                    sum(
                        int(statuses.get(topic, {}).get(f"frames_{k}", 0))
                        for k in ("received", "lost", "skipped")
                    )
                    for topic in cameras[:2]
                ]
                if seen == sent or time.monotonic() > deadline:
                    break
            result = {}
            for i, topic in enumerate(cameras):
                values = statuses.get(topic, {})
                result[topic] = {
                    "size": big if i == 2 else good,
                    "sent": sent[i] if i < 2 else int(values.get("frames_received", 0)),
                    "answered": len(clients[i].detections),
                    "received": int(values.get("frames_received", 0)),
                    "skipped": int(values.get("frames_skipped", 0)),
                    "lost": int(values.get("frames_lost", 0)),
                    "malformed": int(values.get("frames_malformed", 0)),
                    "processed": int(values.get("frames_processed", 0)),
                    "dropped": int(values.get("frames_dropped", 0)),
                    "failed": int(values.get("frames_failed", 0)),
                    "latency_ms_p50": float(values.get("latency_ms_p50", "nan")),
                    "engine_share": float(values.get("engine_share", "nan")),
                }
            return result
        finally:
            for client in clients:
                client.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--good", default="1280x720")
    parser.add_argument("--good-rate", type=float, default=4.0)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--big", default="7680x4320")
    parser.add_argument("--no-big", action="store_true", help="the two good cameras alone (the baseline)")
    parser.add_argument(
        "--malformed",
        type=int,
        default=0,
        help="malformed frames the big camera sends after each of its frames",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--compare", action="store_true", help="the good cameras alone, then beside the flood: their ratio"
    )
    args = parser.parse_args()
    runs = [None, args.big] if args.compare else [None if args.no_big else args.big]
    results = []
    for big in runs:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(probe(args.good, args.good_rate, args.frames, big, Path(tmp), args.malformed))
        _report(results[-1])
    if args.compare:
        for topic in CAMERAS[:2]:
            alone, beside = results[0][topic]["answered"], results[1][topic]["answered"]
            print(f"{topic}: {beside} answered beside the flood, {alone} alone: {beside / max(alone, 1):.2f}")
        accounted = all(_accounted(row) for result in results for row in result.values())
        print("every frame accounted for" if accounted else "FRAMES NOT ACCOUNTED FOR")
    result = results[-1] if len(results) == 1 else {"alone": results[0], "flood": results[1]}
    if args.out:
        from tiled_detector.engines.cache import atomic_write

        atomic_write(args.out, (json.dumps(result, indent=2) + "\n").encode())
    return 0


IN_FLIGHT = 2  # frames a camera may still have in the node (a slot and a batch) when its counters are read


def _accounted(row: dict[str, Any]) -> bool:
    """sent = received + lost + skipped, and received = processed + dropped + malformed + failed + in flight."""
    handled = row["processed"] + row["dropped"] + row["malformed"] + row["failed"]
    return (
        row["sent"] == row["received"] + row["lost"] + row["skipped"]
        and 0 <= row["received"] - handled <= IN_FLIGHT
    )


def _report(result: dict[str, dict[str, Any]]) -> None:
    for topic, row in result.items():
        print(
            f"{topic} {row['size']}: {row['answered']}/{row['sent']} answered ({row['received']} received = "
            f"{row['processed']} processed + {row['dropped']} dropped + {row['malformed']} malformed + "
            f"{row['failed']} failed + in flight; {row['skipped']} skipped, {row['lost']} lost), latency p50 "
            f"{row['latency_ms_p50']:.0f} ms, engine share {row['engine_share']:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
