"""INT8 executed here: the bundled model quantized to Q/DQ by ONNX Runtime from calibration frames tiled as at run
time, cached (keyed, atomic, rebuilt after an interrupted build), run by ONNX Runtime at precision int8 through
every entry point (`build_detector`, `build-engine --backend onnxruntime`, `eval --precision fp32 int8`), and the
bad inputs: no readable image, a bag without images, few frames, a model that cannot be quantized."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
import torch

from tiled_detector.cli import main
from tiled_detector.config import DetectorConfig
from tiled_detector.engines.base import Precision
from tiled_detector.engines.onnx_model import INT8_NEEDS_QDQ, file_has_qdq, has_qdq
from tiled_detector.engines.onnxruntime import OnnxRuntimeEngine
from tiled_detector.engines.quantize import float_convs, quantize_onnx
from tiled_detector.models import default_model_path
from tiled_detector.parameters import build_detector
from tiled_detector.pipeline.preprocess import InputFormat, Preprocessor
from tiled_detector.pipeline.tiling import make_plan
from tiled_detector.tools import calibration as calibration_mod
from tiled_detector.tools.calibration import (
    FEW_FRAMES,
    calibration_set,
    int8_model,
    runtime_tiling,
    spread,
)
from tiled_detector.tools.scoring import box_iou
from tiled_detector.tools.worlds.synthetic import make_scene

MODEL = default_model_path()


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every Q/DQ model of a test in its own cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tiled_detector" / "engines"


def image_folder(folder: Path, count: int, size: tuple[int, int] = (800, 600)) -> Path:
    """`count` synthetic scenes as PNG files (the bundled model's world)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        scene = make_scene(500 + index, *size)
        cv2.imwrite(str(folder / f"{index:03d}.png"), scene.image[..., ::-1])
    return folder


@pytest.fixture(scope="module")
def frames_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_folder(tmp_path_factory.mktemp("calibration") / "frames", FEW_FRAMES)


def test_spread_takes_evenly_spaced_frames_first_and_last_included() -> None:
    assert spread(5, 32) == [0, 1, 2, 3, 4]
    assert spread(100, 5) == [0, 25, 50, 74, 99]
    assert spread(0, 5) == []


def test_the_first_and_the_output_convolutions_stay_float() -> None:
    kept = float_convs(onnx.load(str(MODEL)))
    assert kept == sorted(["/model/stem/stem.0/stem.0.0/Conv", "/model/cls_out/Conv", "/model/box_out/Conv"])


def test_calibration_batches_are_tiled_as_at_run_time() -> None:
    frame = np.random.default_rng(3).integers(0, 256, (100, 150, 3), np.uint8)
    batch = runtime_tiling(torch.device("cpu"), torch.float32, (32, 32), (48, 48), 0.25)(frame, "rgb8")
    plan = make_plan((100, 150), (48, 48), 0.25, (32, 32), True)
    expected = Preprocessor("cpu", torch.float32, (32, 32)).run(frame, plan, "rgb8")
    torch.testing.assert_close(batch, expected, rtol=0, atol=0)
    assert batch.shape == (plan.batch_size, 3, 32, 32)


def test_int8_on_onnxruntime_quantizes_once_and_finds_what_fp32_finds(
    frames_dir: Path, cache_home: Path
) -> None:
    values = {"backend": "onnxruntime", "precision": "int8", "calibration": str(frames_dir)}
    detector = build_detector(values)
    qdq = list(cache_home.glob("default-int8-*.qdq.onnx"))
    assert len(qdq) == 1 and has_qdq(onnx.load(str(qdq[0])))
    assert detector.engine.precision is Precision.INT8 and detector.engine.model == qdq[0]
    assert detector.config.model == MODEL  # the setting stays the user's model
    scene = make_scene(42, 1280, 720)
    ours = detector.detect(scene.image)
    full = build_detector({"backend": "onnxruntime"}).detect(scene.image)
    assert len(full.boxes) > 20
    # every fp32 detection above 0.5 has an int8 twin of its class (IoU >= 0.7); scores within 0.15
    strong = full.scores > 0.5
    iou = box_iou(full.boxes[strong], ours.boxes)
    same = full.class_ids[strong][:, None] == ours.class_ids[None, :]
    best = np.where(same, iou, 0).argmax(1)
    assert (np.where(same, iou, 0).max(1) >= 0.7).mean() >= 0.95
    assert np.median(np.abs(full.scores[strong] - ours.scores[best])) < 0.15
    # the second start finds it in the cache: no quantization
    stamp = qdq[0].stat().st_mtime_ns
    assert build_detector(values).engine.model == qdq[0] and qdq[0].stat().st_mtime_ns == stamp


def test_the_cache_key_follows_model_frames_and_tiling(frames_dir: Path, tmp_path: Path) -> None:
    base = DetectorConfig(backend="onnxruntime", precision="int8", calibration=frames_dir)
    calibration = calibration_set(frames_dir)
    key = calibration_mod.quantized_key(base, calibration, (640, 640), InputFormat())
    assert key == calibration_mod.quantized_key(base, calibration_set(frames_dir), (640, 640), InputFormat())
    assert key.file_name.startswith("default-int8-") and key.file_name.endswith(".qdq.onnx")
    other = calibration_mod.quantized_key(base.replace(overlap=0.3), calibration, (640, 640), InputFormat())
    assert other.digest != key.digest
    copy = image_folder(tmp_path / "copy", 0)
    for path in sorted(frames_dir.iterdir()):
        (copy / path.name).write_bytes(path.read_bytes())
    assert calibration_set(copy).digest == calibration.digest  # the frames' bytes, not where they are
    cv2.imwrite(str(copy / "000.png"), np.zeros((60, 80, 3), np.uint8))
    assert calibration_set(copy).digest != calibration.digest


def test_an_interrupted_build_leaves_no_cache_entry_and_the_next_run_builds(
    frames_dir: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = DetectorConfig(backend="onnxruntime", precision="int8", calibration=frames_dir)
    real = calibration_mod.quantize_onnx

    def interrupted(model: Path, batches, output: Path, chunk: int = 8) -> int:
        output.write_bytes(b"half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(calibration_mod, "quantize_onnx", interrupted)
    with pytest.raises(KeyboardInterrupt):
        int8_model(config)
    assert not list(cache_home.glob("*.onnx")) and not list(cache_home.glob("*.tmp*"))
    monkeypatch.setattr(calibration_mod, "quantize_onnx", real)
    path = int8_model(config)
    assert file_has_qdq(path)
    # a damaged cache entry is rebuilt, not loaded
    path.write_bytes(b"truncated")
    assert file_has_qdq(int8_model(config))


def test_a_model_with_qdq_nodes_runs_as_it_is(frames_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qdq = int8_model(DetectorConfig(backend="onnxruntime", precision="int8", calibration=frames_dir))

    def never(*args: object, **kwargs: object) -> int:
        raise AssertionError("a Q/DQ model is not quantized again")

    monkeypatch.setattr(calibration_mod, "quantize_onnx", never)
    assert int8_model(DetectorConfig(model=qdq, backend="onnxruntime", precision="int8")) == qdq
    detector = build_detector({"model": str(qdq), "backend": "onnxruntime", "precision": "int8"})
    assert detector.engine.precision is Precision.INT8 and detector.engine.model == qdq
    # asked for fp32, a Q/DQ model still runs as it is, and says int8
    assert OnnxRuntimeEngine(qdq, precision=Precision.FP32).precision is Precision.INT8


def test_int8_without_calibration_refuses_with_what_to_give() -> None:
    with pytest.raises(ValueError) as error:
        build_detector({"backend": "onnxruntime", "precision": "int8"})
    assert str(error.value) == INT8_NEEDS_QDQ.format(model=MODEL)
    assert "calibration" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="precision int8 runs an ONNX with QuantizeLinear"):
        OnnxRuntimeEngine(MODEL, precision=Precision.INT8)


def test_bad_calibration_sources_say_why_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tiled_detector.harness.bags import BagWriter, typestore

    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    (unreadable / "a.png").write_bytes(b"not a png")
    (unreadable / "b.jpg").write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"no readable image in .*unreadable \(2 image files, none decodes\)"
    ):
        calibration_set(unreadable)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no images"):
        calibration_set(empty)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        calibration_set(tmp_path / "missing")
    bag = tmp_path / "no_images"
    text = typestore().types["std_msgs/msg/String"]
    with BagWriter(bag) as writer:
        writer.write("/chatter", "std_msgs/msg/String", 1, text(data="hi"))
    with pytest.raises(ValueError, match="no sensor_msgs Image / CompressedImage topic in"):
        calibration_set(bag)
    # an unreadable file among readable ones is skipped with a warning; few frames warn too
    few = image_folder(tmp_path / "few", 2, (320, 240))
    (few / "zz.png").write_bytes(b"broken")
    config = DetectorConfig(backend="onnxruntime", precision="int8", calibration=few)
    with caplog.at_level(logging.WARNING):
        assert file_has_qdq(int8_model(config))
    assert "only 3 calibration frames" in caplog.text and "cannot read image" in caplog.text


def test_frames_from_a_bag_calibrate_too(tmp_path: Path) -> None:
    from tiled_detector.harness.recording import make_synthetic_bag

    bag = make_synthetic_bag(tmp_path / "bag", frames=40, width=320, height=240)
    calibration = calibration_set(bag)
    assert calibration.count == 32  # spread over the 40 frames
    frames = list(calibration.frames())
    assert len(frames) == 32 and frames[0].image.shape == (240, 320, 3)
    assert calibration_set(bag).digest == calibration.digest


def test_a_model_onnxruntime_cannot_quantize_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(MODEL.read_bytes()[:5000])
    batch = np.zeros((2, 3, 640, 640), np.float32)
    with pytest.raises(ValueError, match=r"^ONNX Runtime cannot quantize .*broken.onnx: ") as error:
        quantize_onnx(broken, [batch], tmp_path / "out.onnx")
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="no calibration images"):
        quantize_onnx(MODEL, [], tmp_path / "out.onnx")


def test_onnx_runtimes_tools_leave_nothing_in_the_working_directory(tmp_path, monkeypatch) -> None:
    """ONNX Runtime's quantization tools write temporary files into the working directory (symbolic shape inference
    saves sym_shape_infer_temp.onnx there when it gives up): they run in a temporary one."""
    from onnxruntime.quantization import shape_inference

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    prepare = shape_inference.quant_pre_process
    seen = []

    def leaving_a_file(source, output, **options):  # what ORT does when its inference gives up
        Path("sym_shape_infer_temp.onnx").write_bytes(b"temp")
        seen.append(Path.cwd())
        return prepare(source, output, **options)

    monkeypatch.setattr(shape_inference, "quant_pre_process", leaving_a_file)
    batch = np.random.default_rng(0).random((2, 3, 640, 640), dtype=np.float32)
    quantize_onnx(MODEL, [batch], Path("out.onnx"))  # relative paths are the caller's
    assert seen and seen[0] != work and Path.cwd() == work
    assert sorted(p.name for p in work.iterdir()) == ["out.onnx"]


def test_build_engine_writes_the_qdq_model_for_onnxruntime(frames_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "model.qdq.onnx"
    argv = [
        "build-engine",
        "--backend",
        "onnxruntime",
        "--precision",
        "int8",
        "--calibration",
        str(frames_dir),
    ]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "int8 model: " in printed and "Q/DQ by ONNX Runtime" in printed and file_has_qdq(out)
    assert main(["build-engine", "--backend", "onnxruntime"]) == 2
    assert "makes int8 models (--precision int8)" in capsys.readouterr().err


def test_eval_puts_fp32_and_int8_side_by_side(tmp_path: Path, capsys, caplog) -> None:
    argv = [
        "eval",
        "--frames",
        "2",
        "--width",
        "800",
        "--height",
        "600",
        "--configs",
        "tiles+full",
        "--backend",
        "onnxruntime",
        "--precision",
        "fp32",
        "int8",
        "--out",
        str(tmp_path),
        "--json",
    ]
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    assert "bundled synthetic sample frames" in caplog.text  # no --calibration: a warning
    import json

    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result["configs"]) == {"tiles+full fp32", "tiles+full int8"}
    assert result["precision"] == {"fp32": "fp32", "int8": "int8"}
    fp32, int8 = result["configs"]["tiles+full fp32"], result["configs"]["tiles+full int8"]
    assert fp32["AP50"] > 0.5 and abs(int8["AP50"] - fp32["AP50"]) < 0.1


def test_detect_without_calibration_refuses_int8_in_one_line(tmp_path: Path, capsys) -> None:
    image = tmp_path / "frame.png"
    cv2.imwrite(str(image), make_scene(3, 320, 240).image[..., ::-1])
    assert main(["detect", str(image), "--backend", "onnxruntime", "--precision", "int8"]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("tiled-detector detect: cannot start: precision int8 runs an ONNX with")
        and "\n" not in err
    )
