"""Rotated truth from label folders (tools/scores/rotated_truth.py): DOTA labelTxt and ultralytics OBB labels matched to a
folder's images by name, classes to the model's labels, and every bad input refused in one line before any image
is read."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest

from tiled_detector.tools.scores.rotated_truth import (
    min_area_boxes,
    read_dota,
    read_yolo_obb,
    rotated_recording_frames,
)
from tiled_detector.tools.scores.truth import TruthError, TruthFormat

LABELS = ("plane", "ship", "small vehicle", "storage tank")  # ultralytics' DOTAv1 spelling
SHIP = "1054 1028 1063 1011 1111 1040 1112 1062 ship 0"


def write_labels(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_dota_labels_read_with_headers_classes_and_difficult(tmp_path: Path) -> None:
    labels = write_labels(
        tmp_path / "labelTxt",
        {
            "P0001.txt": "imagesource:GoogleEarth\ngsd:0.146\n"
            f"{SHIP}\n10 10 30 10 30 20 10 20 small-vehicle 1\n5 5 9 5 9 9 5 9 container-crane 0\n",
            "P0002.txt": "acquisition dates:None\nimagesource:GoogleEarth\ngsd:0.4\n",  # DOTA v2 header, no objects
            "P0003.txt": "0 0 8 0 8 4 0 4 plane\n",  # v1.0 files may leave difficult out
        },
    )
    truth = read_dota(labels, ["P0001.png", "P0002.png", "P0003.jpg"], LABELS)
    assert truth.frame.tolist() == [0, 0, 2]
    assert truth.class_ids.tolist() == [1, 2, 0] and truth.difficult.tolist() == [False, True, False]
    np.testing.assert_array_equal(truth.corners[0], [[1054, 1028], [1063, 1011], [1111, 1040], [1112, 1062]])
    assert truth.left_out == 1 and truth.left_out_classes == ("container-crane",)
    only_ships = read_dota(labels, ["P0001.png", "P0002.png", "P0003.jpg"], LABELS, truth_class="ship")
    assert only_ships.class_ids.tolist() == [1] and only_ships.left_out == 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1 2 3 4 5 6 ship 0", "line 2: 6 coordinates; a DOTA label has 8"),
        ("1 2 3 4 5 6 7 ship 0", "line 2: 7 coordinates; a DOTA label has 8"),
        ("1 2 x 4 5 6 7 8 ship 0", "line 2: 'x' is not a number"),
        ("1 2 3 4 5 6 7 8", "line 2: no class name after the 8 coordinates"),
        ("1 2 3 4 5 6 7 8 ship 2", "line 2: difficult must be 0 or 1, got '2'"),
        ("1 2 3 4 5 6 7 nan ship 0", "line 2: coordinates must be finite"),
    ],
)
def test_bad_dota_line_is_refused_naming_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    labels = write_labels(tmp_path / "labelTxt", {"P0001.txt": f"{SHIP}\n{line}\n"})
    with pytest.raises(TruthError, match=message) as error:
        read_dota(labels, ["P0001.png"], LABELS)
    assert str(labels / "P0001.txt") in str(error.value) and "\n" not in str(error.value)


def test_every_problem_counted_in_the_one_line(tmp_path: Path) -> None:
    labels = write_labels(tmp_path / "labelTxt", {"a.txt": "1 2 3 ship 0\n1 2 3 ship 0\n", "b.txt": SHIP})
    with pytest.raises(
        TruthError, match=r"no label file for image c.png \(1 of the 3 images.*\(and 2 more problems\)"
    ):
        read_dota(labels, ["a.png", "b.png", "c.png"], LABELS)


def test_image_without_labels_is_refused_before_any_image_is_read(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    for name in ("P0001.png", "P0002.png"):
        cv2.imwrite(str(images / name), np.zeros((64, 64, 3), np.uint8))
    labels = write_labels(tmp_path / "labelTxt", {"P0001.txt": "0 0 8 0 8 4 0 4 ship 0\n"})
    with pytest.raises(TruthError, match=r"no label file for image P0002.png .*needs an empty P0002.txt"):
        rotated_recording_frames(images, labels, TruthFormat.DOTA, LABELS)


def test_yolo_obb_labels_scaled_by_each_image(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    cv2.imwrite(str(images / "a.png"), np.zeros((100, 200, 3), np.uint8))
    cv2.imwrite(str(images / "b.png"), np.zeros((50, 50, 3), np.uint8))
    labels = write_labels(tmp_path / "labels", {"a.txt": "1 0.1 0.1 0.3 0.1 0.3 0.2 0.1 0.2\n", "b.txt": ""})
    frames, truth = rotated_recording_frames(images, labels, TruthFormat.YOLO_OBB, LABELS)
    first, second = list(frames)
    np.testing.assert_allclose(first.boxes, [[20, 10, 60, 20]])  # the hull in pixels of a 200 x 100 image
    cx, cy, w, h, _ = first.obb[0]
    assert (cx, cy) == pytest.approx((40, 15)) and sorted((w, h)) == pytest.approx([10, 40])
    assert first.class_ids.tolist() == [1] and not first.difficult.any()
    assert second.obb.shape == (0, 5) and truth.normalised
    bad = write_labels(
        tmp_path / "bad", {"a.txt": "7 0.1 0.1 0.3 0.1 0.3 0.2 0.1 0.2\n", "b.txt": "0 0.1 0.2\n"}
    )
    with pytest.raises(
        TruthError, match=r"a.txt line 1: class 7 is not a class index of the model \(0 to 3\)"
    ):
        read_yolo_obb(bad, ["a.png", "b.png"], LABELS)


def test_object_outside_its_image_is_left_out_and_counted(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    cv2.imwrite(str(images / "a.png"), np.zeros((64, 64, 3), np.uint8))
    labels = write_labels(
        tmp_path / "labelTxt",
        {"a.txt": "100 100 110 100 110 105 100 105 ship 0\n10 10 20 10 20 15 10 15 ship 0\n"},
    )
    frames, _ = rotated_recording_frames(images, labels, TruthFormat.DOTA, LABELS)
    (frame,) = list(frames)
    assert len(frame.obb) == 1 and frames.outside == 1


def test_minimum_area_rectangle_gives_back_a_rotated_box() -> None:
    """A rectangle's four corners (OpenCV's boxPoints, any start and direction) give back that rectangle."""
    for cx, cy, w, h, degrees in [(50, 40, 30, 8, 20), (10, 10, 5, 12, -70), (0, 0, 9, 9, 45)]:
        corners = cv2.boxPoints(((cx, cy), (w, h), degrees))
        for polygon in (corners, corners[::-1], np.roll(corners, 1, axis=0)):
            found = min_area_boxes([polygon])[0]
            assert found[:2] == pytest.approx((cx, cy), abs=1e-3)
            back = cv2.boxPoints(((found[0], found[1]), (found[2], found[3]), math.degrees(found[4])))
            distance = np.linalg.norm(back[:, None] - corners[None], axis=2).min(axis=1)
            assert distance.max() < 1e-3  # the same four corners


@pytest.fixture(scope="module")
def obb_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ultralytics OBB export (as its exporter writes it) of classes red and blue."""
    from support.exports import ObbHead, ultralytics_onnx

    return ultralytics_onnx(tmp_path_factory.mktemp("model") / "obb.onnx", ObbHead(), task="obb")


def test_make_bag_writes_dota_truth_as_rotated_boxes(tmp_path: Path, obb_model: Path, capsys) -> None:
    from tiled_detector.cli import main as cli_main
    from tiled_detector.harness import bags, recording
    from tiled_detector.messages.detections import msg_obb

    images = tmp_path / "images"
    images.mkdir()
    for name in ("P1.png", "P2.png"):
        cv2.imwrite(str(images / name), np.zeros((64, 96, 3), np.uint8))
    corners = cv2.boxPoints(((40, 30), (30, 8), 30.0)).reshape(-1).tolist()
    text = " ".join(f"{v:.2f}" for v in corners)
    labels = write_labels(
        tmp_path / "labelTxt",
        {"P1.txt": f"gsd:0.1\n{text} red 0\n{text} blue 1\n{text} ship 0\n", "P2.txt": ""},
    )
    argv = ["make-bag", str(tmp_path / "bag"), "--images", str(images), "--truth", str(labels)]
    assert cli_main([*argv, "--truth-format", "dota", "--model", str(obb_model)]) == 0
    out = capsys.readouterr().out
    assert "2 rotated boxes (1 difficult)" in out and "1 objects of other classes left out (ship)" in out
    info = bags.bag_info(tmp_path / "bag")
    assert info.custom_data[recording.ROTATED] == "true" and info.custom_data["truth_format"] == "dota"
    messages = [
        bags.deserialize(m.data, bags.DETECTIONS)
        for m in bags.read_messages(tmp_path / "bag", ["/ground_truth"])
    ]
    assert [len(m.detections) for m in messages] == [2, 0]
    found = msg_obb(messages[0])[0]
    assert found[:2] == pytest.approx((40, 30), abs=0.01) and sorted(found[2:4]) == pytest.approx(
        [8, 30], abs=0.01
    )
    names = [d.results[0].hypothesis.class_id for d in messages[0].detections]
    assert names == ["red", "blue"] and [d.results[0].hypothesis.score for d in messages[0].detections] == [
        1.0,
        0.0,
    ]


def test_make_bag_refuses_bad_labels_at_start_writing_nothing(
    tmp_path: Path, obb_model: Path, capsys
) -> None:
    from tiled_detector.cli import main as cli_main

    images = tmp_path / "images"
    images.mkdir()
    cv2.imwrite(str(images / "P1.png"), np.zeros((64, 96, 3), np.uint8))
    labels = write_labels(tmp_path / "labelTxt", {"P1.txt": "1 2 3 4 5 6 red 0\n"})
    argv = ["make-bag", str(tmp_path / "bag"), "--images", str(images), "--truth", str(labels)]
    assert cli_main([*argv, "--truth-format", "dota", "--model", str(obb_model)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "P1.txt line 1: 6 coordinates; a DOTA label has 8" in err[0]
    assert cli_main([*argv, "--model", str(obb_model)]) == 1  # a folder needs its format named
    assert "give --truth-format dota" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "labelTxt"]  # nothing written, no staging
