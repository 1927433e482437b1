"""The node's camera inputs: each camera's record (topics, counters, subscription, publishers, gate), the image
QoS, the raw Image read in place, and the subscription callbacks that put each frame into its camera's slot
(`CameraInputs`, mixed into the node: they count what arrives, what is dropped, lost, skipped or malformed)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Any

from builtin_interfaces.msg import Time
from rclpy import subscription as rclpy_subscription
from rclpy.callback_groups import CallbackGroup
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos_overriding_options import QoSOverridingOptions
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from tiled_detector.messages.cdr import UnreadableCdrError, read_image
from tiled_detector.messages.images import ImageConversionError, check_image
from tiled_detector.ros.cameras import CameraTopics
from tiled_detector.ros.stats import LostFrames, SkippedFrames, Stats, publication, takes_message_info
from tiled_detector.ros.worker import Arrival

# rclpy hands a subscription callback of two arguments each message's info (publication sequence number; publisher
# gid on Kilted) from Iron on; Humble's calls every callback with the message alone
MESSAGE_INFO = takes_message_info(rclpy_subscription.Subscription)

try:  # Iron and later
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:  # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks

WARN_EVERY_S = 60.0  # the silent-input WARN is repeated at most this often
# qos_overrides.<topic>.<subscription|publisher>.<history|depth|reliability> parameters of the image
# subscriptions and the output publishers (rclpy declares them, read-only, when the endpoint is created)
OVERRIDABLE = QoSOverridingOptions.with_default_policies()


def raw_image(data: bytes | bytearray | memoryview) -> Any:
    """A serialized sensor_msgs/Image as `messages.cdr.RawImage` (its pixels a view of `data`) with a
    std_msgs/Header, or deserialised where its encapsulation is one `read_image` does not parse."""
    try:
        raw = read_image(data)
    except UnreadableCdrError:
        return deserialize_message(bytes(data), Image)
    return replace(raw, header=Header(stamp=Time(sec=raw.sec, nanosec=raw.nanosec), frame_id=raw.frame_id))


def image_qos(reliability: str) -> QoSProfile:
    """Depth-1 keep-last image QoS; best effort (sensor data) unless `reliable` is asked for."""
    return QoSProfile(
        depth=1,
        history=HistoryPolicy.KEEP_LAST,
        reliability=ReliabilityPolicy.RELIABLE
        if reliability == "reliable"
        else ReliabilityPolicy.BEST_EFFORT,
    )


class Gate(CallbackGroup):
    """A camera's subscription's callback group: while closed the executor leaves out its subscription, so the
    middleware keeps (and replaces) its messages instead of the node converting each one."""

    def __init__(self) -> None:
        super().__init__()
        self.open = True

    def can_execute(self, entity: Any) -> bool:
        return self.open

    def beginning_execution(self, entity: Any) -> bool:
        return self.open

    def ending_execution(self, entity: Any) -> None:
        """Nothing to release."""


@dataclass(eq=False)
class Camera:
    """One input: its topics, its counters (the node's own with a single camera), its subscription and
    publishers, and when its last frame arrived."""

    topics: CameraTopics
    stats: Stats
    subscription: Any = None
    detections_pub: Any = None
    debug_pub: Any = None
    masks_pub: Any = None  # a segmentation model's label images (`masks`)
    last_frame: float = field(default_factory=time.monotonic)
    image_topic: str = ""  # the subscribed topic, fully resolved
    lost: LostFrames = field(default_factory=LostFrames)  # its subscription's message-lost events, counted
    skipped: SkippedFrames = field(default_factory=SkippedFrames)  # frames its publishers sent, never taken
    gate: Gate = field(default_factory=Gate)  # closed while the camera is held (`EngineShare`)


class CameraInputs:
    """The cameras' subscriptions and their callbacks, mixed into the node (which holds `cameras`, `stats`, the
    frame slots `_slots`, the engine share `_share` and `problem`): a frame goes into its camera's slot."""

    cameras: list[Camera]
    _skips_counted = True  # False once the middleware is found to give no sequence numbers

    def _subscribe_cameras(self, reliability: str, compressed: bool) -> None:
        """Subscribe each camera's image topic (raw Image messages as their bytes; with each message's info where
        this rclpy hands it over), its gate as the callback group, its message-lost and QoS events counted."""
        for index, camera in enumerate(self.cameras):
            # with each message's info where this rclpy hands it over (its publication sequence number counts the
            # frames never taken: frames_skipped); else the message alone
            take = self._on_image_info if MESSAGE_INFO else self._on_image
            if not MESSAGE_INFO:
                self._no_sequence_numbers("this rclpy calls subscriptions with the message alone (Humble)")
            camera.subscription = self.create_subscription(
                CompressedImage if compressed else Image,
                camera.topics.image,
                functools.partial(take, index=index),
                image_qos(reliability),
                callback_group=camera.gate,
                qos_overriding_options=OVERRIDABLE,
                raw=not compressed,  # Image messages as their bytes: read in place (`messages.cdr`)
                event_callbacks=SubscriptionEventCallbacks(
                    message_lost=functools.partial(self._on_message_lost, index=index),
                    incompatible_qos=functools.partial(self._on_incompatible_qos, index=index),
                ),
            )
            camera.last_frame = time.monotonic()

    def _count(self, camera: Camera, name: str, count: int = 1) -> None:
        """Count an event of `camera` (in its counters and, with several cameras, the node's)."""
        camera.stats.add(name, count)
        if camera.stats is not self.stats:
            self.stats.add(name, count)

    def _on_image(self, msg: Image | CompressedImage | bytes, index: int = 0) -> None:
        """A frame arrived: into its camera's slot (replacing one the worker never took: dropped). An Image comes
        as its serialized bytes: its fields are read where they lie (no deserialising: an 8K message would cost
        the executor about half a second), and a malformed one is counted and skipped here, never converted."""
        camera = self.cameras[index]
        camera.last_frame = time.monotonic()
        self._share.arrived(index)
        self._count(camera, "received")
        if isinstance(msg, bytes | bytearray | memoryview):
            try:
                msg = raw_image(msg)
                check_image(msg)
            except ImageConversionError as error:
                self._count(camera, "malformed")
                self.problem(index, f"skipped a malformed image: {error}", error=False)
                return
        if self._slots.put(index, Arrival(index, msg, camera.last_frame)):
            self._count(camera, "dropped")

    def _on_image_info(self, msg: Image | CompressedImage, info: Any, index: int = 0) -> None:
        """A frame with its message info: the frames its publisher sent before it that this subscription never
        took are counted (skipped), then the frame is taken as by `_on_image`."""
        camera = self.cameras[index]
        found = publication(info)
        if found is None:
            self._no_sequence_numbers("the middleware gives no publication sequence number with a message")
        # without publisher gids (Jazzy's rclpy) the numbers of several matched publishers cannot be told apart
        elif (
            found[0] is not None
            or camera.subscription is None
            or camera.subscription.get_publisher_count() <= 1
        ):
            skipped = camera.skipped.add(*found)
            if skipped:
                self._count(camera, "skipped", skipped)
        self._on_image(msg, index)

    def _no_sequence_numbers(self, why: str) -> None:
        """Say once that frames_skipped cannot be counted (and leave it out of /diagnostics)."""
        if self._skips_counted:
            self._skips_counted = False
            self.get_logger().info(f"frames_skipped is not counted: {why}")

    def _on_message_lost(self, info: Any, index: int = 0) -> None:
        """The middleware saw frames that never reached this subscription (e.g. a full transport)."""
        camera = self.cameras[index]
        lost = camera.lost.add(int(info.total_count), int(info.total_count_change))
        camera.skipped.lost(lost)
        self._count(camera, "lost", lost)

    def _on_incompatible_qos(self, info: Any, index: int = 0) -> None:
        self.get_logger().warning(
            f"a publisher of {self.cameras[index].image_topic} has a QoS this subscription cannot match "
            f"(policy id {info.last_policy_kind}); set image_reliability to match it",
            throttle_duration_sec=WARN_EVERY_S,
        )
