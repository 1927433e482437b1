"""Models as users export them load as written, with their labels: ultralytics TorchScript / ONNX (static, dynamic,
end-to-end, nms=True), YOLOv5 TorchScript, ultralytics TensorRT files; what a file cannot tell or contradicts is one
line naming the file and the setting that fixes it (fixtures: test/support/exports.py, no ultralytics needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from support import exports
from test_detector import _scene, _sorted
from tiled_detector.detector import TiledDetector
from tiled_detector.engines.metadata import ModelMetadata, extra_files_metadata, split_engine_file
from tiled_detector.pipeline.layouts import OutputLayout

LABELS = ("red", "blue")
SETTINGS = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5)


def _finds_the_squares(detector: TiledDetector, seed: int = 0) -> None:
    frame, boxes, classes = _scene(seed)
    found = detector.detect(frame)
    got, want = _sorted(found.boxes, found.class_ids), _sorted(boxes, classes)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_ultralytics_torchscript_loads_as_written(tmp_path: Path) -> None:
    path = exports.ultralytics_torchscript(tmp_path / "yolov8n.torchscript")
    detector = TiledDetector(path, **SETTINGS)  # no options: backend, size, batch and labels from the file
    engine = detector.engine
    assert engine.backend.value == "torch" and engine.input.shape == (-1, 3, 64, 64)  # any batch (no nms)
    assert detector.labels == LABELS and engine.metadata.source == "ultralytics 8.4.190"
    assert detector.resolved.layout is OutputLayout.YOLOV8
    _finds_the_squares(detector)


def test_an_nms_torchscript_runs_its_export_batch_end_to_end(tmp_path: Path) -> None:
    path = exports.ultralytics_torchscript(
        tmp_path / "e2e.torchscript", exports.EndToEndHead(), batch=2, nms=True
    )
    detector = TiledDetector(path, **SETTINGS)
    assert detector.engine.fixed_batch == 2 and detector.resolved.layout is OutputLayout.END2END
    assert detector.labels == LABELS
    _finds_the_squares(detector, 1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_ultralytics_onnx_loads_as_written(tmp_path: Path, dynamic: bool) -> None:
    path = exports.ultralytics_onnx(tmp_path / "yolov8n.onnx", dynamic=dynamic)
    detector = TiledDetector(path, **SETTINGS)
    engine = detector.engine
    # the default export is one image per call (batch 1, static); dynamic=True: any batch, the size from imgsz
    assert engine.input.shape == ((-1, 3, 64, 64) if dynamic else (1, 3, 64, 64))
    assert detector.labels == LABELS and detector.resolved.layout is OutputLayout.YOLOV8
    _finds_the_squares(detector, 2)


def test_an_end_to_end_onnx_is_read_as_such(tmp_path: Path) -> None:
    path = exports.ultralytics_onnx(
        tmp_path / "yolo26n.onnx", exports.EndToEndHead(), dynamic=True, end2end=True
    )
    detector = TiledDetector(path, **SETTINGS)
    assert detector.resolved.layout is OutputLayout.END2END and detector.labels == LABELS
    _finds_the_squares(detector, 3)


def test_yolov5_torchscript_loads_as_written(tmp_path: Path) -> None:
    detector = TiledDetector(exports.yolov5_torchscript(tmp_path / "yolov5n.torchscript"), **SETTINGS)
    assert detector.engine.metadata.source == "yolov5" and detector.labels == LABELS
    assert detector.engine.input.shape == (-1, 3, 64, 64) and detector.resolved.layout is OutputLayout.YOLOV5
    _finds_the_squares(detector, 4)


def test_an_ultralytics_tensorrt_file_is_split_into_its_metadata_and_the_engine(tmp_path: Path) -> None:
    path = exports.ultralytics_engine_file(tmp_path / "yolov8n.engine", b"\x00SERIALIZED-ENGINE")
    metadata, engine = split_engine_file(path.read_bytes())
    assert engine == b"\x00SERIALIZED-ENGINE" and metadata.labels == LABELS and metadata.hw == (64, 64)
    assert split_engine_file(b"plain engine bytes") == (ModelMetadata(), b"plain engine bytes")


def test_the_detect_command_reports_the_models_own_labels(tmp_path: Path, capsys) -> None:
    import cv2

    from tiled_detector.cli import main

    frame, boxes, classes = _scene(5)
    image = tmp_path / "scene.png"
    cv2.imwrite(str(image), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    model = exports.ultralytics_onnx(tmp_path / "yolov8n.onnx", dynamic=True)
    argv = [
        "detect",
        str(image),
        "--model",
        str(model),
        "--tile-size",
        "64",
        "64",
        "--overlap",
        "0.25",
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    found = report["images"][0]["detections"]
    assert sorted(d["label"] for d in found) == sorted(LABELS[c] for c in classes) and len(found) == len(
        boxes
    )


# --- what a file cannot tell, or contradicts: one line naming the file and the setting --------------------------


def test_a_torchscript_without_shape_information_asks_for_input_size(tmp_path: Path) -> None:
    path = tmp_path / "plain.torchscript"
    torch.jit.trace(exports.SquareDetector((64, 64), 8).eval(), torch.zeros(1, 3, 64, 64)).save(str(path))
    with pytest.raises(
        ValueError, match=rf"^{path} does not say its input size .* setting input_size \(--input-size W H"
    ):
        TiledDetector(path, **SETTINGS)
    detector = TiledDetector(path, input_size=(64, 64), labels=list(LABELS), **SETTINGS)
    assert detector.engine.input.shape == (-1, 3, 64, 64)
    _finds_the_squares(detector)


def test_metadata_that_contradicts_the_graph_is_refused(tmp_path: Path) -> None:
    onnx_path = exports.ultralytics_onnx(tmp_path / "small.onnx", imgsz=[32, 32])  # a static 64x64 input
    with pytest.raises(
        ValueError,
        match=r"small.onnx: its ultralytics 8.4.190 metadata says imgsz \[32, 32\] but its "
        r"input is 64x64 .* setting input_size \(--input-size 64 64\)",
    ):
        TiledDetector(onnx_path, **SETTINGS)
    assert TiledDetector(onnx_path, input_size=(64, 64), **SETTINGS).engine.input_hw == (64, 64)
    three = exports.ultralytics_onnx(tmp_path / "three.onnx", names={0: "red", 1: "blue", 2: "green"})
    with pytest.raises(
        ValueError,
        match=r"three.onnx: .* has 2 classes, not 3 \(3 names from its ultralytics "
        r"8.4.190's names\); give one name per class with the setting labels",
    ):
        TiledDetector(three, **SETTINGS)
    assert TiledDetector(three, labels=list(LABELS), **SETTINGS).labels == LABELS


def test_metadata_contradicting_our_own_input_shape_is_refused(tmp_path: Path) -> None:
    config = json.dumps(exports.ultralytics_metadata())
    with pytest.raises(
        ValueError, match=r"input_shape -1,3,32,32 contradicts the ultralytics 8.4.190 metadata's imgsz"
    ):
        extra_files_metadata({"config.txt": config, "input_shape": "-1,3,32,32"})


def test_a_pytorch_checkpoint_is_refused_with_the_export_command(tmp_path: Path) -> None:
    path = tmp_path / "yolov8n.pt"
    torch.save({"model": exports.SquareDetector((64, 64), 8)}, path)
    with pytest.raises(
        ValueError,
        match=r"yolov8n.pt is a PyTorch checkpoint \(torch.save\), not TorchScript: "
        r"export it first, e.g. `yolo export model=yolov8n.pt format=torchscript`",
    ):
        TiledDetector(path, backend="torch")


def test_a_format_we_do_not_run_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "yolov8n.tflite"
    path.write_bytes(b"TFL3")
    with pytest.raises(
        ValueError, match=r"cannot tell the format of .*yolov8n.tflite: expected one of \.onnx"
    ):
        TiledDetector(path)


def test_fp16_exports_need_precision_fp16(tmp_path: Path) -> None:
    path = exports.ultralytics_torchscript(tmp_path / "half.torchscript", quantize=16)
    with pytest.raises(
        ValueError, match=r"half.torchscript was exported for fp16 input \(half\): set precision fp16"
    ):
        TiledDetector(path, **SETTINGS)
