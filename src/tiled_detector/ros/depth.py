"""The node's 3D side (`depth: true`): per camera the depth_image and camera_info subscriptions, pairing them
with the colour frames (`depth_sync.DepthSync`), the detections_3d publisher, and the bad-input accounting.

Topics (remappable): one camera subscribes `depth_image` and `camera_info` and publishes `detections_3d`, relative
to the node; several cameras (`cameras`) use their image topic's namespace, as for `detections`
(`/front/image_raw` -> `/front/depth_image`, `/front/camera_info`, `/front/detections_3d`). A frame whose depth
is missing or unusable (no camera info yet, no depth image within `depth_sync_tolerance`, an unknown encoding,
another aspect ratio, a zero focal length) is published in 2D only and counted in `frames_without_depth`, with
one WARN line per camera and cause; objects of a frame with depth but without a valid depth are left out of its
Detection3DArray and counted in `objects_without_depth`.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, Image
from vision_msgs.msg import Detection3DArray

from tiled_detector.messages.depth import camera_info_intrinsics, depth_to_array
from tiled_detector.messages.detections import detections_3d_to_msg
from tiled_detector.messages.images import ImageConversionError, stamp_ns
from tiled_detector.pipeline.depth import DepthError, DepthImage, aligned
from tiled_detector.ros.cameras import CameraTopics
from tiled_detector.streaming.depth_sync import DepthSync

# the longest a colour frame waits for a depth image that comes after it (the worker goes on without one then;
# a camera whose wait ran out waits no more until it pairs again: `depth_sync`)
WAIT_S = 0.05
# calibration info: best effort matches a publisher of either reliability; depth 1, the latest is what is used
INFO_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.BEST_EFFORT)


def depth_topics(topics: CameraTopics) -> tuple[str, str, str]:
    """A camera's depth image, camera info and detections_3d topics (module docstring)."""
    namespace = topics.detections.rpartition("/")[0]
    prefix = f"{namespace}/" if namespace else ""
    return f"{prefix}depth_image", f"{prefix}camera_info", f"{prefix}detections_3d"


class DepthInputs:
    """The 3D side of a node with these cameras (module docstring). `publish` and `depth_for` run on the worker,
    the subscriptions' callbacks on the executor."""

    def __init__(
        self,
        node: Any,
        cameras: Sequence[CameraTopics],
        overridable: Any = None,
        *,
        publisher: Callable[..., Any] | None = None,
        destroy: Callable[[Any], Any] | None = None,
    ) -> None:
        """`overridable`: the QoSOverridingOptions of its endpoints (None: none); `publisher` / `destroy` make and
        destroy its detections_3d publishers (the node's output publishers; default: the node's plain ones)."""
        self._node = node
        self._topics = [depth_topics(c) for c in cameras]
        self._images = [c.image for c in cameras]
        self.sync = DepthSync(len(cameras))
        self._options = {} if overridable is None else {"qos_overriding_options": overridable}
        make = node.create_publisher if publisher is None else publisher
        self._destroy = destroy
        self.publishers = [make(Detection3DArray, t[2], 10, **self._options) for t in self._topics]
        self._subscriptions: list[Any] = []
        self._said: set[tuple[int, str]] = set()
        self._lock = threading.Lock()
        self.frames_without_depth = [0] * len(cameras)
        self.objects_without_depth = [0] * len(cameras)

    def subscribe(self, image_qos: QoSProfile) -> None:
        """Subscribe every camera's depth image (with the colour image's QoS) and camera info."""
        for index, (depth, info, _) in enumerate(self._topics):
            on_depth = functools.partial(self._on_depth, index=index)
            on_info = functools.partial(self._on_info, index=index)
            for msg_type, topic, callback, qos in (
                (Image, depth, on_depth, image_qos),
                (CameraInfo, info, on_info, INFO_QOS),
            ):
                self._subscriptions.append(
                    self._node.create_subscription(msg_type, topic, callback, qos, **self._options)
                )

    def unsubscribe(self) -> None:
        """Stop taking depth images and camera infos."""
        for subscription in self._subscriptions:
            self._node.destroy_subscription(subscription)
        self._subscriptions = []

    def destroy(self) -> None:
        """Unsubscribe and destroy the publishers."""
        self.unsubscribe()
        for publisher in self.publishers:
            (self._node.destroy_publisher if self._destroy is None else self._destroy)(publisher)
        self.publishers = []

    def _on_depth(self, msg: Image, index: int = 0) -> None:
        self.sync.add_depth(index, stamp_ns(msg.header.stamp), msg)

    def _on_info(self, msg: CameraInfo, index: int = 0) -> None:
        self.sync.add_info(index, msg)

    def depths(
        self, frames: Sequence[tuple[int, int, tuple[int, int]]], tolerance_s: float
    ) -> list[DepthImage | None]:
        """The depth images of a batch's colour frames, each (camera index, stamp, frame size): `depth_for` each,
        waiting at most `WAIT_S` for them all."""
        deadline = time.monotonic() + WAIT_S
        return [self.depth_for(index, stamp, hw, tolerance_s, deadline) for index, stamp, hw in frames]

    def depth_for(
        self, index: int, stamp: int, frame_hw: tuple[int, int], tolerance_s: float, deadline: float
    ) -> DepthImage | None:
        """The depth image and camera matrix of camera `index`'s colour frame (its stamp, its size), waiting until
        `deadline` (monotonic) for a depth image that may still come; None (one WARN per cause) without one. Each
        frame is paired anew (a frame in parts carries its depth image with its job)."""
        pairing = self.sync.pair(index, stamp, tolerance_s, max(0.0, deadline - time.monotonic()))
        if pairing.depth is None:
            return self._without(index, pairing.text)
        try:
            depth = aligned(
                DepthImage(depth_to_array(pairing.depth), camera_info_intrinsics(pairing.info)), frame_hw
            )
        except (ImageConversionError, DepthError) as error:
            return self._without(index, str(error))
        return depth

    def _without(self, index: int, why: str) -> DepthImage | None:
        """Say once per camera and cause (the text without its numbers) why a frame has no depth."""
        cause = (index, re.sub(r"[-+]?\d[\d.]*", "#", why))
        if cause not in self._said:
            self._said.add(cause)
            self._node.get_logger().warning(
                f"no 3D positions for frames of {self._images[index]}: {why}; their 2D detections are published "
                "(frames_without_depth counts them; said once per cause)"
            )
        return None

    def publish(self, index: int, found: Any, header: Any, labels: Sequence[str] | None) -> None:
        """Publish a frame's Detection3DArray (`found`: its `StreamResult`), or count it without depth."""
        detections = found.detections
        with self._lock:
            if detections.positions is None:
                self.frames_without_depth[index] += 1
                return
            self.objects_without_depth[index] += int(
                np.count_nonzero(~np.isfinite(detections.positions[:, 2]))
            )
        msg = detections_3d_to_msg(
            detections.positions,
            detections.sizes,
            detections.scores,
            detections.class_ids,
            header,
            labels,
            track_ids=found.track_ids,
            seen_ns=found.seen_ns,
        )
        self.publishers[index].publish(msg)

    def counts(self, index: int | None = None) -> dict[str, int]:
        """frames_without_depth and objects_without_depth of camera `index` (None: all cameras)."""
        chosen = slice(None) if index is None else slice(index, index + 1)
        with self._lock:
            return {
                "frames_without_depth": sum(self.frames_without_depth[chosen]),
                "objects_without_depth": sum(self.objects_without_depth[chosen]),
            }
