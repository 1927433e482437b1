"""Instance masks over DDS: `make-bag --truth coco.json` keeps the truth's polygons, `replay` plays the bag through
the real node with a segmentation model (`SquareSegmenter`, whose masks are known), and every answer with
detections has its label image with the same stamp, values matching its array, scored as mask AP; broken truth
polygons are refused at start with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from support.exports import ultralytics_onnx
from support.networks import SquareSegmenter
from test_detector import _scene
from tiled_detector.cli import main
from tiled_detector.harness import bags


@pytest.fixture(scope="module")
def squares(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A segmentation model, a folder of 3 frames of squares and their COCO truth with polygon masks."""
    root = tmp_path_factory.mktemp("squares")
    model = ultralytics_onnx(
        root / "squares-seg.onnx", SquareSegmenter((64, 64), 8), outputs=2, task="segment"
    )
    images, annotations = [], []
    (root / "images").mkdir()
    for index in range(3):
        frame, boxes, classes = _scene(10 + index, 152, 208, 6)
        name = f"{index:03d}.png"
        cv2.imwrite(str(root / "images" / name), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        images.append({"id": index + 1, "file_name": name, "width": 208, "height": 152})
        for (x1, y1, x2, y2), cls in zip(boxes.tolist(), classes.tolist(), strict=True):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": index + 1,
                    "category_id": cls + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                    "segmentation": [[x1, y1, x2, y1, x2, y2, x1, y2]],
                }
            )
    categories = [{"id": 1, "name": "red"}, {"id": 2, "name": "blue"}]
    truth = root / "coco.json"
    truth.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return model, root / "images", truth


def test_make_bag_keeps_the_truth_masks(squares, tmp_path, capsys):
    model, images, truth = squares
    args = ["--images", str(images), "--truth", str(truth), "--truth-class", "red", "--model", str(model)]
    assert main(["make-bag", str(tmp_path / "bag"), *args]) == 0
    info = bags.bag_info(tmp_path / "bag")
    assert info.topics[bags.GROUND_TRUTH_MASKS_TOPIC] == (bags.TEXT, 3)
    messages = list(bags.read_messages(tmp_path / "bag", [bags.GROUND_TRUTH_MASKS_TOPIC]))
    truth_boxes = list(bags.read_messages(tmp_path / "bag", [bags.GROUND_TRUTH_TOPIC]))
    for masks, boxes in zip(messages, truth_boxes, strict=True):
        rles = json.loads(bags.deserialize(masks.data, bags.TEXT).data)
        array = bags.deserialize(boxes.data, bags.DETECTIONS)
        assert len(rles) == len(array.detections) > 0 and all(r["size"] == [152, 208] for r in rles)


def test_broken_truth_polygons_are_refused_with_nothing_written(squares, tmp_path, capsys):
    model, images, truth = squares
    data = json.loads(truth.read_text())
    red = next(a for a in data["annotations"][3:] if a["category_id"] == 1)  # a red square's (truth class)
    red["segmentation"] = [[1.0, 2.0, 3.0, 4.0]]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    args = ["--images", str(images), "--truth", str(broken), "--truth-class", "red", "--model", str(model)]
    assert main(["make-bag", str(tmp_path / "bag"), *args]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert f"{broken}: annotation {red['id']} (image " in error and "polygon 1 has 4 coordinates" in error
    assert not list(tmp_path.glob("*bag*"))  # nothing half written


@pytest.mark.ros
@pytest.mark.slow
def test_replay_through_the_node_publishes_a_label_image_per_answer(squares, tmp_path, capsys):
    model, images, truth = squares
    args = ["--images", str(images), "--truth", str(truth), "--truth-class", "red", "--model", str(model)]
    assert main(["make-bag", str(tmp_path / "bag"), *args]) == 0
    capsys.readouterr()
    node = ["--param", f"model:={model}", "--param", "conf_threshold:=0.5", "--tile-size", "64", "64"]
    node += [
        "--overlap",
        "0.25",
        "--param",
        "masks:=true",
    ]  # tiles start at multiples of 8: the squares' cells; masks a bool
    assert main(["replay", str(tmp_path / "bag"), *node, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["frames_answered"] == 3, report
    # every answer (6 squares each) has its label image, stamped like it, every value one of its array's
    assert report["label_images"] == 3 and report["label_images_missing"] == 0, report
    assert report["label_images_wrong"] == 0, report
    assert report["mask_AP50"] == pytest.approx(1.0) and report["mask_AP"] > 0.9, report
    assert np.isclose(report["AP50"], 1.0), report
