"""`tiled-detector make-bag`: write a rosbag2 bag of camera frames (synthetic with ground truth, a folder of
images or a video file), readable by `ros2 bag` from Humble on and by `tiled-detector replay`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tiled_detector.commands.camera_motion import add_camera_arguments, camera_motion

EPILOG = """examples:
  tiled-detector make-bag out/sample_bag --frames 30  # 30 synthetic 1920x1080 frames + ground truth
  tiled-detector make-bag out/cam_bag --video drive.mp4 --frames 300 --storage mcap
  tiled-detector make-bag out/jpeg_bag --images shots/ --compressed --rate 10
  tiled-detector make-bag out/moving --motion --frames 60 --pan 2   # moving objects, ids in the ground truth
  tiled-detector make-bag out/robot --motion --pan 4 --rotate 0.1 --shake 2   # a robot's camera; true motion kept
  tiled-detector make-bag out/rgbd --depth --width 3840 --height 2160 --frames 10   # + depth, CameraInfo, 3D truth
Synthetic frame i uses seed S+i, so the same command always writes the same bag."""


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
    parser.add_argument("--motion", action="store_true",
                        help="synthetic: one moving scene (objects with their own velocities, crossing, occluded, "
                             "entering and leaving); the ground truth carries each object's id")  # fmt: skip
    add_camera_arguments(parser)
    parser.add_argument(
        "--depth",
        action="store_true",
        help="synthetic: an aligned depth image (16UC1, mm; objects of 8-80 px at 3-60 m over a ground plane, "
        "5 %% holes, 1 %% noise) and the CameraInfo with each frame, the true 3D positions on "
        "/ground_truth/detections_3d",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--images", type=Path, help="a folder of images (sorted by name) instead of synthetic"
    )
    source.add_argument("--video", type=Path, help="a video file instead of synthetic frames")
    parser.add_argument(
        "--topic", default="/camera/image_raw", help="image topic (default /camera/image_raw)"
    )
    parser.add_argument("--frame-id", default="camera", help="header frame_id (default camera)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    """Write the bag and print what it holds."""
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
    if args.images is not None:
        if args.frames is not None:
            raise ValueError("--frames cannot be used with --images (every image is written)")
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
        )
    info = bags.bag_info(path)
    print(f"wrote {path} ({info.storage.value}, rosbag2 metadata version {bags.METADATA_VERSION})")
    for topic, (msgtype, count) in info.topics.items():
        print(f"  {topic}: {count} x {msgtype}")
    return 0
