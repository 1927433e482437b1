"""How many camera frames reach the detector node over Fast DDS, by size, rate and publisher reliability.

    .venv/bin/python benchmarks/transport_check.py measure --out /tmp/transport     # the table in docs/TRANSPORT.md

`measure` starts the detector node (shipped params and Fast DDS profile, best-effort depth-1 subscription) and,
for every (size, encoding, rate, reliability), a separate publisher process (`test/support/publisher.py`, with
the same profile unless `--no-profile`); it reads the node's own frames_received / frames_lost from /diagnostics
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
PUBLISHER = Path(__file__).resolve().parents[1] / "test" / "support" / "publisher.py"


def _counters(diagnostics: list[Any]) -> dict[str, int]:
    values = {kv.key: kv.value for kv in diagnostics[-1].status[0].values} if diagnostics else {}
    return {name: int(values.get(f"frames_{name}", 0)) for name in ("received", "lost", "dropped")}


def measure(args: argparse.Namespace) -> int:
    """Stream every configuration into one node and tabulate what arrived."""
    from diagnostic_msgs.msg import DiagnosticArray

    from tiled_detector.harness.client import DetectorClient
    from tiled_detector.harness.process import NodeProcess, pick_domain_id, ros_environment
    from tiled_detector.ros_launch.fastdds import without_profile

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
                without_profile(env)
            for size in args.sizes:
                for encoding in args.encodings:
                    for rate in args.rates:
                        for reliability in args.reliability:
                            count = max(10, round(rate * SECONDS.get(rate, 2.0)))
                            time.sleep(1.5)  # the node catches up: the counters settle
                            before = _counters(diagnostics)
                            command = [
                                sys.executable,
                                str(PUBLISHER),
                                "--topic",
                                "/transport/image",
                                "--size",
                                size,
                                "--encoding",
                                encoding,
                                "--rate",
                                str(rate),
                                "--count",
                                str(count),
                                "--reliability",
                                reliability,
                            ]
                            done = subprocess.run(
                                command, check=False, env=env, capture_output=True, text=True, timeout=120
                            )
                            sent = (
                                json.loads(done.stdout.strip().splitlines()[-1])["sent"] if done.stdout else 0
                            )
                            time.sleep(1.5)
                            after = _counters(diagnostics)
                            row = {
                                "size": size,
                                "encoding": encoding,
                                "rate_hz": rate,
                                "publisher": reliability,
                                "sent": sent,
                                "arrived": after["received"] - before["received"],
                                "lost_reported": after["lost"] - before["lost"],
                            }
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
    mea = sub.add_parser("measure", help="the transport table")
    mea.add_argument("--out", default="out/transport")
    mea.add_argument("--sizes", nargs="+", default=list(SIZES))
    mea.add_argument("--encodings", nargs="+", default=["rgb8", "bgr8"])
    mea.add_argument("--rates", nargs="+", type=float, default=list(RATES))
    mea.add_argument("--reliability", nargs="+", default=["reliable", "best_effort"])
    mea.add_argument("--no-profile", action="store_true", help="publishers without the Fast DDS profile")
    args = parser.parse_args()
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
