"""`tiled-detector build-engine`: build (and cache) a TensorRT engine from an ONNX model, or with `--backend
onnxruntime --precision int8` the Q/DQ model ONNX Runtime runs and TensorRT builds from; with a progress bar."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from tiled_detector.commands.progress import TextProgress
from tiled_detector.commands.settings import add_settings, frame_size, parameter_values
from tiled_detector.config import DetectorConfig, settings
from tiled_detector.engines.base import Precision
from tiled_detector.pipeline.tiling import make_plan

BUILD_SETTINGS = (
    "device",
    "precision",
    "calibration",
    "max_batch",
    "input_size",
    "tile_size",
    "overlap",
    "full_frame",
    "channel_order",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tiled-detector build-engine`."""
    parser.add_argument(
        "model",
        type=Path,
        nargs="?",
        default=None,
        help="ONNX model (default: the bundled model's ONNX file)",
    )
    parser.add_argument(
        "--opt-batch",
        type=int,
        default=None,
        help="batch to optimise for: tiles per frame + 1 (default 9, at most --max-batch)",
    )
    parser.add_argument(
        "--camera-size",
        nargs="+",
        type=frame_size,
        metavar="WxH",
        help="the frame size of each camera one node detects together (a size per camera, e.g. 1920x1080 "
        "1920x1080 1280x720): the engine is optimised for one frame of each in one batch, and max_batch is "
        "raised to that batch when smaller",
    )
    parser.add_argument(
        "--backend",
        choices=settings()["backend"].kind.choices,
        default="tensorrt",
        help="tensorrt: a TensorRT engine (on the GPU it will run on; int8 from the Q/DQ model); "
        "onnxruntime: the int8 Q/DQ model only (no GPU needed), which ONNX Runtime runs "
        "(default tensorrt; the others build nothing)",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="engine cache (default $XDG_CACHE_HOME/tiled_detector)"
    )
    parser.add_argument(
        "--version-compatible",
        action="store_true",
        help="build with TensorRT's version compatibility: the engine also runs on TensorRT's lean runtime and on "
        "later TensorRT versions (it carries the lean runtime: load it with the engine option "
        "engine_host_code_allowed; it may run slower)",
    )
    parser.add_argument("--out", type=Path, help="also copy the engine (or the Q/DQ model) to this file")
    parser.add_argument("--verbose", action="store_true", help="TensorRT's info messages too")
    # the node's settings that shape the engine (precision, batch) and its INT8 calibration (frames, tiling)
    add_settings(parser, only=BUILD_SETTINGS, defaults={"device": "cuda:0"})


def camera_batch(sizes: list[tuple[int, int]], config: DetectorConfig) -> int:
    """Views (tiles and full-frame views) of one frame of each (width, height) with the config's tiling: the
    batch a node with these cameras runs when every camera has a frame (the model's input size changes only the
    letterbox of a view, not how many there are, so the tile size stands in for it; auto: the model's input)."""
    from tiled_detector.tools.calibration import model_input_hw

    tile_hw = config.tile_hw_for(model_input_hw(config))
    return sum(
        make_plan((h, w), tile_hw, config.overlap, tile_hw, config.full_frame).batch_size for w, h in sizes
    )


def batch_profile(args: argparse.Namespace, config: DetectorConfig, default_opt: int) -> tuple[int, int]:
    """(opt_batch, max_batch) of the engine's profile: --opt-batch, else the cameras' batch (--camera-size),
    else `default_opt` (what the node's own build uses); max_batch raised to the cameras' batch if smaller."""
    if not args.camera_size:
        return args.opt_batch or min(default_opt, config.max_batch), config.max_batch
    views = camera_batch(args.camera_size, config)
    max_batch = max(config.max_batch, views)
    if max_batch > config.max_batch:
        print(
            f"max_batch raised to {max_batch} for {len(args.camera_size)} cameras ({views} views per cycle): "
            f"run the node with max_batch:={max_batch}, or give it the engine file as model:="
        )
    return min(args.opt_batch or views, max_batch), max_batch


def run(args: argparse.Namespace) -> int:
    """Build (or find in the cache) the engine or the Q/DQ model; print its path."""
    import torch

    from tiled_detector.parameters import config_changes
    from tiled_detector.runtime.devices import require_cuda
    from tiled_detector.tools.calibration import int8_model

    config = DetectorConfig(
        **{**config_changes(parameter_values(args)), "backend": args.backend, "model": args.model}
    )
    if not config.model.is_file():
        print(f"error: {config.model} is not a file", file=sys.stderr)
        return 2
    if args.backend not in ("tensorrt", "onnxruntime"):
        print(f"error: build-engine builds for tensorrt or onnxruntime, not {args.backend}", file=sys.stderr)
        return 2
    if args.backend == "onnxruntime" and config.precision is not Precision.INT8:
        print(
            f"error: ONNX Runtime runs {config.model} at {config.precision.value} as it is: build-engine "
            "--backend onnxruntime makes int8 models (--precision int8)",
            file=sys.stderr,
        )
        return 2
    if args.backend == "tensorrt":
        # checked before anything else: without a GPU the native builder can crash the process
        require_cuda(
            torch.device(config.device), "build-engine builds TensorRT engines on the GPU they will run on"
        )
    started = time.monotonic()
    progress = TextProgress()
    model = int8_model(config, sample_default=True, cache_dir=args.cache_dir, progress=progress)
    if args.backend == "onnxruntime":
        print(
            f"int8 model: {model} ({time.monotonic() - started:.1f} s, Q/DQ by ONNX Runtime {ort_version()})"
        )
        return _copy(model, args.out)
    path, version = _build_tensorrt(args, config, model, progress)
    print(f"engine: {path} ({time.monotonic() - started:.1f} s, TensorRT {version})")
    return _copy(path, args.out)


def ort_version() -> str:
    """ONNX Runtime's version (its quantizer made the Q/DQ model)."""
    import onnxruntime

    return onnxruntime.__version__


def _copy(path: Path, out: Path | None) -> int:
    if out is not None:
        shutil.copyfile(path, out)
        print(f"copied to {out}")
    return 0


def _build_tensorrt(
    args: argparse.Namespace, config: DetectorConfig, model: Path, progress: TextProgress
) -> tuple[Path, str]:
    """The TensorRT engine of `model` (the Q/DQ copy at int8) from the cache, built when missing."""
    import torch

    from tiled_detector.engines.tensorrt_api import import_tensorrt, make_logger, make_runtime
    from tiled_detector.engines.tensorrt_build import BuildOptions, load_or_build

    device = torch.device(config.device)
    trt = import_tensorrt()
    logger = make_logger(trt, args.verbose)
    # the version-compatible engine built here carries the lean runtime: ours, so its host code is trusted
    runtime = make_runtime(trt, logger, host_code_allowed=args.version_compatible)
    input_hw = (config.input_size[1], config.input_size[0]) if config.input_size else None
    opt_batch, max_batch = batch_profile(args, config, BuildOptions.opt_batch)
    options = BuildOptions(
        config.precision, max_batch, opt_batch, input_hw, version_compatible=args.version_compatible
    )
    _, path = load_or_build(trt, runtime, logger, model, options, device, args.cache_dir, progress)
    return path, str(trt.__version__)
