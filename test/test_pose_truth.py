"""Keypoint truth: COCO person keypoints read with their joints, areas and skeleton (`tools/scores/truth.py`), carried by
`make-bag --truth` and `make-bag --pose` on /ground_truth/keypoints, refused in one line with nothing written where
the joint count is not the category's or the pose model's; `replay` scores the node's keypoints as keypoint AP."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from tiled_detector.cli import main
from tiled_detector.harness import bags, recording
from tiled_detector.harness.replay import _truth_keypoints
from tiled_detector.models import default_model_path, pose_model_path
from tiled_detector.tools.scores.truth import TruthError, read_coco
from tiled_detector.tools.worlds.pose_scenes import JOINTS, SKELETON, make_pose_scene


def _coco_of_scenes(root: Path, count: int = 2, joints: int = len(JOINTS)) -> tuple[Path, Path]:
    """A folder of `count` pose scenes (640 x 360) and their COCO person-keypoint file (COCO's skeleton counts joints
    from 1); with `joints` other than 13, the category names that many joints."""
    folder = root / "images"
    folder.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for index in range(count):
        scene = make_pose_scene(index, 640, 360)
        name = f"{index:03d}.png"
        cv2.imwrite(str(folder / name), scene.image[..., ::-1])
        images.append({"id": index + 1, "file_name": name, "width": 640, "height": 360})
        for box, points, area in zip(
            scene.boxes.tolist(), scene.keypoints, scene.areas.tolist(), strict=True
        ):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": index + 1,
                    "category_id": 1,
                    "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                    "area": area,
                    "iscrowd": 0,
                    "keypoints": points.ravel().tolist(),
                    "num_keypoints": int((points[:, 2] > 0).sum()),
                }
            )
    names = list(JOINTS) if joints == len(JOINTS) else [f"j{k}" for k in range(joints)]
    category = {
        "id": 1,
        "name": "person",
        "keypoints": names,
        "skeleton": [[a + 1, b + 1] for a, b in SKELETON],
    }
    truth = root / "keypoints.json"
    truth.write_text(json.dumps({"images": images, "annotations": annotations, "categories": [category]}))
    return folder, truth


def test_coco_keypoints_are_read_with_their_areas_joints_and_skeleton(tmp_path: Path) -> None:
    _, path = _coco_of_scenes(tmp_path)
    truth = read_coco(path, "person", ["000.png", "001.png"])
    scene = make_pose_scene(0, 640, 360)
    first = truth.frame == 0
    assert truth.keypoints.shape == (len(truth.frame), 13, 3) and truth.joints == JOINTS
    np.testing.assert_allclose(truth.keypoints[first], scene.keypoints, atol=1e-4)
    np.testing.assert_allclose(truth.areas[first], scene.areas, rtol=1e-6)
    assert truth.skeleton == SKELETON  # 1-based in the file, 0-based here
    points, areas = truth.keypoints_in_frame(0, 640, 360)
    assert points.shape == (int(first.sum()), 13, 3) and len(areas) == len(points)
    assert read_coco(path, "person", ["000.png", "001.png"], joints=13).keypoints is not None


def test_keypoints_of_another_joint_count_are_refused_naming_both_counts(tmp_path: Path) -> None:
    _, path = _coco_of_scenes(tmp_path)
    with pytest.raises(TruthError, match=r"its keypoints have 13 joints but the model's have 17"):
        read_coco(path, "person", ["000.png", "001.png"], joints=17)
    data = json.loads(path.read_text())
    data["annotations"][1]["keypoints"] = data["annotations"][1]["keypoints"][:-3]  # 12 joints
    path.write_text(json.dumps(data))
    with pytest.raises(
        TruthError, match=r"annotation 2 \(image 1\) has keypoints of 12 joints but its category has 13"
    ):
        read_coco(path, "person", ["000.png", "001.png"])


def test_make_bag_carries_coco_keypoints_and_refuses_a_pose_model_of_other_joints(
    tmp_path: Path, capsys
) -> None:
    folder, path = _coco_of_scenes(tmp_path)
    args = [
        "--images",
        str(folder),
        "--truth",
        str(path),
        "--truth-class",
        "person",
        "--model",
        str(pose_model_path()),
    ]
    assert main(["make-bag", str(tmp_path / "bag"), *args]) == 0
    assert "keypoints of 13 joints" in capsys.readouterr().out
    info = bags.bag_info(tmp_path / "bag")
    assert info.topics[bags.GROUND_TRUTH_KEYPOINTS_TOPIC] == (bags.TEXT, 2)
    assert json.loads(info.custom_data[recording.JOINTS]) == list(JOINTS)
    found = _truth_keypoints(tmp_path / "bag", info)
    truth = bags.read_detections(info.path, labels=["person"])
    for stamp, (points, areas) in found.items():
        assert points.shape == (len(truth[stamp][0]), 13, 3) and len(areas) == len(points) > 0
    _, seventeen = _coco_of_scenes(tmp_path / "other", joints=17)
    for bad, model in ((seventeen, pose_model_path()), (seventeen, default_model_path())):
        data = json.loads(bad.read_text())
        for annotation in data["annotations"]:
            annotation["keypoints"] = [0.0] * 51
        bad.write_text(json.dumps(data))
        code = main(
            [
                "make-bag",
                str(tmp_path / "bad"),
                "--images",
                str(folder),
                "--truth",
                str(bad),
                "--truth-class",
                "person",
                "--model",
                str(model),
            ]
        )
        error = capsys.readouterr().err.strip()
        if model == default_model_path():  # a detect model: any joints are kept (the class is what fails)
            assert code == 1 and "--truth-class person: not a class of" in error
            continue
        assert code == 1 and len(error.splitlines()) == 1, error
        assert "its keypoints have 17 joints but the model's have 13" in error
        assert not (tmp_path / "bad").exists()  # nothing written


def test_make_bag_pose_writes_the_pose_world_with_its_keypoints(tmp_path: Path) -> None:
    assert (
        main(
            [
                "make-bag",
                str(tmp_path / "pose"),
                "--pose",
                "--frames",
                "2",
                "--width",
                "640",
                "--height",
                "360",
            ]
        )
        == 0
    )
    info = bags.bag_info(tmp_path / "pose")
    assert info.topics[bags.GROUND_TRUTH_KEYPOINTS_TOPIC] == (bags.TEXT, 2)
    assert json.loads(info.custom_data[recording.SKELETON]) == [list(b) for b in SKELETON]
    found = _truth_keypoints(tmp_path / "pose", info)
    first = found[min(found)]
    np.testing.assert_allclose(first[0], make_pose_scene(0, 640, 360).keypoints, atol=1e-4)
    assert main(["make-bag", str(tmp_path / "x"), "--pose", "--obb"]) == 1


@pytest.mark.ros
@pytest.mark.slow
def test_replay_scores_the_nodes_keypoints_as_keypoint_ap(tmp_path: Path, capsys) -> None:
    """The bundled pose model through the real node: every answer's KeypointsArray came, one entry per detection,
    and scores keypoint AP against the bag's truth (tiles: the figures are at full resolution)."""
    bag = tmp_path / "pose"
    assert main(["make-bag", str(bag), "--pose", "--frames", "2", "--width", "960", "--height", "540"]) == 0
    capsys.readouterr()
    node = ["--param", f"model:={pose_model_path()}", "--json", "--timeout", "60"]
    assert main(["replay", str(bag), *node]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["frames_answered"] == 2 and report["keypoint_arrays"] == 2, report
    assert report["keypoint_arrays_missing"] == 0 and report["keypoint_arrays_wrong"] == 0, report
    assert report["kp_AP50"] > 0.7 and report["kp_AP"] > 0.3, report
