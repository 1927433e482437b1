"""Ground-truth files of a user's recording: MOTChallenge gt.txt (1-based frames and pixels, consider flags, classes,
MOT15's columns, clipping) and COCO (categories by name, images by file name or in frame order, track ids), matched
to the recording's frames, and every refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.tools.frames import Frame
from tiled_detector.tools.scores.truth import (
    Truth,
    TruthError,
    TruthFormat,
    TruthFrames,
    read_coco,
    read_mot,
    recording_frames,
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _frames(count: int, width: int = 64, height: int = 48) -> list[Frame]:
    return [Frame(np.full((height, width, 3), index, np.uint8)) for index in range(count)]


# --- MOTChallenge -------------------------------------------------------------------------------------------


def test_mot_boxes_are_1_based_left_top_width_height(tmp_path: Path) -> None:
    """(left, top) is the box's first pixel counted from 1: the image's first pixel (1, 1) is our [0, 1) x [0, 1)."""
    gt = _write(tmp_path / "gt.txt", "1,7,1,1,10,20,1,1,1.0\n2,7,101.5,51,10,20,1,1,0.5\n3,8,5,6,7,8,1,1,1\n")
    truth = read_mot(gt)
    assert truth.frame.tolist() == [0, 1, 2] and truth.ids.tolist() == [7, 7, 8]
    np.testing.assert_allclose(truth.boxes, [[0, 0, 10, 20], [100.5, 50, 110.5, 70], [4, 5, 11, 13]])
    assert (truth.frames, truth.exact, truth.left_out, truth.identities) == (3, False, 0, True)


def test_mot_leaves_out_rows_not_considered_and_classes_other_than_pedestrian(tmp_path: Path) -> None:
    gt = _write(
        tmp_path / "gt.txt",
        "\n".join(
            [
                "1,1,10,10,5,5,1,1,0.9",  # pedestrian, considered: kept
                "1,2,10,10,5,5,0,1,0.9",  # not considered
                "1,3,10,10,5,5,1,3,0.9",  # a car
                "1,4,10,10,5,5,1,7,0.9",  # a static person
                "2,5,10,10,5,5,1,-1,1",  # unlabelled (MOT15 written in 9 columns): kept
                "4,6,10,10,5,5,0,3,0.2",  # frame 4 has only a left-out row: the truth still spans 4 frames
            ]
        )
        + "\n",
    )
    truth = read_mot(gt)
    assert truth.ids.tolist() == [1, 5] and truth.frame.tolist() == [0, 1]
    assert (truth.left_out, truth.frames) == (4, 4)


def test_mot15_has_world_coordinates_where_mot17_has_a_class(tmp_path: Path) -> None:
    """10 columns: frame, id, box, consider, x, y, z; every row a pedestrian whatever x is."""
    gt = _write(
        tmp_path / "gt.txt", "1,1,10,10,5,5,1,-1,-1,-1\n1,2,20,10,5,5,1,3.5,2,0\n2,1,11,10,5,5,0,-1,-1,-1\n"
    )
    truth = read_mot(gt)
    assert truth.ids.tolist() == [1, 2] and truth.left_out == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "1,1,10,10,5,5,1\n",
            "row 1 has 7 columns; a MOTChallenge gt.txt has 9 (MOT16 / MOT17 / MOT20) or 10",
        ),
        ("1,1,10,10,5,5,1,1,1\n2,1,10,10,5,5,1,1\n", "row 2 has 8 columns"),
        ("1,1,10,10,5,5,1,1,1,1,1\n", "row 1 has 11 columns"),
        ("1,1,10,10,5,5,1,one,1\n", "not a MOTChallenge gt.txt of numbers"),
        ("0,1,10,10,5,5,1,1,1\n", "frame 0 in row 1; MOTChallenge frames count from 1"),
        ("1,-1,10,10,5,5,0.9,-1,-1,-1\n", "every id is -1: a detections file (det.txt)"),
        ("1,4,10,10,5,5,1,1,1\n1,4,30,10,5,5,1,1,1\n", "id 4 appears twice in frame 1"),
        ("\n", "no rows"),
    ],
)
def test_bad_mot_files_are_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    gt = _write(tmp_path / "gt.txt", text)
    with pytest.raises(TruthError, match=r"^--truth .*gt.txt: ") as error:
        read_mot(gt)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_boxes_past_the_border_are_clipped_and_one_wholly_outside_is_left_out_and_counted(
    tmp_path: Path,
) -> None:
    gt = _write(
        tmp_path / "gt.txt",
        "1,1,-9,41,20,20,1,1,1\n1,2,60,1,20,10,1,1,1\n2,3,65,1,5,5,1,1,1\n2,4,5,5,5,5,1,1,1\n",
    )
    truth = read_mot(gt)
    boxes, ids, outside = truth.in_frame(0, 64, 48)
    np.testing.assert_allclose(boxes, [[0, 40, 10, 48], [59, 0, 64, 10]])
    assert ids.tolist() == [1, 2] and outside == 0
    boxes, ids, outside = truth.in_frame(1, 64, 48)  # id 3 lies wholly right of the frame
    np.testing.assert_allclose(boxes, [[4, 4, 9, 9]])
    assert ids.tolist() == [4] and outside == 1
    frames = TruthFrames(_frames(2), truth, "--images x")
    assert [f.ids.tolist() for f in frames] == [[1, 2], [4]] and frames.outside == 1


@settings(max_examples=80, deadline=None)
@given(
    st.tuples(st.floats(-50, 100), st.floats(-50, 100), st.floats(0.5, 80), st.floats(0.5, 80)),
    st.integers(8, 96),
    st.integers(8, 96),
)
def test_a_clipped_box_is_its_part_inside_the_frame(box: tuple[float, ...], width: int, height: int) -> None:
    x1, y1, w, h = box
    truth = Truth(Path("gt.txt"), np.zeros(1, np.int64), np.array([[x1, y1, x1 + w, y1 + h]]), None, 1)
    inside = min(x1 + w, width) > max(x1, 0) and min(y1 + h, height) > max(y1, 0)
    if not inside:
        boxes, _, outside = truth.in_frame(0, width, height)
        assert boxes.shape == (0, 4) and outside == 1
        return
    (clipped,), ids, outside = truth.in_frame(0, width, height)
    assert ids is None and outside == 0
    expected = [max(x1, 0), max(y1, 0), min(x1 + w, width), min(y1 + h, height)]
    np.testing.assert_allclose(clipped, expected, rtol=1e-6, atol=1e-4)


# --- COCO ---------------------------------------------------------------------------------------------------


def _coco(images: list[dict[str, Any]], annotations: list[dict[str, Any]]) -> dict[str, Any]:
    categories = [{"id": 1, "name": "car"}, {"id": 3, "name": "person"}]
    for number, annotation in enumerate(annotations, start=1):
        annotation.setdefault("id", number)
        annotation.setdefault("category_id", 3)
    return {"images": images, "annotations": annotations, "categories": categories}


def test_coco_keeps_the_named_category_on_the_folder_images_by_file_name(tmp_path: Path) -> None:
    images = [
        {"id": 10, "file_name": "seq/b.jpg"},
        {"id": 20, "file_name": "seq/a.jpg"},
        {"id": 30, "file_name": "other/c.jpg"},
    ]
    annotations = [
        {"image_id": 10, "bbox": [1.5, 2, 10, 20], "track_id": 4},
        {"image_id": 20, "bbox": [0, 0, 5, 5], "track_id": 4},
        {"image_id": 20, "bbox": [9, 9, 5, 5], "category_id": 1, "track_id": 5},  # a car
        {"image_id": 20, "bbox": [0, 0, 40, 40], "iscrowd": 1},  # a crowd region
        {"image_id": 30, "bbox": [0, 0, 5, 5], "track_id": 6},  # an image not in the folder
    ]
    path = _write(tmp_path / "truth.json", json.dumps(_coco(images, annotations)))
    truth = read_coco(path, "person", ["a.jpg", "b.jpg"])
    assert truth.frame.tolist() == [1, 0] and truth.ids.tolist() == [4, 4]
    np.testing.assert_allclose(truth.boxes, [[1.5, 2, 11.5, 22], [0, 0, 5, 5]])  # pixel edges: no shift
    assert (truth.frames, truth.exact, truth.left_out) == (2, True, 2)


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        ({"track_id": 8}, [8, 8]),
        ({"instance_id": 8}, [8, 8]),
        ({"attributes": {"track_id": 8, "occluded": False}}, [8, 8]),
    ],
)
def test_coco_track_ids_give_identities(
    tmp_path: Path, identity: dict[str, Any], expected: list[int]
) -> None:
    images = [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}]
    annotations = [{"image_id": i, "bbox": [0, 0, 5, 5], **identity} for i in (1, 2)]
    truth = read_coco(
        _write(tmp_path / "t.json", json.dumps(_coco(images, annotations))), "person", ["a.jpg", "b.jpg"]
    )
    assert truth.identities and truth.ids.tolist() == expected


def test_coco_names_as_identities_are_numbered_and_one_missing_means_none(tmp_path: Path) -> None:
    images = [{"id": 1, "file_name": "a.jpg"}]
    named = [{"image_id": 1, "bbox": [0, 0, 5, 5], "track_id": t} for t in ("walker", "runner")]
    truth = read_coco(_write(tmp_path / "n.json", json.dumps(_coco(images, named))), "person", ["a.jpg"])
    assert truth.ids.tolist() == [1, 2]
    partly = [{"image_id": 1, "bbox": [0, 0, 5, 5], "track_id": 3}, {"image_id": 1, "bbox": [9, 9, 5, 5]}]
    truth = read_coco(_write(tmp_path / "p.json", json.dumps(_coco(images, partly))), "person", ["a.jpg"])
    assert not truth.identities and len(truth.frame) == 2


@pytest.mark.parametrize(
    ("images", "frame_of"),
    [
        (
            [{"id": 7, "frame_index": 1}, {"id": 5, "frame_index": 0}, {"id": 6, "frame_index": 2}],
            {5: 0, 7: 1, 6: 2},
        ),
        ([{"id": 7, "frame_id": 3}, {"id": 5, "frame_id": 9}, {"id": 6, "frame_id": 1}], {6: 0, 7: 1, 5: 2}),
        ([{"id": 7}, {"id": 5}, {"id": 9, "frame_index": 0}], {5: 0, 7: 1, 9: 2}),  # not every image: by id
    ],
)
def test_coco_video_frames_follow_frame_index_else_frame_id_else_image_id(
    tmp_path: Path, images: list[dict[str, Any]], frame_of: dict[int, int]
) -> None:
    annotations = [{"image_id": i["id"], "bbox": [0, 0, 5, 5], "track_id": i["id"]} for i in images]
    truth = read_coco(_write(tmp_path / "v.json", json.dumps(_coco(images, annotations))), "person")
    assert dict(zip(truth.ids.tolist(), truth.frame.tolist(), strict=True)) == frame_of
    assert truth.frames == len(images)


@pytest.mark.parametrize(
    ("data", "names", "message"),
    [
        (
            _coco([{"id": 1, "file_name": "a.jpg"}], []),
            ["a.jpg", "b.jpg"],
            "has no image named b.jpg (1 of the 2 images of --images are not in it)",
        ),
        (
            _coco([{"id": 1, "file_name": "x/a.jpg"}, {"id": 2, "file_name": "y/a.jpg"}], []),
            ["a.jpg"],
            "two images are named a.jpg",
        ),
        (_coco([{"id": 1, "video_id": 1}, {"id": 2, "video_id": 2}], []), None, "holds images of 2 videos"),
        (
            _coco([{"id": 1, "frame_index": 0}, {"id": 2, "frame_index": 0}], []),
            None,
            "two images have the same frame_index",
        ),
        ({"images": []}, None, "not a COCO file"),
    ],
)
def test_bad_coco_files_are_refused_in_one_line(tmp_path: Path, data: Any, names: Any, message: str) -> None:
    with pytest.raises(TruthError, match=r"^--truth .*t.json: ") as error:
        read_coco(_write(tmp_path / "t.json", json.dumps(data)), "person", names)
    assert message in str(error.value)
    with pytest.raises(TruthError, match="not JSON"):
        read_coco(_write(tmp_path / "t.json", "{"), "person", names)


def test_a_coco_category_is_matched_by_its_exact_name(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", json.dumps(_coco([{"id": 1, "file_name": "a.jpg"}], [])))
    with pytest.raises(
        TruthError, match=r"^--truth-class Person: .* has no category of that name \(it has: car, person\)"
    ):
        read_coco(path, "Person", ["a.jpg"])


# --- the format, and matching the recording's frames ----------------------------------------------------------


def test_the_format_comes_from_the_flag_else_the_suffix() -> None:
    assert TruthFormat.of("gt.txt") is TruthFormat.MOT and TruthFormat.of("a.JSON") is TruthFormat.COCO
    assert TruthFormat.of("labels.json", "mot") is TruthFormat.MOT
    with pytest.raises(
        TruthError, match=r"^--truth-format: unknown truth format 'voc'; expected one of: mot, coco"
    ):
        TruthFormat.of("gt.txt", "voc")
    with pytest.raises(TruthError, match=r"^--truth gt.csv: cannot tell its format from the suffix '.csv'"):
        TruthFormat.of("gt.csv")


def test_frames_carry_the_truth_and_a_frame_beyond_the_recording_is_refused(tmp_path: Path) -> None:
    truth = read_mot(_write(tmp_path / "gt.txt", "1,3,1,1,10,10,1,1,1\n3,3,5,1,10,10,1,1,1\n"))
    first, second, third = TruthFrames(_frames(3), truth, "--images x")
    assert first.class_ids.tolist() == [0] and first.ids.tolist() == [3]
    assert second.boxes.shape == (0, 4) and second.ids.tolist() == []  # a frame with no rows: no objects
    np.testing.assert_allclose(third.boxes, [[4, 0, 14, 10]])
    np.testing.assert_array_equal(third.image, _frames(3)[2].image)
    with pytest.raises(TruthError, match=r"holds frame 3 but --video v.mp4 has 2 frames"):
        list(TruthFrames(_frames(2), truth, "--video v.mp4"))
    assert len(list(TruthFrames(_frames(2), truth, "--video v.mp4", cut=2))) == 2  # --frames 2 cut the video
    assert len(list(TruthFrames(_frames(5), truth, "--video v.mp4"))) == 5  # frames after the last row: empty


def test_a_coco_video_must_have_as_many_frames_as_images(tmp_path: Path) -> None:
    data = _coco([{"id": 1}, {"id": 2}], [{"image_id": 2, "bbox": [0, 0, 5, 5]}])
    truth = read_coco(_write(tmp_path / "v.json", json.dumps(data)), "person")
    assert not truth.identities
    with pytest.raises(TruthError, match=r"lists 2 images but --video v.mp4 has 3 frames"):
        list(TruthFrames(_frames(3), truth, "--video v.mp4"))


def test_the_recording_is_checked_before_any_image_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cv2

    folder = tmp_path / "img1"
    folder.mkdir()
    for index in range(2):
        cv2.imwrite(str(folder / f"{index + 1:06d}.png"), np.zeros((48, 64, 3), np.uint8))
    gt = _write(tmp_path / "gt.txt", "1,1,1,1,10,10,1,1,1\n3,1,1,1,10,10,1,1,1\n")
    monkeypatch.setattr(cv2, "imread", lambda *_: pytest.fail("an image was read"))
    with pytest.raises(TruthError, match=r"holds frame 3 but --images .*img1 has 2 frames"):
        recording_frames(folder, None, None, gt, None, "person")
    only_cars = _write(tmp_path / "cars.txt", "1,1,1,1,10,10,1,3,1\n")
    with pytest.raises(TruthError, match="no person to score \\(1 rows or annotations left out"):
        recording_frames(folder, None, None, only_cars, None, "person")
    with pytest.raises(TruthError, match=r"^--truth needs --images or --video"):
        recording_frames(None, None, None, gt, None, "person")


def _folder(path: Path, names: list[str]) -> Path:
    """A folder `path` of 64x48 images named `names`, image k filled with the value k + 1."""
    import cv2

    path.mkdir(parents=True)
    for value, name in enumerate(names, start=1):
        cv2.imwrite(str(path / name), np.full((48, 64, 3), value, np.uint8))
    return path


def test_unpadded_image_numbers_are_read_in_natural_order(tmp_path: Path) -> None:
    """frame1.png ... frame11.png: MOT frame n's boxes land on framen.png (by name as text, frame10.png would be the
    second image and take frame 2's boxes); names numbered from 0 map one to one as well."""
    names = [f"frame{n}.png" for n in range(1, 12)]
    folder = _folder(tmp_path / "img", names[::-1])  # written in another order: framen.png holds 12 - n
    gt = _write(tmp_path / "gt.txt", "".join(f"{n},{n},1,1,{n},10,1,1,1\n" for n in range(1, 12)))
    frames, _ = recording_frames(folder, None, None, gt, None, "person")
    for n, frame in enumerate(frames, start=1):
        assert frame.ids.tolist() == [n] and int(frame.image[0, 0, 0]) == 12 - n, n  # framen.png's pixels
    zero = _folder(tmp_path / "zero", ["f0.png", "f1.png", "f2.png"])
    frames, _ = recording_frames(
        zero, None, None, _write(tmp_path / "one.txt", "2,1,1,1,9,9,1,1,1\n"), None, "person"
    )
    assert [len(f.boxes) for f in frames] == [0, 1, 0]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["a.png", "b.png", "frame3.png"], r"a.png and b.png carry no frame number"),
        (["frame1.png", "frame2.png", "last.png"], r"last.png carries no frame number \(frame1.png does\)"),
        (["frame1.png", "frame01.png", "frame2.png"], r"frame01.png and frame1.png both number frame 1"),
        (
            ["frame1.png", "frame2.png", "frame4.png"],
            r"frame2.png is followed by frame4.png \(frame numbers skipped",
        ),
    ],
)
def test_image_names_that_do_not_number_the_frames_one_to_one_are_refused(tmp_path, names, message) -> None:
    folder = _folder(tmp_path / "img", names)
    gt = _write(tmp_path / "gt.txt", "1,1,1,1,10,10,1,1,1\n")
    with pytest.raises(TruthError, match=rf"^--images {folder}: {message}") as error:
        recording_frames(folder, None, None, gt, None, "person")
    assert "\n" not in str(error.value) and "one to one" in str(error.value)
