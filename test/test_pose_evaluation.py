"""`eval --pose` (tools/scores/pose_evaluation.py) with the bundled pose model: what tiles buy for keypoints, and per-joint
fusion against the keeper's keypoints on the same detections."""

from __future__ import annotations

import json

import pytest

from tiled_detector import TiledDetector
from tiled_detector.cli import main
from tiled_detector.models import default_model_path, pose_model_path
from tiled_detector.tools.scores.pose_evaluation import CONFIGS, config_changes, evaluate_pose, markdown_table


@pytest.fixture(scope="module")
def results() -> dict:
    return evaluate_pose(TiledDetector(pose_model_path()), 1, 7, 1920, 1080)


def test_tiles_find_the_keypoints_the_full_view_cannot(results: dict) -> None:
    assert list(results) == list(CONFIGS)
    full, tiled = results["full"], results["tiles+full"]
    assert tiled["kp_AP"] >= 2 * full["kp_AP"] and tiled["kp_AP50"] > 0.8
    assert tiled["seam_objects"] > 5 and tiled["seam_kp_AP"] is not None
    assert "| tiles+full/keeper |" in markdown_table(results)


def test_the_keeper_row_has_the_same_detections_and_other_keypoints(results: dict) -> None:
    keeper, fused = results["tiles+full/keeper"], results["tiles+full"]
    assert keeper["same_detections"] is True and keeper["box_AP50"] == fused["box_AP50"]
    assert keeper["kp_AP"] != fused["kp_AP"]  # the keypoints differ where views overlap


def test_eval_pose_writes_its_report_and_refuses_what_does_not_fit(tmp_path, capsys) -> None:
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            "--pose",
            "--frames",
            "1",
            "--width",
            "960",
            "--height",
            "540",
            "--json",
            "--out",
            str(out),
            "--configs",
            "full",
            "tiles+full",
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(printed["configs"]) == {"full", "tiles+full"} and printed["model"].endswith("pose.onnx")
    assert json.loads((out / "eval_pose.json").read_text())["configs"] == printed["configs"]
    assert (out / "eval_pose.md").is_file()
    assert main(["eval", "--pose", "--obb", "--frames", "1"]) == 2
    assert "not with --obb" in capsys.readouterr().err
    assert main(["eval", "--pose", "--frames", "1", "--configs", "tiles+full/nmm", "--out", str(out)]) == 1
    assert "unknown pose evaluation config" in capsys.readouterr().err
    code = main(
        [
            "eval",
            "--pose",
            "--frames",
            "1",
            "--width",
            "640",
            "--height",
            "360",
            "--out",
            str(out),
            "--model",
            str(default_model_path()),
        ]
    )
    assert code == 1 and "eval --pose needs a pose model" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown pose evaluation config"):
        config_changes("tiles+full/greedy_nmm", 640, 360)
