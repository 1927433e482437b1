"""Replay: scoring and the release gate, then real processes (a stand-in node, and the detector node)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.harness import bags, recording
from tiled_detector.harness.replay import ReplayOptions, Thresholds, replay_bag
from tiled_detector.harness.report import (
    FrameRecord,
    Mode,
    ReplayReport,
    coco_ap50,
    score,
    summarize,
    true_positives,
)
from tiled_detector.tools.scoring import box_iou
from tiled_detector.tools.worlds.synthetic import MotionStyle, make_sequence

ROBOT = MotionStyle(pan=2.0, rotate=0.2, shake=1.0)  # a robot's camera: panning, turning, shaking
ECHO_NODE = (sys.executable, str(Path(__file__).parent / "support" / "echo_node.py"))


def _arrays(boxes: list[list[float]], scores: list[float], classes: list[int]) -> tuple[np.ndarray, ...]:
    return (
        np.array(boxes, np.float32).reshape(-1, 4),
        np.array(scores, np.float32),
        np.array(classes, np.int64),
    )


# --- scoring ------------------------------------------------------------------------------------------------

box = st.tuples(st.floats(0, 500), st.floats(0, 500), st.floats(1, 100), st.floats(1, 100)).map(
    lambda b: [b[0], b[1], b[0] + b[2], b[1] + b[3]]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(box, min_size=1, max_size=8), st.lists(box, min_size=1, max_size=8))
def test_iou_is_a_symmetric_overlap_ratio(a: list[list[float]], b: list[list[float]]) -> None:
    iou = box_iou(np.array(a), np.array(b))
    assert iou.shape == (len(a), len(b))
    assert ((iou >= 0) & (iou <= 1 + 1e-9)).all()
    np.testing.assert_allclose(iou, box_iou(np.array(b), np.array(a)).T)
    np.testing.assert_allclose(np.diag(box_iou(np.array(a), np.array(a))), 1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(box, max_size=8), st.lists(box, max_size=8))
def test_matches_are_one_to_one(predicted: list[list[float]], truth: list[list[float]]) -> None:
    scores, zeros = np.linspace(1, 0.1, len(predicted)), np.zeros(len(predicted), int)
    hits = true_positives(
        (np.array(predicted).reshape(-1, 4), scores, zeros),
        (np.array(truth).reshape(-1, 4), np.zeros(len(truth), int)),
    )
    assert 0 <= hits <= min(len(predicted), len(truth))
    assert true_positives(
        (np.array(truth).reshape(-1, 4), np.ones(len(truth)), np.zeros(len(truth), int)),
        (np.array(truth).reshape(-1, 4), np.zeros(len(truth), int)),
    ) == len(truth)


def test_scores_of_a_hand_checked_case() -> None:
    truth = {1: (np.array([[0, 0, 10, 10], [20, 20, 30, 30]], np.float32), np.array([0, 1]))}
    perfect = {1: _arrays([[0, 0, 10, 10], [20, 20, 30, 30]], [0.9, 0.8], [0, 1])}
    assert score(perfect, truth).__dict__ == pytest.approx({"ap50": 1.0, "precision": 1.0, "recall": 1.0})
    # class 0 found (AP 1), class 1 labelled as class 0 (a false positive) so class 1 missed (AP 0): mean 0.5
    half = {1: _arrays([[0, 0, 10, 10], [20, 20, 30, 30]], [0.9, 0.8], [0, 0])}
    result = score(half, truth)
    assert (result.precision, result.recall) == (0.5, 0.5)
    assert result.ap50 == pytest.approx(0.5)
    shifted = {1: _arrays([[6, 6, 16, 16]], [0.9], [0])}  # IoU 16/184 < 0.5
    assert score(shifted, truth).recall == 0.0
    assert coco_ap50(shifted, truth) == 0.0
    assert score({}, truth).ap50 is None  # nothing answered: no quality to report


def test_report_counts_drops_and_gates() -> None:
    truth = {1: (np.array([[0, 0, 10, 10]], np.float32), np.array([0]))}
    records = [
        FrameRecord(1, 12.0, _arrays([[0, 0, 10, 10]], [0.9], [0])),
        FrameRecord(2, None, None),
        FrameRecord(3, 30.0, _arrays([], [], [])),
    ]
    report = summarize(Mode.REALTIME, records, truth)
    assert (report.frames_sent, report.frames_answered, report.dropped) == (3, 2, 1)
    assert (report.ap50, report.recall) == pytest.approx((1.0, 1.0))
    assert report.latency_ms_p50 == pytest.approx(21.0)
    summary = report.summary()
    assert {
        "frames_sent",
        "frames_answered",
        "AP50",
        "precision",
        "recall",
        "latency_ms_p50",
        "latency_ms_p95",
        "dropped",
    } <= set(summary)
    assert Thresholds(min_ap50=0.9, min_recall=1.0).failures(report) == []
    assert Thresholds(max_drop_rate=0.2).failures(report) == ["drop rate 0.333 > 0.2 (1 of 3 frames)"]
    no_truth = ReplayReport("lockstep", 1, 1, None, None, None, 1.0, 1.0)
    assert "no ground truth" in Thresholds(min_ap50=0.5).failures(no_truth)[0]
    with pytest.raises(ValueError, match="min_recall must be in"):
        Thresholds(min_recall=80)
    with pytest.raises(ValueError, match="lockstep, realtime"):
        Mode.from_value("fast")
    assert Mode.from_value("LockStep") is Mode.LOCKSTEP


# --- real processes -----------------------------------------------------------------------------------------


def _bright_squares(count: int, shift: int = 0) -> list[recording.Frame]:
    """Frames with one white rectangle each; ground truth shifted by `shift` pixels (0 = exact)."""
    frames = []
    for index in range(count):
        image = np.zeros((240, 320, 3), np.uint8)
        x, y = 20 + 9 * index, 30 + 4 * index
        image[y : y + 40, x : x + 60] = 255
        gt = np.array([[x + shift, y, x + 60 + shift, y + 40]], np.float32)
        frames.append(recording.Frame(image, gt, np.array([0])))
    return frames


@pytest.mark.ros
def test_lockstep_replay_records_and_scores(tmp_path: Path) -> None:
    bag = recording.write_image_bag(tmp_path / "bag", _bright_squares(8), labels=["bright"], storage="mcap")
    report = replay_bag(bag, ReplayOptions(program=ECHO_NODE, timeout=10), tmp_path / "out")
    assert (report.frames_sent, report.frames_answered, report.dropped) == (8, 8, 0)
    assert (report.ap50, report.precision, report.recall) == pytest.approx((1.0, 1.0, 1.0))
    assert 0 < report.latency_ms_p50 <= report.latency_ms_p95
    recorded = bags.read_detections(tmp_path / "out" / "detections", "/detections", ["bright"])
    assert sorted(recorded) == [recording.frame_stamp(i, 30.0) for i in range(8)]
    assert bags.bag_info(tmp_path / "out" / "detections").storage is bags.Storage.MCAP
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["summary"] == report.summary()
    assert saved["frames"][0]["detections"][0]["class_id"] == "bright"


def _tilted_bars(count: int) -> list[recording.Frame]:
    """Frames with one white 70 x 12 bar turned 35 degrees, its rotated truth exact, and a difficult object that
    is not drawn (no detection can find it)."""
    import cv2

    from tiled_detector.geometry import polygons

    frames = []
    for index in range(count):
        image = np.zeros((240, 320, 3), np.uint8)
        bar = np.array([[100 + 8 * index, 90 + 5 * index, 70, 12, np.radians(35)]])
        hidden = np.array([[260, 200, 20, 10, 0.0]])
        obb = np.concatenate([bar, hidden]).astype(np.float32)
        corners = polygons.corners(bar)[0] - 0.5  # OpenCV's pixel centres are whole coordinates
        cv2.fillPoly(image, [(corners * 16).round().astype(np.int32)], (255, 255, 255), cv2.LINE_8, 4)
        hulls = polygons.hulls(polygons.corners(obb.astype(np.float64))).astype(np.float32)
        frames.append(
            recording.Frame(image, hulls, np.array([0, 0]), obb=obb, difficult=np.array([False, True]))
        )
    return frames


def test_rotated_truth_scores_rotated_answers_and_ignores_difficult_objects() -> None:
    """The same bar answered by its rotated box scores 1; by its hull (IoU about 0.3) 0; a difficult object
    missed costs nothing, a detection of it is neither right nor wrong."""
    from tiled_detector.geometry import polygons

    bar = [100.0, 90.0, 70.0, 12.0, np.radians(35)]
    truth = {1: (np.array([bar, [260, 200, 20, 10, 0]]), np.array([0, 0]), np.array([False, True]))}
    x1, y1, x2, y2 = polygons.hulls(polygons.corners(np.array(bar)))
    hull = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, 0.0]

    def scored(*rows: list[float]) -> tuple:
        found = summarize(Mode.LOCKSTEP, [FrameRecord(1, 5.0, _rotated(*rows))], truth, rotated=True)
        return found.ap50, found.precision, found.recall

    assert scored(bar) == pytest.approx((1.0, 1.0, 1.0))
    assert scored(bar, [260, 200, 20, 10, 0.1]) == pytest.approx((1.0, 1.0, 1.0))  # on the difficult one
    assert scored(hull) == pytest.approx((0.0, 0.0, 0.0))
    assert scored(bar, [20, 20, 10, 10, 0]) == pytest.approx((1.0, 0.5, 1.0))


@pytest.mark.ros
def test_rotated_answers_against_axis_aligned_truth_are_scored_by_their_rotated_geometry() -> None:
    """A rotated-box model replayed against axis-aligned truth (each object's hull): its answers are read back as the
    hulls of their rectangles (`to_arrays`, `msg_to_detections`), so a right answer scores 1 (a 100 x 10 box at 1.5
    rad read as centre +- (w, h) / 2 had IoU 0.07 with its true hull)."""
    from std_msgs.msg import Header

    from tiled_detector.geometry import polygons
    from tiled_detector.harness.report import to_arrays
    from tiled_detector.messages.detections import detections_to_msg

    header = Header(frame_id="camera")
    obb = np.array([[300.0, 200.0, 100.0, 10.0, 1.5], [80.0, 90.0, 40.0, 20.0, 0.4]])
    true_hulls = polygons.hulls(polygons.corners(obb))
    answer = detections_to_msg(true_hulls, [0.9, 0.8], [0, 0], header, ["bar"], obb=obb)
    answers = to_arrays({1: answer}, ["bar"])
    np.testing.assert_allclose(answers[1][0], true_hulls, atol=1e-3)
    assert box_iou(answers[1][0][:1].astype(np.float64), true_hulls[:1])[0, 0] == pytest.approx(1.0, abs=1e-4)
    found = summarize(Mode.LOCKSTEP, [FrameRecord(1, 5.0, answers[1])], {1: (true_hulls, np.array([0, 0]))})
    assert (found.ap50, found.precision, found.recall) == pytest.approx((1.0, 1.0, 1.0))


def test_a_bags_rotated_detections_are_read_as_hulls_or_as_rotated_boxes(tmp_path: Path) -> None:
    """`bags.read_detections`: the rotated truth of a bag as the hulls of its rectangles, or (`rotated`) as the
    rectangles themselves in the regular form."""
    frames = _tilted_bars(2)
    bag = recording.write_image_bag(
        tmp_path / "bag", frames, labels=["bright"], custom_data={recording.ROTATED: "true"}
    )
    hulls = bags.read_detections(bag, bags.GROUND_TRUTH_TOPIC, ["bright"])
    rotated = bags.read_detections(bag, bags.GROUND_TRUTH_TOPIC, ["bright"], rotated=True)
    for frame, (stamp, (boxes, _, _)) in zip(frames, sorted(hulls.items()), strict=True):
        np.testing.assert_allclose(boxes, frame.boxes, atol=1e-3)
        np.testing.assert_allclose(rotated[stamp][0], frame.obb, atol=1e-4)


def _rotated(*rows: list[float]) -> tuple[np.ndarray, ...]:
    scores = np.linspace(0.9, 0.5, len(rows))
    return np.array(rows, np.float64).reshape(-1, 5), scores, np.zeros(len(rows), np.int64)


@pytest.mark.ros
def test_a_rotated_bag_replays_scored_by_polygon_iou(tmp_path: Path) -> None:
    bag = recording.write_image_bag(
        tmp_path / "bag", _tilted_bars(6), labels=["bright"], custom_data={recording.ROTATED: "true"}
    )
    truth = bags.read_detections(bag, bags.GROUND_TRUTH_TOPIC, ["bright"])
    first = next(iter(truth.values()))
    assert first[1].tolist() == [1.0, 0.0]  # the difficult object's score
    rotated = replay_bag(bag, ReplayOptions(program=ECHO_NODE, timeout=10, parameters={"rotated": True}))
    assert (rotated.ap50, rotated.precision, rotated.recall) == pytest.approx((1.0, 1.0, 1.0))
    upright = replay_bag(
        bag, ReplayOptions(program=ECHO_NODE, timeout=10)
    )  # hulls: IoU with the bar about 0.3
    assert (upright.ap50, upright.precision, upright.recall) == pytest.approx((0.0, 0.0, 0.0))


@pytest.mark.ros
def test_realtime_replay_reports_drops_honestly(tmp_path: Path) -> None:
    bag = recording.write_image_bag(tmp_path / "bag", _bright_squares(10), rate=60.0, labels=["bright"])
    report = replay_bag(bag, ReplayOptions(mode="realtime", program=ECHO_NODE, timeout=10))
    assert report.frames_sent == 10
    assert 1 <= report.frames_answered <= 10
    assert report.dropped == report.frames_sent - report.frames_answered
    assert report.ap50 == pytest.approx(1.0)  # every answer it gave is right


@pytest.mark.ros
def test_cli_gate_attached_to_a_running_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiled_detector.cli import main
    from tiled_detector.harness.process import NodeProcess, pick_domain_id

    good = recording.write_image_bag(tmp_path / "good", _bright_squares(4), labels=["bright"])
    bad = recording.write_image_bag(tmp_path / "bad", _bright_squares(4, shift=45), labels=["bright"])
    domain = pick_domain_id()
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    with NodeProcess(remaps={"image": "/camera/image_raw"}, domain_id=domain, program=ECHO_NODE):
        assert (
            main(["replay", str(good), "--attach", "--json", "--min-ap50", "0.9", "--startup-timeout", "30"])
            == 0
        )
        passed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (
            main(["replay", str(bad), "--attach", "--json", "--min-ap50", "0.9", "--startup-timeout", "30"])
            == 1
        )
        failed_lines = capsys.readouterr().out.strip().splitlines()
    assert passed["passed"] and passed["frames_answered"] == 4 and passed["AP50"] == pytest.approx(1.0)
    failed = json.loads(failed_lines[-1])
    assert not failed["passed"] and failed["AP50"] == 0.0
    assert any(line.startswith("FAILED: AP50 0.000 < 0.9") for line in failed_lines)


@pytest.fixture(scope="module")
def camera_bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recording.make_synthetic_bag(
        tmp_path_factory.mktemp("camera") / "bag", 30, 100, 1920, 1080, rate=30.0
    )


@pytest.mark.ros
@pytest.mark.slow
def test_detector_node_passes_the_gate_lockstep(camera_bag: Path) -> None:
    from tiled_detector.commands.settings import default_params_file

    report = replay_bag(
        camera_bag, ReplayOptions(params_file=default_params_file(), timeout=30, startup_timeout=60)
    )
    assert report.frames_sent == report.frames_answered == 30
    assert report.ap50 is not None and report.ap50 >= 0.80, report.summary()


@pytest.mark.ros
@pytest.mark.slow
def test_detector_node_drops_frames_in_realtime_at_30_hz(camera_bag: Path) -> None:
    from tiled_detector.commands.settings import default_params_file

    report = replay_bag(
        camera_bag,
        ReplayOptions(mode="realtime", params_file=default_params_file(), timeout=30, startup_timeout=60),
    )
    assert report.frames_sent == 30
    assert report.frames_answered < report.frames_sent  # slower than the camera on this CPU
    assert report.dropped == report.frames_sent - report.frames_answered


@pytest.mark.ros
@pytest.mark.slow
def test_ctrl_c_ends_replay_with_one_line_and_no_orphan(camera_bag: Path) -> None:
    import psutil

    # answers awaited on a topic nobody publishes: the replay is still running whenever Ctrl-C comes
    command = [
        sys.executable,
        "-m",
        "tiled_detector.cli",
        "replay",
        str(camera_bag),
        "--detections-topic",
        "nowhere",
    ]
    # (also when the tests run as a shell's background job, whose SIGINT the replay inherits ignored)
    replay = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(replay.pid)
    deadline = time.monotonic() + 60
    while not parent.children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.2)
    children = parent.children(recursive=True)
    assert children, "replay started no node"

    def node_ready() -> bool:  # the node's log (its stdout, a file) says it is up
        for child in children:
            with contextlib.suppress(OSError):
                if "ready:" in Path(os.readlink(f"/proc/{child.pid}/fd/1")).read_text(errors="replace"):
                    return True
        return False

    while not node_ready() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert node_ready(), "the node never said it was ready"
    assert replay.poll() is None
    replay.send_signal(signal.SIGINT)
    out, err = replay.communicate(timeout=30)
    assert replay.returncode == 130, (out, err)
    assert err.strip().splitlines()[-1] == "tiled-detector replay: interrupted", err
    assert "Traceback" not in err
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, alive


@pytest.fixture(scope="module")
def moving_bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recording.make_synthetic_bag(
        tmp_path_factory.mktemp("moving") / "bag", 12, 5, 960, 540, rate=30.0, camera=ROBOT
    )


def test_a_moving_bag_carries_identities_and_is_the_same_every_time(moving_bag: Path, tmp_path: Path) -> None:
    from tiled_detector.harness.recording import IDENTITIES
    from tiled_detector.messages.detections import msg_ids

    assert bags.bag_info(moving_bag).custom_data[IDENTITIES] == "true"
    truth = [
        bags.deserialize(m.data, bags.DETECTIONS)
        for m in bags.read_messages(moving_bag, [bags.GROUND_TRUTH_TOPIC])
    ]
    ids = [set(msg_ids(m).tolist()) for m in truth]
    assert len(truth) == 12 and all(i and min(i) >= 1 for i in ids)
    assert len(ids[0] & ids[-1]) >= 0.5 * len(ids[0])  # the same objects, moved
    again = recording.make_synthetic_bag(tmp_path / "again", 12, 5, 960, 540, rate=30.0, camera=ROBOT)
    topics = [bags.GROUND_TRUTH_TOPIC, bags.CAMERA_MOTION_TOPIC]
    first = [m.data for m in bags.read_messages(moving_bag, topics)]
    assert first == [m.data for m in bags.read_messages(again, topics)]
    # the true camera motion of every frame, as the scene was rendered
    stored = [
        bags.deserialize(m.data, bags.CAMERA_MOTION).data.reshape(2, 3)
        for m in bags.read_messages(moving_bag, [bags.CAMERA_MOTION_TOPIC])
    ]
    rendered = [scene.camera for scene in make_sequence(5, 12, 960, 540, ROBOT)]
    assert len(stored) == 12 and np.allclose(stored, rendered)
    assert np.allclose(stored[0], np.eye(3)[:2]) and not np.allclose(stored[5], np.eye(3)[:2])
    assert {k: bags.bag_info(moving_bag).custom_data[k] for k in ("pan", "rotate", "shake")} == {
        "pan": "2.0",
        "rotate": "0.2",
        "shake": "1.0",
    }


@pytest.mark.ros
def test_replay_scores_identities_and_gates_on_idf1(moving_bag: Path, capsys: pytest.CaptureFixture) -> None:
    """Tracking on: IDF1 / MOTA / id_switches in the JSON next to AP50; without a tracker the ids are per-frame
    indices and --min-idf1 fails the gate (exit 1)."""
    from tiled_detector.cli import main

    assert main(["replay", str(moving_bag), "--tracker", "bytetrack", "--min-idf1", "0.7", "--json"]) == 0
    tracked = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"AP50", "IDF1", "MOTA", "id_switches"} <= set(tracked) and tracked["IDF1"] >= 0.7, tracked
    assert main(["replay", str(moving_bag), "--min-idf1", "0.7", "--json"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    untracked = json.loads(lines[-1])
    assert untracked["IDF1"] < 0.7 and untracked["id_switches"] > tracked["id_switches"]
    assert any(line.startswith("FAILED: IDF1 ") for line in lines)


@pytest.mark.ros
def test_an_rgbd_bag_replays_its_depth_and_scores_the_positions(tmp_path: Path, capsys) -> None:
    """make-bag --depth writes depth images, camera infos and the true 3D positions; replay --depth plays them into
    the node's depth_image and camera_info and scores its detections_3d (a bag without depth: no depth keys)."""
    from tiled_detector.cli import main
    from tiled_detector.harness.depth_recording import GROUND_TRUTH_3D_TOPIC

    bag = tmp_path / "rgbd"
    assert main(["make-bag", str(bag), "--depth", "--frames", "3", "--width", "960", "--height", "540"]) == 0
    info = bags.bag_info(bag)
    assert info.image_topic() == "/camera/image_raw" and info.topics[GROUND_TRUTH_3D_TOPIC][1] == 3
    assert main(["replay", str(bag), "--depth", "--json", "--timeout", "60"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["frames_answered"] == 3 and summary["objects_3d"] > 0, summary
    assert summary["depth_error_median"] <= 0.01 and summary["depth_error_p95"] <= 0.03, summary
    assert ReplayReport("lockstep", 1, 1, None, None, None, None, None).summary()["objects_3d"] is None


SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MOT17_04 = SHARED / "data" / "mot17_mini" / "MOT17-04-FRCNN"
YOLOX = SHARED / "models" / "yolox_nano.onnx"


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.skipif(
    not (MOT17_04.is_dir() and YOLOX.is_file()), reason=f"no MOT17-mini / YOLOX-nano in {SHARED}"
)
def test_a_real_recording_with_mot_truth_scores_as_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """make-bag --truth gt.txt on 8 real MOT17 frames, replayed through the node with the real YOLOX-nano: AP50, IDF1,
    MOTA and id_switches against the truth, IDF1 within 0.005 of the same frames run in this process."""
    from tiled_detector.cli import main
    from tiled_detector.commands.settings import add_settings, default_params_file, parameter_values
    from tiled_detector.harness.recording import frame_stamp
    from tiled_detector.parameters import build_detector
    from tiled_detector.tools.scores.stream_scores import score_stream
    from tiled_detector.tools.scores.truth import recording_frames

    truth = ["--truth", str(MOT17_04 / "gt" / "gt.txt"), "--truth-class", "person"]
    source = ["--images", str(MOT17_04 / "img1"), *truth, "--rate", "30"]
    assert main(["make-bag", str(tmp_path / "bag"), *source, "--model", str(YOLOX)]) == 0
    assert "ground truth: 336 person boxes" in capsys.readouterr().out  # 42 pedestrians a frame, 8 frames
    small = ["--tracker", "bytetrack", "--tile-size", "1920", "1080", "--no-full-frame"]  # one view a frame
    node = ["--param", f"model:={YOLOX}", "--param", "classes:=[person]"]
    assert (
        main(["replay", str(tmp_path / "bag"), *node, *small, "--out", str(tmp_path / "out"), "--json"]) == 0
    )
    replayed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert replayed["frames_answered"] == 8, replayed
    answers = json.loads((tmp_path / "out" / "report.json").read_text())["frames"]
    assert {d["class_id"] for f in answers for d in f["detections"]} == {"person"}  # classes:=[person]
    assert 0.1 < replayed["AP50"] < 1 and 0.1 < replayed["IDF1"] < 1 and replayed["MOTA"] < 1, replayed
    assert replayed["id_switches"] >= 0
    # the same frames, truth, stamps and settings in this process (what benchmarks/score_recording.py prints)
    parser = argparse.ArgumentParser()
    add_settings(parser)
    args = parser.parse_args(["--model", str(YOLOX), "--classes", "person", *small])
    args.params_file = default_params_file()  # the node's params file, as replay starts it
    detector = build_detector(parameter_values(args))
    frames, _ = recording_frames(MOT17_04 / "img1", None, None, MOT17_04 / "gt" / "gt.txt", None, "person")
    stamps = (frame_stamp(index, 30.0) for index in itertools.count())
    here = score_stream(detector, frames, stamps, ["person"])
    assert here["frames"] == 8
    assert here["IDF1"] == pytest.approx(replayed["IDF1"], abs=0.005)
    assert here["AP50"] == pytest.approx(replayed["AP50"], abs=0.005)
    assert here["MOTA"] == pytest.approx(replayed["MOTA"], abs=0.005)
    assert here["id_switches"] == replayed["id_switches"]


def test_a_synthetic_rotated_bag_carries_the_scenes_rotated_truth(tmp_path: Path) -> None:
    """`make-bag --obb --motion`: the rotated world's boxes with theta, identities, both marked in the metadata."""
    from tiled_detector.geometry.polygons import regularized
    from tiled_detector.messages.detections import msg_ids, msg_obb
    from tiled_detector.tools.worlds.rotated_scenes import make_rotated_sequence

    bag = recording.make_synthetic_bag(tmp_path / "bag", 3, 4, 480, 320, camera=MotionStyle(), rotated=True)
    info = bags.bag_info(bag)
    assert info.custom_data[recording.ROTATED] == "true" and info.custom_data[recording.IDENTITIES] == "true"
    messages = [
        bags.deserialize(m.data, bags.DETECTIONS) for m in bags.read_messages(bag, [bags.GROUND_TRUTH_TOPIC])
    ]
    for message, scene in zip(messages, make_rotated_sequence(4, 3, 480, 320), strict=True):
        # (turning objects' angles leave [0, pi/2): each written in the convention's regular form, the same rectangle)
        np.testing.assert_allclose(msg_obb(message), regularized(scene.obb.astype(np.float64)), atol=1e-4)
        assert [int(i) for i in msg_ids(message)] == scene.ids.tolist()
