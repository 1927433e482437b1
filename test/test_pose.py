"""Pose models as exported (`model_files/pose_model.py`, the pose layouts of `pipeline/decode.py`): ultralytics pose heads, raw
and end-to-end, ONNX (a batch-1 file run batched), TorchScript and TensorRT (its header's metadata), `kpt_shape` and
joint names from the file's metadata with their sources, a file of 2 values per joint (score 1), and the files and
settings refused in one line (fixtures: `support.exports.PoseHead`, written as ultralytics writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from support import exports
from test_detector import _scene
from tiled_detector.config import DetectorConfig
from tiled_detector.detector import TiledDetector
from tiled_detector.engines.metadata import split_engine_file
from tiled_detector.model_files.pose_model import COCO_KEYPOINTS, skeleton_for
from tiled_detector.model_files.resolve import ModelView, resolve
from tiled_detector.pipeline.decode import decode_padded
from tiled_detector.pipeline.layouts import OutputLayout

SETTINGS = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="onnxruntime")
NAMES = ["top_left", "top_right", "bottom_right", "bottom_left", "centre"]


@pytest.fixture(scope="module")
def pose_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PoseHead as `yolo export format=onnx` writes a pose model: batch 1, `task: pose`, `kpt_shape`, `kpt_names`."""
    path = tmp_path_factory.mktemp("pose") / "squares-pose.onnx"
    return exports.ultralytics_onnx(
        path, exports.PoseHead(), task="pose", kpt_shape=[5, 3], kpt_names={0: NAMES}
    )


def corners(boxes: np.ndarray) -> np.ndarray:
    """The known answer: each box's corners and centre (N, 5, 2)."""
    x1, y1, x2, y2 = boxes.T
    xs = np.stack([x1, x2, x2, x1, (x1 + x2) / 2], 1)
    ys = np.stack([y1, y1, y2, y2, (y1 + y2) / 2], 1)
    return np.stack([xs, ys], -1)


def _checks_the_squares(detector: TiledDetector, seed: int = 0, score: float | None = None) -> None:
    frame, boxes, _ = _scene(seed)
    found = detector.detect(frame)
    assert len(found) == len(boxes) and found.keypoints is not None
    assert found.keypoints.shape == (len(boxes), 5, 3) and found.keypoints.dtype == np.float32
    np.testing.assert_allclose(found.keypoints[..., :2], corners(found.boxes), atol=1e-4)
    if score is not None:
        np.testing.assert_allclose(found.keypoints[..., 2], score, atol=1e-6)


def test_an_onnx_pose_export_is_read_with_its_keypoints_and_their_sources(pose_onnx: Path) -> None:
    detector = TiledDetector(pose_onnx, **SETTINGS)
    resolved = detector.resolved
    assert resolved.layout is OutputLayout.POSE and resolved.task == "pose" and resolved.num_classes == 2
    assert resolved.keypoint_names == tuple(NAMES) and resolved.skeleton is None
    assert resolved.keypoints.shape == (5, 3) and "kpt_shape" in resolved.keypoints.shape_from
    assert "kpt_names" in resolved.keypoints.names_from and "5 keypoints" in resolved.head
    _checks_the_squares(detector, score=1.0)


def test_keypoints_off_gives_none_and_on_for_a_detect_model_is_refused(
    pose_onnx: Path, tmp_path: Path
) -> None:
    frame, _, _ = _scene(1)
    assert TiledDetector(pose_onnx, keypoints=False, **SETTINGS).detect(frame).keypoints is None
    plain = exports.ultralytics_onnx(tmp_path / "detect.onnx")
    assert TiledDetector(plain, **SETTINGS).detect(frame).keypoints is None
    with pytest.raises(ValueError, match=r"^keypoints: true, but .*not a pose model") as error:
        TiledDetector(plain, keypoints=True, **SETTINGS)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("values", [3, 2])
def test_torchscript_pose_exports_raw_and_two_values_per_joint(tmp_path: Path, values: int) -> None:
    path = exports.ultralytics_torchscript(
        tmp_path / "pose.torchscript", exports.PoseHead(values=values), task="pose", kpt_shape=[5, values]
    )
    detector = TiledDetector(path, **{**SETTINGS, "backend": "auto"})
    assert detector.resolved.keypoints.shape == (5, values)
    _checks_the_squares(detector, seed=2, score=1.0)  # 2 values per joint: score 1


def test_end_to_end_pose_rows(tmp_path: Path) -> None:
    path = exports.ultralytics_onnx(
        tmp_path / "pose26.onnx", exports.PoseHead(end2end=True), task="pose", kpt_shape=[5, 3], end2end=True
    )
    detector = TiledDetector(path, **SETTINGS)
    assert detector.resolved.layout is OutputLayout.POSE_END2END
    assert "end-to-end pose rows" in detector.resolved.head
    _checks_the_squares(detector, seed=3, score=1.0)


def test_decode_carries_each_candidates_joints_as_its_payload() -> None:
    head = exports.PoseHead()(torch.zeros(1, 3, 64, 64))
    head[0, 4, 9] = 0.9  # one red anchor
    found = decode_padded({"output0": head}, OutputLayout.POSE, 0.5, 10, num_classes=2)
    assert found.extra.shape == (10, 15) and int(found.valid.sum()) == 1
    np.testing.assert_allclose(found.extra[0].numpy(), head[0, 6:, 9].numpy())
    with pytest.raises(ValueError, match="class count"):
        decode_padded({"output0": head}, OutputLayout.POSE, 0.5, 10)


def _view(outputs: dict[str, tuple[int, ...]], **metadata: object) -> ModelView:
    values = exports.ultralytics_metadata(task="pose", **metadata)
    from tiled_detector.engines.metadata import exporter_metadata

    found = exporter_metadata(values)
    return ModelView(outputs, (64, 64), found.labels, found, lambda name: torch.zeros(0))


def _refusal(config: DetectorConfig, view: ModelView) -> str:
    with pytest.raises(ValueError) as error:
        resolve(config, view)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_wrong_labels_or_layout_on_a_pose_file_is_one_line_naming_the_setting() -> None:
    view = _view({"output0": (1, 4 + 2 + 15, 64)}, kpt_shape=[5, 3])
    config = DetectorConfig(model=Path("pose.onnx"))
    assert resolve(config, view).keypoints.shape == (5, 3)
    wrong = _refusal(config.replace(labels=("a", "b", "c")), view)
    assert "14 keypoint columns" in wrong and "kpt_shape [5, 3]" in wrong and "setting labels" in wrong
    wrong = _refusal(config.replace(layout="yolov8"), view)
    assert wrong.startswith("layout yolov8:") and "task pose" in wrong and "setting layout to pose" in wrong
    detect = ModelView(view.outputs, (64, 64), None, view.metadata.__class__(task="detect"), view.probe)
    assert "setting layout to auto" in _refusal(config.replace(layout="pose"), detect)


def test_keypoint_columns_that_are_no_joints_are_one_line_with_the_shapes() -> None:
    config = DetectorConfig(model=Path("pose.onnx"))
    wrong = _refusal(config, _view({"output0": (1, 4 + 2 + 14, 64)}, kpt_shape=[5, 3]))
    assert "'output0' [1, 20, 64]" in wrong and "14 keypoint columns" in wrong
    wrong = _refusal(config.replace(labels=("a", "b")), _view({"output0": (1, 4 + 2 + 7, 64)}))
    assert "'output0' [1, 13, 64]" in wrong and "do not divide into 2 or 3" in wrong
    wrong = _refusal(config.replace(labels=("a", "b")), _view({"output0": (1, 4 + 2 + 12, 64)}))
    assert "4 joints x 3 or 6 joints x 2" in wrong
    # no kpt_shape: the columns decide where only one reading fits (51: 17 x 3, COCO's names)
    found = resolve(config.replace(labels=("person",)), _view({"output0": (1, 4 + 1 + 51, 64)}))
    assert found.keypoints.shape == (17, 3) and found.keypoint_names == COCO_KEYPOINTS
    assert "no kpt_shape" in found.keypoints.shape_from and len(skeleton_for(17, None)) == 19
    wrong = _refusal(
        config.replace(labels=("a",)), _view({"output0": (1, 4 + 1 + 51, 64)}, kpt_shape=[17, 4])
    )
    assert "kpt_shape [17, 4]" in wrong


def test_a_pose_tensorrt_file_carries_its_keypoints_in_the_header(tmp_path: Path) -> None:
    """The TensorRT file's header (ultralytics' 4-byte length + JSON) gives the pose metadata, and a TensorRT engine
    (autospec doubles of the real bindings) with a pose head resolves to the pose layout with its keypoints."""
    path = exports.ultralytics_engine_file(
        tmp_path / "pose.engine", b"SERIALIZED", task="pose", kpt_shape=[5, 3], kpt_names={0: NAMES}
    )
    metadata, engine = split_engine_file(path.read_bytes())
    assert engine == b"SERIALIZED" and metadata.task == "pose" and metadata.keypoint_shape == (5, 3)
    assert metadata.keypoint_names == tuple(NAMES)
    view = ModelView({"output0": (-1, 21, 64)}, (64, 64), metadata.labels, metadata, lambda n: torch.zeros(0))
    found = resolve(DetectorConfig(model=path), view)
    assert found.layout is OutputLayout.POSE and found.keypoints.shape == (5, 3) and found.num_classes == 2


def test_inspect_says_the_keypoints_and_where_each_came_from(pose_onnx: Path, capsys) -> None:
    from tiled_detector.cli import main

    assert main(["inspect", str(pose_onnx), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    points = report["keypoints"]
    assert points["count"] == 5 and points["values"] == 3 and points["names"] == NAMES
    assert "kpt_shape" in points["from"] and "kpt_names" in points["names_from"]
    assert main(["inspect", str(pose_onnx)]) == 0
    assert "keypoints  5 joints (x, y, visibility)" in capsys.readouterr().out


def test_detect_json_gives_every_detection_its_keypoints_and_the_image_its_skeletons(
    pose_onnx: Path, tmp_path: Path, capsys
) -> None:
    import cv2

    from tiled_detector.cli import main

    frame, boxes, _ = _scene(5)
    image = tmp_path / "scene.png"
    cv2.imwrite(str(image), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    argv = ["detect", str(image), "--model", str(pose_onnx), "--tile-size", "64", "64", "--overlap", "0.25"]
    assert main([*argv, "--json", "--out", str(tmp_path / "out")]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["images"][0]["detections"]
    assert len(found) == len(boxes)
    for detection in found:
        joints = np.array(detection["keypoints"])
        assert joints.shape == (5, 3) and (joints[:, 2] == 1.0).all()
        np.testing.assert_allclose(joints[:, :2], corners(np.array([detection["box"]]))[0], atol=0.01)
    assert (tmp_path / "out" / "scene.png").exists()


def test_annotate_draws_the_models_skeleton_else_cocos_for_17_joints() -> None:
    from tiled_detector.tools.annotate import annotate
    from tiled_detector.types import Detections

    joints = np.array([[[20, 20, 0.9], [80, 20, 0.9], [80, 80, 0.1]]], np.float32)  # the third unseen
    found = Detections(np.array([[10, 10, 90, 90]]), np.array([0.9]), np.array([0]), keypoints=joints)
    blank = np.zeros((100, 100, 3), np.uint8)
    drawn = annotate(blank, found, captions=False, skeleton=[(0, 1), (1, 2)])
    assert drawn[20, 50].any() and not drawn[50, 80].any()  # 0-1 drawn; 1-2 not (joint 2 unseen)
    assert not annotate(blank, found, captions=False)[20, 50].any()  # 3 joints, no skeleton: joints only
    assert annotate(blank, found, captions=False)[20, 20].any()
    assert len(skeleton_for(17, None)) == 19 and skeleton_for(3, ((0, 1), (1, 5))) == ((0, 1),)
