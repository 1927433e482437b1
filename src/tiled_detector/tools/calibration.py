"""INT8 from the frames the node will see: calibration frames (a folder of images, a rosbag2 bag's image topics,
or the bundled synthetic sample frames) spread over the source, tiled exactly as the detector tiles them at run
time (tiles + full-frame view), and the Q/DQ model made from them (`engines/quantize.py`), cached by everything it
depends on (model bytes, the calibration frames' bytes, the tiling, the recipe, the tools' versions)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

import tiled_detector
from tiled_detector.config import DetectorConfig
from tiled_detector.engines.base import Backend, ModelFormat, Precision, choose_backend, model_format
from tiled_detector.engines.cache import sha256_file
from tiled_detector.engines.onnx_model import (
    INT8_NEEDS_QDQ,
    file_has_qdq,
    onnx_input,
    onnx_metadata,
    onnx_sha256,
)
from tiled_detector.engines.quantize import QuantizedKey, cached_quantized, quantize_onnx
from tiled_detector.model_files.resolve import file_view, resolve
from tiled_detector.pipeline.preprocess import InputFormat, Preprocessor
from tiled_detector.pipeline.tiling import make_plan
from tiled_detector.tools.frames import (
    Frame,
    bag_frames,
    bag_image_count,
    bag_messages,
    image_paths,
    is_bag,
    read_image,
    synthetic_frames,
)

LOG = logging.getLogger(__name__)
CALIBRATION_FRAMES = 32  # frames calibrated on, spread evenly over the source (32 x 9 views at 1080p)
FEW_FRAMES = 8  # fewer calibrate poorly: a warning
SAMPLE_FRAMES = 16  # the bundled synthetic sample frames: 1920x1080, seeds apart from eval's held-out scenes
SAMPLE_SEED = 900_000
SAMPLE_SIZE = (1920, 1080)
SAMPLE_WARNING = (
    "int8: calibrating on the bundled synthetic sample frames; frames from your cameras calibrate better "
    "(--calibration DIR_OR_BAG)"
)


def runtime_tiling(
    device: torch.device,
    dtype: torch.dtype,
    input_hw: tuple[int, int],
    tile_hw: tuple[int, int] | None = None,
    overlap: float = 0.2,
    full_frame: bool = True,
    input_format: InputFormat | str = "rgb",
) -> Callable[[np.ndarray, str], torch.Tensor]:
    """frame -> engine batch, through the same `make_plan` + `Preprocessor` the detector runs (`input_format`:
    the model's input conventions, or its channel order alone)."""
    preprocessor = Preprocessor(device, dtype, input_hw, input_format)
    letterbox = preprocessor.format.letterbox

    def tile(frame: np.ndarray, encoding: str) -> torch.Tensor:
        plan = make_plan(
            frame.shape[:2], tile_hw or input_hw, overlap, input_hw, full_frame, letterbox=letterbox
        )
        return preprocessor.run(frame, plan, encoding).clone()

    return tile


def spread(count: int, most: int) -> list[int]:
    """At most `most` indices spread evenly over range(count), first and last included."""
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})


@dataclass(frozen=True)
class CalibrationSet:
    """The frames to calibrate on: `count` frames of `source` (None: the bundled sample frames), `digest` of
    their bytes (or of the sample's recipe), `frames()` reads them."""

    source: Path | None
    count: int
    digest: str
    frames: Callable[[], Iterator[Frame]]


def _readable(paths: list[Path]) -> Iterator[Frame]:
    """The frames of `paths`, skipping (with a warning) files OpenCV cannot decode."""
    for path in paths:
        try:
            yield read_image(path)
        except ValueError as error:
            LOG.warning("calibration: %s: skipped", error)


def calibration_set(source: Path | None) -> CalibrationSet:
    """At most `CALIBRATION_FRAMES` frames spread over a folder of images or a bag's image messages (None: the
    bundled sample frames). ValueError / FileNotFoundError (one line) when the source holds no readable image."""
    if source is None:
        recipe = f"synthetic seed {SAMPLE_SEED} frames {SAMPLE_FRAMES} size {SAMPLE_SIZE}"
        return CalibrationSet(
            None,
            SAMPLE_FRAMES,
            hashlib.sha256(recipe.encode()).hexdigest(),
            lambda: synthetic_frames(SAMPLE_FRAMES, SAMPLE_SEED, *SAMPLE_SIZE),
        )
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(
            f"calibration source {source} does not exist: give a folder of images or a bag"
        )
    digest = hashlib.sha256()
    if is_bag(source):
        chosen = set(spread(bag_image_count(source), CALIBRATION_FRAMES))
        for _, raw, _ in bag_messages(source, chosen.__contains__):
            digest.update(hashlib.sha256(raw).digest())
        if not chosen:
            raise ValueError(f"no image message in {source}")
        return CalibrationSet(
            source, len(chosen), digest.hexdigest(), lambda: bag_frames(source, chosen.__contains__)
        )
    if not source.is_dir():
        raise ValueError(f"calibration source {source} is neither a folder of images nor a rosbag2 bag")
    paths = image_paths(source)
    paths = [paths[i] for i in spread(len(paths), CALIBRATION_FRAMES)]
    if next(_readable(paths), None) is None:
        raise ValueError(f"no readable image in {source} ({len(paths)} image files, none decodes)")
    for path in paths:
        digest.update(f"{path.name}\n{sha256_file(path)}\n".encode())
    return CalibrationSet(source, len(paths), digest.hexdigest(), lambda: _readable(paths))


def model_input_hw(config: DetectorConfig) -> tuple[int, int]:
    """The ONNX model's input (height, width): the graph's, else input_size, else the exporter's imgsz."""
    given = (config.input_size[1], config.input_size[0]) if config.input_size else None
    model = onnx.load(str(config.model), load_external_data=False)
    return onnx_input(model, given or onnx_metadata(config.model).hw)[1][1:]


def model_input_format(config: DetectorConfig, input_hw: tuple[int, int]) -> InputFormat:
    """The ONNX model's input conventions as the detector resolves them (settings, file, family by its outputs);
    the settings' and the file's alone where the file cannot be read without an engine."""
    view = file_view(config)
    return (
        resolve(config, view).input_format
        if view is not None
        else config.input_format(None, onnx_metadata(config.model))
    )


def needs_quantizing(config: DetectorConfig) -> bool:
    """precision int8 with an ONNX model without Q/DQ nodes, for ONNX Runtime or TensorRT."""
    return (
        config.precision is Precision.INT8
        and model_format(config.model) is ModelFormat.ONNX
        and choose_backend(config.model, config.backend, config.device).backend
        in (Backend.ONNXRUNTIME, Backend.TENSORRT)
        and not file_has_qdq(config.model)
    )


def quantized_key(
    config: DetectorConfig, calibration: CalibrationSet, input_hw: tuple[int, int], input_format: InputFormat
) -> QuantizedKey:
    """The cache key of the Q/DQ model `config`'s model makes with `calibration`."""
    import onnxruntime  # the quantizer's version (imported only when quantizing)

    tiling = (
        ("tile_hw", str(config.tile_hw_for(input_hw))),
        ("overlap", repr(config.overlap)),
        ("full_frame", str(config.full_frame)),
        ("input_hw", str(input_hw)),
        ("input_format", repr(input_format)),
    )
    versions = (
        ("tiled_detector", tiled_detector.__version__),
        ("onnxruntime", onnxruntime.__version__),
        ("onnx", onnx.__version__),
    )
    return QuantizedKey(
        Path(config.model).stem,
        onnx_sha256(Path(config.model)),
        calibration.digest,
        tiling,
        calibration.count,
        versions,
    )


def int8_model(
    config: DetectorConfig,
    sample_default: bool = False,
    cache_dir: str | Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """The Q/DQ model `config` runs at precision int8: its own model when that has Q/DQ nodes, else the cached
    quantized copy made from `config.calibration` (built on first use, one log line). Without calibration:
    the bundled sample frames with a warning when `sample_default` (tools whose own frames are synthetic), else
    ValueError saying what to give."""
    if not needs_quantizing(config):
        return Path(config.model)
    if config.calibration is None and not sample_default:
        raise ValueError(INT8_NEEDS_QDQ.format(model=config.model))
    if config.calibration is None:
        LOG.warning(SAMPLE_WARNING)
    calibration = calibration_set(config.calibration)
    if calibration.count < FEW_FRAMES:
        LOG.warning(
            "int8: only %d calibration frames in %s; %d or more calibrate better",
            calibration.count,
            calibration.source,
            FEW_FRAMES,
        )
    input_hw = model_input_hw(config)
    input_format = model_input_format(config, input_hw)
    key = quantized_key(config, calibration, input_hw, input_format)
    tiling = runtime_tiling(
        torch.device("cpu"),
        torch.float32,
        input_hw,
        config.tile_hw_for(input_hw),
        config.overlap,
        config.full_frame,
        input_format,
    )

    def batches() -> Iterator[np.ndarray]:
        for index, frame in enumerate(calibration.frames()):
            yield tiling(frame.image, frame.encoding).numpy()
            if progress is not None:
                progress("calibrating (frames)", index + 1, calibration.count)

    def build(output: Path) -> None:
        where = calibration.source or "the bundled sample frames"
        LOG.warning(
            "int8: quantizing %s from %d frames of %s (once: the Q/DQ model is cached)",
            config.model,
            calibration.count,
            where,
        )
        quantize_onnx(Path(config.model), batches(), output)

    return cached_quantized(key, build, cache_dir)
