"""`tiled-detector replay`: play a bag through the detector node, score it, gate a release on the result."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiled_detector.commands.settings import add_settings, default_params_file, flag_parameters

EPILOG = """gate a release on a bag (exit 0: passed, 1: a threshold was missed, 2: the replay could not run):
  tiled-detector make-bag bags/sample --frames 30          # or record one on the robot: ros2 bag record
  tiled-detector replay bags/sample --min-ap50 0.80 --min-recall 0.80 --out out/replay --json
  tiled-detector make-bag bags/moving --motion --frames 60 && tiled-detector replay bags/moving --tracker bytetrack \
    --min-idf1 0.80 --json          # tracking: IDF1, MOTA, id_switches against the ground truth's identities

  The last line printed with --json is one JSON object:
    {"frames_sent": 30, "frames_answered": 30, "dropped": 0, "AP50": 0.9, "precision": ..., "recall": ...,
     "latency_ms_p50": ..., "latency_ms_p95": ..., "IDF1": ..., "MOTA": ..., "id_switches": ...,
     "views_per_frame": 9.2, "views_per_frame_max": 33, "frames_per_second": ..., "predicted_boxes": ...,
     "frames_skipped": 0}
  views_per_frame (mean, max) are the engine views the node ran per frame (tiles + full-frame view, from its
  /diagnostics); predicted_boxes counts detections reported from an earlier frame (tile_budget: tiles not run);
  frames_skipped the frames sent that the node never took (its /diagnostics; null where not counted).
  An RGB-D bag (make-bag --depth) plays its depth images and camera infos into the node too: with --depth the node
  answers detections_3d, and the report adds depth_error_median, depth_error_p95 (|p - p_true| / |p_true| of the
  matched objects of 12 px and more) and objects_3d:
    tiled-detector make-bag bags/rgbd --depth --frames 10 && tiled-detector replay bags/rgbd --depth --json
  A segmentation model's node publishes masks (label images): the report adds label_images, label_images_missing,
  label_images_wrong (their values against the array of the same stamp) and, where the bag's truth has masks
  (make-bag --truth coco.json with segmentations), mask_AP and mask_AP50 (pycocotools segm).
  Scores use the bag's /ground_truth (vision_msgs/Detection2DArray, class_id = label name) over the answered
  frames; frames without an answer count as dropped (gate them with --max-drop-rate).
  lockstep (default) sends a frame, waits for its detections (matched by header stamp), then the next: it
  measures quality without losing frames. realtime plays at the bag's rate with /clock from the bag and
  use_sim_time:=true, so a node slower than the camera drops frames, as on the robot.
  --attach plays into a node that is already running (same host and ROS_DOMAIN_ID) instead of starting one."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of replay."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("bag", type=Path, help="rosbag2 folder (sqlite3 or mcap)")
    parser.add_argument("--mode", choices=("lockstep", "realtime"), default="lockstep")
    parser.add_argument("--min-ap50", type=float, default=None, help="fail (exit 1) below this AP50 [0, 1]")
    parser.add_argument(
        "--min-idf1",
        type=float,
        default=None,
        help="fail (exit 1) below this IDF1 [0, 1] (a bag whose ground truth has object identities: "
        "make-bag --motion, or --truth with ids; run the node with --tracker bytetrack)",
    )
    parser.add_argument(
        "--min-recall", type=float, default=None, help="fail (exit 1) below this recall [0, 1]"
    )
    parser.add_argument(
        "--max-drop-rate",
        type=float,
        default=None,
        help="fail (exit 1) above this fraction of frames without an answer [0, 1]",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object (last line)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write DIR/detections (a bag of the answers) and DIR/report.json",
    )
    parser.add_argument("--attach", action="store_true", help="use a running node instead of starting one")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME:=VALUE",
        help="any other node parameter, e.g. --param transport:=compressed (repeatable)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for a frame's answer (realtime: for the last one) (default 30)",
    )
    parser.add_argument(
        "--startup-timeout", type=float, default=120.0, help="seconds for the node to come up"
    )
    parser.add_argument(
        "--topic", default=None, help="image topic of the bag (default: its only image topic)"
    )
    parser.add_argument("--detections-topic", default="detections", help="topic the node answers on")
    add_settings(parser, params_file_help="the node's params file (default config/detector.yaml)")


def _parameters(items: list[str]) -> dict[str, object]:
    """NAME:=VALUE strings -> parameters (values parsed as YAML scalars, like `ros2 run -p`)."""
    import yaml

    out = {}
    for item in items:
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise ValueError(f"--param needs NAME:=VALUE, got {item!r}")
        out[name] = yaml.safe_load(value)
    return out


def run(args: argparse.Namespace) -> int:
    """Replay, print the report, return 0 (passed), 1 (a threshold missed) or 2 (could not run)."""
    from tiled_detector.harness.replay import ReplayError, ReplayOptions, Thresholds, replay_bag

    try:
        thresholds = Thresholds(args.min_ap50, args.min_recall, args.max_drop_rate, args.min_idf1)
        params_file = args.params_file
        if params_file is None and not args.attach:
            params_file = default_params_file()
        options = ReplayOptions(
            mode=args.mode,
            timeout=args.timeout,
            startup_timeout=args.startup_timeout,
            topic=args.topic,
            detections_topic=args.detections_topic,
            attach=args.attach,
            params_file=params_file,
            parameters={**_parameters(args.param), **flag_parameters(args)},
        )
        report = replay_bag(args.bag, options, args.out)
    except (ReplayError, ValueError, FileNotFoundError) as error:
        print(f"replay: cannot run: {error}")
        if args.json:
            print(json.dumps({"error": str(error).splitlines()[0]}))
        return 2
    failures = thresholds.failures(report)
    summary = {**report.summary(), "passed": not failures, "failures": failures}
    if not args.json:
        print(_describe(summary))
    for failure in failures:
        print(f"FAILED: {failure}")
    if args.json:
        print(json.dumps(summary))
    return 1 if failures else 0


def _describe(summary: dict[str, object]) -> str:
    """The human-readable report."""

    def number(value: object, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    return (
        f"{summary['mode']}: {summary['frames_answered']}/{summary['frames_sent']} frames answered, "
        f"{summary['dropped']} dropped\n"
        f"AP50 {number(summary['AP50'], '.3f')}, precision {number(summary['precision'], '.3f')}, "
        f"recall {number(summary['recall'], '.3f')} (IoU 0.5, answered frames)\n"
        f"latency p50 {number(summary['latency_ms_p50'], '.1f')} ms, "
        f"p95 {number(summary['latency_ms_p95'], '.1f')} ms"
        + (
            ""
            if summary.get("IDF1") is None
            else f"\nIDF1 {number(summary['IDF1'], '.3f')}, MOTA {number(summary['MOTA'], '.3f')}, "
            f"identity switches {summary['id_switches']} (ground truth identities, IoU 0.5)"
        )
        + f"\nviews per frame {number(summary['views_per_frame'], '.1f')} (max {summary['views_per_frame_max']}), "
        f"{number(summary['frames_per_second'], '.2f')} frames/s, {summary['predicted_boxes']} boxes reported "
        f"from an earlier frame, {summary['frames_skipped']} frames skipped"
        + (
            ""
            if summary.get("objects_3d") is None
            else f"\n3D: {summary['objects_3d']} objects with a position, error median "
            f"{number(summary['depth_error_median'], '.4f')}, p95 {number(summary['depth_error_p95'], '.4f')} of "
            "the true distance (objects of 12 px and more)"
        )
        + (
            ""
            if summary.get("label_images") is None
            else f"\nmasks: {summary['label_images']} label images ({summary['label_images_missing']} answers "
            f"with detections had none, {summary['label_images_wrong']} not matching their array), mask AP "
            f"{number(summary['mask_AP'], '.3f')}, mask AP50 {number(summary['mask_AP50'], '.3f')}"
        )
    )
