"""Synthetic depth scenes (`tools/worlds/depth_scenes.py`) and their scoring (`tools/scores/depth_evaluation.py`,
`tools/scoring.position_errors`): objects at known distances over a ground plane, holes and noise as a sensor's,
true positions that project onto the boxes, and `eval --depth`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tiled_detector.cli import main
from tiled_detector.tools.scoring import matched, position_errors
from tiled_detector.tools.worlds.depth_scenes import (
    FAR,
    HOLES,
    NEAR,
    NOISE,
    camera_for,
    ground,
    make_depth_scene,
)


@pytest.fixture(scope="module")
def scene():
    return make_depth_scene(3, 640, 360)


def test_the_ground_recedes_from_near_at_the_bottom_to_far_at_the_top_as_a_plane() -> None:
    rows = ground(101)
    assert rows[0] == pytest.approx(FAR) and rows[-1] == pytest.approx(NEAR)
    assert np.all(np.diff(rows) < 0)
    np.testing.assert_allclose(np.diff(1.0 / rows), np.diff(1.0 / rows)[0], rtol=1e-4)  # inverse depth linear


def test_holes_and_noise_are_a_sensors(scene) -> None:
    assert (scene.depth == 0).mean() == pytest.approx(HOLES, abs=0.005)
    top = scene.depth[0][scene.depth[0] > 0]  # the ground's top row, where no object stands
    assert np.std(top / FAR) == pytest.approx(NOISE, rel=0.3)
    np.testing.assert_array_equal(scene.depth_mm(), np.round(scene.depth * 1000).astype(np.uint16))
    assert make_depth_scene(3, 640, 360).depth.tobytes() == scene.depth.tobytes()  # deterministic


def test_objects_stand_at_their_distance_and_their_true_positions_project_onto_their_boxes(scene) -> None:
    boxes, camera = scene.scene.boxes, scene.camera
    assert len(boxes) and np.all((scene.positions[:, 2] >= NEAR) & (scene.positions[:, 2] <= FAR))
    for box, position in zip(boxes, scene.positions, strict=True):
        x1, y1, x2, y2 = box
        u = camera.fx * position[0] / position[2] + camera.cx
        v = camera.fy * position[1] / position[2] + camera.cy
        assert (u, v) == (
            pytest.approx((x1 + x2) / 2 - 0.5, abs=1e-3),
            pytest.approx((y1 + y2) / 2 - 0.5, abs=1e-3),
        )
    # the median depth at each box centre is the object's (nearer objects may hide part of a farther one)
    centres = [scene.depth[int((y1 + y2) / 2), int((x1 + x2) / 2)] for x1, y1, x2, y2 in boxes]
    relative = np.array([c / p for c, p in zip(centres, scene.positions[:, 2], strict=True) if c > 0])
    assert np.median(np.abs(relative - 1)) < 2 * NOISE
    assert camera_for(640, 360).fx == pytest.approx(640 / (2 * np.tan(np.radians(34.5))))


def test_position_errors_score_matched_objects_of_the_size_asked() -> None:
    truth = (np.array([[0, 0, 10, 10], [50, 50, 80, 80]], np.float32), np.array([0, 1]))
    true_positions = np.array([[0.0, 0.0, 10.0], [1.0, 1.0, 20.0]])
    boxes = np.array([[51, 50, 80, 80], [0, 0, 10, 10], [0, 0, 10, 10]], np.float32)
    predicted = (boxes, np.array([0.9, 0.8, 0.95]), np.array([1, 0, 1]))
    assert matched(predicted, truth).tolist() == [1, 0]  # the wrong class never matches
    positions = np.array([[1.0, 1.0, 20.2], [0.0, 0.0, 10.5], [0.0, 0.0, 0.0]])
    errors = position_errors(predicted, positions, truth, true_positions)
    np.testing.assert_allclose(sorted(errors), [0.2 / np.linalg.norm([1, 1, 20]), 0.05])
    assert position_errors(predicted, positions, truth, true_positions, min_size=12).tolist() == [
        pytest.approx(0.2 / np.linalg.norm([1, 1, 20]))
    ]
    positions[1] = np.nan  # a matched object without a position is not scored
    assert len(position_errors(predicted, positions, truth, true_positions)) == 1


def test_eval_depth_reports_the_position_errors(tmp_path: Path, capsys) -> None:
    argv = [
        "eval",
        "--depth",
        "--frames",
        "1",
        "--width",
        "640",
        "--height",
        "360",
        "--out",
        str(tmp_path),
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["depth"]
    assert report["scored"] > 0 and report["objects_3d"] > 0
    assert report["depth_error_median"] < 0.01 and report["depth_error_p95"] < 0.03
    assert json.loads((tmp_path / "eval_depth.json").read_text())["depth"] == report
