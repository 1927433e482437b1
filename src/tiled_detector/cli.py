"""The one `tiled-detector` command line: subcommands are loaded lazily from `tiled_detector.commands`."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType

from tiled_detector import __version__
from tiled_detector.runtime.errors import one_line
from tiled_detector.runtime.threads import follow_load, short_spin

# name -> (module under tiled_detector.commands, one-line help). Each module defines
# `add_arguments(parser)` and `run(args) -> int`; only the chosen one is imported.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "the main job: run the node on a stream of frames and print a report"),
    "detect": ("detect", "detect objects in image files"),
    "eval": ("evaluate", "COCO metrics of tiled vs full-frame detection on synthetic scenes"),
    "make-bag": ("make_bag", "write a rosbag2 bag of images (and ground truth)"),
    "replay": ("replay", "replay a bag through the node and score its detections"),
    "build-engine": ("build_engine", "build (and cache) a TensorRT engine from an ONNX model"),
    "bench": (
        "bench",
        "time the pipeline per stage against the model alone, per backend, precision and size",
    ),
    "env": ("env", "versions of everything the detector depends on, and the GPU"),
    "inspect": (
        "inspect",
        "what the node would make of a model file (layout, inputs, labels, tiles) and why",
    ),
}


def top_parser() -> argparse.ArgumentParser:
    """The parser of `tiled-detector` itself: the subcommand's name and the flags before it."""
    parser = argparse.ArgumentParser(
        prog="tiled-detector",
        description="Tiled small-object detection for ROS 2.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="subcommands:\n" + "\n".join(f"  {n:<14} {h}" for n, (_, h) in COMMANDS.items()),
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND", help="see below")
    parser.add_argument("--version", action="version", version=f"tiled-detector {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (any subcommand)"
    )
    return parser


def subcommand(name: str) -> tuple[ModuleType, argparse.ArgumentParser]:
    """The module of subcommand `name` (imported now) and its parser, with every flag it takes."""
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(f"tiled_detector.commands.{module_name}")
    parser = argparse.ArgumentParser(prog=f"tiled-detector {name}", description=help_text)
    module.add_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return module, parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tiled-detector` console script.

    Exit codes: 0 done, 1 an error (one line on stderr: `<command>: cannot start: <what and why>`; the traceback
    with `--debug`), 2 a usage error, 130 interrupted (Ctrl-C). A subcommand may return 1 for its own verdicts.
    """
    short_spin()  # before a subcommand imports torch
    if argv is None:  # the console script's own process (not a caller's): torch's CPU threads follow the load
        follow_load()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    if not args or args[0] not in COMMANDS:
        top_parser().parse_args(args[:1] or ["--help"])
        return 2
    name, rest = args[0], args[1:]
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # a shell's background job starts with SIGINT ignored: Ctrl-C / `kill -INT` still end a command (exit
        # 130, its node stopped), as they end the node itself (tiled_detector.ros.run)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        module, parser = subcommand(name)
        return int(module.run(parser.parse_args(rest)) or 0)
    except KeyboardInterrupt:
        print(f"tiled-detector {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # the CLI boundary: one line for the user (--debug: the traceback)
        if debug:
            traceback.print_exc()
        print(f"tiled-detector {name}: cannot start: {one_line(error)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
