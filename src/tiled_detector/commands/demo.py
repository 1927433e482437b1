"""`tiled-detector demo`: the main job. Starts the node as a real process with config/detector.yaml and the
bundled model, feeds it synthetic 1920x1080 camera frames over DDS, prints a report and writes one annotated image.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from tiled_detector.ros.process import NodeProcess, pick_domain_id


def default_params_file() -> Path:
    """config/detector.yaml of a source checkout, else the installed share/tiled_detector copy."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[3] / "config" / "detector.yaml",
                      Path(os.environ.get("VIRTUAL_ENV", "/nonexistent")) / "share/tiled_detector/config/detector.yaml"):  # fmt: skip
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("config/detector.yaml not found: pass --params-file")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the demo."""
    parser.add_argument("--frames", type=int, default=30, help="number of frames to send (default 30)")
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--seed", type=int, default=7, help="seed of the first synthetic frame")
    parser.add_argument("--params-file", type=Path, default=None, help="default: config/detector.yaml")
    parser.add_argument("--model", default="", help="model file; default: the bundled model")
    parser.add_argument("--out", type=Path, default=Path("demo_out"), help="where the annotated image goes")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for each frame's detections"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object (last line)")


def run(args: argparse.Namespace) -> int:
    """Run the node, stream frames lock-step (each frame waits for its detections), report."""
    from tiled_detector.annotate import annotate
    from tiled_detector.ros.client import DetectorClient
    from tiled_detector.ros.detections import msg_to_detections
    from tiled_detector.ros.images import array_to_imgmsg
    from tiled_detector.synthetic import CLASSES, make_scene
    from tiled_detector.tiling import plan_tiles
    from tiled_detector.types import Detections

    if args.frames < 1:
        raise SystemExit("--frames must be at least 1")
    domain = pick_domain_id()
    params = {"model": args.model} if args.model else {}
    scenes = [make_scene(args.seed + i, args.width, args.height) for i in range(args.frames)]
    say = (lambda *_: None) if args.json else print
    say(f"starting the node (ROS_DOMAIN_ID={domain}) with {args.params_file or default_params_file()}")
    latencies, counts = [], []
    snapshot: tuple[np.ndarray, Detections] | None = None
    with NodeProcess(args.params_file or default_params_file(), params, domain_id=domain) as node:
        client = DetectorClient(domain_id=domain, image_reliable=True)
        try:
            if not client.wait_for_node(timeout=60):
                raise SystemExit(f"the node did not come up:\n{node.log_text()[-3000:]}")
            start = time.monotonic()
            for i, scene in enumerate(scenes):
                msg = array_to_imgmsg(scene.image, "rgb8")
                msg.header.frame_id = "camera"
                msg.header.stamp.sec, msg.header.stamp.nanosec = 1_700_000_000 + i, 0
                sent = time.monotonic()
                client.publish(msg)
                reply = client.wait_for_stamp((1_700_000_000 + i) * 1_000_000_000, args.timeout)
                if reply is None:
                    raise SystemExit(
                        f"no detections for frame {i} within {args.timeout} s:\n{node.log_text()[-3000:]}"
                    )
                latencies.append((time.monotonic() - sent) * 1e3)
                boxes, scores, class_ids = msg_to_detections(reply, list(CLASSES))
                counts.append(len(scores))
                if snapshot is None or len(scores) > len(snapshot[1]):
                    snapshot = (scene.image, Detections(boxes, scores, class_ids))
                say(f"frame {i:3d}: {len(scores):3d} detections, {latencies[-1]:7.1f} ms")
            elapsed = time.monotonic() - start
        finally:
            client.close()
    assert snapshot is not None
    args.out.mkdir(parents=True, exist_ok=True)
    image_path = args.out / "demo_annotated.png"
    _write_png(
        image_path,
        annotate(snapshot[0], snapshot[1], list(CLASSES), plan_tiles(args.height, args.width, 640, 640, 0.2)),
    )
    report = {
        "frames": len(latencies),
        "frames_with_detections": int(sum(c > 0 for c in counts)),
        "detections": int(sum(counts)),
        "detections_per_frame": float(np.mean(counts)),
        "latency_ms_p50": float(np.percentile(latencies, 50)),
        "latency_ms_p95": float(np.percentile(latencies, 95)),
        "fps": len(latencies) / elapsed,
        "annotated_image": str(image_path),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"\n{report['frames']} frames ({args.width}x{args.height}), {report['frames_with_detections']} with "
            f"detections, {report['detections_per_frame']:.1f} detections/frame\n"
            f"latency p50 {report['latency_ms_p50']:.1f} ms, p95 {report['latency_ms_p95']:.1f} ms, "
            f"{report['fps']:.2f} frames/s (lock-step, end to end over DDS)\nannotated frame: {image_path}"
        )
    return 0


def _write_png(path: Path, rgb: np.ndarray) -> None:
    """Write an RGB image atomically (temp file, rename)."""
    import cv2

    ok, data = cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))
    if not ok:
        raise RuntimeError(f"could not encode {path}")
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(data.tobytes())
    os.replace(tmp.name, path)
