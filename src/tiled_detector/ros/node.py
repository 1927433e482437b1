"""The `tiled_detector` ROS 2 node: camera images in, vision_msgs/Detection2DArray out.

Latest-frame semantics: the subscription callbacks only keep the newest frame of each camera; one worker thread
runs the pipeline, so no queue can grow when the model is slower than the cameras; overwritten frames are counted
as dropped. The worker's loop is ROS-free (`ros.worker`: each cycle takes the newest frame of every camera the
engine share lets through, in one engine batch through the stream); this module converts messages, owns
parameters, QoS, publishers and threads, and reports /diagnostics.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image
from vision_msgs.msg import Detection2DArray, VisionInfo

from tiled_detector.config import DetectorConfig
from tiled_detector.messages.detections import detections_to_msg
from tiled_detector.messages.images import (
    array_to_imgmsg,
    byte_view,
    compressed_to_array,
    imgmsg_to_array,
    stamp_ns,
)
from tiled_detector.messages.vision_info import LABELS_PARAMETER, label_info, vision_info
from tiled_detector.parameters import build_detector
from tiled_detector.pipeline.jpeg import GpuJpegDecoder
from tiled_detector.pipeline.tiling import make_plan
from tiled_detector.ros.cameras import camera_topics, check_mask_cameras
from tiled_detector.ros.depth import DepthInputs
from tiled_detector.ros.diagnostics import input_problem, problems, status
from tiled_detector.ros.inputs import OVERRIDABLE, WARN_EVERY_S, Camera, CameraInputs, image_qos
from tiled_detector.ros.keypoints import KeypointOutputs, keypoint_outputs
from tiled_detector.ros.node_parameters import NodeParameters
from tiled_detector.ros.params import PARAMS
from tiled_detector.ros.run import run_node
from tiled_detector.ros.share import EngineShare
from tiled_detector.ros.stats import FrameSlots, Stats
from tiled_detector.ros.worker import Arrival, Worker
from tiled_detector.stream import Job, Stream, StreamResult, budget_problem
from tiled_detector.tools.annotate import annotate, annotated_encoding

try:  # vision_msgs 4.x (Humble and later)
    from vision_msgs.msg import LabelInfo
except ImportError:  # older vision_msgs have none: VisionInfo only
    LabelInfo = None

NODE_NAME = "tiled_detector"
# vision_info and label_info: published once per configuration (activation), kept for subscribers that come later
VISION_INFO_QOS = QoSProfile(
    depth=1,
    history=HistoryPolicy.KEEP_LAST,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.TRANSIENT_LOCAL,
)


class DetectorNodeBase(CameraInputs, NodeParameters):
    """The detector node's work in phases, shared by the plain node (all of them at start) and the managed
    (lifecycle) one: `_declare` the parameters; `_configure` loads the engine and makes the publishers and the
    diagnostics timer; `_activate` subscribes the cameras and starts the worker; `_deactivate` stops taking
    frames; `_cleanup` frees the engine (and the GPU memory it held) and the publishers. Mixed into an rclpy
    `Node` or `LifecycleNode`.
    """

    _detector: Any = None
    _worker: threading.Thread | None = None
    _timer: Any = None
    diagnostics_pub: Any = None
    vision_info_pub: Any = None
    # per-camera tracks and tile schedules, kept (with the track id counters) for the node's life
    _stream: Stream | None = None
    cameras: list[Camera] = []  # noqa: RUF012 -- replaced per instance by _configure
    _depth: DepthInputs | None = None  # `depth: true`: the depth inputs and detections_3d (ros/depth.py)
    _keypoints: KeypointOutputs | None = None  # a pose model's keypoints topics (ros/keypoints.py)
    label_info_pub: Any = None
    # qos_overrides already warned about as matching no endpoint
    _said_overrides: frozenset[str] = frozenset()

    def _configure(self) -> None:
        values = {p.name: self.get_parameter(p.name).value for p in PARAMS}
        for param in PARAMS:
            reason = param.check(values[param.name])
            if reason:
                raise ValueError(reason)
        compressed = values["transport"] == "compressed"
        topics = camera_topics(values["cameras"] or (), compressed)
        detector = build_detector(values)
        check_mask_cameras(detector.config.ignore_mask, values["cameras"])
        values["model"] = self._show_loaded("model", str(detector.config.model))
        self.labels = list(detector.labels or ())
        # the class names in use, readable as the parameter VisionInfo points to
        values[LABELS_PARAMETER] = self._show_loaded(LABELS_PARAMETER, self.labels)
        # used by the worker thread (it applies parameter changes between frames)
        self._detector = detector
        if self._stream is None:
            self._stream = Stream(detector)
        self._stream.detector = detector
        # the detector settings and the parameter values they come from, swapped together under the lock
        with self._state_lock:
            self._state = (detector.config, values)
        self.stats = Stats()  # every camera's frames
        self.cameras = [Camera(t, self.stats if len(topics) == 1 else Stats()) for t in topics]
        self._warned_silent = -WARN_EVERY_S
        self._warned_mono = False
        self._frame_hw: dict[
            int, tuple[int, int]
        ] = {}  # camera index -> its last frame's size (the worker's)
        self._loop: Worker | None = None
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.vision_info_pub = self.output_publisher(VisionInfo, "vision_info", VISION_INFO_QOS)
        self.label_info_pub = (
            self.output_publisher(LabelInfo, "label_info", VISION_INFO_QOS) if LabelInfo is not None else None
        )
        for camera in self.cameras:
            camera.image_topic = self.resolve_topic_name(camera.topics.image)
            camera.detections_pub = self.output_publisher(
                Detection2DArray, camera.topics.detections, 10, qos_overriding_options=OVERRIDABLE
            )
            camera.debug_pub = self.output_publisher(
                Image, camera.topics.debug_image, 1, qos_overriding_options=OVERRIDABLE
            )
            if detector.resolved.segments:  # a segmentation model's label images
                camera.masks_pub = self.output_publisher(
                    Image, camera.topics.masks, 10, qos_overriding_options=OVERRIDABLE
                )
        self._keypoints = keypoint_outputs(self, detector, [c.topics for c in self.cameras], VISION_INFO_QOS)
        self._depth = (
            DepthInputs(
                self,
                [c.topics for c in self.cameras],
                OVERRIDABLE,
                publisher=self.output_publisher,
                destroy=self.destroy_output,
            )
            if detector.config.depth
            else None
        )
        self._convert = compressed_to_array if compressed else imgmsg_to_array
        self._gpu_jpeg = GpuJpegDecoder(detector.engine.device) if compressed else None
        if (
            self._gpu_jpeg is not None
            and detector.engine.device.type == "cuda"
            and not self._gpu_jpeg.available
        ):
            self.get_logger().info(
                "JPEG frames are decoded by OpenCV on the CPU: torchvision's decode_jpeg does not import here"
            )
        # wall-clock timer: /diagnostics keep coming when use_sim_time is on and /clock is paused or absent
        self._timer = self.create_timer(
            values["diagnostics_period"],
            self._publish_diagnostics,
            clock=Clock(clock_type=ClockType.STEADY_TIME),
        )
        self.get_logger().debug(f"parameters: {values}")

    def _activate(self) -> None:
        _, values = self._current()
        compressed = values["transport"] == "compressed"
        self._subscribe_cameras(values["image_reliability"], compressed)
        if self._depth is not None:
            self._depth.subscribe(image_qos(values["image_reliability"]))
        self._warn_unused_qos_overrides()
        self._slots = FrameSlots(len(self.cameras))
        self._share = EngineShare(len(self.cameras))  # a costly camera cannot set the pace for the others
        self._loop = Worker(
            self,
            self._stream,
            [c.topics.name for c in self.cameras],
            [self._mask_camera(i) for i in range(len(self.cameras))],
            self._slots,
            self._share,
            self._frame_hw,
        )
        self._stop = threading.Event()
        self._worker = threading.Thread(
            target=self._loop.run, args=(self._stop,), name="tiled-detector-worker", daemon=True
        )
        self._worker.start()
        engine, config = self._detector.engine, self._detector.config
        self.get_logger().info(
            f"ready: model={config.model} backend={engine.backend.value} device={engine.device} "
            f"precision={engine.precision.value} "
            f"input={', '.join(c.image_topic for c in self.cameras)} "
            f"tiles={values['tile_width']}x{values['tile_height']} overlap={values['overlap']}"
        )

    def _publish_info(self) -> None:
        """Publish what the detections mean: VisionInfo and (where vision_msgs has it) LabelInfo."""
        config, values = self._current()
        header = self._now_header()
        engine = self._detector.engine
        names = values["output_format"] == "labels"
        backend, precision = engine.backend.value, engine.precision.value
        self.vision_info_pub.publish(
            vision_info(config.model, backend, precision, self.labels, header, names)
        )
        if self.label_info_pub is not None:
            self.label_info_pub.publish(label_info(self.labels, config.conf_threshold, header))
        if self._keypoints is not None:
            self._keypoints.publish_info(header)

    def _warn_unused_qos_overrides(self) -> None:
        """One WARN per `qos_overrides.*` value given that matches no endpoint of this node (rclpy declares the
        ones it honours when an endpoint is created: the image subscriptions and the output publishers)."""
        given = {n for n in getattr(self, "_parameter_overrides", {}) if n.startswith("qos_overrides.")}
        unused = sorted(given - set(self._parameters) - self._said_overrides)
        for name in unused:
            self.get_logger().warning(
                f"{name} ignored: no endpoint of this node matches it (qos_overrides.<resolved topic>."
                "<subscription|publisher>.<history|depth|reliability> of the image subscriptions and the outputs)"
            )
        self._said_overrides |= frozenset(unused)

    def _changed(self, before: DetectorConfig, after: DetectorConfig) -> None:
        """Runtime settings changed: LabelInfo's threshold follows `conf_threshold`."""
        if after.conf_threshold != before.conf_threshold and self.label_info_pub is not None:
            self.label_info_pub.publish(label_info(self.labels, after.conf_threshold, self._now_header()))

    def _now_header(self) -> Any:
        """A header stamped now (the node's clock), no frame."""
        header = Detection2DArray().header
        header.stamp = self.get_clock().now().to_msg()
        return header

    def output_publisher(self, msg_type: Any, topic: str, qos: Any, **kwargs: Any) -> Any:
        """An output publisher (the managed node's publish only while it is active)."""
        return self.create_publisher(msg_type, topic, qos, **kwargs)

    def destroy_output(self, publisher: Any) -> None:
        self.destroy_publisher(publisher)

    def _deactivate(self) -> None:
        """Stop taking frames: unsubscribe, then stop and join the worker (the frame in hand is finished)."""
        for camera in self.cameras:
            if camera.subscription is not None:
                self.destroy_subscription(camera.subscription)
                camera.subscription = None
        if self._depth is not None:
            self._depth.unsubscribe()
        if self._worker is not None:
            self._stop.set()
            self._slots.close()
            self._worker.join(timeout=10)
            self._worker = None

    def _cleanup(self) -> None:
        """Free the engine (and the GPU memory it held), the publishers and the diagnostics timer."""
        for camera in self.cameras:
            for publisher in (camera.detections_pub, camera.debug_pub, camera.masks_pub):
                if publisher is not None:
                    self.destroy_output(publisher)
        self.cameras = []
        if self._keypoints is not None:
            self._keypoints.destroy()
            self._keypoints = None
        if self._depth is not None:
            self._depth.destroy()
            self._depth = None
        if self.diagnostics_pub is not None:
            self.destroy_publisher(self.diagnostics_pub)
            self.diagnostics_pub = None
        for name in ("vision_info_pub", "label_info_pub"):
            if getattr(self, name) is not None:
                self.destroy_output(getattr(self, name))
                setattr(self, name, None)
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None
        with self._state_lock:
            self._state = None
        self._restore_given()
        if self._stream is not None:  # a cleanup ends every track and schedule (the ids keep counting up)
            self._stream.reset()
        device = self._detector.engine.device if self._detector is not None else None
        self._detector = None
        gc.collect()
        if device is not None and device.type == "cuda":
            torch.cuda.empty_cache()

    def shutdown(self) -> None:
        """Stop taking frames and join the worker thread."""
        self._deactivate()

    # --- the worker's host (`ros.worker.Host`) ---------------------------------------------------------------

    def prepare(self) -> None:
        """Apply changed runtime parameters: re-plan, keeping engine and buffers; label images composed on the
        device while a camera's `masks` topic has a subscriber."""
        config, _ = self._current()
        if self._detector.config is not config:
            self._detector.reconfigure(config)
        self._detector.label_images = any(
            c.masks_pub is not None and c.masks_pub.get_subscription_count() > 0 for c in self.cameras
        )

    def decode(self, index: int, msg: Image | CompressedImage) -> tuple[Any, str]:
        """A message's frame: a JPEG decoded on the GPU when the engine runs on CUDA and torchvision is there
        (an (H, W, 3) rgb8 tensor on the device); else converted on the CPU (a compressed frame the GPU decoder
        could not take, e.g. a PNG, is counted as `cpu_decoded`)."""
        if self._gpu_jpeg is not None and self._gpu_jpeg.available:
            frame = self._gpu_jpeg.decode(byte_view(msg.data))
            if frame is not None:
                return frame, "rgb8"
            self._count(self.cameras[index], "cpu_decoded")
        return self._convert(msg)

    def stamp(self, msg: Image | CompressedImage) -> int:
        return stamp_ns(msg.header.stamp)

    def depths(self, frames: list[tuple[int, int, tuple[int, int]]]) -> list[Any]:
        """The depth image paired with each (camera index, stamp, frame size) of a batch (`depth: true`)."""
        if self._depth is None:
            return [None] * len(frames)
        return self._depth.depths(frames, self._current()[0].depth_sync_tolerance)

    def gate(self, held: set[int]) -> None:
        """Take no message of a held camera (the executor leaves them in the middleware, newer replacing older);
        wake the executor when a camera is let through again."""
        opened = False
        for index, camera in enumerate(self.cameras):
            closed = index in held
            opened |= not closed and not camera.gate.open
            camera.gate.open = not closed
        if opened and self.executor is not None:
            self.executor.wake()

    def count(self, index: int, name: str) -> None:
        self._count(self.cameras[index], name)

    def problem(self, index: int | None, text: str, error: bool) -> None:
        where = "" if index is None else self._on_topic(index)
        log = self.get_logger().error if error else self.get_logger().warning
        log(f"{text}{where}", throttle_duration_sec=2.0)

    def publish(self, arrival: Arrival, job: Job, found: StreamResult) -> None:
        """Publish a frame's detections with its header (and its debug image when subscribed); count it."""
        _, values = self._current()
        labels = self.labels if values["output_format"] == "labels" else None
        index, msg, frame, encoding = arrival.index, arrival.message, job.frame, str(job.encoding)
        detections = found.detections
        camera = self.cameras[index]
        if encoding.startswith("mono") and not self._warned_mono:
            self._warned_mono = True
            self.get_logger().warning(
                f"{msg.encoding} frames: the model takes colour; each grey value is repeated in R, G and B "
                "(16-bit scaled to [0, 1]), which a colour-trained model may detect poorly. Said once."
            )
        track_ids = found.track_ids
        camera.detections_pub.publish(
            detections_to_msg(
                detections.boxes,
                detections.scores,
                detections.class_ids,
                msg.header,
                labels,
                track_ids=track_ids,
                seen_ns=found.seen_ns,
                obb=detections.obb,
            )
        )
        if self._keypoints is not None:
            self._keypoints.publish(index, detections, msg.header, track_ids)
        if self._depth is not None:
            self._depth.publish(index, found, msg.header, labels)
        if (
            camera.masks_pub is not None
            and detections.masks is not None
            and camera.masks_pub.get_subscription_count() > 0
        ):
            # mono16: k + 1 where the k-th detection of the array just published covers the pixel, 0 elsewhere;
            # composed on the device while someone listens (`TiledDetector.label_images`), else on the host
            camera.masks_pub.publish(array_to_imgmsg(detections.masks.labels, "mono16", msg.header))
        if camera.debug_pub.get_subscription_count() > 0:
            plan = self._detector.plan_for(frame.shape[0], frame.shape[1], self._mask_camera(index))
            image = frame.cpu().numpy() if isinstance(frame, torch.Tensor) else frame  # GPU-decoded
            skeleton = self._detector.resolved.skeleton
            drawn = annotate(
                image, detections, self.labels, plan=plan, track_ids=track_ids, skeleton=skeleton
            )
            camera.debug_pub.publish(array_to_imgmsg(drawn, annotated_encoding(encoding), msg.header))
            self._count(camera, "annotated")
        if found.motion is not None and found.motion.fallback:
            self._count(camera, "motion_fallback")
        latency_ms = (time.monotonic() - arrival.received) * 1e3
        camera.stats.record(latency_ms, detections.timings, found.views, found.predicted)
        if camera.stats is not self.stats:
            self.stats.record(latency_ms, detections.timings, found.views, found.predicted)

    def _check_runtime(self, candidate: Any) -> None:
        """A tile budget must keep `max_tile_age` for the frame sizes the cameras have sent (refused with the
        smallest budget that can); for a size not seen yet, the stream raises it with one warning."""
        for hw in self._frame_hw.values():
            if self._detector is not None:
                input_hw = self._detector.engine.input_hw
                plan = make_plan(
                    hw,
                    candidate.tile_hw_for(input_hw),
                    candidate.overlap,
                    input_hw,
                    candidate.full_frame,
                    candidate.roi,
                )
                problem = budget_problem(plan, candidate.tile_budget, candidate.max_tile_age)
                if problem:
                    raise ValueError(problem)

    def _largest_batch(self) -> int:
        """Most frames (cameras) detected in one batch so far."""
        return 0 if self._loop is None else self._loop.largest_batch

    def _mask_camera(self, index: int) -> str | None:
        """The camera name `ignore_mask` entries use: the topic as `cameras` lists it (one camera: None)."""
        return self.cameras[index].topics.name if len(self.cameras) > 1 else None

    def _on_topic(self, index: int) -> str:
        """' on <topic>' with several cameras (which camera a log line is about), else ''."""
        return f" on {self.cameras[index].image_topic}" if len(self.cameras) > 1 else ""

    def _counted(self, values: dict[str, Any]) -> dict[str, Any]:
        """A stats snapshot without frames_skipped where it cannot be counted."""
        if not self._skips_counted:
            values.pop("frames_skipped", None)
            values.pop("skipped_since_last", None)
        return values

    def _publish_diagnostics(self) -> None:
        """One `pipeline` status (every camera's frames together), and with several cameras one status per
        camera (its rates, drops, latency, topics and publishers)."""
        config, _ = self._current()
        detector = self._detector
        engine = detector.engine
        publishers = [self.count_publishers(c.image_topic) for c in self.cameras]
        active = self._worker is not None  # (a managed node may be configured but inactive)
        silent = [
            input_problem(c.image_topic, c.last_frame, n) if active else None
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
            "tile_size": "x".join(map(str, config.tile_hw_for(engine.input_hw)[::-1])),
            "full_frame": str(config.full_frame),
            "input_publishers": sum(publishers),
            "active": str(active),
        }
        plans = [detector.plan_for(*hw, self._mask_camera(i)) for i, hw in sorted(self._frame_hw.items())]
        if plans:
            if len(self.cameras) == 1:
                info["tiles_per_frame"] = len(plans[0].tiles)
            else:
                info.update(cameras=len(self.cameras), largest_batch_frames=self._largest_batch())
            info["batch_size"] = sum(p.batch_size for p in plans)
        values, name = self._counted(self.stats.snapshot()), self.get_fully_qualified_name()
        values.update(self._depth.counts() if self._depth is not None else {})
        found = problems(values) + [s for s in silent if s]
        statuses = [status(f"{name}: pipeline", {**values, **info}, found, str(engine.device))]
        if len(self.cameras) > 1:
            shares = self._share.fractions() if active else []  # each camera's recent fraction of engine time
            for camera_index, (camera, count, problem) in enumerate(
                zip(self.cameras, publishers, silent, strict=True)
            ):
                own = self._counted(camera.stats.snapshot())
                own.update(self._depth.counts(camera_index) if self._depth is not None else {})
                own.update(
                    image_topic=camera.image_topic,
                    input_publishers=count,
                    detections_topic=camera.detections_pub.topic_name,
                    engine_share=shares[camera_index] if shares else 0.0,
                )
                if camera_index in self._frame_hw:
                    height, width = self._frame_hw[camera_index]
                    own["frame_size"] = f"{width}x{height}"
                found = problems(own) + ([problem] if problem else [])
                statuses.append(
                    status(f"{name}: camera {camera.topics.name}", own, found, str(engine.device))
                )
        msg = DiagnosticArray(status=statuses)
        msg.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(msg)


class DetectorNode(DetectorNodeBase, Node):
    """Subscribes `image` (or `image/compressed`; or every topic of `cameras`), publishes `detections` (per
    camera), `debug_image` and `/diagnostics`; configured and active from the start."""

    finished = False  # (a managed node finishes with its shutdown transition)

    def __init__(self, argv: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._argv = argv  # the process's command line: its params files and -p values (None: sys.argv)
        self._declare()
        self._configure()
        self._activate()
        self._publish_info()


def main(args: Sequence[str] | None = None) -> int:
    """Run the node until Ctrl-C / SIGTERM: exit 0 after a clean shutdown, 1 when it cannot start."""
    return run_node(DetectorNode, NODE_NAME, args)


if __name__ == "__main__":
    sys.exit(main())
