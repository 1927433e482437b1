"""`tiled-detector make-bag`: write a rosbag2 bag of camera frames (synthetic with ground truth, a folder of
images or a video file, with the ground truth of a MOTChallenge or COCO file), readable by `ros2 bag` from Humble
on and by `tiled-detector replay`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from tiled_detector.commands.camera_motion import add_world_arguments, camera_motion
from tiled_detector.commands.settings import add_settings, parameter_values

if TYPE_CHECKING:
    from tiled_detector.tools.scores.rotated_truth import LabelFolder, RotatedTruthFrames
    from tiled_detector.tools.scores.truth import Truth, TruthFormat, TruthFrames

# the settings that name the detector's classes: `--truth-class` must be one of them
LABEL_SETTINGS = ("model", "labels", "layout")

EPILOG = """examples:
  tiled-detector make-bag out/sample_bag --frames 30  # 30 synthetic 1920x1080 frames + ground truth
  tiled-detector make-bag out/cam_bag --video drive.mp4 --frames 300 --storage mcap
  tiled-detector make-bag out/jpeg_bag --images shots/ --compressed --rate 10
  tiled-detector make-bag out/moving --motion --frames 60 --pan 2   # moving objects, ids in the ground truth
  tiled-detector make-bag out/robot --motion --pan 4 --rotate 0.1 --shake 2   # a robot's camera; true motion kept
  tiled-detector make-bag out/rgbd --depth --width 3840 --height 2160 --frames 10   # + depth, CameraInfo, 3D truth
  # your recording with its MOTChallenge ground truth (ids: replay reports IDF1, MOTA, id_switches)
  tiled-detector make-bag out/mot04 --images MOT17-04/img1 --truth MOT17-04/gt/gt.txt --truth-class person \\
    --model yolox_nano.onnx
  tiled-detector make-bag out/yard --video yard.mp4 --truth yard.json --truth-class person --model yolox_nano.onnx
  # aerial images with their DOTA labels (rotated boxes; replay scores DOTA's AP50, difficult objects ignored)
  tiled-detector make-bag out/dota --images DOTA/images --truth DOTA/labelTxt --truth-format dota \
    --model yolov8n-obb.onnx
  tiled-detector make-bag out/rotated --obb --frames 10   # the rotated world with rotated truth (--motion: turning)
  tiled-detector make-bag out/pose --pose --frames 10     # figures with 13 named joints: keypoint truth
  # photos with COCO person keypoints (replay scores keypoint AP by OKS); the pose model's joints must match
  tiled-detector make-bag out/people --images val2017 --truth person_keypoints_val2017.json --truth-class person \
    --model yolov8n-pose.onnx
Synthetic frame i uses seed S+i, so the same command always writes the same bag.
--truth: a MOTChallenge gt.txt (frame n = the n-th image in natural order, frame2 before frame10, the names numbering
the frames one to one / the n-th video frame; pedestrians with consider 1) or a
COCO file (images matched by file name; for a video, its images in frame_index / frame_id / id order; track_id,
instance_id or attributes.track_id give identities; person keypoints are kept, their joints as many as the
category names and, with --model a pose model, as its joints, else refused). --truth-class names the detector's class the objects are:
checked against the labels of the model given by --model / --labels / --params-file (default: the bundled model).
--truth DIR --truth-format dota / yolo-obb: a folder of label files, one <image name>.txt per image of --images
(an image without objects needs an empty file): DOTA labelTxt (8 corner coordinates, class, difficult; classes
matched to the model's labels, - _ and spaces alike) or ultralytics OBB labels (class index, 8 normalised
coordinates). The ground truth is rotated boxes (each label's minimum-area rectangle; center.theta the angle; a
difficult object has score 0); --truth-class, optional there, keeps one class."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of make-bag."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("out", type=Path, help="bag folder to create")
    parser.add_argument(
        "--frames",
        type=int,
        default=None,
        help="number of frames (synthetic default 30; "
        "with --video at most this many; not allowed with --images)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the first synthetic frame (default 0)")
    parser.add_argument("--width", type=int, default=1920, help="synthetic frame width (default 1920)")
    parser.add_argument("--height", type=int, default=1080, help="synthetic frame height (default 1080)")
    parser.add_argument(
        "--rate", type=float, default=30.0, help="frame rate of the stamps in Hz (default 30)"
    )
    parser.add_argument("--storage", choices=("sqlite3", "mcap"), default="sqlite3")
    parser.add_argument("--compressed", action="store_true", help="sensor_msgs/CompressedImage (JPEG) frames")
    add_world_arguments(
        parser,
        motion="synthetic: one moving scene (objects with their own velocities, crossing, occluded, "
        "entering and leaving); the ground truth carries each object's id",
        obb="synthetic: the rotated world (boats, cars, trucks at any angle, dense rows) with rotated ground truth "
        "(center.theta); with --motion its objects drive and turn (a still camera)",
    )
    parser.add_argument(
        "--pose",
        action="store_true",
        help="synthetic: the pose world (articulated figures with 13 named joints, still scenes) with keypoint truth "
        "(/ground_truth/keypoints; replay scores keypoint AP)",
    )
    parser.add_argument(
        "--depth",
        action="store_true",
        help="synthetic: an aligned depth image (16UC1, mm; objects of 8-80 px at 3-60 m over a ground plane, "
        "5 %% holes, 1 %% noise) and the CameraInfo with each frame, the true 3D positions on "
        "/ground_truth/detections_3d",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--images",
        type=Path,
        help="a folder of images (in natural order of their names: frame2 before frame10) instead of synthetic",
    )
    source.add_argument("--video", type=Path, help="a video file instead of synthetic frames")
    parser.add_argument(
        "--topic", default="/camera/image_raw", help="image topic (default /camera/image_raw)"
    )
    parser.add_argument("--frame-id", default="camera", help="header frame_id (default camera)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    add_truth_arguments(parser)
    add_settings(
        parser,
        only=LABEL_SETTINGS,
        params_file_help="a params file naming the model the bag will be replayed with (--truth-class is "
        "checked against its labels)",
    )


def add_truth_arguments(parser: argparse.ArgumentParser) -> None:
    """`--truth`, `--truth-format` and `--truth-class` (also `benchmarks/score_recording.py`'s)."""
    group = parser.add_argument_group("ground truth of --images / --video")
    group.add_argument(
        "--truth",
        type=Path,
        default=None,
        metavar="FILE",
        help="a MOTChallenge gt.txt or a COCO JSON file of the frames' objects, or a folder of label files "
        "(dota, yolo-obb: one per image)",
    )
    group.add_argument(
        "--truth-format",
        default=None,
        metavar="{mot,coco,dota,yolo-obb}",
        help="the --truth file's format (default from its suffix: .txt mot, .json coco); a folder of DOTA labelTxt "
        "(dota) or ultralytics OBB labels (yolo-obb) gives rotated boxes",
    )
    group.add_argument(
        "--truth-class",
        default=None,
        metavar="NAME",
        help="the detector's class the truth's objects are (e.g. person); with coco, the category "
        "of that name is taken",
    )


def run(args: argparse.Namespace) -> int:
    """Write the bag and print what it holds."""
    import numpy as np

    from tiled_detector.harness import bags, recording
    from tiled_detector.tools import frames as sources

    common = {
        "rate": args.rate,
        "storage": args.storage,
        "compressed": args.compressed,
        "topic": args.topic,
        "frame_id": args.frame_id,
        "force": args.force,
    }
    camera = camera_motion(args)
    if args.motion and (args.images is not None or args.video is not None):
        raise ValueError("--motion makes synthetic frames: not with --images or --video")
    if args.depth and (args.motion or args.images is not None or args.video is not None):
        raise ValueError("--depth makes synthetic still scenes: not with --motion, --images or --video")
    if args.images is not None and args.frames is not None:
        raise ValueError("--frames cannot be used with --images (every image is written)")
    still = not (args.pan or args.rotate or args.zoom != 1.0 or args.shake)
    if args.obb and (args.depth or args.images is not None or args.video is not None or not still):
        raise ValueError(
            "--obb makes synthetic rotated scenes (with --motion a still camera): not with --depth, --images, "
            "--video, --pan, --rotate, --zoom or --shake"
        )
    if args.pose and (
        args.obb or args.motion or args.depth or args.images is not None or args.video is not None
    ):
        raise ValueError(
            "--pose makes synthetic still scenes of figures: not with --obb, --motion, --depth, --images or --video"
        )
    truth = truthful = None
    if args.truth is not None:
        path, truthful, truth = _truth_bag(args, common)
    elif args.truth_class is not None or args.truth_format is not None:
        raise ValueError(f"--truth-{'class' if args.truth_class else 'format'} needs --truth FILE")
    elif args.images is not None:
        path = recording.write_image_bag(
            args.out,
            sources.image_folder_frames(args.images),
            **common,
            custom_data={"source": f"images:{args.images}"},
        )
    elif args.video is not None:
        frames = sources.video_frames(args.video, args.frames)
        path = recording.write_image_bag(
            args.out, frames, **common, custom_data={"source": f"video:{args.video}"}
        )
    elif args.depth:
        from tiled_detector.harness.depth_recording import make_depth_bag

        path = make_depth_bag(
            args.out, 30 if args.frames is None else args.frames, args.seed, args.width, args.height, **common
        )
    else:
        path = recording.make_synthetic_bag(
            args.out,
            30 if args.frames is None else args.frames,
            args.seed,
            args.width,
            args.height,
            **common,
            camera=camera,
            rotated=args.obb,
            pose=args.pose,
        )
    info = bags.bag_info(path)
    print(f"wrote {path} ({info.storage.value}, rosbag2 metadata version {bags.METADATA_VERSION})")
    for topic, (msgtype, count) in info.topics.items():
        print(f"  {topic}: {count} x {msgtype}")
    if truth is not None and hasattr(truth, "difficult"):  # rotated truth from label files
        left = f"; {truth.left_out} objects of other classes left out ({', '.join(truth.left_out_classes)})"
        outside = truthful.outside
        print(
            f"  ground truth: {len(truth.frame) - outside} rotated boxes ({int(truth.difficult.sum())} difficult) "
            f"from {args.truth}{left if truth.left_out else ''}"
            + (f"; {outside} objects with no area inside their image left out" if outside else "")
        )
    elif truth is not None and truthful is not None:
        written = int(np.count_nonzero(truth.frame < info.topics[args.topic][1])) - truthful.outside
        joints = "" if truth.keypoints is None else f", keypoints of {len(truth.joints)} joints"
        print(
            f"  ground truth: {written} {args.truth_class} boxes from {args.truth}, "
            f"{'with identities' if truth.identities else 'no identities (AP50 only)'}{joints}; "
            f"{truth.left_out} rows / annotations left out (consider 0, other classes, crowds), "
            f"{truthful.outside} with no area inside their frame"
        )
    return 0


def _truth_bag(
    args: argparse.Namespace, common: dict[str, object]
) -> tuple[Path, TruthFrames | RotatedTruthFrames, Truth | LabelFolder]:
    """The bag of `--images` / `--video` with the `--truth` file's boxes as ground truth (checked before writing;
    a mismatch found while reading the frames leaves nothing written), the frames written (their count of boxes
    left out) and the truth."""
    from tiled_detector.harness import recording
    from tiled_detector.tools.scores.truth import TruthError, TruthFormat, recording_frames

    kind = TruthFormat.of(args.truth, args.truth_format)
    if kind.rotated:
        return _rotated_truth_bag(args, common, kind)
    if args.truth_class is None:
        raise TruthError("--truth needs --truth-class NAME: the detector's class the truth's objects are")
    from tiled_detector.parameters import build_detector

    values = parameter_values(args)
    detector = build_detector(values)
    posed = detector.resolved.keypoints if values.get("model") else None  # a pose --model: its joints
    frames, truth = recording_frames(
        args.images,
        args.video,
        args.frames,
        args.truth,
        args.truth_format,
        args.truth_class,
        None if posed is None else posed.joints,
    )
    _check_class(args, values, detector.labels or ())
    source = f"images:{args.images}" if args.images is not None else f"video:{args.video}"
    custom = {
        "source": source,
        "truth": str(args.truth),
        "truth_class": args.truth_class,
        recording.IDENTITIES: str(truth.identities).lower(),
    }
    if truth.keypoints is not None:
        custom.update(
            {recording.JOINTS: json.dumps(truth.joints), recording.SKELETON: json.dumps(truth.skeleton)}
        )
    path = recording.write_image_bag(
        args.out, frames, **common, labels=[args.truth_class], custom_data=custom
    )
    return path, frames, truth


def _rotated_truth_bag(
    args: argparse.Namespace, common: dict[str, object], kind: TruthFormat
) -> tuple[Path, RotatedTruthFrames, LabelFolder]:
    """The bag of `--images` with the rotated boxes of a folder of label files (DOTA, ultralytics OBB) as ground
    truth, classes named by the model's labels (every label file read and checked before anything is written)."""
    from tiled_detector.harness import recording
    from tiled_detector.parameters import build_detector
    from tiled_detector.tools.scores.rotated_truth import rotated_recording_frames
    from tiled_detector.tools.scores.truth import TruthError

    if args.images is None:
        raise TruthError(
            f"--truth-format {kind.value} needs --images: one label file per image, matched by name"
        )
    values = parameter_values(args)
    labels = list(build_detector(values).labels or ())
    frames, truth = rotated_recording_frames(args.images, args.truth, kind, labels, args.truth_class)
    custom = {
        "source": f"images:{args.images}",
        "truth": str(args.truth),
        "truth_format": kind.value,
        recording.ROTATED: "true",
    }
    path = recording.write_image_bag(args.out, frames, **common, labels=labels, custom_data=custom)
    return path, frames, truth


def _check_class(args: argparse.Namespace, values: dict, labels: tuple[str, ...]) -> None:
    """ValueError unless `--truth-class` is one of the `labels` of the detector the settings (`values`) describe."""
    if args.truth_class not in labels:
        model = values.get("model") or "the bundled model"
        raise ValueError(
            f"--truth-class {args.truth_class}: not a class of {model} (its labels: {', '.join(labels) or 'none'}); "
            "give the model the bag will be replayed with (--model, --labels or --params-file)"
        )
