"""The `tiled_detector` ROS 2 node: camera images in, vision_msgs/Detection2DArray out.

Latest-frame semantics: the subscription callback only keeps the newest frame; one worker thread runs the
pipeline, so no queue can grow when the model is slower than the camera; overwritten frames are counted as
dropped. Everything numeric lives in the ROS-free core (`tiled_detector.detector`); this module converts
messages, owns parameters, QoS and threads, and reports /diagnostics.
"""

from __future__ import annotations

import difflib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
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
from tiled_detector.ros.detections import detections_to_msg
from tiled_detector.ros.fastdds import FASTDDS_PROFILE
from tiled_detector.ros.images import (
    ImageConversionError,
    array_to_imgmsg,
    compressed_to_array,
    imgmsg_to_array,
)
from tiled_detector.ros.params import BY_NAME, PARAMS, USAGE, declared_value, descriptor
from tiled_detector.ros.stats import FrameSlot, Stats

try:  # Iron and later
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:  # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks

NODE_NAME = "tiled_detector"
SILENT_AFTER_S = 3.0  # no frame for this long while the input has publishers: WARN (and /diagnostics)
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


class DetectorNode(Node):
    """Subscribes `image` (or `image/compressed`), publishes `detections`, `debug_image` and `/diagnostics`."""

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

        self.stats = Stats()
        self._last_hw: tuple[int, int] | None = None
        self._slot = FrameSlot()
        self._stop = threading.Event()
        self._last_frame = time.monotonic()
        self._warned_silent = -WARN_EVERY_S
        self._warned_mono = False
        self.detections_pub = self.create_publisher(Detection2DArray, "detections", 10)
        self.debug_pub = self.create_publisher(Image, "debug_image", 1)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        compressed = values["transport"] == "compressed"
        self.image_sub = self.create_subscription(
            CompressedImage if compressed else Image,
            "image/compressed" if compressed else "image",
            self._on_image,
            image_qos(values["image_reliability"]),
            event_callbacks=SubscriptionEventCallbacks(
                message_lost=self._on_message_lost, incompatible_qos=self._on_incompatible_qos
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
            f"precision={engine.precision.value} input={self.image_sub.topic_name} "
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

    def _on_image(self, msg: Image | CompressedImage) -> None:
        self.stats.add("received")
        self._last_frame = time.monotonic()
        if self._slot.put((msg, self._last_frame)):
            self.stats.add("dropped")

    def _on_message_lost(self, info: Any) -> None:
        """The middleware saw frames that never reached this subscription (e.g. a full transport)."""
        self.stats.add("lost", int(info.total_count_change))

    def _on_incompatible_qos(self, info: Any) -> None:
        self.get_logger().warning(
            f"a publisher of {self.image_sub.topic_name} has a QoS this subscription cannot match "
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
            item = self._slot.take(timeout=0.1)
            if item is None:
                continue
            try:
                self._process(*item)
            except Exception:
                self.stats.add("failed")
                self.get_logger().error(
                    f"a frame failed:\n{traceback.format_exc()}", throttle_duration_sec=2.0
                )

    def _process(self, msg: Image | CompressedImage, received: float) -> None:
        config, values = self._current()
        detector = self._detector
        if detector.config is not config:  # new runtime parameters: re-plan, keeping engine and buffers
            detector.reconfigure(config)
        try:
            frame, encoding = self._convert(msg)
        except ImageConversionError as error:
            self.stats.add("malformed")
            self.get_logger().warning(f"skipped a malformed image: {error}", throttle_duration_sec=2.0)
            return
        try:
            detections = detector.detect(frame, encoding)
        except (RuntimeError, ValueError) as error:
            self.stats.add("failed")
            self.get_logger().error(f"detection failed for one frame: {error}", throttle_duration_sec=2.0)
            return
        self._last_hw = frame.shape[:2]
        if encoding.startswith("mono") and not self._warned_mono:
            self._warned_mono = True
            self.get_logger().warning(
                f"{msg.encoding} frames: the model takes colour; each grey value is repeated in R, G and B (16-bit "
                "scaled to [0, 1]), which a colour-trained model may detect poorly. Said once."
            )
        labels = self.labels if values["output_format"] == "labels" else None
        self.detections_pub.publish(
            detections_to_msg(detections.boxes, detections.scores, detections.class_ids, msg.header, labels)
        )
        if self.debug_pub.get_subscription_count() > 0:
            plan = detector.plan_for(frame.shape[0], frame.shape[1])
            drawn = annotate(frame, detections, self.labels, plan.tiles)
            self.debug_pub.publish(array_to_imgmsg(drawn, annotated_encoding(encoding), msg.header))
        self.stats.record((time.monotonic() - received) * 1e3, detections.timings)

    def _input_problem(self, publishers: int) -> str | None:
        """Why no frame arrives, when none has for `SILENT_AFTER_S` (None while frames flow)."""
        silent_s = time.monotonic() - self._last_frame
        if silent_s < SILENT_AFTER_S:
            return None
        topic = self.image_sub.topic_name
        if not publishers:
            return f"no publisher on {topic}"
        profile = os.environ.get("FASTDDS_DEFAULT_PROFILES_FILE") or str(FASTDDS_PROFILE)
        return (
            f"{topic} has {publishers} publisher(s) but no frame arrived for {silent_s:.0f} s: large images need "
            f"the shared-memory Fast DDS profile in the publisher's environment too: "
            f"export FASTDDS_DEFAULT_PROFILES_FILE={profile} before starting the camera driver / ros2 bag play"
        )

    def _publish_diagnostics(self) -> None:
        config, _ = self._current()
        detector = self._detector
        values = self.stats.snapshot()
        engine = detector.engine
        publishers = self.image_sub.get_publisher_count()
        info = {
            "backend": engine.backend.value,
            "device": str(engine.device),
            "precision": engine.precision.value,
            "model": str(config.model),
            "tile_size": "x".join(map(str, config.tile_size)),
            "full_frame": str(config.full_frame),
            "input_publishers": publishers,
        }
        if self._last_hw is not None:
            plan = detector.plan_for(*self._last_hw)
            info["tiles_per_frame"] = len(plan.tiles)
            info["batch_size"] = plan.batch_size
        silent = self._input_problem(publishers)
        if silent and publishers and time.monotonic() - self._warned_silent >= WARN_EVERY_S:
            self._warned_silent = time.monotonic()
            self.get_logger().warning(silent)
        lost = values["lost_since_last"]
        problems = [
            text
            for count, text in (
                (values["malformed_since_last"], "skipping malformed frames"),
                (values["failed_since_last"], "frames failed"),
                (lost, f"{lost} frame(s) lost before the node (transport)"),
            )
            if count
        ]
        if silent:
            problems.append(silent)
        status = DiagnosticStatus(
            level=DiagnosticStatus.WARN if problems else DiagnosticStatus.OK,
            name=f"{self.get_fully_qualified_name()}: pipeline",
            message="; ".join(problems) or "ok",
            hardware_id=str(engine.device),
            values=[KeyValue(key=k, value=f"{v:.3f}" if isinstance(v, float) else str(v))
                    for k, v in {**values, **info}.items()],
        )  # fmt: skip
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(msg)

    def shutdown(self) -> None:
        """Stop and join the worker thread."""
        self._stop.set()
        self._slot.close()
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
