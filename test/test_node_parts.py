"""Unit tests of the node's ROS-light parts: parameter table, latest-frame slot, statistics."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("rclpy")

from tiled_detector.config import DetectorConfig
from tiled_detector.parameters import runtime_changes
from tiled_detector.ros.inputs import image_qos
from tiled_detector.ros.params import BY_NAME, PARAMS, descriptor
from tiled_detector.ros.stats import FrameSlots, Stats
from tiled_detector.ros.worker import Arrival


def test_every_parameter_has_a_description_and_a_valid_default() -> None:
    assert len({p.name for p in PARAMS}) == len(PARAMS)
    for param in PARAMS:
        assert param.description
        assert param.check(param.default) is None, param.name
        assert descriptor(param).read_only == param.read_only
    engine = {"model", "backend", "device", "precision", "max_batch", "labels", "transport"}
    assert all(BY_NAME[name].read_only for name in engine)
    runtime = {
        "tile_width",
        "tile_height",
        "overlap",
        "full_frame",
        "conf_threshold",
        "merge",
        "match_metric",
        "merge_threshold",
        "class_agnostic",
        "max_detections",
        "classes",
    }
    assert not any(BY_NAME[name].read_only for name in runtime)


def test_parameter_checks_state_the_rule_and_the_value() -> None:
    assert BY_NAME["merge"].check("average") == "merge must be one of nms, nmm, greedy_nmm, got 'average'"
    assert BY_NAME["overlap"].check(0.99) == "overlap must be in [0.0, 0.95], got 0.99"
    assert BY_NAME["conf_threshold"].check(0.3) is None
    assert descriptor(BY_NAME["overlap"]).floating_point_range[0].to_value == 0.95
    assert descriptor(BY_NAME["tile_width"]).integer_range[0].from_value == 0  # 0 = auto: the model's input
    assert BY_NAME["tile_width"].check(0) is None and BY_NAME["tile_width"].check(416) is None
    assert BY_NAME["tile_width"].check(8) == "tile_width must be in [16, 8192], got 8"


def test_class_filter_from_names_and_ids() -> None:
    labels = ["red_disc", "blue_square", "yellow_triangle"]

    def resolved(classes, labels=labels):
        return DetectorConfig(classes=classes).frame_settings(labels).classes

    assert resolved([]) is None
    assert resolved(["yellow_triangle", "0", "0"]) == (0, 2)
    with pytest.raises(ValueError, match="unknown class 'unicorn'"):
        resolved(["unicorn"])
    with pytest.raises(ValueError, match="numeric ids"):
        resolved(["red_disc"], None)


def test_pipeline_changes_map_parameters_to_config_fields() -> None:
    changes = runtime_changes(
        {"tile_width": 512, "tile_height": 384, "conf_threshold": 0.5, "classes": ["", "1"], "model": "x"}
    )
    assert changes == {"tile_size": (512, 384), "conf_threshold": 0.5, "classes": ["1"]}
    assert DetectorConfig(**changes).classes == (1,)


def test_message_lost_events_count_what_they_can_mean() -> None:
    from tiled_detector.ros.stats import LostFrames

    lost = LostFrames()  # a cumulative count that grows: its growth
    assert [lost.add(total, change) for total, change in ((3, 3), (10, 7), (10, 0), (12, 2))] == [3, 7, 1, 2]
    # what rmw_fastrtps handed over for fragmented frames (provoked in test_node): one frame per event
    garbage = LostFrames()
    values = [
        (0xFFFFFFFF80000000,) * 2,
        (0, 0xFFFFFFFF80000000),
        (2**64 - 1,) * 2,
        (2**31 - 1,) * 2,
        (0, 0),
        (48 * 2**32 + 413, 48 * 2**32 + 413),
    ]
    assert [garbage.add(total, change) for total, change in values] == [1] * len(values)


@pytest.mark.distro
def test_the_message_info_each_rclpy_gives() -> None:
    """Iron and later (Jazzy's rclpy 7.1.6, Kilted's 9.x) call a two-argument callback with each message's info, though
    Jazzy's has no `rclpy.subscription.MessageInfo` type; Humble's calls every callback with the message alone (rclpy
    humble: `Subscription` has no `CallbackType`, `executors.py` passes `msg_info[0]` only). Jazzy's info names no
    publisher (no `publisher_gid`), Kilted's does."""
    from rclpy.subscription import Subscription

    from tiled_detector.ros.inputs import MESSAGE_INFO
    from tiled_detector.ros.stats import publication, takes_message_info

    assert MESSAGE_INFO and takes_message_info(Subscription)

    class HumbleSubscription:  # rclpy humble's Subscription: callback, no CallbackType
        callback = None

    assert not takes_message_info(HumbleSubscription)
    jazzy = {"source_timestamp": 1, "publication_sequence_number": 7, "reception_sequence_number": None}
    kilted = {
        **jazzy,
        "publisher_gid": {"implementation_identifier": "rmw_fastrtps_cpp", "data": b"\x01\x0f"},
    }
    assert publication(jazzy) == (None, 7)
    assert publication(kilted) == ((1, 15), 7)
    assert publication({"source_timestamp": 1}) is None and publication(None) is None


@pytest.mark.distro
def test_frames_skipped_from_sequence_numbers_without_publisher_gids() -> None:
    """Jazzy's message info has no publisher gid: the gaps of a subscription's one matched publisher are
    frames_skipped; while several are matched, their numbers cannot be told apart and none is counted (never a
    made-up gap). A publisher the subscription does not match (another QoS) does not count."""
    import rclpy
    from rclpy.context import Context
    from rclpy.qos import qos_profile_sensor_data
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import Image

    from tiled_detector.harness.process import apply_ros_environment
    from tiled_detector.messages.images import array_to_imgmsg
    from tiled_detector.ros.node import DetectorNode

    apply_ros_environment()
    context = Context()
    rclpy.init(context=context)
    node = DetectorNode(
        context=context,
        parameter_overrides=[rclpy.parameter.Parameter("image_reliability", value="reliable")],
    )
    try:
        camera = node.cameras[0]
        data = serialize_message(array_to_imgmsg(np.zeros((8, 8, 3), np.uint8), "rgb8"))
        matched = camera.subscription.get_publisher_count

        def feed(*sequences: int) -> tuple[int, int]:
            for sequence in sequences:
                node._on_image_info(data, {"publication_sequence_number": sequence})
            return node.stats.counts["received"], node.stats.counts["skipped"]

        first = node.create_publisher(Image, camera.image_topic, 1)
        other_qos = node.create_publisher(Image, camera.image_topic, qos_profile_sensor_data)  # not matched
        assert _wait(lambda: matched() == 1) and node.count_publishers(camera.image_topic) == 2
        assert feed(1, 2, 5) == (3, 2)  # one publisher: 2 frames skipped before the third
        second = node.create_publisher(Image, camera.image_topic, 1)
        assert _wait(lambda: matched() == 2)
        assert feed(1, 9, 2, 12) == (7, 2)  # two publishers interleaved: nothing counted
        for publisher in (second, other_qos, first):
            node.destroy_publisher(publisher)
    finally:
        node.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def _wait(predicate: Any, timeout: float = 10.0) -> bool:
    """Whether `predicate()` holds within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(predicate())


def test_skipped_frames_are_the_sequence_gaps_less_the_frames_reported_lost() -> None:
    from tiled_detector.ros.stats import SkippedFrames

    skipped = SkippedFrames()
    a, b = (1, 2, 3), (9, 9, 9)  # two publishers (their gids)
    # the first counts nothing, then the gaps
    assert [skipped.add(a, n) for n in (5, 6, 9, 10)] == [
        0,
        0,
        2,
        0,
    ]
    assert skipped.add(b, 1) == 0 and skipped.add(b, 4) == 2  # per publisher
    skipped.lost(3)  # the middleware reported 3 lost: they are gaps, not skips
    assert skipped.add(a, 15) == 4 - 3 and skipped.add(a, 17) == 1 and skipped.add(a, 19) == 1
    assert skipped.add(a, 2) == 0 and skipped.add(a, 4) == 1  # a restarted publisher numbers from 1 again
    many = SkippedFrames()
    for gid in range(SkippedFrames.PUBLISHERS + 10):  # bounded: the most recent publishers are kept
        many.add(gid, 1)
    assert len(many._last) == SkippedFrames.PUBLISHERS and many.add(0, 5) == 0  # forgotten: a first message


def test_each_sending_camera_gets_an_equal_share_of_the_engine() -> None:
    from tiled_detector.ros.share import EngineShare

    now = [0.0]
    share = EngineShare(3, tau_s=2.0, active_s=1.0, clock=lambda: now[0])
    share.arrived(2)
    share.charge([(2, 136)], 3.0)  # one camera alone: never held, whatever it costs
    assert share.held() == set()
    for camera in (0, 1):
        share.arrived(camera)
    # three sending: the costly camera (1.5 of 2 s decayed: 75 %) is over a third; the cheap ones are not
    share.charge([(0, 7), (1, 7), (2, 136)], 0.15)
    assert share.held() == {2}
    fractions = share.fractions()
    assert fractions[0] == fractions[1] < 0.01 < 1 / 3 < fractions[2]
    now[0] = 2.0 * np.log(fractions[2] * 3) + 0.01  # its use decays under the share: released
    for camera in (0, 1, 2):
        share.arrived(camera)
    assert share.held() == set()
    now[0] += 1.5  # the cheap cameras stopped sending (over 1 s ago): a camera alone is never held
    share.arrived(2)
    share.charge([(2, 136)], 3.0)
    assert share.held() == set()


def test_a_frame_costing_many_times_the_cheapest_cameras_runs_in_parts() -> None:
    """Parts of at most the cheapest camera's views (at least 4): an 8K frame (136 views) among 720p ones (7) runs
    in parts of 7, each batch giving every camera the same views; 1080p (9) among 480p (2) in parts of 4; one camera
    alone never in parts."""
    from tiled_detector.ros.share import view_cap

    assert view_cap([7, 7, 136]) == 7 and view_cap([2, 5, 9]) == 4
    assert view_cap([136]) == 0 and view_cap([]) == 0


def test_a_closed_gate_leaves_a_cameras_messages_in_the_middleware() -> None:
    """The executor builds its wait set from the subscriptions whose callback group can execute: a held camera's
    (closed gate) is left out, so its messages are neither taken nor converted."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from tiled_detector.ros.inputs import Gate

    context = rclpy.Context()
    rclpy.init(context=context)
    gate, executor = Gate(), SingleThreadedExecutor(context=context)

    class Entity:
        _executor_event = False
        callback_group = gate

    assert executor.can_execute(Entity()) and gate.beginning_execution(Entity())
    gate.open = False
    assert not executor.can_execute(Entity()) and not gate.beginning_execution(Entity())
    executor.shutdown()
    rclpy.shutdown(context=context)


def test_held_cameras_keep_their_newest_frame_in_the_slot() -> None:
    from tiled_detector.ros.stats import FrameSlots

    slots = FrameSlots(3)
    assert not slots.put(0, "a1") and not slots.put(2, "c1")
    assert slots.take(0.01, held={2}) == [(0, "a1")]  # c waits in its slot
    assert slots.put(2, "c2")  # a newer frame replaces it: a drop
    assert slots.take(0.01, held={2}) == []  # nothing else: the worker waits (timeout) rather than run c
    assert slots.take(0.01) == [(2, "c2")]


def test_the_override_chain_is_read_as_rcl_applies_it(tmp_path) -> None:
    from tiled_detector.ros.node_parameters import given_parameters

    base = tmp_path / "base.yaml"
    base.write_text(
        "/**:\n  ros__parameters:\n    conf_threshold: 0.25\n    overlap: 0.2\n"
        "/rear/tiled_detector:\n  ros__parameters:\n    overlap: 0.5\n"
    )
    site = tmp_path / "site.yaml"
    site.write_text('tiled_detector:\n  ros__parameters:\n    conf_threshold: "abc"\n    top_k: 7\n')
    argv = ["node", "--ros-args", "--params-file", str(base), "-p", "top_k:=9", "--params-file", str(site)]
    given = given_parameters(argv, "/tiled_detector")
    # files in order (the later one wins), then -p on top wherever it stands; another node's section ignored
    assert given == {
        "conf_threshold": ("abc", "site.yaml"),
        "overlap": (0.2, "base.yaml"),
        "top_k": (9, "-p"),
    }
    assert given_parameters(argv, "/rear/tiled_detector")["overlap"] == (0.5, "base.yaml")
    assert given_parameters([*argv, "-p", "other_node:top_k:=3"], "/tiled_detector")["top_k"] == (9, "-p")


def test_frame_slots_keep_only_the_newest_frame_of_each_camera() -> None:
    slots = FrameSlots(3)
    assert slots.put(0, "a") is False
    assert slots.put(0, "b") is True  # "a" was never taken: a drop
    assert slots.put(2, "z") is False  # another camera's frame is no drop
    assert slots.take(timeout=0.1) == [(0, "b"), (2, "z")]  # every camera's newest, at once
    assert slots.take(timeout=0.01) == []
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(slots.take(timeout=5)))
    worker.start()
    time.sleep(0.05)
    slots.put(1, "c")  # any camera wakes the worker
    worker.join(2)
    assert got == [[(1, "c")]]
    slots.close()
    start = time.monotonic()
    assert slots.take(timeout=5) == [] and time.monotonic() - start < 1  # returns at once once closed


def test_stats_rates_and_percentiles() -> None:
    stats = Stats()
    for _ in range(10):
        stats.add("received")
    for ms in (10.0, 20.0, 30.0):
        stats.record(ms, {"infer": ms / 2})
    stats.add("dropped")
    snap = stats.snapshot()
    assert snap["frames_received"] == 10 and snap["frames_processed"] == 3 and snap["frames_dropped"] == 1
    assert snap["latency_ms_p50"] == 20.0 and snap["infer_ms_p50"] == 10.0
    assert snap["input_rate_hz"] > 0
    assert stats.snapshot()["dropped_since_last"] == 0.0


def test_the_silent_input_warn_names_the_variable_the_running_fast_dds_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fast DDS 2.x (Humble 2.6, Jazzy 2.14; the library libfastrtps.so.2.*) reads FASTRTPS_DEFAULT_PROFILES_FILE,
    Fast DDS 3 (libfastdds.so.3.*) FASTDDS_DEFAULT_PROFILES_FILE (XMLParserCommon.cpp at eProsima/Fast-DDS v2.6.10,
    v2.14.5, v3.2.2): the WARN tells the user to export the one their Fast DDS reads (both when it is unknown)."""
    from tiled_detector.ros import diagnostics
    from tiled_detector.ros_launch.fastdds import FASTDDS_PROFILE, loaded_major

    humble = "7f3a1c000000-7f3a1c400000 r-xp 00000000 08:01 42 /opt/ros/humble/lib/libfastrtps.so.2.6.10\n"
    kilted = "7f3a1c000000-7f3a1c400000 r-xp 00000000 08:01 42 /venv/lib/libfastdds.so.3.2.2\n"
    assert (loaded_major(humble), loaded_major(kilted), loaded_major("/usr/lib/libc.so.6")) == (2, 3, None)
    for name in ("FASTRTPS_DEFAULT_PROFILES_FILE", "FASTDDS_DEFAULT_PROFILES_FILE"):
        monkeypatch.delenv(name, raising=False)
    silent = time.monotonic() - 10
    warned = {}
    for major in (2, 3, None):
        monkeypatch.setattr(diagnostics, "running_major", lambda major=major: major)
        warned[major] = diagnostics.input_problem("/cam/image_raw", silent, 1)
    assert f"export FASTRTPS_DEFAULT_PROFILES_FILE={FASTDDS_PROFILE} (Fast DDS 2)" in warned[2]
    assert "FASTDDS_DEFAULT_PROFILES_FILE" not in warned[2]
    assert f"export FASTDDS_DEFAULT_PROFILES_FILE={FASTDDS_PROFILE} (Fast DDS 3)" in warned[3]
    assert "FASTRTPS_DEFAULT_PROFILES_FILE" not in warned[3]
    assert f"FASTRTPS_DEFAULT_PROFILES_FILE={FASTDDS_PROFILE} FASTDDS_DEFAULT_PROFILES_FILE=" in warned[None]
    # the profile the node itself runs with is the one named (Fast DDS 2 reads the old name)
    monkeypatch.setenv("FASTRTPS_DEFAULT_PROFILES_FILE", "/robot/large.xml")
    monkeypatch.setattr(diagnostics, "running_major", lambda: 2)
    assert "FASTRTPS_DEFAULT_PROFILES_FILE=/robot/large.xml" in diagnostics.input_problem("/cam", silent, 1)


def test_every_frame_of_a_window_failing_is_an_error_on_diagnostics() -> None:
    """ERROR (not WARN) when frames were taken since the last report and every one failed or was malformed."""
    from diagnostic_msgs.msg import DiagnosticStatus

    from tiled_detector.ros.diagnostics import problems, status

    stats = Stats()

    def reported() -> DiagnosticStatus:
        values = stats.snapshot()
        return status("pipeline", values, problems(values), "cpu")

    for _ in range(3):
        stats.add("failed")
    every = reported()
    assert (
        every.level == DiagnosticStatus.ERROR and "every frame since the last report failed" in every.message
    )
    stats.record(5.0, {})
    stats.add("failed")
    assert reported().level == DiagnosticStatus.WARN  # one answered, one failed
    assert reported().level == DiagnosticStatus.OK  # nothing at all
    stats.add("malformed")
    assert reported().level == DiagnosticStatus.ERROR  # only malformed frames


def test_image_qos_is_depth_one() -> None:
    from rclpy.qos import ReliabilityPolicy

    assert image_qos("best_effort").depth == 1
    assert image_qos("best_effort").reliability == ReliabilityPolicy.BEST_EFFORT
    assert image_qos("reliable").reliability == ReliabilityPolicy.RELIABLE


def test_a_frame_whose_camera_motion_cannot_be_estimated_is_counted_and_answered() -> None:
    """With the tracker on, a flat frame (a covered lens) between textured ones: its motion falls back to the
    identity, counted as frames_motion_fallback in the node's /diagnostics values, and every frame is answered."""
    import numpy as np
    import rclpy
    from rclpy.context import Context
    from rclpy.parameter import Parameter

    from tiled_detector.harness.process import apply_ros_environment
    from tiled_detector.messages.images import array_to_imgmsg
    from tiled_detector.ros.node import DetectorNode
    from tiled_detector.tools.worlds.synthetic import make_scene

    apply_ros_environment()
    context = Context()
    rclpy.init(context=context)
    node = DetectorNode(context=context)
    try:
        assert node.set_parameters([Parameter("tracker", value="bytetrack")])[0].successful
        scene = make_scene(5, 640, 480).image
        frames = [scene, np.full_like(scene, 90), scene]
        for index, image in enumerate(frames):
            msg = array_to_imgmsg(image, "rgb8")
            msg.header.stamp.sec, msg.header.stamp.nanosec = 100, index * 33_000_000
            node._on_image(msg)
            deadline = time.monotonic() + 30
            while node.stats.counts["processed"] < index + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert node.stats.counts["processed"] == 3
        assert node.stats.counts["motion_fallback"] == 2  # flat after textured, textured after flat
        assert node.stats.snapshot()["frames_motion_fallback"] == 2
    finally:
        node.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_camera_topics_map_each_camera_to_its_namespace() -> None:
    from tiled_detector.ros.cameras import CameraTopics, camera_topics

    assert camera_topics([]) == [CameraTopics("image", "image", "detections", "debug_image")]
    assert camera_topics([], compressed=True)[0].image == "image/compressed"
    front, rear = camera_topics(["/front/image_raw", "robot/rear/image/"], compressed=True)
    assert front == CameraTopics(
        "/front/image_raw",
        "/front/image_raw/compressed",
        "/front/detections",
        "/front/debug_image",
        "/front/masks",
        "/front/keypoints",
    )
    assert (rear.image, rear.detections) == ("robot/rear/image/compressed", "robot/rear/detections")
    with pytest.raises(ValueError, match="'/image' needs a namespace of its own"):
        camera_topics(["/front/image", "/image"])
    with pytest.raises(ValueError, match="would both publish on /front/detections"):
        camera_topics(["/front/image_raw", "/front/image_rect"])


def test_frames_of_several_cameras_go_through_one_detect_many_call(tmp_path) -> None:
    import cv2
    import numpy as np
    import rclpy
    from rclpy.context import Context
    from rclpy.parameter import Parameter

    from tiled_detector.harness.process import apply_ros_environment
    from tiled_detector.messages.images import array_to_imgmsg
    from tiled_detector.ros.node import DetectorNode

    apply_ros_environment()
    context = Context()
    rclpy.init(context=context)
    cameras = ["/a/image", "/b/image", "/c/image"]
    cv2.imwrite(str(tmp_path / "c.png"), np.full((2, 2), 255, np.uint8))
    masks = [f"/c/image={tmp_path / 'c.png'}"]  # camera c's own mask; the others have none
    node = DetectorNode(
        context=context,
        parameter_overrides=[Parameter("cameras", value=cameras), Parameter("ignore_mask", value=masks)],
    )
    try:
        node.shutdown()  # no worker: this test hands the frames over itself
        calls: list[tuple[int, list[int], list[str]]] = []
        detect_many = node._detector.detect_many

        def counted(frames, encodings, slots, cameras, tiles=None, on_device=None):
            calls.append((len(frames), list(slots), list(cameras)))
            return detect_many(
                frames, encodings, slots=slots, cameras=cameras, tiles=tiles, on_device=on_device
            )

        node._detector.detect_many = counted
        published: list[tuple[str, str]] = []
        for camera in node.cameras:
            camera.detections_pub.publish = lambda msg, t=camera.topics.detections: published.append(
                (t, msg.header.frame_id)
            )
        frames = [np.zeros((48 + 16 * i, 64, 3), np.uint8) for i in range(3)]
        messages = [array_to_imgmsg(f, "rgb8") for f in frames]
        for i, msg in enumerate(messages):
            msg.header.frame_id = f"cam_{i}"
        bad = array_to_imgmsg(frames[1], "rgb8")
        bad.data = bad.data[:10]  # a truncated frame: that camera's, counted; the others still detected
        node._loop.process([Arrival(0, messages[0], 0.0), Arrival(1, bad, 0.0), Arrival(2, messages[2], 0.0)])
        assert calls == [(2, [0, 2], ["/a/image", "/c/image"])]  # one batch, each camera its own upload slot
        assert node._detector.plan_for(80, 64, "/c/image").ignored.path == str(tmp_path / "c.png")
        assert node._detector.plan_for(80, 64, "/a/image").ignored is None
        assert published == [("/a/detections", "cam_0"), ("/c/detections", "cam_2")]
        assert node.cameras[1].stats.counts["malformed"] == 1 and node.stats.counts["malformed"] == 1
        node._loop.process([Arrival(i, m, 0.0) for i, m in enumerate(messages)])
        assert calls[-1][:2] == (3, [0, 1, 2]) and node._loop.largest_batch == 3
        assert [node.cameras[i].stats.counts["processed"] for i in range(3)] == [2, 1, 2]
        assert node.stats.counts["processed"] == 5
    finally:
        node.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_compressed_frames_use_the_gpu_decoder_and_png_falls_back_counted() -> None:
    import cv2
    import numpy as np
    import rclpy
    import torch
    from rclpy.context import Context
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import CompressedImage

    from tiled_detector.harness.process import apply_ros_environment
    from tiled_detector.pipeline.jpeg import is_jpeg
    from tiled_detector.ros.node import DetectorNode
    from tiled_detector.tools.worlds.synthetic import make_scene

    apply_ros_environment()
    context = Context()
    rclpy.init(context=context)
    node = DetectorNode(context=context, parameter_overrides=[Parameter("transport", value="compressed")])
    try:
        node.shutdown()  # no worker: this test hands the frames over itself
        assert node._gpu_jpeg is not None and not node._gpu_jpeg.available  # a CPU engine: OpenCV decodes

        class StandIn:  # what nvJPEG gives: an (H, W, 3) rgb8 tensor (on the CPU here)
            available, decoded = True, 0

            def decode(self, data):
                if not is_jpeg(data):
                    return None
                self.decoded += 1
                return torch.from_numpy(cv2.imdecode(data, cv2.IMREAD_COLOR)[..., ::-1].copy())

        node._gpu_jpeg = StandIn()
        frames: list[tuple[str, object]] = []
        detect_many = node._detector.detect_many

        def recorded(images, encodings, slots, cameras, tiles=None, on_device=None):
            frames.extend(zip(encodings, images, strict=True))
            return detect_many(
                images, encodings, slots=slots, cameras=cameras, tiles=tiles, on_device=on_device
            )

        node._detector.detect_many = recorded
        scene = make_scene(4, 320, 240).image
        for fmt, ext in (("jpeg", ".jpg"), ("png", ".png")):
            msg = CompressedImage(format=fmt)
            msg.data = cv2.imencode(ext, np.ascontiguousarray(scene[..., ::-1]))[1].tobytes()
            node._loop.process([Arrival(0, msg, 0.0)])
        assert node._gpu_jpeg.decoded == 1 and node.stats.counts["cpu_decoded"] == 1  # the PNG
        (jpeg_encoding, jpeg_frame), (png_encoding, png_frame) = frames
        assert jpeg_encoding == "rgb8" and isinstance(jpeg_frame, torch.Tensor)
        assert png_encoding == "bgr8" and isinstance(png_frame, np.ndarray)  # OpenCV's decode
        assert node.stats.counts["processed"] == 2
        assert node.stats.snapshot()["frames_cpu_decoded"] == 1  # on /diagnostics
    finally:
        node.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_mask_entries_must_name_a_camera_of_the_node() -> None:
    from pathlib import Path

    from tiled_detector.ros.cameras import check_mask_cameras

    check_mask_cameras([("", Path("m.png"))], [])
    check_mask_cameras(
        [("/front/image_raw", Path("f.png")), ("", Path("m.png"))], ["/front/image_raw/", "/rear/x"]
    )
    with pytest.raises(ValueError, match="no camera '/side/image_raw' \\(cameras: /front/image_raw\\)"):
        check_mask_cameras([("/side/image_raw", Path("s.png"))], ["/front/image_raw"])
    with pytest.raises(ValueError, match="the node has one input: give the mask's path alone"):
        check_mask_cameras([("/front/image_raw", Path("f.png"))], [])


def test_several_cameras_pair_their_own_depth_and_publish_their_own_detections_3d() -> None:
    import rclpy
    from rclpy.context import Context
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import CameraInfo, Image

    from tiled_detector.harness.process import apply_ros_environment
    from tiled_detector.messages.detections import msg_to_positions
    from tiled_detector.messages.images import array_to_imgmsg
    from tiled_detector.ros.depth import depth_topics
    from tiled_detector.ros.node import DetectorNode
    from tiled_detector.tools.worlds.synthetic import make_scene

    apply_ros_environment()
    context = Context()
    rclpy.init(context=context)
    cameras = ["/a/image", "/b/image", "/c/image"]
    overrides = [Parameter("cameras", value=cameras), Parameter("depth", value=True)]
    node = DetectorNode(context=context, parameter_overrides=overrides)
    try:
        node.shutdown()  # no worker: this test hands the frames over itself
        topics = [depth_topics(c.topics) for c in node.cameras]
        assert topics[0] == ("/a/depth_image", "/a/camera_info", "/a/detections_3d")
        published: list[tuple[str, object]] = []
        for publisher in node._depth.publishers:
            publisher.publish = lambda msg, t=publisher.topic_name: published.append((t, msg))
        frame = make_scene(5, 320, 240).image
        messages = []
        for index, metres in enumerate((4.0, 9.0, 6.0)):
            msg = array_to_imgmsg(frame, "rgb8")
            msg.header.stamp.sec = 10 + index
            messages.append(Arrival(index, msg, 0.0))
            depth = Image(height=120, width=160, encoding="32FC1", step=640)
            depth.data = np.full((120, 160), metres, np.float32).tobytes()
            depth.header.stamp.sec = 10 + index
            node._depth._on_depth(depth, index=index)
            if index < 2:  # camera c has no camera info yet: 2D only, counted for it alone
                info = CameraInfo(width=320, height=240, k=[300.0, 0, 159.5, 0, 300.0, 119.5, 0, 0, 1])
                node._depth._on_info(info, index=index)
        node._loop.process(messages)
        assert [t for t, _ in published] == ["/a/detections_3d", "/b/detections_3d"]
        for (_, msg), metres in zip(published, (4.0, 9.0), strict=True):
            _, positions, _ = msg_to_positions(msg)
            assert len(positions) and np.allclose(positions[:, 2], metres)
        assert node._depth.counts(2) == {"frames_without_depth": 1, "objects_without_depth": 0}
        assert node._depth.counts() == {"frames_without_depth": 1, "objects_without_depth": 0}
    finally:
        node.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_a_repeated_colour_stamp_gets_the_latest_depth_image() -> None:
    """A camera that stamps every frame 0 (or a paused sim clock): each frame is paired anew, the second with the
    depth image that came after the first (3 m), not the first frame's (1 m)."""
    import logging
    import time

    from sensor_msgs.msg import CameraInfo, Image

    from tiled_detector.ros.cameras import camera_topics
    from tiled_detector.ros.depth import DepthInputs

    class Node:
        def create_publisher(self, *args: object) -> None:
            return None

        def get_logger(self) -> logging.Logger:
            return logging.getLogger("test")

    inputs = DepthInputs(Node(), camera_topics([]))
    inputs._on_info(CameraInfo(width=4, height=4, k=[4.0, 0, 1.5, 0, 4.0, 1.5, 0, 0, 1]), index=0)
    held = []
    for value in (1000, 3000):
        depth = Image(height=4, width=4, encoding="16UC1", step=8)
        depth.data = np.full((4, 4), value, np.uint16).tobytes()  # mm; the header stamp stays 0
        inputs._on_depth(depth, index=0)
        paired = inputs.depth_for(0, 0, (4, 4), 0.02, time.monotonic())
        held.append(int(np.asarray(paired.image).max()))
    assert held == [1000, 3000]


def test_images_arrive_as_bytes_read_in_place_and_a_malformed_one_is_skipped_there() -> None:
    """The node takes Image messages raw: a frame's fields are read from its bytes (its pixels a view of them, its
    header a std_msgs/Header), it is detected and published with that header; a malformed one is counted and skipped
    as it arrives, before any conversion, and never reaches the worker."""
    import rclpy
    from rclpy.context import Context
    from rclpy.serialization import serialize_message
    from std_msgs.msg import Header

    from tiled_detector.harness.process import apply_ros_environment
    from tiled_detector.messages.images import array_to_imgmsg
    from tiled_detector.ros.node import DetectorNode

    apply_ros_environment()
    context = Context()
    rclpy.init(context=context)
    node = DetectorNode(context=context)
    try:
        node.shutdown()  # no worker: this test hands the frames over itself
        frame = np.random.default_rng(0).integers(0, 255, (48, 64, 3), np.uint8)
        good = array_to_imgmsg(frame, "rgb8")
        good.header.frame_id, good.header.stamp.sec, good.header.stamp.nanosec = "cam", 7, 5
        short = array_to_imgmsg(frame, "rgb8")
        short.data = short.data[:10]
        data = serialize_message(good)
        node._on_image(data)
        node._on_image(serialize_message(short))
        counts = node.stats.counts
        assert (counts["received"], counts["malformed"], counts["dropped"]) == (2, 1, 0)
        [(index, arrival)] = node._slots.take(timeout=0.0)
        msg = arrival.message
        assert index == 0 and isinstance(msg.header, Header) and msg.header.frame_id == "cam"
        assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (7, 5)
        assert np.shares_memory(np.frombuffer(msg.data, np.uint8), np.frombuffer(data, np.uint8))
        published = []
        node.cameras[0].detections_pub.publish = published.append
        node._loop.process([arrival])
        assert [p.header.frame_id for p in published] == ["cam"] and counts["processed"] == 1
    finally:
        node.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)
