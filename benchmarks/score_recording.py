"""A recording with ground truth scored in this process, without ROS: what `tiled-detector replay --json` reports
for the bag `make-bag --truth` writes of it (`tools.stream_scores.score_stream`: the same frames, the same settings,
the bag's stamps, through the `Stream` the node runs).

    .venv/bin/python benchmarks/score_recording.py --images DIR --truth gt.txt --truth-class person --rate 30 \
        --model yolox_nano.onnx --classes person --tracker bytetrack

The frames and the truth are read as `make-bag` reads them (`--images` / `--video`, `--frames`, `--truth`,
`--truth-format`, `--truth-class`); the detector's settings as `replay` gives them to the node
(config/detector.yaml unless --params-file, then the flags). Prints one JSON object: frames, AP50, IDF1, MOTA,
id_switches.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tiled_detector.commands.make_bag import add_truth_arguments
from tiled_detector.commands.settings import add_settings, default_params_file, parameter_values
from tiled_detector.harness.recording import frame_stamp
from tiled_detector.parameters import build_detector
from tiled_detector.tools.scores.rotated_truth import rotated_recording_frames
from tiled_detector.tools.scores.stream_scores import score_stream
from tiled_detector.tools.scores.truth import TruthFormat, recording_frames


def scores(argv: Sequence[str] | None = None) -> dict[str, float | int | None]:
    """The scores of the recording the arguments name (the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", type=Path, help="a folder of images (in natural order of their names)")
    source.add_argument("--video", type=Path, help="a video file")
    parser.add_argument("--frames", type=int, default=None, help="with --video: at most this many frames")
    parser.add_argument("--rate", type=float, default=30.0, help="the bag's frame rate in Hz (default 30)")
    add_truth_arguments(parser)
    add_settings(parser, params_file_help="the node's params file (default config/detector.yaml)")
    args = parser.parse_args(argv)
    kind = TruthFormat.of(args.truth, args.truth_format) if args.truth is not None else None
    if kind is None or (args.truth_class is None and not kind.rotated):
        parser.error("--truth FILE and --truth-class NAME are needed: the recording's ground truth")
    args.params_file = args.params_file or default_params_file()
    detector = build_detector(parameter_values(args))
    stamps = (frame_stamp(index, args.rate) for index in range(sys.maxsize))
    if kind.rotated:  # a folder of DOTA / ultralytics OBB labels: classes by the model's labels
        if args.images is None:
            parser.error(f"--truth-format {kind.value} needs --images")
        labels = list(detector.labels or ())
        frames, _ = rotated_recording_frames(args.images, args.truth, kind, labels, args.truth_class)
        return score_stream(detector, frames, stamps, labels)
    frames, _ = recording_frames(
        args.images, args.video, args.frames, args.truth, args.truth_format, args.truth_class
    )
    return score_stream(detector, frames, stamps, [args.truth_class])


if __name__ == "__main__":
    print(json.dumps(scores()))
