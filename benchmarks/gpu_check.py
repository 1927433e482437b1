"""GPU acceptance check of the torch-backend pipeline (no ROS, ONNX Runtime or TensorRT needed).

    PYTHONPATH=src python3 benchmarks/gpu_check.py              # on a CUDA machine
    PYTHONPATH=src python3 benchmarks/gpu_check.py --device cpu --runs 3   # dry run of the same code on CPU

1. equality: SquareDetector (TorchScript) on CPU and on the device over the same structured random frames must
   give the same detections (float tolerance);
2. transfers: torch.profiler over one detect() per frame size counts host<->device memcpys: exactly one
   host-to-device copy (the frame) and one device-to-host copy (the packed results); small device-to-host reads
   that data-dependent shapes force (nonzero counts, .item()) are listed and fail only with --strict-syncs;
   the same again with the whole detection policy on (per-class thresholds, roi, an ignore mask, size limits),
   which must also stay one captured graph per frame size;
3. timings: per-stage medians over --runs detect() calls of a YOLOv8n-sized TorchScript model, 1920x1080 and
   3840x2160 frames, 640 tiles, overlap 0.2, fp32 and fp16.
Exits non-zero with a FAIL line for every failed check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from networks import SquareDetector, YoloV8nLike, save_torchscript
from tiled_detector.detector import TiledDetector
from tiled_detector.tools.benchmark import profiled_copies
from tiled_detector.types import Detections

FRAME_SIZES = ((1080, 1920), (2160, 3840))
SCALAR_READ_BYTES = 8  # a D2H copy this small is a sync read of a count or flag, not data


def structured_frame(rng: np.random.Generator, height: int, width: int, squares: int = 15) -> np.ndarray:
    """Dark noise with red and blue squares (sides multiples of 8, corners on a 4-pixel grid): SquareDetector
    scores are exact multiples of 1/4 on both devices, so thresholds and merges cannot flip on rounding."""
    frame = rng.integers(0, 30, (height, width, 3), dtype=np.uint8)
    frame[..., 1] = frame[..., 0]  # equal R and G (and B below) in the background: it scores 0
    frame[..., 2] = frame[..., 0]
    for _ in range(squares):
        side = 8 * int(rng.integers(1, 4))
        y = 4 * int(rng.integers(0, (height - side) // 4))
        x = 4 * int(rng.integers(0, (width - side) // 4))
        frame[y : y + side, x : x + side] = (255, 0, 0) if rng.random() < 0.5 else (0, 0, 255)
    return frame


def _sorted_rows(dets: Detections) -> np.ndarray:
    rows = np.column_stack([dets.class_ids, dets.boxes, dets.scores]).astype(np.float64)
    return rows[np.lexsort(rows.T[::-1])] if len(rows) else rows


def check_equality(model: Path, device: str, frames: int, failures: list[str]) -> None:
    """CPU and `device` detectors agree on every frame."""
    options = {"tile_size": (640, 640), "overlap": 0.2, "conf_threshold": 0.3, "backend": "torch"}
    options["max_detections"] = 10_000  # no cut among equal scores
    cpu = TiledDetector(model, device="cpu", **options)
    devices = {  # the default (on CUDA: the frame captured as a CUDA graph) and the eager path
        "graph": TiledDetector(model, device=device, **options),
        "eager": TiledDetector(model, device=device, cuda_graph=False, **options),
    }
    rng = np.random.default_rng(0)
    for i in range(frames):
        height, width = FRAME_SIZES[i % len(FRAME_SIZES)]
        frame = structured_frame(rng, height, width)
        a = _sorted_rows(cpu.detect(frame))
        for mode, dev in devices.items():
            b = _sorted_rows(dev.detect(frame))
            same = a.shape == b.shape and np.allclose(a, b, atol=1e-3)
            print(
                f"equality frame {i} {width}x{height}: cpu {len(a)} vs {device} {mode} {len(b)} detections -> "
                f"{'ok' if same else 'MISMATCH'}"
            )
            if not same:
                failures.append(
                    f"CPU and {device} {mode} detections differ on frame {i} ({width}x{height}): {len(a)} vs "
                    f"{len(b)} rows; first rows cpu={a[:3].tolist()} dev={b[:3].tolist()}"
                )


def check_many_and_captured(model: Path, device: str, runs: int, failures: list[str]) -> None:
    """detect_many of 3 sizes equals per-frame detect in one engine call; on CUDA the same frame program
    captured as a CUDA graph (the default, `cuda_graph=True`) equals eager, and is timed against it."""
    options = {"tile_size": (640, 640), "overlap": 0.2, "conf_threshold": 0.3, "backend": "torch"}
    eager = TiledDetector(model, device=device, cuda_graph=False, **options)
    rng = np.random.default_rng(5)
    frames = [structured_frame(rng, h, w) for h, w in ((480, 640), (720, 1280), (1080, 1920))]
    alone = [eager.detect(f) for f in frames]
    calls, infer = [], eager.engine.infer
    eager.engine.infer = lambda batch: calls.append(batch.shape[0]) or infer(batch)
    together = eager.detect_many(frames)
    del eager.engine.infer
    same = all(
        np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
        for a, b in zip(alone, together, strict=False)
    )
    views = sum(eager.plan_for(*f.shape[:2]).batch_size for f in frames)
    fewest = -(-views // eager.engine.max_batch)  # one call on a GPU (max_batch 32); calls of 4 on a CPU
    print(f"detect_many 640x480 + 1280x720 + 1920x1080: engine calls {calls}, equal to detect: {same}")
    if not same or len(calls) != fewest:
        failures.append(f"detect_many differs from detect or took {len(calls)} engine calls, not {fewest}")
    if torch.device(device).type != "cuda":
        return
    captured = TiledDetector(model, device=device, **options)
    if not captured._runner.captures:
        failures.append("the CUDA detector does not capture its frame program by default")
    frame_set = [structured_frame(rng, 1080, 1920) for _ in range(3)]
    for i, frame in enumerate(frame_set):
        a, b = eager.detect(frame), captured.detect(frame)
        ok = np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
        print(f"captured frame {i}: {len(b)} rows, equal to eager: {ok}")
        if not ok:
            failures.append(f"the captured frame program differs from eager on frame {i}")
    for name, detector in (("eager", eager), ("captured", captured)):
        times = []
        for i in range(runs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            detector.detect(frame_set[i % 3])
            times.append((time.perf_counter() - start) * 1000)
        print(
            f"1080p squares model, {name}: median {statistics.median(times):.2f} ms per frame (detect, wall)"
        )


def policy_settings(folder: Path) -> dict:
    """Every detection policy setting on: a class threshold, the lower 3/4 of the frame, an ignore mask over the
    right quarter (written into `folder`), size limits."""
    import cv2

    mask = np.zeros((90, 160), np.uint8)
    mask[:, 120:] = 255
    cv2.imwrite(str(folder / "right.png"), mask)
    return dict(
        class_thresholds=["1:0.6"],
        roi=(0.0, 0.25, 1.0, 1.0),
        ignore_mask=[str(folder / "right.png")],
        min_box_size=6.0,
        max_box_size=400.0,
    )


def check_transfers(model: Path, device: str, strict_syncs: bool, failures: list[str], **policy) -> None:
    """One H2D (the frame) and one D2H (the results) per detect() call, counted by torch.profiler (with the
    `policy` settings: and one CUDA graph captured per frame size)."""
    if torch.device(device).type != "cuda":
        print("transfers: skipped (needs CUDA)")
        return
    detector = TiledDetector(
        model, device=device, backend="torch", tile_size=(640, 640), conf_threshold=0.3, **policy
    )
    captures = []
    if policy:
        runner = detector._runner
        capture = runner._capture
        runner._capture = lambda function: (captures.append(1), capture(function))[1]
        print(f"transfers with the policy on: {policy}")
    rng = np.random.default_rng(1)
    for height, width in FRAME_SIZES:
        frame = structured_frame(rng, height, width)
        for _ in range(3):  # warm-up: plans, index tensors and pinned buffers are built once per size
            detector.detect(frame)
        torch.cuda.synchronize()
        dets, copies, prof = profiled_copies(lambda frame=frame: detector.detect(frame))
        h2d = [b for d, b in copies if d == "HtoD"]
        d2h = [b for d, b in copies if d == "DtoH"]
        scalar = [b for b in d2h if b is not None and b <= SCALAR_READ_BYTES]
        data_d2h = [b for b in d2h if b is None or b > SCALAR_READ_BYTES]
        result_bytes = len(dets) * 6 * 4
        print(
            f"transfers {width}x{height}: H2D {len(h2d)} {h2d} (frame {frame.nbytes} B); "
            f"D2H data {len(data_d2h)} {data_d2h} (results {result_bytes} B); D2H scalar reads {len(scalar)}; "
            f"other {[c for c in copies if c[0] == 'other']}"
        )
        if len(h2d) != 1 or (h2d[0] is not None and h2d[0] != frame.nbytes):
            failures.append(f"{width}x{height}: expected exactly one H2D copy of {frame.nbytes} B, got {h2d}")
        results_copied = len(data_d2h) == 1 or (result_bytes <= SCALAR_READ_BYTES and not data_d2h)
        if not results_copied:
            failures.append(
                f"{width}x{height}: expected one D2H copy of the results, got data copies {data_d2h}"
            )
        if strict_syncs and len(d2h) != 1:
            failures.append(f"{width}x{height}: {len(scalar)} scalar D2H sync reads besides the results")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    if policy:
        print(f"captured graphs with the policy on: {len(captures)} for {len(FRAME_SIZES)} frame sizes")
        if len(captures) != len(FRAME_SIZES):
            failures.append(f"policy on: {len(captures)} captures for {len(FRAME_SIZES)} frame sizes")


def report_timings(device: str, runs: int, failures: list[str]) -> None:
    """Median per-stage milliseconds: a YOLOv8n-sized random network (fp32, fp16) on noise, and the bundled
    model on synthetic scenes (real detections), each with the sync-free and the exact post-processing."""
    from tiled_detector.models import default_model_path
    from tiled_detector.tools.worlds.synthetic import make_scene

    with tempfile.TemporaryDirectory() as tmp:
        yolo = save_torchscript(YoloV8nLike(), Path(tmp) / "yolov8n_like.ts", (640, 640))
        bundled = default_model_path().with_suffix(".ts")
        cases = [  # (name, model, precision, sync_free, cuda_graph)
            ("yolov8n-like", yolo, "fp32", True, True),
            ("yolov8n-like", yolo, "fp16", True, True),
            ("yolov8n-like", yolo, "fp16", True, False),
            ("yolov8n-like", yolo, "fp32", False, False),
            ("bundled", bundled, "fp32", True, True),
            ("bundled", bundled, "fp32", True, False),
            ("bundled", bundled, "fp32", False, False),
        ]
        for name, model, precision, sync_free, graph in cases:
            if precision == "fp16" and torch.device(device).type == "cpu":
                continue
            detector = TiledDetector(
                model,
                device=device,
                backend="torch",
                precision=precision,
                sync_free=sync_free,
                cuda_graph=graph,
            )
            rng = np.random.default_rng(2)
            for height, width in FRAME_SIZES:
                if name == "bundled":
                    frame = make_scene(11, width, height).image
                else:
                    frame = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
                for _ in range(3):
                    detector.detect(frame)
                walls, stages = [], []
                for _ in range(runs):
                    start = time.perf_counter()
                    dets = detector.detect(frame)
                    walls.append((time.perf_counter() - start) * 1000)
                    stages.append(dets.timings)
                medians = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
                plan = detector.plan_for(height, width)
                print(
                    f"timings {name} {precision} sync_free={sync_free} cuda_graph={graph} {width}x{height} ({plan.num_tiles} tiles "
                    f"+ full frame, batch {plan.batch_size}, {len(dets)} detections): wall "
                    f"{statistics.median(walls):.2f} ms | "
                    + ", ".join(f"{k} {v:.2f}" for k, v in medians.items())
                )
                if not all(np.isfinite(list(medians.values()))):
                    failures.append(f"non-finite timings for {name} {precision} {width}x{height}: {medians}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--runs", type=int, default=50, help="timed detect() calls per configuration")
    parser.add_argument("--frames", type=int, default=4, help="frames of the CPU/device equality check")
    parser.add_argument("--strict-syncs", action="store_true", help="also fail on scalar D2H sync reads")
    args = parser.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(f"FAIL: --device {args.device} but torch {torch.__version__} sees no CUDA device")
        return 2
    name = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {name}, {torch.get_num_threads()} CPU threads")
    failures: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        square = save_torchscript(
            SquareDetector((640, 640), 8), Path(tmp) / "squares.ts", (640, 640), ["r", "b"]
        )
        for check in (
            lambda: check_equality(square, args.device, args.frames, failures),
            lambda: check_transfers(square, args.device, args.strict_syncs, failures),
            lambda: check_transfers(
                square, args.device, args.strict_syncs, failures, **policy_settings(Path(tmp))
            ),
            lambda: check_many_and_captured(square, args.device, args.runs, failures),
            lambda: report_timings(args.device, args.runs, failures),
        ):
            try:
                check()
            except Exception as error:  # report every check, then fail loudly below
                failures.append(f"{type(error).__name__}: {error}")
                import traceback

                traceback.print_exc()
    print(f"done in {time.perf_counter() - started:.1f} s")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("ALL CHECKS PASSED" if not failures else f"{len(failures)} CHECK(S) FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
