"""A soak of the detector node (a real process over Fast DDS): one camera streaming from a reliable publisher with
the tracker and a tile budget on, a runtime parameter set every 2 s (a bad value every fifth time), optionally beside
CPU hogs (a busy host); at the end, every frame the publisher sent is accounted for by /diagnostics (received +
lost + skipped = sent, within the frames in flight at the end) and the node's memory and threads are compared.

    .venv/bin/python benchmarks/soak.py [--frames 2000] [--rate 20] [--size 1280x720] [--hogs 1] [--out out/soak.json]
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
NODE = "/tiled_detector"


def _usage(pid: int) -> tuple[float, int]:
    """RSS (MB) and threads of the node's process tree."""
    import psutil

    process = psutil.Process(pid)
    tree = [process, *process.children(recursive=True)]
    return sum(p.memory_info().rss for p in tree) / 2**20, sum(p.num_threads() for p in tree)


def soak(frames: int, rate: float, size: str, hogs: int, workdir: Path) -> dict[str, Any]:
    """The soak's counts (module docstring)."""
    from diagnostic_msgs.msg import DiagnosticArray

    from tiled_detector.harness.client import DetectorClient
    from tiled_detector.harness.process import NodeProcess, pick_domain_id, ros_environment

    params = workdir / "params.yaml"
    params.write_text(
        "/**:\n  ros__parameters:\n    tracker: bytetrack\n    tile_budget: 3\n    diagnostics_period: 0.5\n"
    )
    domain = pick_domain_id()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        with NodeProcess(params, domain_id=domain) as node:
            client = DetectorClient(domain, "/image", "/detections", node_name="soak")
            diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
            try:
                assert client.wait_for_node(timeout=60), node.log_text()
                publisher = subprocess.Popen(
                    [
                        *PUBLISHER,
                        "--topic",
                        "/image",
                        "--size",
                        size,
                        "--rate",
                        str(rate),
                        "--count",
                        str(frames),
                        "--reliability",
                        "reliable",
                    ],
                    env=ros_environment(domain),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                time.sleep(5.0)
                start = _usage(node.process.pid)
                sets = {"applied": 0, "refused": 0, "unanswered": 0}
                while publisher.poll() is None:
                    bad = sum(sets.values()) % 5 == 4
                    value = 1.5 if bad else 0.25 + 0.05 * (sum(sets.values()) % 3)
                    try:
                        (result,) = client.set_parameters(NODE, {"conf_threshold": value}, timeout=5.0)
                        sets["applied" if result.successful else "refused"] += 1
                    except (TimeoutError, RuntimeError):
                        sets["unanswered"] += 1
                    time.sleep(2.0)
                sent = json.loads(publisher.communicate()[0].strip().splitlines()[-1])["sent"]
                time.sleep(3.0)  # the last frames and a diagnostics report after them
                end = _usage(node.process.pid)
                values = {kv.key: kv.value for kv in diagnostics[-1].status[0].values}
            finally:
                client.close()
    finally:
        for hog in busy:
            hog.kill()
    counts = {
        k: int(values.get(f"frames_{k}", 0)) for k in ("received", "lost", "skipped", "dropped", "processed")
    }
    return {
        "sent": sent,
        **counts,
        "accounted": counts["received"] + counts["lost"] + counts["skipped"],
        "parameter_sets": sets,
        "rss_mb": [round(start[0]), round(end[0])],
        "threads": [start[1], end[1]],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--hogs", type=int, default=1, help="busy processes beside the node (a loaded host)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = soak(args.frames, args.rate, args.size, args.hogs, Path(tmp))
    print(json.dumps(result))
    if args.out:
        from tiled_detector.engines.cache import atomic_write

        atomic_write(args.out, (json.dumps(result, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
