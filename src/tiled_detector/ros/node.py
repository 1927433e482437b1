"""The `tiled_detector` ROS 2 node: camera images in, vision_msgs/Detection2DArray out.

Latest-frame semantics: the subscription callbacks only keep the newest frame of each camera; one worker thread
runs the pipeline, so no queue can grow when the model is slower than the cameras; overwritten frames are counted
as dropped. With several cameras (`cameras`), each cycle takes the newest frame of every camera that has one and
detects them all in one engine batch (`TiledDetector.detect_many`); a silent camera holds back no other. Everything numeric lives in the ROS-free core (`tiled_detector.detector`); this module converts
messages, owns parameters, QoS and threads, and reports /diagnostics.
"""

from __future__ import annotations

import difflib
import functools
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import CompressedImage, Image
from vision_msgs.msg import Detection2DArray

from tiled_detector.annotate import annotate, annotated_encoding
from tiled_detector.config import DetectorConfig
from tiled_detector.errors import one_line
from tiled_detector.parameters import build_detector, runtime_changes
from tiled_detector.ros.cameras import CameraTopics, camera_topics
from tiled_detector.ros.detections import detections_to_msg
from tiled_detector.ros.diagnostics import input_problem, problems, status
from tiled_detector.ros.images import (
    ImageConversionError,
    array_to_imgmsg,
    compressed_to_array,
    imgmsg_to_array,
)
from tiled_detector.ros.params import BY_NAME, PARAMS, USAGE, declared_value, descriptor
from tiled_detector.ros.stats import FrameSlots, Stats
from tiled_detector.types import Detections

try:  # Iron and later
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:  # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks

NODE_NAME = "tiled_detector"
WARN_EVERY_S = 60.0  # the silent-input WARN is repeated at most this often
SPIN_WAKE_S = 0.25  # the executor wakes at least this often (wall clock), so Ctrl-C never waits on sim time


def image_qos(reliability: str) -> QoSProfile:
    """Depth-1 keep-last image QoS; best effort (sensor data) unless `reliable` is asked for."""
    return QoSProfile(
        depth=1,
        history=HistoryPolicy.KEEP_LAST,
        reliability=ReliabilityPolicy.RELIABLE
        if reliability == "reliable"
        else ReliabilityPolicy.BEST_EFFORT,
    )


@dataclass(eq=False)
class Camera:
    """One input: its topics, its counters (the node's own with a single camera), its subscription and
    publishers, when its last frame arrived and that frame's size."""

    topics: CameraTopics
    stats: Stats
    subscription: Any = None
    detections_pub: Any = None
    debug_pub: Any = None
    last_frame: float = field(default_factory=time.monotonic)
    last_hw: tuple[int, int] | None = None


class DetectorNode(Node):
    """Subscribes `image` (or `image/compressed`; or every topic of `cameras`), publishes `detections` (per
    camera), `debug_image` and `/diagnostics`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._check_override_types()
        for param in PARAMS:
            described = descriptor(param)
            # `model` becomes read-only once the loaded path is known (_show_loaded_model)
            described.read_only &= param.name != "model"
            self.declare_parameter(param.name, declared_value(param), described)
        self._warn_unknown_overrides()
        values = {p.name: self.get_parameter(p.name).value for p in PARAMS}
        for param in PARAMS:
            reason = param.check(values[param.name])
            if reason:
                raise ValueError(reason)

        detector = build_detector(values)
        values["model"] = self._show_loaded_model(str(detector.config.model))
        self.labels = list(detector.labels or ())
        # used by the worker thread (it applies parameter changes between frames)
        self._detector = detector
        # the detector settings and the parameter values they come from, swapped together under the lock
        self._state = (detector.config, values)
        self._state_lock = threading.Lock()

        self.stats = Stats()  # every camera's frames
        compressed = values["transport"] == "compressed"
        topics = camera_topics(values["cameras"] or (), compressed)
        self.cameras = [Camera(t, self.stats if len(topics) == 1 else Stats()) for t in topics]
        self._slots = FrameSlots(len(self.cameras))
        self._stop = threading.Event()
        self._warned_silent = -WARN_EVERY_S
        self._warned_mono = False
        self._largest_batch = 0  # most frames (cameras) detected in one batch so far
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        for index, camera in enumerate(self.cameras):
            camera.detections_pub = self.create_publisher(Detection2DArray, camera.topics.detections, 10)
            camera.debug_pub = self.create_publisher(Image, camera.topics.debug_image, 1)
            camera.subscription = self.create_subscription(
                CompressedImage if compressed else Image,
                camera.topics.image,
                functools.partial(self._on_image, index=index),
                image_qos(values["image_reliability"]),
                event_callbacks=SubscriptionEventCallbacks(
                    message_lost=functools.partial(self._on_message_lost, index=index),
                    incompatible_qos=functools.partial(self._on_incompatible_qos, index=index),
                ),
            )
        self._convert = compressed_to_array if compressed else imgmsg_to_array
        self.add_on_set_parameters_callback(self._on_set_parameters)
        # wall-clock timer: /diagnostics keep coming when use_sim_time is on and /clock is paused or absent
        self.create_timer(
            values["diagnostics_period"],
            self._publish_diagnostics,
            clock=Clock(clock_type=ClockType.STEADY_TIME),
        )
        self._worker = threading.Thread(target=self._run, name="tiled-detector-worker", daemon=True)
        self._worker.start()
        engine, config = detector.engine, detector.config
        self.get_logger().debug(f"parameters: {values}")
        self.get_logger().info(
            f"ready: model={config.model} backend={engine.backend.value} device={engine.device} "
            f"precision={engine.precision.value} "
            f"input={', '.join(c.subscription.topic_name for c in self.cameras)} "
            f"tiles={values['tile_width']}x{values['tile_height']} overlap={values['overlap']}"
        )

    def _check_override_types(self) -> None:
        """Refuse a parameter given with the wrong type (params file or -p) instead of ignoring it; an integer
        for a floating-point parameter (`conf_threshold: 1`) is taken as that number."""
        overrides = getattr(self, "_parameter_overrides", {})
        for param in PARAMS:
            given = overrides.get(param.name)
            if given is None or param.value_type is list:
                continue
            value = given.value
            if param.value_type is float and isinstance(value, int) and not isinstance(value, bool):
                overrides[param.name] = Parameter(param.name, value=float(value))
            elif not isinstance(value, param.value_type) or isinstance(value, bool) != (
                param.value_type is bool
            ):
                example = param.default if param.default is not None else "..."
                raise ValueError(
                    f"parameter {param.name} must be a {param.value_type.__name__} (e.g. {param.name}: {example!r}), "
                    f"got {value!r} ({type(value).__name__}) from the params file or -p"
                )

    def _warn_unknown_overrides(self) -> None:
        """One WARN per parameter given (params file, -p) that the node does not have, naming the nearest."""
        known = set(self._parameters)
        for name in sorted(set(getattr(self, "_parameter_overrides", {})) - known):
            if name.startswith("qos_overrides."):
                continue
            nearest = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
            self.get_logger().warning(f"unknown parameter {name!r} ignored{hint}")

    def _show_loaded_model(self, path: str) -> str:
        """Re-declare the read-only `model` parameter with the path actually loaded (e.g. the bundled model)."""
        self.undeclare_parameter("model")
        self.declare_parameter("model", path, descriptor(BY_NAME["model"]), ignore_override=True)
        return path

    # --- callbacks -------------------------------------------------------------------------------------------

    def _count(self, camera: Camera, name: str, count: int = 1) -> None:
        """Count an event of `camera` (in its counters and, with several cameras, the node's)."""
        camera.stats.add(name, count)
        if camera.stats is not self.stats:
            self.stats.add(name, count)

    def _on_image(self, msg: Image | CompressedImage, index: int = 0) -> None:
        camera = self.cameras[index]
        camera.last_frame = time.monotonic()
        self._count(camera, "received")
        if self._slots.put(index, (msg, camera.last_frame)):
            self._count(camera, "dropped")

    def _on_message_lost(self, info: Any, index: int = 0) -> None:
        """The middleware saw frames that never reached this subscription (e.g. a full transport)."""
        self._count(self.cameras[index], "lost", int(info.total_count_change))

    def _on_incompatible_qos(self, info: Any, index: int = 0) -> None:
        self.get_logger().warning(
            f"a publisher of {self.cameras[index].subscription.topic_name} has a QoS this subscription cannot match "
            f"(policy id {info.last_policy_kind}); set image_reliability to match it",
            throttle_duration_sec=WARN_EVERY_S,
        )

    def _on_set_parameters(self, params: Sequence[Parameter]) -> SetParametersResult:
        changed = {p.name: p.value for p in params if p.name in BY_NAME}
        for name, value in changed.items():
            reason = BY_NAME[name].check(value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        current, values = self._current()
        merged = {**values, **changed}
        runtime = {k: merged[k] for k in changed if not BY_NAME[k].read_only}
        if "tile_width" in runtime or "tile_height" in runtime:
            runtime.update(tile_width=merged["tile_width"], tile_height=merged["tile_height"])
        try:
            candidate = current.replace(**runtime_changes(runtime, self.labels))
        except ValueError as error:
            return SetParametersResult(successful=False, reason=str(error))
        with self._state_lock:
            self._state = (candidate, merged)
        return SetParametersResult(successful=True)

    def _current(self) -> tuple[DetectorConfig, dict[str, Any]]:
        with self._state_lock:
            return self._state

    # --- worker ----------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            items = self._slots.take(timeout=0.1)
            if not items:
                continue
            try:
                self._process(items)
            except Exception:
                for index, _ in items:
                    self._count(self.cameras[index], "failed")
                self.get_logger().error(
                    f"a frame failed:\n{traceback.format_exc()}", throttle_duration_sec=2.0
                )

    def _process(self, items: list[tuple[int, tuple[Image | CompressedImage, float]]]) -> None:
        """Convert the newest frame of each camera in `items` ((camera index, (message, arrival time))), detect
        them in one batch and publish each camera's detections with its frame's header."""
        config, values = self._current()
        detector = self._detector
        if detector.config is not config:  # new runtime parameters: re-plan, keeping engine and buffers
            detector.reconfigure(config)
        batch = []
        for index, (msg, received) in items:
            try:
                frame, encoding = self._convert(msg)
            except ImageConversionError as error:
                self._count(self.cameras[index], "malformed")
                self.get_logger().warning(
                    f"skipped a malformed image{self._on_topic(index)}: {error}", throttle_duration_sec=2.0
                )
                continue
            batch.append((index, msg, received, frame, encoding))
        self._largest_batch = max(self._largest_batch, len(batch))
        labels = self.labels if values["output_format"] == "labels" else None
        for (index, msg, received, frame, encoding), detections in zip(
            batch, self._detect(batch), strict=True
        ):
            if detections is None:
                continue
            camera = self.cameras[index]
            camera.last_hw = frame.shape[:2]
            if encoding.startswith("mono") and not self._warned_mono:
                self._warned_mono = True
                self.get_logger().warning(
                    f"{msg.encoding} frames: the model takes colour; each grey value is repeated in R, G and B "
                    "(16-bit scaled to [0, 1]), which a colour-trained model may detect poorly. Said once."
                )
            camera.detections_pub.publish(
                detections_to_msg(
                    detections.boxes, detections.scores, detections.class_ids, msg.header, labels
                )
            )
            if camera.debug_pub.get_subscription_count() > 0:
                plan = detector.plan_for(frame.shape[0], frame.shape[1])
                drawn = annotate(frame, detections, self.labels, plan.tiles)
                camera.debug_pub.publish(array_to_imgmsg(drawn, annotated_encoding(encoding), msg.header))
            latency_ms = (time.monotonic() - received) * 1e3
            camera.stats.record(latency_ms, detections.timings)
            if camera.stats is not self.stats:
                self.stats.record(latency_ms, detections.timings)

    def _detect(self, batch: list[tuple[int, Any, float, Any, str]]) -> list[Detections | None]:
        """Detections of every (camera, message, arrival, frame, encoding) of `batch`, all in one batch; when
        that fails, each frame alone, so that one bad frame costs only its own camera (None: failed, counted)."""
        if not batch:
            return []
        try:
            return list(self._detector.detect_many(
                [b[3] for b in batch], [b[4] for b in batch], slots=[b[0] for b in batch]
            ))  # fmt: skip
        except (RuntimeError, ValueError) as error:
            if len(batch) == 1:
                self._count(self.cameras[batch[0][0]], "failed")
                self.get_logger().error(
                    f"detection failed for one frame{self._on_topic(batch[0][0])}: {error}",
                    throttle_duration_sec=2.0,
                )
                return [None]
        return [self._detect([item])[0] for item in batch]

    def _on_topic(self, index: int) -> str:
        """' on <topic>' with several cameras (which camera a log line is about), else ''."""
        return f" on {self.cameras[index].subscription.topic_name}" if len(self.cameras) > 1 else ""

    def _publish_diagnostics(self) -> None:
        """One `pipeline` status (every camera's frames together), and with several cameras one status per
        camera (its rates, drops, latency, topics and publishers)."""
        config, _ = self._current()
        detector = self._detector
        engine = detector.engine
        publishers = [c.subscription.get_publisher_count() for c in self.cameras]
        silent = [
            input_problem(c.subscription.topic_name, c.last_frame, n)
            for c, n in zip(self.cameras, publishers, strict=True)
        ]
        unexplained = [s for s, n in zip(silent, publishers, strict=True) if s and n]  # publishers, no frames
        if unexplained and time.monotonic() - self._warned_silent >= WARN_EVERY_S:
            self._warned_silent = time.monotonic()
            for text in unexplained:
                self.get_logger().warning(text)
        info: dict[str, Any] = {
            "backend": engine.backend.value,
            "device": str(engine.device),
            "precision": engine.precision.value,
            "model": str(config.model),
            "tile_size": "x".join(map(str, config.tile_size)),
            "full_frame": str(config.full_frame),
            "input_publishers": sum(publishers),
        }
        plans = [detector.plan_for(*c.last_hw) for c in self.cameras if c.last_hw is not None]
        if plans:
            if len(self.cameras) == 1:
                info["tiles_per_frame"] = len(plans[0].tiles)
            else:
                info.update(cameras=len(self.cameras), largest_batch_frames=self._largest_batch)
            info["batch_size"] = sum(p.batch_size for p in plans)
        values, name = self.stats.snapshot(), self.get_fully_qualified_name()
        found = problems(values) + [s for s in silent if s]
        statuses = [status(f"{name}: pipeline", {**values, **info}, found, str(engine.device))]
        if len(self.cameras) > 1:
            for camera, count, problem in zip(self.cameras, publishers, silent, strict=True):
                own = camera.stats.snapshot()
                own.update(image_topic=camera.subscription.topic_name, input_publishers=count,
                           detections_topic=camera.detections_pub.topic_name)  # fmt: skip
                if camera.last_hw is not None:
                    own["frame_size"] = f"{camera.last_hw[1]}x{camera.last_hw[0]}"
                found = problems(own) + ([problem] if problem else [])
                statuses.append(
                    status(f"{name}: camera {camera.topics.name}", own, found, str(engine.device))
                )
        msg = DiagnosticArray(status=statuses)
        msg.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(msg)

    def shutdown(self) -> None:
        """Stop and join the worker thread."""
        self._stop.set()
        self._slots.close()
        self._worker.join(timeout=10)


def main(args: Sequence[str] | None = None) -> int:
    """Run the node until Ctrl-C / SIGTERM: exit 0 after a clean shutdown, 1 when the node cannot start."""
    argv = list(sys.argv if args is None else args)
    ros_args_at = argv.index("--ros-args") if "--ros-args" in argv else len(argv)
    if {"-h", "--help"} & set(argv[1:ros_args_at]):
        print(USAGE)
        return 0
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except RuntimeError as error:  # rclpy's RCLError: unreadable params file or --ros-args
        print(f"[{NODE_NAME}] cannot start: {error}", file=sys.stderr)
        return 1
    # Ctrl-C / SIGTERM end the node, also when started from a background job (which inherits SIGINT ignored),
    # as rclpy's own handlers do; launch stops nodes with SIGINT
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    node: DetectorNode | None = None
    try:
        try:
            node = DetectorNode()
        except Exception as error:  # the process boundary: one line (bad parameter, model, backend, device)
            if os.environ.get("TILED_DETECTOR_DEBUG"):
                traceback.print_exc()
            print(f"[{NODE_NAME}] cannot start: {one_line(error)}", file=sys.stderr)
            return 1
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        while rclpy.ok():  # a wall-clock wake-up: Ctrl-C is handled even while sim time stands still
            executor.spin_once(timeout_sec=SPIN_WAKE_S)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        # a second signal (launch forwards SIGINT to a process that got the group's) must not cut the cleanup
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        if node is not None:
            node.shutdown()
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
