"""Evaluation: COCO metrics on hand-made predictions, duplicate counting, config table, report files, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tiled_detector.tools.scores.evaluation import (
    CONFIGS,
    METRICS,
    STREAM_METRICS,
    coco_metrics,
    config_changes,
    duplicate_count,
    markdown_table,
    write_report,
)
from tiled_detector.tools.scoring import box_iou
from tiled_detector.tools.worlds.synthetic import coco_ground_truth
from tiled_detector.types import Detections

GT_BOXES = np.array([[10, 10, 30, 30], [100, 100, 160, 150], [200, 50, 212, 62]], np.float32)
GT_CLASSES = np.array([0, 1, 2], np.int64)


def _truth(frames: int = 2) -> dict:
    return coco_ground_truth([(GT_BOXES, GT_CLASSES)] * frames, [(320, 240)] * frames)


def test_perfect_predictions_score_one() -> None:
    perfect = Detections(GT_BOXES, np.full(3, 0.9, np.float32), GT_CLASSES)
    metrics = coco_metrics(_truth(), [perfect, perfect])
    assert metrics["AP"] == pytest.approx(1.0)
    assert metrics["AP50"] == pytest.approx(1.0)
    assert metrics["AP_small"] == pytest.approx(1.0)  # two of the boxes are under 32^2
    assert metrics["recall"] == pytest.approx(1.0)


def test_missing_and_wrong_class_predictions_lower_the_metrics() -> None:
    half = Detections(GT_BOXES[:1], np.full(1, 0.9, np.float32), GT_CLASSES[:1])
    wrong = Detections(GT_BOXES, np.full(3, 0.9, np.float32), (GT_CLASSES + 1) % 3)
    assert coco_metrics(_truth(1), [half])["recall"] == pytest.approx(1 / 3)
    assert coco_metrics(_truth(1), [wrong])["AP50"] == pytest.approx(0.0)


def test_no_predictions_give_zero() -> None:
    assert coco_metrics(_truth(1), [Detections.empty()]) == {
        "AP": 0.0,
        "AP50": 0.0,
        "AP_small": 0.0,
        "recall": 0.0,
    }


def test_duplicate_count_on_crafted_case() -> None:
    # object 0: matched by two boxes of its class (duplicate); object 1: one box of its class and one of another
    # class (not a duplicate); object 2: one box at IoU 0.5 and one at IoU < 0.5 (not a duplicate).
    boxes = np.array(
        [
            [10, 10, 30, 30],
            [11, 11, 30, 30],
            [100, 100, 160, 150],
            [100, 100, 160, 150],
            [200, 50, 212, 62],
            [200, 50, 218, 68],  # IoU 144 / 324 < 0.5
        ],
        np.float32,
    )
    found = Detections(boxes, np.full(6, 0.5, np.float32), np.array([0, 0, 1, 3, 2, 2]))
    assert duplicate_count(GT_BOXES, GT_CLASSES, found) == 1
    assert duplicate_count(GT_BOXES, GT_CLASSES, Detections.empty()) == 0


def test_box_iou() -> None:
    a = np.array([[0, 0, 10, 10]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]], np.float32)
    np.testing.assert_allclose(box_iou(a, b), [[1.0, 50 / 150, 0.0]], rtol=1e-6)


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("full", {"tile_size": (1920, 1080), "full_frame": False}),
        ("tiles", {"full_frame": False}),
        ("tiles+full", {}),
        ("tiles+full/nms", {"merge": "nms"}),
        ("tiles+full/nmm", {"merge": "nmm"}),
        ("tiles+full/greedy_nmm", {"merge": "greedy_nmm"}),
    ],
)
def test_config_changes(name: str, changes: dict) -> None:
    assert config_changes(name, 1920, 1080) == changes


def test_eval_runs_every_merge_method() -> None:
    from tiled_detector.pipeline.merge import KERNELS, MergeMethod
    from tiled_detector.tools.scores.evaluation import CONFIGS

    assert set(KERNELS) == set(MergeMethod)  # every method has its kernel
    assert {f"tiles+full/{m.value}" for m in MergeMethod} <= set(CONFIGS)


def test_unknown_config_lists_options() -> None:
    with pytest.raises(ValueError, match="tiles\\+full/nms"):
        config_changes("tiles+full/soft", 640, 480)


def test_full_config_is_one_letterboxed_view_like_the_full_frame_view() -> None:
    """The "full" config (one frame-sized tile) maps boxes exactly like the default plan's full-frame view."""
    from tiled_detector.pipeline.tiling import make_plan

    full = make_plan((1080, 1920), (1080, 1920), 0.2, (640, 640), False)
    default = make_plan((1080, 1920), (640, 640), 0.2, (640, 640), True)
    assert full.batch_size == 1
    np.testing.assert_allclose(full.scales[0], default.scales[-1])
    np.testing.assert_allclose(full.offsets[0], default.offsets[-1])
    assert not full.inner_edges.any()


def test_report_files_and_table(tmp_path) -> None:
    values = {m: 0.5 for m in METRICS}
    results = {name: dict(values) for name in CONFIGS}
    paths = write_report(results, tmp_path, {"frames": 2})
    data = json.loads(paths["json"].read_text())
    assert data["frames"] == 2 and set(data["configs"]) == set(CONFIGS)
    table = markdown_table(results)
    assert table.count("\n") == len(CONFIGS) + 2 and "| tiles+full/nmm |" in table
    assert paths["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_command_json_last_line(tmp_path, capsys) -> None:
    """End to end on two small frames with the bundled model: the last printed line is the JSON report."""
    from tiled_detector.cli import main

    configs = ["full", "tiles", "tiles+full", "tiles+full/nms"]
    args = ["eval", "--frames", "2", "--width", "960", "--height", "640", "--out", str(tmp_path)]
    code = main([*args, "--json", "--configs", *configs])
    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    report = json.loads(last)
    assert set(report["configs"]) == set(configs)
    for values in report["configs"].values():
        assert set(values) == set(METRICS)
        assert 0.0 <= values["AP50"] <= 1.0 and 0.0 <= values["duplicate_rate"] <= 1.0
    assert report["configs"]["tiles+full"] == report["configs"]["tiles+full/nms"]  # same config, run once
    assert report["configs"]["tiles+full"]["recall"] > 0.3
    assert (tmp_path / "eval.md").is_file() and (tmp_path / "eval.png").is_file()


def test_eval_motion_tracks_one_moving_scene_and_adds_the_mot_metrics(tmp_path, capsys) -> None:
    from tiled_detector.cli import main

    args = ["eval", "--motion", "--frames", "6", "--width", "960", "--height", "540", "--out", str(tmp_path)]
    assert main([*args, "--json", "--configs", "tiles+full"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    values = report["configs"]["tiles+full"]
    # the tracker is on unless --tracker says not
    assert report["motion"] and report["tracker"] == "bytetrack"
    assert set(values) == {*METRICS, "IDF1", "MOTA", "id_switches", *STREAM_METRICS} and values["IDF1"] > 0.7
    assert values["views_per_frame"] == values["views_per_frame_max"] == 3 and values["predicted_boxes"] == 0
    assert "| IDF1 | MOTA | id_switches | views_per_frame |" in (tmp_path / "eval.md").read_text()
    assert main([*args, "--json", "--configs", "tiles+full", "--tracker", "none"]) == 0
    untracked = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["configs"]["tiles+full"]
    assert untracked["IDF1"] < values["IDF1"] and untracked["AP50"] == pytest.approx(values["AP50"], abs=0.05)
    assert values["motion_error_px"] == 0 and values["motion_fallbacks"] == 0  # a still camera: the identity


def test_eval_motion_moves_the_camera_and_scores_the_estimate(tmp_path, capsys) -> None:
    """A robot's camera (pan, rotation, zoom, shake): the estimate's error beside the scores; bad flags are one
    line naming the flag."""
    from tiled_detector.cli import main

    args = ["eval", "--motion", "--frames", "6", "--width", "960", "--height", "540", "--out", str(tmp_path)]
    robot = ["--pan", "4", "--rotate", "0.1", "--zoom", "1.002", "--shake", "2"]
    assert main([*args, *robot, "--json", "--configs", "tiles+full"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    values = report["configs"]["tiles+full"]
    assert (report["pan"], report["rotate"], report["zoom"], report["shake"]) == (4, 0.1, 1.002, 2)
    assert report["motion_compensation"] == "image" and values["motion_fallbacks"] == 0
    assert 0 < values["motion_error_px"] < 1.0 and values["IDF1"] > 0.7
    assert "motion_error_px" in (tmp_path / "eval.md").read_text()
    for bad, flag in (
        (["--zoom", "-1"], "--zoom"),
        (["--rotate", "20"], "--rotate"),
        (["--shake", "-2"], "--shake"),
    ):
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and flag in err, err
    assert main(["eval", "--rotate", "0.1", "--out", str(tmp_path)]) == 2
    assert "need --motion" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--motion-compensation", "gyro"])
    assert "--motion-compensation: invalid choice: 'gyro'" in capsys.readouterr().err


def test_eval_motion_compares_tile_budgets_side_by_side(tmp_path, capsys) -> None:
    from tiled_detector.cli import main

    args = [
        "eval",
        "--motion",
        "--frames",
        "6",
        "--width",
        "1920",
        "--height",
        "1080",
        "--out",
        str(tmp_path),
    ]
    assert main([*args, "--json", "--budgets", "2", "4", "--max-tile-age", "4"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    every, two, four = (report["configs"][name] for name in ("every tile", "tile_budget 2", "tile_budget 4"))
    assert every["views_per_frame"] == 9 and every["predicted_boxes"] == 0
    # two frames of history run every tile (the tracker learns the motion), then 2 (or 4) tiles + the full view
    assert two["views_per_frame"] == pytest.approx((2 * 9 + 4 * 3) / 6) and two["views_per_frame_max"] == 9
    assert four["views_per_frame"] == pytest.approx((2 * 9 + 4 * 5) / 6)
    assert two["predicted_boxes"] > 0 and two["latency_vs_full_max"] <= 4
    assert {"latency_p50", "latency_p95", "frames_per_second"} <= set(two)
    assert (tmp_path / "eval.png").stat().st_size > 0 and "tile_budget 2" in (
        tmp_path / "eval.md"
    ).read_text()
    # beside each budget what a user could do instead, at the same mean views per frame: every tile on one frame
    # in k = 8 / 2 = 4 (the full view alone between), and 2 tiles in turn
    interval, turns = report["configs"]["interval 2"], report["configs"]["round_robin 2"]
    assert (
        interval["views_per_frame"] == pytest.approx((3 * 9 + 3 * 1) / 6)
        and interval["views_per_frame_max"] == 9
    )
    assert turns["views_per_frame"] == two["views_per_frame"] and "round_robin 4" in report["configs"]
    # a budget that cannot keep the age bound for the frame's 8 tiles is refused with the smallest that can
    assert main([*args, "--budgets", "1", "--max-tile-age", "4"]) == 1
    assert "the smallest that can is 2" in capsys.readouterr().err
    assert main(["eval", "--budgets", "2", "--out", str(tmp_path)]) == 2  # budgets need a moving scene


def test_new_object_latency_counts_frames_from_appearance_and_from_full_tilings_detection() -> None:
    from tiled_detector.tools.scores.evaluation import first_detections, new_object_latency
    from tiled_detector.types import Detections

    box = np.array([[10.0, 10.0, 30.0, 30.0]])
    other = np.array([[100.0, 100.0, 120.0, 120.0]])
    # object 1 from frame 0, object 2 appears at frame 1
    truth = [(box, np.array([0]), np.array([1]))] + [
        (np.concatenate([box, other]), np.array([0, 0]), np.array([1, 2])) for _ in range(4)
    ]

    def run(frames_with_2: set[int], carried_at: set[int] = frozenset()) -> tuple[list, list]:
        found, fresh = [], []
        for index in range(5):
            boxes = np.concatenate([box, other]) if index in frames_with_2 | carried_at else box
            found.append(
                Detections(
                    boxes.astype(np.float32),
                    np.ones(len(boxes), np.float32),
                    np.zeros(len(boxes), np.int64),
                    {},
                )
            )
            fresh.append(np.array([True, index not in carried_at])[: len(boxes)])
        return found, fresh

    full = first_detections(truth, *run({2, 3, 4}))
    budget = first_detections(truth, *run({4}, carried_at={3}))  # a carried box is no detection
    assert full == {1: 0, 2: 2} and budget == {1: 0, 2: 4}
    got = new_object_latency(truth, budget, full)
    assert got["latency_max"] == 3 and got["latency_vs_full_max"] == 2  # appeared at 1, full found at 2
    assert new_object_latency(truth, full, full)["latency_vs_full_max"] == 0
