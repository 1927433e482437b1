"""Tests for tiled_detector.messages.detections: arrays <-> vision_msgs/Detection2DArray (2.x, 3.x, 4.x layouts)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

pytest.importorskip("rclpy")
from rclpy.serialization import deserialize_message, serialize_message
from std_msgs.msg import Header
from vision_msgs.msg import (
    Detection2D,
    Detection2DArray,
    Detection3DArray,
    LabelInfo,
    ObjectHypothesisWithPose,
)

from tiled_detector.messages.detections import (
    detections_3d_to_msg,
    detections_to_msg,
    msg_links,
    msg_obb,
    msg_to_detections,
    msg_to_positions,
    position_covariance,
)

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_4X_HASH = "RIHS01_214274120007f4a683866481336b70310268cfa107aebe9d594a6acf75bda968"
LABELS = ["person", "car", "boat"]
BOXES = np.array([[10, 20, 30, 60], [100.5, 200.25, 101.5, 260.75], [0, 0, 0, 0]], np.float32)
SCORES = np.array([0.9, 1.7, -0.2], np.float32)
CLASS_IDS = np.array([0, 2, 7], np.int64)


# --- fakes of older vision_msgs layouts (fields as in the upstream .msg files) ---------------------------


@dataclass
class Pose2DGeometry:  # geometry_msgs/Pose2D (2.x, 3.x centre)
    x: float = 0.0
    y: float = 0.0
    theta: float = 0.0


@dataclass
class BoundingBox2DOld:
    center: Pose2DGeometry = field(default_factory=Pose2DGeometry)
    size_x: float = 0.0
    size_y: float = 0.0


@dataclass
class PointFake:
    x: float = 0.0
    y: float = 0.0
    z: float = 0.0


@dataclass
class QuaternionFake:
    x: float = 0.0
    y: float = 0.0
    z: float = 0.0
    w: float = 0.0


@dataclass
class PoseFake:
    position: PointFake = field(default_factory=PointFake)
    orientation: QuaternionFake = field(default_factory=QuaternionFake)


@dataclass
class PoseWithCovarianceFake:  # geometry_msgs/PoseWithCovariance (every layout's hypothesis pose)
    pose: PoseFake = field(default_factory=PoseFake)
    covariance: np.ndarray = field(default_factory=lambda: np.zeros(36))


@dataclass
class ObjectHypothesis3:
    class_id: str = ""
    score: float = 0.0


@dataclass
class ObjectHypothesisWithPose3:
    hypothesis: ObjectHypothesis3 = field(default_factory=ObjectHypothesis3)
    pose: PoseWithCovarianceFake = field(default_factory=PoseWithCovarianceFake)


@dataclass
class ObjectHypothesisWithPose2:  # Foxy: id and score directly on the hypothesis
    id: str = ""
    score: float = 0.0
    pose: PoseWithCovarianceFake = field(default_factory=PoseWithCovarianceFake)


@dataclass
class Detection2DArrayFake:
    header: object = None
    detections: list = field(default_factory=list)


def _fakes(kind: str, bbox: type, source: str) -> dict[str, SimpleNamespace]:
    """vision_msgs 3.x / 2.x stand-ins of the `kind` (2D or 3D) messages, their box a `bbox`: 3.x's detection has an
    id, Foxy's (2.x) none but tracking fields and its `source` (image or cloud)."""
    common = [("header", object, None), ("results", list, field(default_factory=list))]
    common.append(("bbox", bbox, field(default_factory=bbox)))
    detection_3x = make_dataclass(f"Detection{kind}3", [*common, ("id", str, "")])
    foxy = [(source, object, None), ("is_tracking", bool, False), ("tracking_id", str, "")]
    detection_2x = make_dataclass(f"Detection{kind}2", common + foxy)
    return {
        version: SimpleNamespace(
            **{f"Detection{kind}Array": Detection2DArrayFake, f"Detection{kind}": detection},
            ObjectHypothesisWithPose=hypothesis,
        )
        for version, detection, hypothesis in (
            ("3.x", detection_3x, ObjectHypothesisWithPose3),
            ("2.x", detection_2x, ObjectHypothesisWithPose2),
        )
    }


FAKES = _fakes("2D", BoundingBox2DOld, "source_img")


def image_header() -> Header:
    header = Header(frame_id="camera_optical")
    header.stamp.sec, header.stamp.nanosec = 1700000000, 123456789
    return header


# --- 4.x (the real messages) ----------------------------------------------------------------------------


def test_real_messages_carry_boxes_scores_labels_and_header() -> None:
    header = image_header()
    msg = detections_to_msg(BOXES, SCORES, CLASS_IDS, header, LABELS)
    assert isinstance(msg, Detection2DArray) and len(msg.detections) == 3
    assert msg.header.frame_id == "camera_optical" and msg.header.stamp.nanosec == 123456789
    first, second, third = msg.detections
    assert isinstance(first, Detection2D) and isinstance(first.results[0], ObjectHypothesisWithPose)
    assert all(
        d.header.frame_id == "camera_optical" and d.header.stamp.sec == 1700000000 for d in msg.detections
    )
    assert (first.bbox.center.position.x, first.bbox.center.position.y) == (20.0, 40.0)
    assert (first.bbox.size_x, first.bbox.size_y, first.bbox.center.theta) == (20.0, 40.0, 0.0)
    assert (second.bbox.center.position.x, second.bbox.center.position.y) == (101.0, 230.5)
    assert (second.bbox.size_x, second.bbox.size_y) == (1.0, 60.5)
    assert [d.results[0].hypothesis.class_id for d in msg.detections] == ["person", "boat", "7"]
    # untracked: no identity across messages, so no id (vision_msgs 4.1.1 Detection2D.msg: "This field may be
    # empty"; the index in the array would give different objects of different frames the same id)
    assert [d.id for d in msg.detections] == ["", "", ""]
    assert first.results[0].hypothesis.score == pytest.approx(0.9)
    assert (second.results[0].hypothesis.score, third.results[0].hypothesis.score) == (1.0, 0.0)
    assert all(len(d.results) == 1 for d in msg.detections)


def test_rotated_boxes_carry_their_angle_in_center_theta() -> None:
    """A rotated box: bbox.center its centre, center.theta its angle, size_x / size_y its own w / h (not the hull's);
    through serialization and back (`msg_obb`); a NaN angle refused."""
    obb = np.array([[20, 40, 30, 8, 0.5], [101, 230.5, 1, 60.5, 1.2], [0, 0, 0, 0, 0]], np.float32)
    msg = detections_to_msg(BOXES, SCORES, CLASS_IDS, image_header(), LABELS, obb=obb)
    first = msg.detections[0]
    assert (first.bbox.center.position.x, first.bbox.center.position.y) == (20.0, 40.0)
    assert (first.bbox.size_x, first.bbox.size_y) == (30.0, 8.0)
    assert first.bbox.center.theta == pytest.approx(0.5)
    back = deserialize_message(serialize_message(msg), Detection2DArray)
    np.testing.assert_allclose(msg_obb(back), obb, rtol=1e-6)
    with pytest.raises(ValueError, match="finite rotated box"):
        detections_to_msg(BOXES, SCORES, CLASS_IDS, image_header(), LABELS, obb=np.full((3, 5), np.nan))


def test_the_angle_turns_x_toward_y_and_is_read_back_in_that_one_convention() -> None:
    """`center.theta` (polygons.ANGLE): radians from the image's +x axis toward +y (clockwise on screen). Read back,
    a rotated detection's box is the hull of its turned rectangle (not centre +- (w, h) / 2), and its rotated box
    comes in the regular form (theta in [0, pi/2)) whatever equivalent form a publisher wrote it in."""
    obb = np.array([[200, 100, 100, 10, np.pi / 6], [50, 60, 40, 10, 0], [300, 200, 80, 20, 0.3]], np.float32)
    msg = detections_to_msg(BOXES, SCORES, CLASS_IDS, image_header(), LABELS, obb=obb)
    boxes, _, _ = msg_to_detections(msg, LABELS)
    half_x, half_y = (
        50 * np.cos(np.pi / 6) + 5 * np.sin(np.pi / 6),
        50 * np.sin(np.pi / 6) + 5 * np.cos(np.pi / 6),
    )
    # the end of its w axis at (200 + 43.3, 100 + 25): turned toward +y (down on screen)
    np.testing.assert_allclose(boxes[0], [200 - half_x, 100 - half_y, 200 + half_x, 100 + half_y], atol=1e-4)
    np.testing.assert_array_equal(boxes[1], [30, 55, 70, 65])  # theta 0: the box as before
    # another publisher's form of the third rectangle: a quarter turn on, w and h swapped; and half a turn back
    other = [[300, 200, 20, 80, 0.3 + np.pi / 2], [300, 200, 80, 20, 0.3 - np.pi]]
    for row in other:
        written = detections_to_msg(BOXES[:1], SCORES[:1], CLASS_IDS[:1], image_header(), LABELS, obb=[row])
        read = msg_obb(written)[0]
        np.testing.assert_allclose(read, obb[2], atol=1e-5)
        np.testing.assert_allclose(msg_to_detections(written, LABELS)[0][0], boxes[2], atol=1e-4)


def test_fields_are_python_scalars() -> None:
    msg = detections_to_msg(BOXES, SCORES, CLASS_IDS, image_header(), LABELS, msg_types=FAKES["3.x"])
    for detection in msg.detections:
        values = [detection.bbox.center.x, detection.bbox.size_x, detection.results[0].hypothesis.score]
        assert all(type(value) is float for value in values)
        assert type(detection.results[0].hypothesis.class_id) is str


def test_without_labels_class_ids_are_decimal_strings() -> None:
    msg = detections_to_msg(BOXES, SCORES, CLASS_IDS, image_header())
    assert [d.results[0].hypothesis.class_id for d in msg.detections] == ["0", "2", "7"]


def test_labels_as_a_mapping() -> None:
    msg = detections_to_msg(BOXES, SCORES, CLASS_IDS, image_header(), {7: "kite"})
    assert [d.results[0].hypothesis.class_id for d in msg.detections] == ["0", "2", "kite"]
    _, _, ids = msg_to_detections(msg, {7: "kite"})
    np.testing.assert_array_equal(ids, CLASS_IDS)


def test_empty_input_gives_an_empty_array_with_the_header() -> None:
    msg = detections_to_msg(np.zeros((0, 4)), [], [], image_header(), LABELS)
    assert msg.detections == [] and msg.header.frame_id == "camera_optical"
    boxes, scores, ids = msg_to_detections(msg)
    assert boxes.shape == (0, 4) and scores.shape == (0,) and ids.shape == (0,)
    assert (boxes.dtype, scores.dtype, ids.dtype) == (np.float32, np.float32, np.int64)


@pytest.mark.parametrize("labels", [None, LABELS])
def test_serialization_round_trip(labels: list[str] | None) -> None:
    header = image_header()
    wire = serialize_message(detections_to_msg(BOXES, SCORES, CLASS_IDS, header, labels))
    msg = deserialize_message(wire, Detection2DArray)
    assert msg.header == header and all(d.header == header for d in msg.detections)
    boxes, scores, ids = msg_to_detections(msg, labels)
    np.testing.assert_array_equal(boxes, BOXES)
    np.testing.assert_array_equal(scores, np.clip(SCORES, 0, 1))
    np.testing.assert_array_equal(ids, CLASS_IDS)
    assert (boxes.dtype, scores.dtype, ids.dtype) == (np.float32, np.float32, np.int64)


@pytest.mark.parametrize("layout", sorted(FAKES))
def test_older_layouts_by_feature_detection(layout: str) -> None:
    header = image_header()
    msg = detections_to_msg(BOXES, SCORES, CLASS_IDS, header, LABELS, msg_types=FAKES[layout])
    first = msg.detections[0]
    assert msg.header is header and first.header is header
    assert (first.bbox.center.x, first.bbox.center.y, first.bbox.size_x, first.bbox.size_y) == (
        20,
        40,
        20,
        40,
    )
    result = first.results[0]
    if layout == "2.x":
        assert (result.id, result.score) == ("person", pytest.approx(0.9))
    else:
        assert (result.hypothesis.class_id, result.hypothesis.score) == ("person", pytest.approx(0.9))
        assert first.id == ""
    boxes, scores, ids = msg_to_detections(msg, LABELS)
    np.testing.assert_array_equal(boxes, BOXES)
    np.testing.assert_array_equal(scores, np.clip(SCORES, 0, 1))
    np.testing.assert_array_equal(ids, CLASS_IDS)


def test_reverse_takes_the_best_hypothesis_and_skips_empty_detections() -> None:
    msg = detections_to_msg(BOXES[:2], [0.3, 0.6], [0, 1], image_header(), LABELS)
    extra = ObjectHypothesisWithPose()
    extra.hypothesis.class_id, extra.hypothesis.score = "boat", 0.8
    msg.detections[0].results.append(extra)
    msg.detections[1].results = []
    boxes, scores, ids = msg_to_detections(msg, LABELS)
    np.testing.assert_array_equal(boxes, BOXES[:1])
    np.testing.assert_allclose(scores, [0.8])
    np.testing.assert_array_equal(ids, [2])


def test_reverse_rejects_unknown_class_names() -> None:
    msg = detections_to_msg(BOXES, SCORES, CLASS_IDS, image_header(), LABELS)
    with pytest.raises(ValueError, match="class id 'person' is neither a known label nor an integer"):
        msg_to_detections(msg)


@pytest.mark.parametrize(
    ("boxes", "scores", "class_ids", "reason"),
    [
        (np.zeros((2, 3)), [0.5, 0.5], [0, 0], r"boxes must have shape \(N, 4\)"),
        (np.zeros((2, 4)), [0.5], [0, 0], "as many boxes as scores and class ids, got 2, 1 and 2"),
        ([[0, 0, np.nan, 1]], [0.5], [0], "finite"),
        ([[0, 0, 1, 1]], [np.inf], [0], "finite"),
        ([[5, 0, 1, 1]], [0.5], [0], "x2 >= x1"),
        ([[0, 0, 1, 1]], [0.5], [1.5], "class ids must be integers"),
    ],
)
def test_invalid_inputs_raise_value_error(
    boxes: object, scores: object, class_ids: object, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        detections_to_msg(boxes, scores, class_ids, image_header())


coordinates = st.floats(0, 8192, width=32)


@settings(max_examples=60, deadline=None)
@given(
    corners=arrays(np.float32, st.tuples(st.integers(0, 12), st.just(2)), elements=coordinates),
    sizes=arrays(np.float32, st.tuples(st.integers(0, 12), st.just(2)), elements=st.floats(0, 512, width=32)),
    data=st.data(),
)
def test_generated_boxes_round_trip(corners: np.ndarray, sizes: np.ndarray, data: st.DataObject) -> None:
    count = min(len(corners), len(sizes))
    boxes = np.concatenate([corners[:count], corners[:count] + sizes[:count]], axis=1)
    scores = data.draw(arrays(np.float32, count, elements=st.floats(-1, 2, width=32)))
    ids = data.draw(arrays(np.int64, count, elements=st.integers(0, 5)))
    msg = detections_to_msg(boxes, scores, ids, image_header(), LABELS)
    for detection, (x1, y1, x2, y2) in zip(msg.detections, boxes.tolist(), strict=True):
        centre = detection.bbox.center.position
        assert (centre.x, centre.y) == ((x1 + x2) / 2, (y1 + y2) / 2)
        assert detection.bbox.size_x >= 0 and detection.bbox.size_y >= 0
    back_boxes, back_scores, back_ids = msg_to_detections(msg, LABELS)
    # exact for pixel-scale values; float64 centre/size arithmetic loses only denormal-sized remainders
    np.testing.assert_allclose(back_boxes, boxes, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(back_scores, np.clip(scores, 0, 1))
    np.testing.assert_array_equal(back_ids, ids)


# --- the message definition itself ----------------------------------------------------------------------


def test_generated_type_hash_equals_upstream_4x() -> None:
    described = json.loads((ROOT / ".venv/share/vision_msgs/msg/Detection2DArray.json").read_text())
    hashes = {entry["type_name"]: entry["hash_string"] for entry in described["type_hashes"]}
    assert hashes["vision_msgs/msg/Detection2DArray"] == UPSTREAM_4X_HASH


def test_vendored_msg_definitions_hash_to_upstream_4x() -> None:
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_JAZZY)
    types = {}
    for path in sorted((ROOT / "vendor/vision_msgs/msg").glob("*.msg")):
        types.update(get_types_from_msg(path.read_text(), f"vision_msgs/msg/{path.stem}"))
    store.register(types)
    assert store.hash_rihs01("vision_msgs/msg/Detection2DArray") == UPSTREAM_4X_HASH


# LabelInfo / VisionClass as vision_msgs 4.1.1 defines them (hashed with rosbags from msg/LabelInfo.msg and
# msg/VisionClass.msg of ros-perception/vision_msgs at tag 4.1.1)
UPSTREAM_4X_LABEL_INFO = {
    "LabelInfo": "RIHS01_3d37df4015cdf660cc851c51897f2acd957e1ca6205ba0a99aebffb9406b0783",
    "VisionClass": "RIHS01_1e4a11f0fed50b5623cb8ff26ca0e37952a48a9c074d16f804b44e9164c2037a",
}


def test_label_info_is_upstreams_in_rosidl_and_in_bags() -> None:
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    described = json.loads((ROOT / ".venv/share/vision_msgs/msg/LabelInfo.json").read_text())
    generated = {entry["type_name"]: entry["hash_string"] for entry in described["type_hashes"]}
    store = get_typestore(Stores.ROS2_JAZZY)
    for name in UPSTREAM_4X_LABEL_INFO:
        text = (ROOT / f"vendor/vision_msgs/msg/{name}.msg").read_text()
        store.register(get_types_from_msg(text, f"vision_msgs/msg/{name}"))
    for name, upstream in UPSTREAM_4X_LABEL_INFO.items():
        assert (
            generated[f"vision_msgs/msg/{name}"] == store.hash_rihs01(f"vision_msgs/msg/{name}") == upstream
        )


def test_vision_info_and_label_info_say_what_class_id_holds() -> None:
    """class_id holds the label names (output_format: labels, the default) or the ids (ids): VisionInfo's method
    says which; `labels` (index = id) and LabelInfo's class_map hold the names of the ids either way."""
    from tiled_detector.messages.vision_info import label_info, labels_version, vision_info

    named = vision_info("/models/m.onnx", "onnxruntime", "fp32", LABELS, image_header())
    numbered = vision_info("/models/m.onnx", "onnxruntime", "fp32", LABELS, image_header(), names=False)
    assert named.method == "tiled_detector m.onnx (onnxruntime, fp32); class_id: label names"
    assert numbered.method.endswith("; class_id: ids")
    assert named.database_location == numbered.database_location == "labels"
    assert named.database_version == labels_version(LABELS) >= 0
    info = deserialize_message(serialize_message(label_info(LABELS, 0.25, image_header())), LabelInfo)
    assert [(c.class_id, c.class_name) for c in info.class_map] == list(enumerate(LABELS))
    assert info.threshold == pytest.approx(0.25) and info.header == image_header()
    by_id = {c.class_id: c.class_name for c in info.class_map}
    names = detections_to_msg(BOXES[:2], SCORES[:2], CLASS_IDS[:2], image_header(), LABELS)
    ids = detections_to_msg(BOXES[:2], SCORES[:2], CLASS_IDS[:2], image_header())
    assert [d.results[0].hypothesis.class_id for d in names.detections] == [
        by_id[int(d.results[0].hypothesis.class_id)] for d in ids.detections
    ]


# --- Detection3DArray: the objects with a position --------------------------------------------------------


def test_the_3d_messages_hash_alike_in_rosidl_and_in_bags() -> None:
    from tiled_detector.harness.bags import typestore

    described = json.loads((ROOT / ".venv/share/vision_msgs/msg/Detection3DArray.json").read_text())
    hashes = {entry["type_name"]: entry["hash_string"] for entry in described["type_hashes"]}
    for name in ("Detection3DArray", "Detection3D", "BoundingBox3D"):
        assert typestore().hash_rihs01(f"vision_msgs/msg/{name}") == hashes[f"vision_msgs/msg/{name}"]


POSITIONS = np.array([[0.5, -0.25, 12.0], [np.nan] * 3, [-3.0, 1.0, 40.5]], np.float32)
SIZES = np.array([[0.4, 0.8, 0.1], [np.nan] * 3, [2.0, 1.5, 0.7]], np.float32)


@dataclass
class BoundingBox3D:
    center: PoseFake = field(default_factory=PoseFake)
    size: PointFake = field(default_factory=PointFake)


FAKES_3D = _fakes("3D", BoundingBox3D, "source_cloud")


def test_3d_messages_hold_the_objects_with_a_position_in_the_2d_order() -> None:
    """Untracked, the 3D objects are the 2D detections that have a position, in the 2D order, with the same (empty)
    id, class and score: the k-th 3D object is the first 2D detection after the (k-1)-th's with its class and
    score. Each hypothesis' pose is the position, with the depth spread's covariance; its orientation unknown."""
    header = image_header()
    wire = serialize_message(detections_3d_to_msg(POSITIONS, SIZES, SCORES, CLASS_IDS, header, LABELS))
    msg = deserialize_message(wire, Detection3DArray)
    assert msg.header == header and all(d.header == header for d in msg.detections)
    ids, positions, sizes = msg_to_positions(msg)
    assert ids == ["", ""]  # the second object has no valid depth: left out
    np.testing.assert_allclose(positions, POSITIONS[[0, 2]])
    np.testing.assert_allclose(sizes, SIZES[[0, 2]])
    flat = detections_to_msg(BOXES, SCORES, CLASS_IDS, header, LABELS)
    hypotheses = [(d.id, d.results[0].hypothesis) for d in flat.detections]
    assert [(d.id, d.results[0].hypothesis) for d in msg.detections] == [hypotheses[0], hypotheses[2]]
    assert all(d.bbox.center.orientation.w == 1.0 for d in msg.detections)
    for detection, position, size in zip(msg.detections, POSITIONS[[0, 2]], SIZES[[0, 2]], strict=True):
        pose = detection.results[0].pose
        point = pose.pose.position
        np.testing.assert_allclose([point.x, point.y, point.z], position, rtol=1e-6)
        assert pose.pose.orientation.w == 1.0
        covariance = np.asarray(pose.covariance).reshape(6, 6)
        # the depth's variance along the ray through the position: its z variance is (depth extent)^2 / 12 ...
        ray = position / position[2]
        np.testing.assert_allclose(covariance[:3, :3], size[2] ** 2 / 12 * np.outer(ray, ray), rtol=1e-5)
        assert covariance[2, 2] == pytest.approx(size[2] ** 2 / 12, rel=1e-5)
        # the orientation is not estimated: unknown (a large variance, never 0 = exactly known), uncorrelated
        np.testing.assert_array_equal(covariance[3:, 3:], np.eye(3) * 1e9)
        assert not covariance[3:, :3].any() and not covariance[:3, 3:].any()
        # ... and none across it: the ray is the only direction of uncertainty
        across = np.cross(ray, [0.0, 1.0, 0.0])
        assert across @ covariance[:3, :3] @ across == pytest.approx(0.0, abs=1e-12)


def test_each_2d_detection_finds_its_3d_object_by_order_and_hypothesis_or_by_track_id() -> None:
    """msg_links: untracked, the 2D order with the same class and score; tracked, the id. The documented limit:
    untracked detections of equal class and score in a row, not all with a position, are linked in order."""
    header = image_header()
    scores = np.array([0.9, 0.9, 0.9, 0.5], np.float32)  # three equal hypotheses in a row
    classes = np.array([0, 0, 0, 2])
    boxes = np.array([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10], [60, 0, 70, 10]], np.float32)
    positions = np.array([[0.1, 0, 4], [np.nan] * 3, [0.3, 0, 5], [0.4, 0, 6]], np.float32)
    sizes = np.full((4, 3), 0.2, np.float32)
    flat = detections_to_msg(boxes, scores, classes, header, LABELS)
    located = detections_3d_to_msg(positions, sizes, scores, classes, header, LABELS)
    links = msg_links(flat, located)
    # three 3D objects for four detections; the 2nd detection has no depth: without an id the equal neighbours
    # cannot tell, so the order links the 1st and 2nd 3D objects to the 1st and 2nd equal detections
    assert links.tolist() == [0, 1, -1, 2]
    tracked = [11, 12, 13, 14]
    flat = detections_to_msg(boxes, scores, classes, header, LABELS, track_ids=tracked)
    located = detections_3d_to_msg(positions, sizes, scores, classes, header, LABELS, track_ids=tracked)
    assert msg_links(flat, located).tolist() == [0, -1, 1, 2]  # ids tell them apart


def test_position_covariance_follows_the_depth_spread_of_sampled_depths() -> None:
    """The covariance of positions back-projected from depths spread as the depth stage sees them (uniform over
    the depth extent: pipeline.depth.EXTENT) matches position_covariance."""
    from tiled_detector.pipeline.depth import EXTENT

    rng = np.random.default_rng(5)
    centre, extent = np.array([1.5, -0.5, 6.0]), 0.6
    depths = centre[2] + rng.uniform(-extent / 2, extent / 2, 200_000)
    points = centre[None, :] / centre[2] * depths[:, None]  # the same pixel, back-projected at each depth
    expected = position_covariance(centre[None], np.array([[0.3, 0.3, extent]]))[0]
    np.testing.assert_allclose(np.cov(points.T), expected, rtol=0.02, atol=1e-6)
    assert extent == pytest.approx(EXTENT * depths.std(), rel=0.01)


def test_3d_ids_are_track_ids_and_carried_objects_keep_their_stamp() -> None:
    header = image_header()
    seen = [1700000000_123456789, 1700000000_000000000, 1699999999_500000000]
    msg = detections_3d_to_msg(
        POSITIONS, SIZES, SCORES, CLASS_IDS, header, LABELS, track_ids=[7, 8, 9], seen_ns=seen
    )
    assert [d.id for d in msg.detections] == ["7", "9"]
    assert msg.detections[0].header is header
    assert (msg.detections[1].header.stamp.sec, msg.detections[1].header.stamp.nanosec) == (
        1699999999,
        500000000,
    )
    assert msg.detections[1].header.frame_id == "camera_optical"
    with pytest.raises(ValueError, match="one track id per detection"):
        detections_3d_to_msg(POSITIONS, SIZES, SCORES, CLASS_IDS, header, track_ids=[1])


@pytest.mark.parametrize("layout", sorted(FAKES_3D))
def test_3d_older_layouts_by_feature_detection(layout: str) -> None:
    msg = detections_3d_to_msg(
        POSITIONS, SIZES, SCORES, CLASS_IDS, image_header(), LABELS, msg_types=FAKES_3D[layout]
    )
    first = msg.detections[0]
    assert (first.bbox.center.position.z, first.bbox.size.x) == (12.0, pytest.approx(0.4))
    result = first.results[0]
    if layout == "2.x":
        assert (result.id, first.tracking_id) == ("person", "")
    else:
        assert (result.hypothesis.class_id, first.id) == ("person", "")
    assert (result.pose.pose.position.z, result.pose.covariance[14]) == (12.0, pytest.approx(0.1**2 / 12))
