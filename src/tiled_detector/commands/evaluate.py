"""`tiled-detector eval`: COCO metrics of tiled vs full-frame detection on held-out synthetic scenes (`--obb`: DOTA's
AP50 of rotated boxes on the rotated world; `--pose`: COCO keypoint AP on scenes of figures)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiled_detector.commands.camera_motion import add_world_arguments, camera_motion
from tiled_detector.commands.settings import add_settings, flag_parameters, parameter_values
from tiled_detector.config import settings
from tiled_detector.tools.scores.evaluation import (
    CONFIGS,
    DEFAULT_SEED,
    evaluate,
    markdown_table,
    write_report,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tiled-detector eval`."""
    parser.add_argument("--frames", type=int, default=100, help="number of synthetic frames (default 100)")
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help=f"held-out scene seed (default {DEFAULT_SEED})"
    )
    parser.add_argument("--width", type=int, default=1920, help="frame width (default 1920)")
    parser.add_argument("--height", type=int, default=1080, help="frame height (default 1080)")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=list(CONFIGS),
        metavar="NAME",
        help=f"subset of: {' '.join(CONFIGS)} (--pose: full tiles tiles+full tiles+full/keeper)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("eval_out"), help="report folder (default ./eval_out)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_world_arguments(
        parser,
        motion="one moving scene of --frames frames, tracked (tracker bytetrack unless --tracker says "
        "otherwise): IDF1, MOTA and identity switches too",
        obb="rotated boxes: the rotated world (boats, cars, trucks at any angle, dense rows; with --motion "
        "driving and turning) scored by DOTA's AP50 on polygon IoU; the model defaults to the bundled "
        "rotated-box model",
    )
    parser.add_argument(
        "--pose",
        action="store_true",
        help="keypoints: scenes of articulated figures with 13 named joints scored by COCO keypoint AP (OKS), also "
        "over the figures cut by tile seams, with per-joint fusion against the keeper's keypoints "
        "(tiles+full/keeper); configs full, tiles, tiles+full, tiles+full/keeper; the model defaults to the "
        "bundled pose model",
    )
    parser.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        default=[],
        metavar="N",
        help="with --motion: compare these tile_budget values (and every tile, 0) side by side, "
        "each beside what a user could do instead at the same tiles per frame (interval N: "
        "every tile on one frame in k; round_robin N: the tiles in turn): views per frame, "
        "frames/s, new-object latency; the chart plots them",
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        default=None,
        choices=settings()["precision"].kind.choices,
        help="engine precision; several (e.g. fp32 int8) evaluate each side by side, rows named "
        "'CONFIG PRECISION'; int8 without --calibration calibrates on the bundled synthetic "
        "sample frames (default: fp32, or the params file's)",
    )
    add_settings(parser, only=[n for n in settings() if n != "precision"])


def run(args: argparse.Namespace) -> int:
    """Build the detector, evaluate every configuration, write the report and print the table (or JSON)."""
    from tiled_detector.parameters import build_detector

    if args.frames < 1:
        print(f"--frames must be at least 1, got {args.frames}", file=sys.stderr)
        return 2
    if args.budgets and (not args.motion or min(args.budgets) < 0):
        print("--budgets takes tile budgets >= 0 (0: every tile) and needs --motion", file=sys.stderr)
        return 2
    try:
        camera = camera_motion(args)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    values = parameter_values(args)
    if args.pose and (args.obb or args.motion or args.budgets):
        print(
            "--pose evaluates still scenes of figures: not with --obb, --motion or --budgets", file=sys.stderr
        )
        return 2
    if args.pose and not values.get("model"):
        from tiled_detector.models import pose_model_path

        values["model"] = str(pose_model_path(values.get("backend")))
    if args.obb and not values.get("model"):
        from tiled_detector.models import obb_model_path

        values["model"] = str(obb_model_path(values.get("backend")))
    if args.obb and (args.pan or args.rotate or args.zoom != 1.0 or args.shake):
        print(
            "--obb: the rotated world's sequences have a still camera (no --pan, --rotate, --zoom or --shake)",
            file=sys.stderr,
        )
        return 2
    if args.motion and "tracker" not in flag_parameters(args):
        values["tracker"] = "bytetrack"
    precisions = args.precision or [values.get("precision", "fp32")]
    # int8 without calibration: the bundled sample frames (the evaluated frames are synthetic too), with a warning
    detectors = {p: build_detector({**values, "precision": p}, sample_calibration=True) for p in precisions}
    detector = detectors[precisions[0]]

    def progress(done: int, total: int) -> None:
        if done % 10 == 0 or done == total:
            print(f"eval: {done}/{total} frames", file=sys.stderr, flush=True)

    if detector.config.depth:  # the 3D positions on synthetic depth scenes, the detector as configured
        if args.motion or args.budgets:
            print(
                "--depth evaluates 3D positions on still scenes: not with --motion or --budgets",
                file=sys.stderr,
            )
            return 2
        return _depth_report(args, detector, progress)

    if args.pose:
        return _pose_report(args, detector, progress)

    start = time.perf_counter()
    from tiled_detector.stream import budget_problem

    plan = detector.plan_for(args.height, args.width)
    for budget in [detector.config.tile_budget, *args.budgets]:
        problem = budget_problem(plan, budget, detector.config.max_tile_age)
        if problem:
            print(problem, file=sys.stderr)
            return 1
    results = {}
    for precision, each in detectors.items():
        found = evaluate(
            each,
            args.frames,
            args.seed,
            args.width,
            args.height,
            args.configs,
            progress,
            motion=args.motion,
            camera=camera,
            budgets=args.budgets,
            obb=args.obb,
        )
        results.update(
            {f"{name} {precision}" if len(detectors) > 1 else name: row for name, row in found.items()}
        )
    meta = {
        "model": str(detector.config.model),
        "backend": detector.engine.backend.value,
        "device": detector.config.device,
        "precision": {p: each.engine.precision.value for p, each in detectors.items()},
        "conf_threshold": detector.config.conf_threshold,
        "frames": args.frames,
        "motion": args.motion,
        "obb": args.obb,
        "tracker": detector.config.tracker.value,
        **{k: getattr(args, k) for k in ("pan", "rotate", "zoom", "shake")},
        "motion_compensation": detector.config.motion_compensation.value,
        "max_tile_age": detector.config.max_tile_age,
        "seed": args.seed,
        "frame_size": f"{args.width}x{args.height}",
        "seconds": round(time.perf_counter() - start, 1),
    }
    paths = write_report(results, args.out, meta)
    print(f"eval: wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    if args.json:
        print(json.dumps({**meta, "configs": results}))
    else:
        print(markdown_table(results), end="")
    return 0


def _depth_report(args: argparse.Namespace, detector: Any, progress: Callable[[int, int], None]) -> int:
    """`eval --depth`: position errors on synthetic depth scenes (`tools.depth_evaluation`), printed and written to
    OUT/eval_depth.json."""
    from tiled_detector.tools.scores.depth_evaluation import MIN_SIZE, evaluate_depth

    start = time.perf_counter()
    found = evaluate_depth(detector, args.frames, args.seed, args.width, args.height, progress)
    meta = {
        "model": str(detector.config.model),
        "device": detector.config.device,
        "frames": args.frames,
        "seed": args.seed,
        "frame_size": f"{args.width}x{args.height}",
        "min_size_px": MIN_SIZE,
        "seconds": round(time.perf_counter() - start, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    temporary = args.out / ".eval_depth.json.tmp"
    temporary.write_text(json.dumps({**meta, "depth": found}, indent=2) + "\n")
    temporary.replace(args.out / "eval_depth.json")
    if args.json:
        print(json.dumps({**meta, "depth": found}))
    else:
        print("| " + " | ".join(found) + " |\n|" + "---:|" * len(found))
        print("| " + " | ".join("n/a" if v is None else f"{v:.4g}" for v in found.values()) + " |")
    return 0


def _pose_report(args: argparse.Namespace, detector: Any, progress: Callable[[int, int], None]) -> int:
    """`eval --pose`: keypoint AP per configuration (`tools.pose_evaluation`), printed (or JSON) and written to
    OUT/eval_pose.json and OUT/eval_pose.md."""
    from tiled_detector.tools.scores import pose_evaluation

    configs = args.configs if args.configs != list(CONFIGS) else list(pose_evaluation.CONFIGS)
    try:
        for name in configs:
            pose_evaluation.config_changes(name, args.width, args.height)
        start = time.perf_counter()
        found = pose_evaluation.evaluate_pose(
            detector, args.frames, args.seed, args.width, args.height, configs, progress
        )
    except ValueError as error:
        print(error, file=sys.stderr)
        return 1
    meta = {
        "model": str(detector.config.model),
        "backend": detector.engine.backend.value,
        "device": detector.config.device,
        "conf_threshold": detector.config.conf_threshold,
        "frames": args.frames,
        "seed": args.seed,
        "frame_size": f"{args.width}x{args.height}",
        "seconds": round(time.perf_counter() - start, 1),
    }
    paths = pose_evaluation.write_report(found, args.out, meta)
    print(f"eval: wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    if args.json:
        print(json.dumps({**meta, "configs": found}))
    else:
        print(pose_evaluation.markdown_table(found), end="")
    return 0
