"""The flags of the synthetic worlds (`make-bag`, `eval`): a moving scene (`--motion`), how a robot's camera moves in
it, and the rotated world (`--obb`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tiled_detector.tools.worlds.synthetic import MotionStyle


def add_world_arguments(parser: argparse.ArgumentParser, motion: str, obb: str) -> None:
    """--motion (its help `motion`), the camera's motion (`add_camera_arguments`) and --obb (its help `obb`)."""
    parser.add_argument("--motion", action="store_true", help=motion)
    add_camera_arguments(parser)
    parser.add_argument("--obb", action="store_true", help=obb)


def add_camera_arguments(parser: argparse.ArgumentParser) -> None:
    """--pan, --rotate, --zoom and --shake."""
    parser.add_argument(
        "--pan",
        type=float,
        default=0.0,
        metavar="PIXELS_PER_FRAME",
        help="with --motion: the camera pans this many pixels per frame (default 0)",
    )
    parser.add_argument(
        "--rotate",
        type=float,
        default=0.0,
        metavar="DEGREES_PER_FRAME",
        help="with --motion: the camera turns this many degrees per frame about the centre (default 0)",
    )
    parser.add_argument(
        "--zoom",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="with --motion: the view scales by this factor per frame about the centre (above 1: "
        "driving forward; default 1)",
    )
    parser.add_argument(
        "--shake",
        type=float,
        default=0.0,
        metavar="PIXELS",
        help="with --motion: each frame's view jitters by up to this many pixels per axis (default 0)",
    )


def camera_motion(args: argparse.Namespace) -> MotionStyle | None:
    """The camera's motion the flags give (None: none given); ValueError naming a bad flag, or camera flags
    without --motion."""
    from tiled_detector.tools.worlds.synthetic import MotionStyle, camera_motion_problem

    moving = args.pan or args.rotate or args.zoom != 1.0 or args.shake
    problem = camera_motion_problem(args.rotate, args.zoom, args.shake)
    if problem:
        raise ValueError(problem)
    if moving and not args.motion:
        raise ValueError("--pan, --rotate, --zoom and --shake need --motion")
    if not args.motion:
        return None
    return MotionStyle(pan=args.pan, rotate=args.rotate, zoom=args.zoom, shake=args.shake)
