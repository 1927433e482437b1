"""The detector node as a real process over Fast DDS, checked against the ROS-free pipeline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

pytestmark = pytest.mark.ros

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rclpy.qos import DurabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tiled_detector.detector import TiledDetector  # noqa: E402
from tiled_detector.harness.client import DetectorClient  # noqa: E402
from tiled_detector.harness.process import FASTDDS_PROFILE, NodeProcess, pick_domain_id, ros_environment  # noqa: E402
from tiled_detector.messages.detections import msg_to_detections  # noqa: E402
from tiled_detector.messages.images import array_to_imgmsg  # noqa: E402
from tiled_detector.ros_launch.fastdds import (  # noqa: E402
    PROFILE_VARIABLES,
    installed_major,
    profile_environment,
    without_profile,
)
from tiled_detector.tools.worlds.synthetic import CLASSES, make_scene  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NODE = "/tiled_detector"
SECOND = 1_000_000_000


@pytest.fixture(scope="module")
def scenes() -> list[Any]:
    return [make_scene(seed, 1280, 720) for seed in (901, 902, 903)]


def _write_params(path: Path, **values: Any) -> Path:
    lines = ["/**:", "  ros__parameters:" + ("" if values else " {}")]
    for name, value in values.items():
        literal = str(value).lower() if isinstance(value, bool) else repr(value)
        lines.append(f"    {name}: {literal}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _image(frame: np.ndarray, index: int, frame_id: str = "cam_optical") -> Image:
    msg = array_to_imgmsg(frame, "rgb8")
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1000 + index, 250
    return msg


def _stamp(index: int) -> int:
    return (1000 + index) * SECOND + 250


def _running(params_file: Path, params: dict[str, Any]) -> Iterator[tuple[NodeProcess, DetectorClient]]:
    """A node started with `params` (written to `params_file`) and a client that has found it; afterwards the node
    exited cleanly, with no traceback."""
    _write_params(params_file, **params)
    domain = pick_domain_id()
    with NodeProcess(params_file, domain_id=domain) as node:
        client = DetectorClient(
            domain_id=domain, image_reliable=params.get("image_reliability") == "reliable"
        )
        try:
            assert client.wait_for_node(timeout=60), node.log_text()
            yield node, client
        finally:
            client.close()
    assert node.returncode == 0, node.log_text()
    assert "Traceback" not in node.log_text()


@pytest.fixture
def node_and_client(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[NodeProcess, DetectorClient]]:
    """A node of the test's own (its parameters from `indirect` parametrization), for tests that change it."""
    yield from _running(tmp_path / "params.yaml", getattr(request, "param", {}))


READING_PARAMS = {"conf_threshold": 0.4, "overlap": 0.25, "max_detections": 50}


@pytest.fixture(scope="module")
def reading_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProcess, DetectorClient]]:
    """One node (READING_PARAMS) shared by the module's tests that only read it: they send frames and read the
    answers, or ask for changes it refuses (and check that none stuck)."""
    yield from _running(tmp_path_factory.mktemp("reading") / "params.yaml", READING_PARAMS)


def _send(client: DetectorClient, msg: Image, stamp: int, timeout: float = 30.0) -> Any:
    """Publish until answered (best-effort images can be lost right after discovery)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client.publish(msg)
        reply = client.wait_for_stamp(stamp, timeout=min(5.0, deadline - time.monotonic()))
        if reply is not None:
            return reply
    raise AssertionError(f"no detections for stamp {stamp}")


def _assert_same(reply: Any, expected: Any) -> None:
    boxes, scores, class_ids = msg_to_detections(reply, list(CLASSES))
    order = np.lexsort((boxes[:, 0], -scores))
    ref = np.lexsort((expected.boxes[:, 0], -expected.scores))
    assert len(scores) == len(expected.scores)
    np.testing.assert_allclose(boxes[order], expected.boxes[ref], atol=1e-3)
    np.testing.assert_allclose(scores[order], expected.scores[ref], atol=1e-5)
    np.testing.assert_array_equal(class_ids[order], expected.class_ids[ref])


def test_node_publishes_what_the_pipeline_computes(reading_node: Any, scenes: list[Any]) -> None:
    _, client = reading_node
    reference = TiledDetector(**READING_PARAMS)
    for i, scene in enumerate(scenes):
        reply = _send(client, _image(scene.image, i), _stamp(i))
        assert reply.header.frame_id == "cam_optical"
        assert (reply.header.stamp.sec, reply.header.stamp.nanosec) == (1000 + i, 250)
        expected = reference.detect(scene.image, "rgb8")
        assert len(expected) > 0
        _assert_same(reply, expected)


def test_an_ultralytics_export_is_published_with_its_own_class_names(tmp_path: Path) -> None:
    """model:= an ultralytics ONNX export, no other model option: class_id holds the names in its metadata."""
    from support import exports
    from test_detector import _scene

    model = exports.ultralytics_onnx(tmp_path / "yolov8n.onnx", dynamic=True)
    params = _write_params(
        tmp_path / "params.yaml",
        model=str(model),
        tile_width=64,
        tile_height=64,
        overlap=0.25,
        conf_threshold=0.5,
    )
    frame, boxes, classes = _scene(6)
    domain = pick_domain_id()
    with NodeProcess(params, domain_id=domain) as node:
        client = DetectorClient(domain_id=domain)
        try:
            assert client.wait_for_node(timeout=60), node.log_text()
            reply = _send(client, _image(frame, 0), _stamp(0))
        finally:
            client.close()
    names = sorted(d.results[0].hypothesis.class_id for d in reply.detections)
    assert names == sorted(exports.NAMES[c] for c in classes.tolist()) and len(names) == len(boxes)


def test_int8_quantizes_once_from_calibration_and_publishes_what_the_core_computes(
    tmp_path: Path, scenes: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """precision:=int8 calibration:=DIR on ONNX Runtime: the node quantizes the bundled model on first use (one
    log line) and publishes what the ROS-free detector computes with the same cached Q/DQ model."""
    import cv2

    from tiled_detector.parameters import build_detector

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    frames = tmp_path / "calibration"
    frames.mkdir()
    for index, scene in enumerate(scenes[:2]):
        cv2.imwrite(str(frames / f"{index}.png"), scene.image[..., ::-1])
    settings = {"backend": "onnxruntime", "precision": "int8", "calibration": str(frames)}
    params = _write_params(tmp_path / "params.yaml", **settings)
    domain = pick_domain_id()
    with NodeProcess(params, domain_id=domain) as node:
        client = DetectorClient(domain_id=domain)
        try:
            assert client.wait_for_node(timeout=120), node.log_text()
            reply = _send(client, _image(scenes[2].image, 0), _stamp(0))
        finally:
            client.close()
    assert node.returncode == 0 and "Traceback" not in node.log_text(), node.log_text()
    assert node.log_text().count("int8: quantizing") == 1, node.log_text()
    detector = build_detector(settings)  # finds the node's Q/DQ model in the cache
    assert detector.engine.model.name.endswith(".qdq.onnx")
    expected = detector.detect(scenes[2].image, "rgb8")
    assert len(expected) > 0
    _assert_same(reply, expected)


def test_runtime_parameter_change_applies_from_next_frame(node_and_client: Any, scenes: list[Any]) -> None:
    _, client = node_and_client
    scene = scenes[0]
    before = _send(client, _image(scene.image, 0), _stamp(0))
    _assert_same(before, TiledDetector().detect(scene.image, "rgb8"))
    (result,) = client.set_parameters(NODE, {"conf_threshold": 0.7})
    assert result.successful, result.reason
    (result,) = client.set_parameters(NODE, {"full_frame": False})
    assert result.successful, result.reason
    after = _send(client, _image(scene.image, 1), _stamp(1))
    _assert_same(after, TiledDetector(conf_threshold=0.7, full_frame=False).detect(scene.image, "rgb8"))


def test_invalid_parameter_values_are_rejected_with_a_reason(reading_node: Any) -> None:
    _, client = reading_node
    names = ["merge", "overlap", "model", "classes"]
    kept = client.get_parameters(NODE, names)
    (bad_choice,) = client.set_parameters(NODE, {"merge": "average"})
    assert not bad_choice.successful
    assert "merge must be one of nms, nmm, greedy_nmm" in bad_choice.reason
    (out_of_range,) = client.set_parameters(NODE, {"overlap": 0.99})
    assert not out_of_range.successful and out_of_range.reason
    (read_only,) = client.set_parameters(NODE, {"model": "other.onnx"})
    assert not read_only.successful and "read-only" in read_only.reason
    (unknown_class,) = client.set_parameters(NODE, {"classes": ["unicorn"]})
    assert not unknown_class.successful and "unicorn" in unknown_class.reason
    assert client.get_parameters(NODE, names) == kept  # refused: every value as it was


def test_policy_parameters_apply_from_the_next_frame_and_vision_info_reaches_a_late_subscriber(
    node_and_client: Any, scenes: list[Any], tmp_path: Path
) -> None:
    from vision_msgs.msg import VisionInfo

    from tiled_detector.messages.vision_info import labels_version
    from tiled_detector.ros.node import VISION_INFO_QOS

    _, client = node_and_client
    scene = scenes[1]
    _send(client, _image(scene.image, 0), _stamp(0))
    # a subscriber that comes after the node published (transient local): it still gets the one VisionInfo
    infos = client.subscribe(VisionInfo, "/vision_info", VISION_INFO_QOS)
    assert client.wait_until(lambda: len(infos) == 1, 10), "no VisionInfo for a late subscriber"
    info = infos[0]
    assert info.method.startswith("tiled_detector default.onnx (onnxruntime, fp32)"), info.method
    assert info.database_location == "labels"
    assert info.database_version == labels_version(CLASSES)
    assert client.get_parameters(NODE, [info.database_location]) == [list(CLASSES)]
    # each policy parameter, set at runtime, applies from the next frame (cumulatively here)
    mask = np.zeros((72, 128), np.uint8)
    mask[:, :40] = 255
    cv2.imwrite(str(tmp_path / "left.png"), mask)
    steps = [
        {"class_thresholds": ["red_disc:0.6", "3:0.5"]},
        {"roi": [0.0, 0.3, 1.0, 1.0]},
        {"min_box_size": 20.0},
        {"max_box_size": 60.0},
        {"ignore_mask": str(tmp_path / "left.png")},  # one path: a string parameter is taken too
    ]
    changes: dict[str, Any] = {}
    for index, step in enumerate(steps, 1):
        (result,) = client.set_parameters(NODE, step)
        assert result.successful, (step, result.reason)
        changes.update(step)
        expected = TiledDetector(**changes).detect(scene.image, "rgb8")
        _assert_same(_send(client, _image(scene.image, index), _stamp(index)), expected)
    assert len(expected.boxes) > 0
    # bad values: refused with the reason, the old value stays
    bad = [
        ({"class_thresholds": ["unicorn:0.5"]}, "class_thresholds: unknown class 'unicorn'"),
        (
            {"class_thresholds": ["red_disc:1.5"]},
            "class_thresholds of red_disc must be in [0.0, 1.0], got 1.5",
        ),
        ({"roi": [0.6, 0.0, 0.4, 1.0]}, "roi must be [x_min, y_min, x_max, y_max]"),
        ({"ignore_mask": "/no/such/mask.png"}, "ignore_mask: cannot read /no/such/mask.png"),
        ({"ignore_mask": [f"/front/image_raw={tmp_path / 'left.png'}"]}, "give the mask's path alone"),
        ({"min_box_size": 80.0}, "min_box_size (80) must not exceed max_box_size (60)"),
        ({"max_box_size": -1.0}, "max_box_size"),
    ]
    for values, reason in bad:
        (result,) = client.set_parameters(NODE, values)
        assert not result.successful and reason in result.reason, (values, result.reason)
    names = ["class_thresholds", "roi", "ignore_mask", "min_box_size", "max_box_size"]
    assert client.get_parameters(NODE, names) == [
        ["red_disc:0.6", "3:0.5"],
        [0.0, 0.3, 1.0, 1.0],
        str(tmp_path / "left.png"),
        20.0,
        60.0,
    ]


def test_track_ids_hold_across_frames_over_dds(node_and_client: Any) -> None:
    """`tracker` set at runtime: Detection2D.id is the track id, the same object keeps it from frame to frame, and
    the ids equal what the ROS-free tracker gives the same detections; `tracker: none` leaves them empty again."""
    from tiled_detector.messages.detections import msg_ids
    from tiled_detector.tools.worlds.synthetic import make_sequence
    from tiled_detector.tracking.tracks import Tracks

    _, client = node_and_client
    assert client.set_parameters(NODE, {"tracker": "bytetrack"})[0].successful
    frames = [scene.image for scene in make_sequence(7, 5, 960, 540)]
    local, tracks = TiledDetector(), Tracks(TiledDetector().config.tracker_settings())
    seen = []
    for index, frame in enumerate(frames):
        msg = _image(frame, index)
        msg.header.stamp.sec, msg.header.stamp.nanosec = 2000, index * 33_333_333
        stamp = 2000 * SECOND + index * 33_333_333
        reply = _send(client, msg, stamp)
        found = local.detect(frame)
        want = tracks.update(stamp, found)
        boxes, _, _ = msg_to_detections(reply, list(CLASSES))
        ids = msg_ids(reply)
        order, ref = np.lexsort((boxes[:, 1], boxes[:, 0])), np.lexsort((want.boxes[:, 1], want.boxes[:, 0]))
        np.testing.assert_allclose(boxes[order], want.boxes[ref], atol=1e-2)
        np.testing.assert_array_equal(ids[order], want.track_ids[ref])
        seen.append(dict(zip(ids.tolist(), boxes.tolist(), strict=True)))
    kept = set(seen[0]) & set(seen[-1])
    assert len(kept) >= 0.6 * len(seen[0]) > 0  # the same ids from the first frame to the last
    # a tracker setting changed: every track starts over, with ids never given before
    assert client.set_parameters(NODE, {"lost_track_buffer": 2.0})[0].successful
    msg = _image(frames[-1], 5)
    msg.header.stamp.sec, msg.header.stamp.nanosec = 2000, 5 * 33_333_333
    fresh = msg_ids(_send(client, msg, 2000 * SECOND + 5 * 33_333_333))
    assert len(fresh) and fresh.min() > max(max(ids) for ids in seen if ids)
    assert client.set_parameters(NODE, {"tracker": "none"})[0].successful
    reply = _send(client, _image(frames[0], 9), _stamp(9))
    # untracked: no id (vision_msgs 4.1.1: an identity across messages, "This field may be empty")
    assert [d.id for d in reply.detections] == [""] * len(reply.detections) and reply.detections


@pytest.mark.parametrize(
    "node_and_client", [{"image_reliability": "reliable", "diagnostics_period": 0.1}], indirect=True
)
def test_a_tile_budget_over_dds_equals_the_ros_free_stream(node_and_client: Any) -> None:
    """`tile_budget` set at runtime: each answer equals the ROS-free `Stream` on the same frames and stamps, a box
    carried from an earlier frame carries that frame's stamp in its own header, /diagnostics counts the views
    run; a budget that cannot keep max_tile_age for the frames seen is refused with the smallest that can."""
    from tiled_detector.stream import Stream
    from tiled_detector.tools.worlds.synthetic import make_sequence

    _, client = node_and_client
    diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
    frames = [scene.image for scene in make_sequence(5, 4, 1920, 1080)]  # 8 tiles
    assert client.set_parameters(NODE, {"tile_budget": 2, "max_tile_age": 4})[0].successful
    local = Stream(TiledDetector(tile_budget=2, max_tile_age=4))
    carried = 0
    for index, frame in enumerate(frames):
        stamp = 3000 * SECOND + index * 33_333_333
        msg = _image(frame, index)
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, SECOND)
        reply = _send(client, msg, stamp)
        want = local.process([frame], [stamp], ["image"])[0]
        boxes, scores, _ = msg_to_detections(reply, list(CLASSES))
        np.testing.assert_allclose(boxes, want.detections.boxes, atol=1e-2)
        np.testing.assert_allclose(scores, want.detections.scores, atol=1e-4)
        seen = [d.header.stamp.sec * SECOND + d.header.stamp.nanosec for d in reply.detections]
        assert seen == want.seen_ns.tolist()
        carried += want.predicted
    assert carried > 0
    # the first frame ran every tile (8 + the full view), the next three 2 + the full view
    assert client.wait_until(lambda: _counter(diagnostics, "frames_processed") == 4, timeout=10)
    assert client.wait_until(lambda: _counter(diagnostics, "views_per_frame") == (9 + 3 * 3) / 4, timeout=10)
    assert (
        _counter(diagnostics, "views_per_frame_max") == 9
        and _counter(diagnostics, "predicted_boxes") == carried
    )
    (result,) = client.set_parameters(NODE, {"tile_budget": 1})
    assert not result.successful and "the smallest that can is 2" in result.reason, result.reason
    for values in ({"tile_budget": -1}, {"max_tile_age": 0}):
        (result,) = client.set_parameters(NODE, values)
        assert not result.successful and next(iter(values)) in result.reason, result.reason


def _counter(diagnostics: list[Any], name: str) -> float:
    """The newest value of a /diagnostics counter of the pipeline status (-1 before any report has it)."""
    for msg in reversed(diagnostics):
        values = {kv.key: kv.value for kv in msg.status[0].values}
        if name in values:
            return float(values[name])
    return -1.0


@pytest.mark.parametrize(
    "node_and_client", [{"image_reliability": "reliable", "diagnostics_period": 0.1}], indirect=True
)
def test_malformed_images_are_counted_and_skipped(node_and_client: Any, scenes: list[Any]) -> None:
    _, client = node_and_client
    diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
    good = _image(scenes[0].image, 0)
    short = _image(scenes[0].image, 1)
    short.data = bytes(100)
    unknown = _image(scenes[0].image, 2)
    unknown.encoding = "hsv_magic"
    empty = Image(encoding="rgb8", height=0, width=1280, step=3840)  # zero size
    assert _send(client, good, _stamp(0)) is not None  # the path works both ways
    for count, bad in enumerate((short, unknown, empty), 1):
        client.publish(bad)  # reliable: it arrives; the next one goes out once the worker has taken this one
        assert client.wait_until(lambda count=count: _counter(diagnostics, "frames_malformed") == count, 10)
    assert _send(client, _image(scenes[0].image, 1), _stamp(1)) is not None
    assert client.detections.keys() == {_stamp(0), _stamp(1)}
    assert client.wait_until(lambda: _counter(diagnostics, "frames_processed") == 2, timeout=5)
    assert _counter(diagnostics, "frames_malformed") == 3.0


def test_overload_keeps_latency_bounded_and_counts_drops(node_and_client: Any, scenes: list[Any]) -> None:
    _, client = node_and_client
    diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
    _send(client, _image(scenes[0].image, 0), _stamp(0))  # warm-up, and DDS fully matched
    sent: dict[int, float] = {}
    for i in range(1, 91):  # 3 s at 30 Hz: faster than the pipeline on this CPU
        msg = _image(scenes[i % len(scenes)].image, i)
        sent[_stamp(i)] = time.monotonic()
        client.publish(msg)
        time.sleep(max(0.0, sent[_stamp(i)] + 1 / 30 - time.monotonic()))

    def settled() -> bool:  # every frame that arrived was processed or dropped: nothing is left in the node
        values = {
            kv.key: float(kv.value) for kv in diagnostics[-1].status[0].values if kv.key.startswith("frames_")
        }
        received = values.get("frames_received", 0)
        return received > 1 and received == values["frames_processed"] + values["frames_dropped"]

    assert client.wait_until(lambda: bool(diagnostics) and settled(), timeout=10)
    answered = [s for s in sent if s in client.detections]
    latencies = np.array([client.arrivals[s] - sent[s] for s in answered])
    assert 0 < len(answered) < len(sent)
    # no backlog: a growing queue would make the last answers seconds old
    assert latencies.max() < 1.5, latencies
    assert latencies[-5:].mean() < 3 * np.median(latencies) + 0.2, latencies

    def dropped() -> float:
        values = {kv.key: kv.value for kv in diagnostics[-1].status[0].values} if diagnostics else {}
        return float(values.get("frames_dropped", -1))

    assert client.wait_until(lambda: dropped() > 0, timeout=5)
    status = {kv.key: kv.value for kv in diagnostics[-1].status[0].values}
    for key in (
        "input_rate_hz",
        "output_rate_hz",
        "latency_ms_p50",
        "latency_ms_p95",
        "backend",
        "precision",
        "tiles_per_frame",
    ):
        assert key in status, key
    received, processed = float(status["frames_received"]), float(status["frames_processed"])
    assert processed < received
    assert float(status["frames_dropped"]) <= received - processed


@pytest.mark.parametrize("node_and_client", [{"diagnostics_period": 0.1}], indirect=True)
def test_debug_image_is_drawn_only_for_subscribers(
    node_and_client: Any, scenes: list[Any], tmp_path: Path
) -> None:
    from tiled_detector.messages.images import imgmsg_to_array
    from tiled_detector.tools.annotate import annotate

    _, client = node_and_client
    diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
    scene = scenes[1]
    _send(client, _image(scene.image, 4), _stamp(4))  # nobody subscribes debug_image: not drawn
    assert client.wait_until(lambda: _counter(diagnostics, "frames_processed") >= 1, timeout=10)
    assert _counter(diagnostics, "frames_annotated") == 0
    mask = np.zeros((9, 16), np.uint8)
    mask[6:, 12:] = 255  # the bottom right corner
    cv2.imwrite(str(tmp_path / "corner.png"), mask)
    policy = {"roi": [0.1, 0.2, 0.9, 1.0], "ignore_mask": [str(tmp_path / "corner.png")]}
    assert all(r.successful for r in client.set_parameters(NODE, policy))
    debug = client.subscribe(Image, "debug_image")
    # a frame per second until the node's debug publisher has matched this subscription (no fixed sleep)
    for index in range(5, 35):
        _send(client, _image(scene.image, index), _stamp(index))
        if client.wait_until(lambda: len(debug) > 0, timeout=1.0):
            break
    assert debug, "no debug image within 30 frames"
    assert (debug[0].height, debug[0].width, debug[0].encoding) == (720, 1280, "rgb8")
    assert debug[0].header.stamp.sec >= 1005 and debug[0].header.frame_id == "cam_optical"
    assert client.wait_until(lambda: _counter(diagnostics, "frames_annotated") >= 1, timeout=5)
    # the kept boxes, the tiles over the region of interest, its outline and the ignored corner tinted
    detector = TiledDetector(**policy)
    drawn = annotate(scene.image, detector.detect(scene.image), CLASSES, plan=detector.plan_for(720, 1280))
    np.testing.assert_array_equal(imgmsg_to_array(debug[0])[0], drawn)
    assert (drawn[719, 1279] != scene.image[719, 1279]).any() and (drawn[144, 640] == 255).all()


def test_compressed_transport_subscribes_image_compressed(tmp_path: Path, scenes: list[Any]) -> None:
    from tiled_detector.messages.images import array_to_compressed

    params_file = _write_params(tmp_path / "params.yaml", transport="compressed", output_format="ids")
    domain = pick_domain_id()
    scene = scenes[2]
    msg = array_to_compressed(scene.image, "rgb8", "png")  # lossless: same pixels as the raw frame
    msg.header.frame_id = "cam_optical"
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1000, 250
    with NodeProcess(params_file, domain_id=domain) as node:
        client = DetectorClient(domain_id=domain, image_topic="image/compressed", compressed=True)
        try:
            assert client.wait_for_node(timeout=60), node.log_text()
            reply = _send(client, msg, _stamp(0))
        finally:
            client.close()
    assert node.returncode == 0, node.log_text()
    assert {d.results[0].hypothesis.class_id for d in reply.detections} <= {"0", "1", "2", "3"}
    boxes, scores, class_ids = msg_to_detections(reply)
    expected = TiledDetector().detect(scene.image, "rgb8")
    assert len(boxes) == len(expected) > 0
    np.testing.assert_allclose(np.sort(scores), np.sort(expected.scores), atol=1e-5)
    assert sorted(class_ids.tolist()) == sorted(expected.class_ids.tolist())


# --- frames lost before the node: counted and explained ------------------------------------------------------

PUBLISHER = (sys.executable, str(ROOT / "test" / "support" / "publisher.py"))


def _status(diagnostics: list[Any]) -> dict[str, str]:
    return {kv.key: kv.value for kv in diagnostics[-1].status[0].values} if diagnostics else {}


def _publisher(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*PUBLISHER, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@contextlib.contextmanager
def _watched_node(
    tmp_path: Path, domain: int, profile: Path | bool = True, **params: Any
) -> Iterator[tuple[Any, Any, list]]:
    """The node (with the shipped Fast DDS profile, another one, or none: False) reporting every 0.5 s, a client,
    its /diagnostics."""
    node = NodeProcess(
        _write_params(tmp_path / "params.yaml", diagnostics_period=0.5, **params), domain_id=domain
    )
    if profile is False:
        without_profile(node.env)
    elif profile is not True:
        node.env.update(profile_environment(profile))
    with node:
        client = DetectorClient(domain_id=domain)
        diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
        try:
            assert client.wait_until(lambda: len(diagnostics) > 0, timeout=60), node.log_text()
            yield node, client, diagnostics
        finally:
            client.close()


@pytest.mark.distro
def test_publisher_without_the_large_image_profile_is_explained(tmp_path: Path) -> None:
    """No frame gets through from a publisher lacking the profile: one WARN names the variable the node's Fast DDS
    reads (2.x: FASTRTPS_DEFAULT_PROFILES_FILE, 3: FASTDDS_DEFAULT_PROFILES_FILE) and the file."""
    domain = pick_domain_id()
    env = ros_environment(domain)
    without_profile(env)
    major = installed_major(env)
    variable, other = PROFILE_VARIABLES[::-1] if major == 3 else PROFILE_VARIABLES
    with _watched_node(tmp_path, domain) as (node, client, diagnostics):
        publisher = _publisher(
            env,
            "--topic",
            "image",
            "--size",
            "1920x1080",
            "--rate",
            "5",
            "--count",
            "40",
            "--reliability",
            "best_effort",
        )
        explained = client.wait_until(lambda: variable in diagnostics[-1].status[0].message, timeout=30)
        publisher.wait(60)
    assert explained, [d.status[0].message for d in diagnostics[-3:]]
    # (a stray UDP frame may end the silence later: the statuses that explain it are the ones checked)
    explaining = [d.status[0] for d in list(diagnostics) if variable in d.status[0].message]
    assert explaining and all(s.level == DiagnosticStatus.WARN for s in explaining)
    # of 40: UDP fragments rarely get one through (up to 7 seen on a loaded host: the point is most are not)
    assert int(_status(diagnostics)["frames_received"]) <= 10
    assert int(_status(diagnostics)["input_publishers"]) >= 1  # (the test client publishes on it too)
    log = node.log_text()
    warnings = [line for line in log.splitlines() if "no frame arrived" in line]
    assert len(warnings) == 1, log  # said once, not per frame
    # the variable the node's Fast DDS reads (2.x on Jazzy, 3 on Kilted), not the other's
    assert f"{variable}={FASTDDS_PROFILE} (Fast DDS {major})" in warnings[0]
    assert other not in warnings[0]


def _stream_through_a_small_queue(tmp_path: Path) -> tuple[dict[str, str], int, str]:
    """A node whose shared-memory port queue is small (128 fragments) receives 60 4K frames (380 fragments of
    64 KB each) while two busy processes share the cores: its /diagnostics status at the end, frames sent, stderr."""
    domain = pick_domain_id()
    tmp_path.mkdir(parents=True, exist_ok=True)
    small = tmp_path / "small_queue.xml"
    small.write_text(
        FASTDDS_PROFILE.read_text().replace("<port_queue_capacity>4096<", "<port_queue_capacity>128<")
    )
    env = {**ros_environment(domain), **profile_environment(small)}
    with _watched_node(tmp_path, domain, small) as (_, client, diagnostics):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            publisher = _publisher(
                env,
                "--topic",
                "image",
                "--size",
                "3840x2160",
                "--rate",
                "30",
                "--count",
                "60",
                "--reliability",
                "reliable",
            )
            out, err = publisher.communicate(timeout=120)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        sent = json.loads(out.strip().splitlines()[-1])["sent"]

        def settled() -> bool:
            status = _status(diagnostics)
            return int(status.get("frames_received", 0)) + int(status.get("frames_lost", 0)) >= sent * 0.9

        client.wait_until(settled, timeout=10)
        return _status(diagnostics), sent, err


def test_frames_lost_stay_a_count_when_the_middleware_reports_none(tmp_path: Path) -> None:
    """Node and publisher both without the large-image profile, a reliable publisher and the node's best-effort
    subscription, 1080p frames each followed by 15 tiny ones (the mix of the fuzz run that once reported
    206158430621 lost): frames are lost on the way, the message-lost events rmw_fastrtps raises for them carry
    values that are no counts (ros.stats.LostFrames), and frames_lost stays a count of what went missing."""
    domain = pick_domain_id()
    env = ros_environment(domain)
    without_profile(env)
    with _watched_node(tmp_path, domain, profile=False) as (_, client, diagnostics):
        publisher = _publisher(
            env,
            "--topic",
            "image",
            "--size",
            "1920x1080",
            "--rate",
            "20",
            "--count",
            "40",
            "--between",
            "15",
            "--reliability",
            "reliable",
        )
        out, err = publisher.communicate(timeout=120)
        sent = json.loads(out.strip().splitlines()[-1])["sent"]
        client.wait_until(lambda: int(_status(diagnostics).get("frames_lost", 0)) > 0, timeout=5)
        status = _status(diagnostics)
    received, lost = int(status["frames_received"]), int(status["frames_lost"])
    # lost frames are reported (at least one per event), never more than went missing (+ the client's own frames)
    assert 0 < lost <= sent - received + 2, (status, sent, err)


def test_frames_lost_in_transport_are_counted(tmp_path: Path) -> None:
    """A stream that overruns the shared-memory port queue: the middleware's message-lost reports reach
    /diagnostics, so received + lost accounts for what was sent. Whether a session overflows depends on how the
    OS schedules the reception (and Fast DDS may match a session over UDP instead): up to 3 fresh nodes are tried
    until one reports losses that account for the stream (Fast DDS also overwrites samples in the port queue without
    a message-lost event now and then: about one session in ten here, which a single try made a flaky test)."""
    for attempt in range(3):
        status, sent, err = _stream_through_a_small_queue(tmp_path / str(attempt))
        received, lost = int(status["frames_received"]), int(status["frames_lost"])
        # never more than went missing (+ the client's)
        assert received + lost <= sent + 2, (
            received,
            lost,
            sent,
        )
        if lost > 0 and received + lost >= 0.9 * sent:
            break
    assert lost > 0 and received < sent, (status, err)
    assert received + lost >= 0.9 * sent, (received, lost, sent)  # (a few may still be overwritten unseen)


@pytest.mark.distro
def test_frames_a_publisher_sent_that_the_node_never_took_are_counted(tmp_path: Path) -> None:
    """A camera publishes at 30 Hz (reliable, keep-last 1 as the node subscribes) and the node's process is stopped
    for a second (a host too busy to run it): the frames replaced in the keep-last queues meanwhile, which no
    message-lost event reports, are counted as frames_skipped (from the publication sequence numbers), those the
    middleware reports lost as frames_lost, none twice: received + lost + skipped is every frame sent."""
    domain = pick_domain_id()
    with _watched_node(tmp_path, domain, image_reliability="reliable") as (node, client, diagnostics):
        # small frames (one fragment each): none is lost in transport while the node is stopped
        publisher = _publisher(
            ros_environment(domain),
            "--topic",
            "image",
            "--size",
            "160x120",
            "--rate",
            "30",
            "--count",
            "120",
            "--reliability",
            "reliable",
        )
        assert client.wait_until(lambda: int(_status(diagnostics).get("frames_received", 0)) >= 10, 60)
        os.kill(node.process.pid, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(node.process.pid, signal.SIGCONT)
        out, err = publisher.communicate(timeout=120)
        sent = json.loads(out.strip().splitlines()[-1])["sent"]

        def counted() -> int:
            status = _status(diagnostics)
            return sum(int(status.get(f"frames_{k}", 0)) for k in ("received", "lost", "skipped"))

        client.wait_until(lambda: counted() >= sent, timeout=10)
        status = _status(diagnostics)
    skipped, lost = int(status["frames_skipped"]), int(status["frames_lost"])
    # the frames missed while stopped are reported: replaced in the node's keep-last queue (skipped, from the
    # sequence numbers) or, where the middleware reports them itself, lost (Fast DDS 3 under load: the writer's
    # keep-last history replaced them before delivery; seen on kilted with two test runs on the 2 cores)
    assert skipped + lost > 0, (status, err)
    assert counted() == sent, (status, sent)
    if skipped:
        assert "replaced in the input queue" in " ".join(d.status[0].message for d in diagnostics)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # (the node's one line with nothing before it: no rcl WARN about the environment, on each distro)
        pytest.param("overlap: 1.5", "overlap out of range", marks=pytest.mark.distro),
        ('conf_threshold: "abc"', "parameter conf_threshold must be a float"),
        ("model: /no/such/model.onnx", "model file /no/such/model.onnx not found"),
        ("max_batch: 0", "max_batch out of range"),
        ("precision: fp8", "precision must be one of fp32, fp16, int8"),
        ("precision: int8", "precision int8 runs an ONNX with QuantizeLinear/DequantizeLinear (Q/DQ) nodes"),
        ("ignore_mask: /no/such/mask.png", "ignore_mask: cannot read /no/such/mask.png: No such file"),
    ],
)
def test_bad_parameters_stop_the_node_with_one_line(tmp_path: Path, line: str, expected: str) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(f"/**:\n  ros__parameters:\n    {line}\n")
    with NodeProcess(params, domain_id=pick_domain_id()) as node:
        node.process.wait(60)
    lines = [text for text in node.log_text().splitlines() if text.strip()]
    assert node.returncode == 1, lines
    assert len(lines) == 1 and lines[0].startswith("[tiled_detector] cannot start: "), lines
    assert expected in lines[0], lines


@pytest.mark.parametrize(
    ("site", "flags", "expected"),
    [
        (
            'conf_threshold: "abc"',
            {},
            "parameter conf_threshold must be a float (e.g. conf_threshold: 0.25), got "
            "'abc' (str) from the params file site.yaml",
        ),
        ("conf_threshold: 0.4", {"conf_threshold": "abc"}, "got 'abc' (str) from -p"),
        ("full_frame: 1", {}, "parameter full_frame must be a bool"),
    ],
)
def test_a_wrong_type_anywhere_in_the_override_chain_stops_the_node(
    tmp_path: Path, site: str, flags: dict[str, str], expected: str
) -> None:
    """The usual base + site params files (and -p on top): rcl keeps the first value's type and drops a later
    one of another type without a word, so the node checks the chain itself, as it does a single file."""
    base = _write_params(tmp_path / "detector.yaml", conf_threshold=0.25, full_frame=True)
    (tmp_path / "site.yaml").write_text(f"/**:\n  ros__parameters:\n    {site}\n")
    node = NodeProcess(base, parameters=flags, domain_id=pick_domain_id())
    at = node.command.index("--params-file") + 2
    node.command[at:at] = ["--params-file", str(tmp_path / "site.yaml")]
    with node:
        node.process.wait(60)
    lines = [text for text in node.log_text().splitlines() if text.strip()]
    assert node.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith("[tiled_detector] cannot start: ") and expected in lines[0], lines


def test_the_last_value_in_the_override_chain_is_the_one_used(tmp_path: Path) -> None:
    """A later file's integer for a decimal parameter (rcl would keep the earlier decimal) is taken as that
    number."""
    base = _write_params(tmp_path / "detector.yaml", conf_threshold=0.25)
    (tmp_path / "site.yaml").write_text("/**:\n  ros__parameters:\n    conf_threshold: 1\n")
    domain = pick_domain_id()
    node = NodeProcess(base, domain_id=domain)
    at = node.command.index("--params-file") + 2
    node.command[at:at] = ["--params-file", str(tmp_path / "site.yaml")]
    with node:
        client = DetectorClient(domain_id=domain)
        try:
            assert client.wait_for_node(timeout=60), node.log_text()
            (value,) = client.get_parameters(NODE, ["conf_threshold"])
        finally:
            client.close()
    assert value == 1.0


def test_an_integer_for_a_float_parameter_is_taken_as_that_number(tmp_path: Path) -> None:
    """...and a misspelt parameter gets one WARN naming the nearest one."""
    params = _write_params(tmp_path / "params.yaml", conf_threshold=1, merge_threshold=0, conf_treshold=0.5)
    domain = pick_domain_id()
    with NodeProcess(params, domain_id=domain) as node:
        client = DetectorClient(domain_id=domain)
        try:
            assert client.wait_for_node(timeout=60), node.log_text()
            reply = _send(client, _image(make_scene(904, 640, 480).image, 0), _stamp(0))
        finally:
            client.close()
    assert node.returncode == 0 and reply.detections == []  # conf_threshold 1.0: nothing scores above it
    warnings = [line for line in node.log_text().splitlines() if "conf_treshold" in line]
    assert len(warnings) == 1 and "did you mean 'conf_threshold'?" in warnings[0], node.log_text()


# --- several cameras in one node ----------------------------------------------------------------------------

CAMERAS = ("/cam_a/image", "/cam_b/image", "/cam_c/image")


@contextlib.contextmanager
def _camera_clients(tmp_path: Path, name: str) -> Iterator[tuple[list[DetectorClient], list]]:
    """The node with `CAMERAS` (conf_threshold 0.4, /diagnostics every 0.5 s), a client per camera (`<name>_<i>`)
    and the /diagnostics it received; afterwards the clients still open are closed and the node must have exited
    cleanly."""
    domain = pick_domain_id()
    params = _write_params(
        tmp_path / "params.yaml", cameras=list(CAMERAS), conf_threshold=0.4, diagnostics_period=0.5
    )
    with NodeProcess(params, domain_id=domain) as node:
        clients = [
            DetectorClient(domain, topic, topic.rpartition("/")[0] + "/detections", node_name=f"{name}_{i}")
            for i, topic in enumerate(CAMERAS)
        ]
        diagnostics = clients[0].subscribe(DiagnosticArray, "/diagnostics")
        try:
            for client in clients:
                assert client.wait_for_node(timeout=60), node.log_text()
            yield clients, diagnostics
        finally:
            for client in clients:
                if client.context.ok():  # a test may have closed one (its camera stopped)
                    client.close()
    assert node.returncode == 0, node.log_text()
    assert "Traceback" not in node.log_text()


def _camera_statuses(diagnostics: list[Any]) -> dict[str, Any]:
    return {s.name.rpartition(": camera ")[2]: s for s in diagnostics[-1].status[1:]} if diagnostics else {}


def test_one_node_answers_every_camera_with_its_own_detections(tmp_path: Path) -> None:
    """Three cameras of three sizes into one node: each camera's detections on its own topic, with its frame's
    header, equal to detecting that frame alone; a camera that stops holds back neither of the others."""
    sizes = ((640, 480), (1280, 720), (1920, 1080))
    frames = [make_scene(910 + i, w, h).image for i, (w, h) in enumerate(sizes)]
    reference = TiledDetector(conf_threshold=0.4)
    expected = [reference.detect(frame) for frame in frames]
    with _camera_clients(tmp_path, "camera") as (clients, diagnostics):
        pending = dict(enumerate(clients))
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:  # all at once: the node batches what it finds
            for i, client in pending.items():
                client.publish(_image(frames[i], i, frame_id=f"cam_{i}"))
            for i in [i for i, c in pending.items() if c.wait_for_stamp(_stamp(i), timeout=2.0)]:
                reply = pending.pop(i).detections[_stamp(i)]
                assert reply.header.frame_id == f"cam_{i}"
                _assert_same(reply, expected[i])
        assert not pending, f"cameras {sorted(pending)} not answered"
        assert not any(_stamp(j) in clients[i].detections for i in range(3) for j in range(3) if i != j)
        clients[2].close()  # camera c stops (its publisher is gone)
        for k in range(3, 6):
            for i in (0, 1):
                reply = _send(
                    clients[i], _image(frames[i], 10 * k + i, frame_id=f"cam_{i}"), _stamp(10 * k + i)
                )
                _assert_same(reply, expected[i])

        def settled() -> bool:  # c reported silent in a report that counts every frame a and b sent
            cameras = _camera_statuses(diagnostics)
            if set(cameras) != set(CAMERAS):  # no report received yet (a slow discovery under load)
                return False
            processed = [
                {kv.key: kv.value for kv in cameras[t].values}["frames_processed"] for t in CAMERAS[:2]
            ]
            silent = "no publisher on /cam_c/image" in cameras["/cam_c/image"].message
            return silent and all(int(n) >= 4 for n in processed)

        assert clients[0].wait_until(settled, timeout=30), [
            s.message for m in diagnostics[-1:] for s in m.status
        ]
        cameras = _camera_statuses(diagnostics)
        assert set(cameras) == set(CAMERAS)
        for i, topic in enumerate(CAMERAS):
            values = {kv.key: kv.value for kv in cameras[topic].values}
            assert values["image_topic"] == topic
            assert values["detections_topic"] == topic.rpartition("/")[0] + "/detections"
            assert int(values["frames_processed"]) >= (4 if i < 2 else 1)
            assert values["frame_size"] == "{}x{}".format(*sizes[i])
        pipeline = _status(diagnostics)
        # every camera's frames
        assert int(pipeline["frames_processed"]) >= 9 and pipeline["cameras"] == "3"


def test_a_costly_camera_runs_in_parts_between_the_other_cameras_frames(tmp_path: Path) -> None:
    """Two 640x480 cameras (2 views a frame) and a 3840x2160 one (33 views: parts of at most 4): the 4K frame
    runs in parts between the cheap cameras' frames, so they are answered while it runs, not after it; its own
    answer finds what detecting it whole finds, and /diagnostics counts the views its parts ran."""
    from tiled_detector.tools.scoring import box_iou

    small = [make_scene(930 + i, 640, 480).image for i in range(2)]
    big = make_scene(932, 3840, 2160).image
    whole = TiledDetector(conf_threshold=0.4).detect(big)
    with _camera_clients(tmp_path, "cost") as (clients, diagnostics):
        for i in (0, 1):  # the cheap cameras' sizes are known before the costly frame comes
            _send(clients[i], _image(small[i], i), _stamp(i))
        index = 100
        for _ in range(
            3
        ):  # the best-effort 4K frame can be lost right after discovery: then it is sent again
            clients[2].publish(_image(big, 50))
            sent = time.monotonic()
            while _stamp(50) not in clients[2].detections and time.monotonic() - sent < 8:
                for i in (0, 1):
                    clients[i].publish(_image(small[i], index + i))
                index += 2
                time.sleep(0.05)
            if _stamp(50) in clients[2].detections:
                break
        reply = clients[2].wait_for_stamp(_stamp(50), timeout=5.0)
        assert reply is not None, "the 4K frame was never answered"
        done = clients[2].arrivals[_stamp(50)]
        answered_while = [
            t for c in clients[:2] for k, t in c.arrivals.items() if k >= _stamp(100) and t < done
        ]
        assert len(answered_while) >= 2, (len(answered_while), done - sent)
        boxes, _, class_ids = msg_to_detections(reply, list(CLASSES))
        iou = box_iou(whole.boxes.astype(np.float64), boxes.astype(np.float64))
        same = np.where(whole.class_ids[:, None] == class_ids[None, :], iou, 0)
        assert (same.max(axis=1) >= 0.7).mean() >= 0.95 and abs(len(boxes) - len(whole.boxes)) <= 3

        def counted() -> bool:
            status = _camera_statuses(diagnostics).get(CAMERAS[2], DiagnosticStatus())
            return int({kv.key: kv.value for kv in status.values}.get("frames_processed", 0)) >= 1

        assert clients[0].wait_until(counted, timeout=30)
        values = {kv.key: kv.value for kv in _camera_statuses(diagnostics)[CAMERAS[2]].values}
        # 32 tiles in 11 parts of at most 3 (a cap of 4 views), each with the full view
        assert float(values["views_per_frame_max"]) == 32 + 11


# --- the managed (lifecycle) node -------------------------------------------------------------------------

LIFECYCLE_NODE = (sys.executable, "-m", "tiled_detector.ros.lifecycle")


def test_managed_node_detects_only_while_active_and_frees_its_engine_on_cleanup(
    tmp_path: Path, scenes: list[Any]
) -> None:
    domain = pick_domain_id()
    from tiled_detector.messages.detections import msg_ids

    params = _write_params(tmp_path / "params.yaml", conf_threshold=0.4, tracker="bytetrack")
    expected = TiledDetector(conf_threshold=0.4).detect(scenes[0].image)
    with NodeProcess(params, domain_id=domain, program=LIFECYCLE_NODE) as node:
        client = DetectorClient(domain_id=domain)
        try:
            assert client.lifecycle(NODE) == "unconfigured", node.log_text()
            assert client.image_publisher.get_subscription_count() == 0  # nothing taken before activate
            assert client.lifecycle(NODE, "configure") and client.lifecycle(NODE) == "inactive"
            assert "ready:" not in node.log_text()
            assert client.lifecycle(NODE, "activate") and client.lifecycle(NODE) == "active"
            assert client.wait_for_node(timeout=30)
            first = _send(client, _image(scenes[0].image, 0), _stamp(0))
            # (the first frame of a track is published with the detection's box)
            _assert_same(first, expected)
            assert client.lifecycle(NODE, "deactivate") and client.lifecycle(NODE) == "inactive"
            assert client.wait_until(lambda: client.image_publisher.get_subscription_count() == 0, timeout=10)
            client.publish(_image(scenes[0].image, 1))
            assert client.wait_for_stamp(_stamp(1), timeout=2.0) is None  # inactive: frames are not taken
            assert client.lifecycle(NODE, "cleanup") and client.lifecycle(NODE) == "unconfigured"
            assert client.wait_until(lambda: client.detections_subscription.get_publisher_count() == 0, 10)
            assert client.lifecycle(NODE, "configure") and client.lifecycle(NODE, "activate")  # again
            again = _send(client, _image(scenes[0].image, 2), _stamp(2))
            _assert_same(again, expected)
            # cleanup ended every track; ids are never reused
            assert msg_ids(again).min() > msg_ids(first).max()
            assert client.lifecycle(NODE, "shutdown")
            assert client.wait_until(lambda: not node.alive(), timeout=20), "shutdown did not end the process"
        finally:
            client.close()
    assert node.returncode == 0, node.log_text()
    assert "Traceback" not in node.log_text()


def test_managed_node_configure_fails_with_the_reason(tmp_path: Path) -> None:
    domain = pick_domain_id()
    params = _write_params(tmp_path / "params.yaml", model=str(tmp_path / "missing.onnx"))
    with NodeProcess(params, domain_id=domain, program=LIFECYCLE_NODE) as node:
        client = DetectorClient(domain_id=domain)
        try:
            assert client.lifecycle(NODE) == "unconfigured", node.log_text()
            assert client.lifecycle(NODE, "configure") is False
            assert client.lifecycle(NODE) == "unconfigured"
            failed = [line for line in node.log_text().splitlines() if "configure failed:" in line]
            assert len(failed) == 1 and "missing.onnx" in failed[0], node.log_text()
        finally:
            client.close()
    assert node.returncode == 0, node.log_text()
    assert "Traceback" not in node.log_text()


def test_managed_node_publishes_only_while_active_and_takes_engine_parameters_while_unconfigured(
    tmp_path: Path,
) -> None:
    """Lifecycle publishers: vision_info and label_info (transient local) come on activate, not on configure.
    The parameters the plain node fixes at start are refused while configured and taken while unconfigured."""
    from vision_msgs.msg import LabelInfo, VisionInfo

    from tiled_detector.harness.client import reliable_qos

    domain = pick_domain_id()
    params = _write_params(tmp_path / "params.yaml", conf_threshold=0.4)
    latched = reliable_qos(1)
    latched.durability = DurabilityPolicy.TRANSIENT_LOCAL
    with NodeProcess(params, domain_id=domain, program=LIFECYCLE_NODE) as node:
        client = DetectorClient(domain_id=domain)
        try:
            infos = client.subscribe(VisionInfo, "vision_info", latched)
            labels = client.subscribe(LabelInfo, "label_info", latched)
            assert client.lifecycle(NODE, "configure"), node.log_text()
            assert client.wait_until(lambda: client.node.count_publishers("/vision_info") == 1, 20)
            assert not client.wait_until(lambda: infos or labels, 2.0)  # inactive: nothing published
            refused = client.set_parameters(NODE, {"precision": "fp16"})[0]
            assert not refused.successful and "set while it is unconfigured" in refused.reason
            assert client.lifecycle(NODE, "activate")
            assert client.wait_until(lambda: infos and labels, 20), node.log_text()
            assert infos[0].method.endswith("(onnxruntime, fp32); class_id: label names")
            assert [c.class_name for c in labels[0].class_map] == list(CLASSES)
            assert labels[0].threshold == pytest.approx(0.4)
            assert client.set_parameters(NODE, {"conf_threshold": 0.45})[0].successful
            assert client.wait_until(lambda: len(labels) == 2, 10)  # the threshold it publishes follows
            assert labels[1].threshold == pytest.approx(0.45)
            assert client.lifecycle(NODE, "deactivate") and client.lifecycle(NODE, "cleanup")
            taken = client.set_parameters(NODE, {"backend": "torch", "conf_threshold": 0.5})
            assert all(r.successful for r in taken), taken
            assert client.lifecycle(NODE, "configure") and client.lifecycle(NODE, "activate")
            assert client.wait_until(lambda: len(infos) == 2, 20)
            assert infos[1].method.endswith("(torch, fp32); class_id: label names")
        finally:
            client.close()
    assert node.returncode == 0 and "Traceback" not in node.log_text(), node.log_text()
    # bondpy is not on PyPI: no bond, said once (INFO) over both activations
    assert node.log_text().count("bondpy does not import: no bond to a lifecycle manager") == 1, (
        node.log_text()
    )


def test_qos_overrides_are_honoured_and_a_failing_activate_frees_the_engine(tmp_path: Path) -> None:
    """qos_overrides.* (rclpy's QoSOverridingOptions) set the image subscription's and the outputs' QoS; one that
    matches no endpoint is one WARN. A transition that raises (a qos override rclpy cannot read, on the camera
    that activate subscribes) is logged in one line and handled by on_error: the engine and the diagnostics timer
    are freed, the node is unconfigured and configures again."""
    from rclpy.qos import ReliabilityPolicy

    domain = pick_domain_id()
    params = tmp_path / "params.yaml"
    params.write_text(
        "/**:\n  ros__parameters:\n    diagnostics_period: 0.2\n    cameras: [/left/image_raw, /right/image_raw]\n"
        "    qos_overrides:\n"
        "      /left/image_raw: {subscription: {reliability: reliable}}\n"
        "      /right/image_raw: {subscription: {reliability: bogus}}\n"
        "      /left/detections: {publisher: {reliability: best_effort, depth: 3}}\n"
        "      /nowhere: {publisher: {depth: 2}}\n"
    )
    with NodeProcess(params, domain_id=domain, program=LIFECYCLE_NODE) as node:
        client = DetectorClient(domain_id=domain)
        diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
        try:
            assert client.lifecycle(NODE, "configure"), node.log_text()
            assert client.wait_until(lambda: len(diagnostics) > 0, 30)
            (out,) = client.node.get_publishers_info_by_topic("/left/detections")
            assert out.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT  # (default: reliable)
            # (the depth is no part of what discovery tells: the parameter rclpy declared from it is read)
            (depth,) = client.get_parameters(NODE, ["qos_overrides./left/detections.publisher.depth"])
            assert depth == 3
            assert client.lifecycle(NODE, "activate") is False
            assert client.lifecycle(NODE) == "unconfigured"
            log = node.log_text()
            failed = [line for line in log.splitlines() if "activate failed:" in line]
            assert len(failed) == 1 and "bogus" in failed[0], log
            settled = len(diagnostics)
            time.sleep(1.0)  # (five periods)
            assert len(diagnostics) <= settled + 1  # the timer went with the engine
            assert client.set_parameters(NODE, {"cameras": ["/left/image_raw"]})[0].successful
            assert client.lifecycle(NODE, "configure") and client.lifecycle(NODE, "activate"), node.log_text()
            (sub,) = client.node.get_subscriptions_info_by_topic("/left/image_raw")
            assert sub.qos_profile.reliability == ReliabilityPolicy.RELIABLE  # image_reliability: best_effort
            log = node.log_text()
            assert log.count("qos_overrides./nowhere.publisher.depth ignored") == 1, log
        finally:
            client.close()
    assert node.returncode == 0 and "Traceback" not in node.log_text(), node.log_text()


def _depth_image(depth: np.ndarray, index: int, encoding: str = "16UC1") -> Image:
    """A depth image message (little-endian rows) stamped as frame `index`."""
    height, width = depth.shape
    msg = Image(
        height=height, width=width, encoding=encoding, step=width * depth.itemsize, data=depth.tobytes()
    )
    msg.header.frame_id = "cam_optical"
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1000 + index, 250
    return msg


@pytest.mark.parametrize(
    "node_and_client",
    [{"depth": True, "image_reliability": "reliable", "diagnostics_period": 0.1, "max_detections": 40}],
    indirect=True,
)
def test_depth_positions_over_dds_and_each_bad_input_said_once(
    node_and_client: Any, scenes: list[Any]
) -> None:
    """`depth: true`: a frame with its aligned depth image and camera info gets a Detection3DArray (its stamp and
    frame_id) with what the ROS-free detector computes, and a 2D message bit-identical to a frame without depth;
    no camera info yet, another aspect ratio, an unknown encoding, a zero focal length and stamps out of the
    tolerance each give 2D only, one WARN line per cause, counted in frames_without_depth."""
    from sensor_msgs.msg import CameraInfo
    from vision_msgs.msg import Detection3DArray

    from tiled_detector.harness.client import reliable_qos
    from tiled_detector.messages.detections import msg_links, msg_to_positions
    from tiled_detector.pipeline.depth import DepthImage, Intrinsics

    node, client = node_and_client
    diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
    located = client.subscribe(Detection3DArray, "detections_3d")
    depth_pub = client.node.create_publisher(Image, "depth_image", reliable_qos(10))
    info_pub = client.node.create_publisher(CameraInfo, "camera_info", reliable_qos(1))
    assert client.wait_until(
        lambda: depth_pub.get_subscription_count() and info_pub.get_subscription_count(), 30
    )
    frame = scenes[0].image
    depth = np.full((360, 640), 8000, np.uint16)  # half size: 8 m in millimetres
    depth[::7, ::5] = 0  # holes
    info = CameraInfo(width=1280, height=720, k=[900.0, 0.0, 639.5, 0.0, 900.0, 359.5, 0.0, 0.0, 1.0])

    def send(index: int, depth_msg: Image | None = None, camera: CameraInfo | None = None) -> Any:
        if camera is not None:
            info_pub.publish(camera)
        if depth_msg is not None:
            depth_pub.publish(depth_msg)
        return _send(client, _image(frame, index), _stamp(index))

    plain = send(0, _depth_image(depth, 0))  # no camera info yet
    good = send(1, _depth_image(depth, 1), info)
    assert client.wait_until(lambda: len(located) == 1, 10)
    (answer,) = located
    assert (answer.header.stamp.sec, answer.header.frame_id) == (1001, "cam_optical")
    camera = Intrinsics(900.0, 900.0, 639.5, 359.5)
    reference = TiledDetector(max_detections=40).detect(frame, depth=DepthImage(depth, camera))
    ids, positions, _ = msg_to_positions(answer)
    links = msg_links(good, answer)  # (untracked: no ids; the 2D order, class and score)
    assert ids == [""] * len(reference) and sorted(links.tolist()) == list(range(len(reference)))
    np.testing.assert_allclose(positions[links], reference.positions, atol=1e-4)
    assert len(ids) == len(reference) > 0 and np.allclose(positions[:, 2], 8.0)
    assert [(d.bbox, d.results) for d in good.detections] == [(d.bbox, d.results) for d in plain.detections]
    send(2, _depth_image(np.full((300, 300), 8000, np.uint16), 2))  # another aspect ratio
    send(3, _depth_image(depth.astype(np.int16), 3, "16SC1"))  # an unknown encoding
    send(4, _depth_image(depth, 4), CameraInfo(width=1280, height=720))  # no focal length
    send(5, _depth_image(depth, 0), info)  # a depth stamp 5 s away
    send(6, _depth_image(depth, 0))  # (the same cause again: said once)
    assert client.wait_until(lambda: _counter(diagnostics, "frames_processed") == 7, 10)
    assert _counter(diagnostics, "frames_without_depth") == 6.0 and len(located) == 1
    assert _counter(diagnostics, "objects_without_depth") == 0.0
    log = node.log_text()
    causes = (
        "no camera info has arrived yet",
        "another aspect ratio",
        "unknown depth encoding '16SC1'",
        "zero or negative focal length",
        "nearest depth image is",
    )
    for cause in causes:
        assert log.count(cause) == 1, (cause, log)
