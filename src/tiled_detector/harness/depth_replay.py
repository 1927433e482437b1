"""Replaying an RGB-D bag (`make-bag --depth`, or any bag whose metadata names its `depth_topic` and
`camera_info_topic`): its depth images and camera infos are played into the node's `depth_image` and `camera_info`
just before each frame, the node's `detections_3d` are collected, and their positions scored against the bag's
3D ground truth (`depth_recording.GROUND_TRUTH_3D_TOPIC`).

Scores: each answer's Detection2D matched to a ground-truth object (same class, IoU >= 0.5, highest score first)
whose Detection3D (the same id) has a position is scored by its relative error |p - p_true| / |p_true|, over the
objects of at least `MIN_SIZE` px (the longer side of their box): `depth_error_median`, `depth_error_p95`;
`objects_3d` counts the Detection3D answers received.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from tiled_detector.harness import bags
from tiled_detector.harness.depth_recording import CAMERA_INFO_KEY, DETECTIONS_3D, GROUND_TRUTH_3D_TOPIC
from tiled_detector.messages.detections import msg_links, msg_to_positions
from tiled_detector.messages.images import stamp_ns
from tiled_detector.tools.scores.depth_evaluation import MIN_SIZE, error_percentiles
from tiled_detector.tools.scoring import Arrays, position_errors


class DepthPlay:
    """A bag's depth side during a replay (module docstring); nothing to do for a bag without one."""

    def __init__(self, info: bags.BagInfo) -> None:
        depth, camera = info.custom_data.get(bags.DEPTH_TOPIC_KEY), info.custom_data.get(CAMERA_INFO_KEY)
        self.topics = (depth, camera) if depth in info.topics and camera in info.topics else ()
        self.truth = GROUND_TRUTH_3D_TOPIC in info.topics
        self._publishers: dict[str, Any] = {}
        self._answers: list[Any] = []

    def remaps(self) -> dict[str, str]:
        """The node's depth inputs remapped to the bag's topics."""
        return dict(zip(("depth_image", "camera_info"), self.topics, strict=True)) if self.topics else {}

    def start(self, client: Any) -> None:
        """Publishers of the bag's depth topics, and the node's detections_3d collected."""
        if not self.topics:
            return
        from sensor_msgs.msg import CameraInfo, Image
        from vision_msgs.msg import Detection3DArray

        from tiled_detector.harness.client import reliable_qos

        for topic, kind in zip(self.topics, (Image, CameraInfo), strict=True):
            self._publishers[topic] = client.node.create_publisher(kind, topic, reliable_qos(10))
        self._answers = client.subscribe(Detection3DArray, "detections_3d")

    def wait(self, client: Any, timeout: float) -> bool:
        """Wait until the node subscribes to the depth topics (their first messages are not lost)."""
        return client.wait_until(
            lambda: all(p.get_subscription_count() for p in self._publishers.values()), timeout
        )

    def frames(self, messages: Iterable[bags.BagMessage]) -> Iterator[bags.BagMessage]:
        """The image messages of `messages` (bag order), each depth image and camera info published as it comes
        (the bag has them just before their frame)."""
        for message in messages:
            publisher = self._publishers.get(message.topic)
            if publisher is not None:
                publisher.publish(message.data)
            elif message.topic not in self.topics:
                yield message

    def answers(self, stamps: Iterable[int]) -> dict[int, Any]:
        """stamp -> the node's Detection3DArray, for the frames sent."""
        wanted = set(stamps)
        return {s: m for m in self._answers if (s := stamp_ns(m.header.stamp)) in wanted}


def truth_positions(bag: Any) -> dict[int, np.ndarray]:
    """stamp -> (N, 3) true positions of the bag's 3D ground truth (the 2D ground truth's objects, in its order)."""
    found = {}
    for message in bags.read_messages(bag, [GROUND_TRUTH_3D_TOPIC]):
        assert message.stamp_ns is not None
        found[message.stamp_ns] = msg_to_positions(bags.deserialize(message.data, DETECTIONS_3D))[1]
    return found


def depth_scores(
    answers: Mapping[int, Arrays],
    answer_messages: Mapping[int, Any],
    answers_3d: Mapping[int, Any],
    truth: Mapping[int, tuple[np.ndarray, np.ndarray]],
    true_positions: Mapping[int, np.ndarray],
) -> dict[str, float | int | None]:
    """The replay's depth scores (module docstring) from the 2D answers (arrays and messages, by stamp), the 3D
    answers and the 2D and 3D ground truth."""
    errors: list[np.ndarray] = []
    for stamp, arrays in answers.items():
        if stamp not in truth or stamp not in true_positions:
            continue
        positions = _aligned(answer_messages[stamp], answers_3d.get(stamp))
        errors.append(position_errors(arrays, positions, truth[stamp], true_positions[stamp], MIN_SIZE))
    median, p95 = error_percentiles(errors)
    return {
        "depth_error_median": median,
        "depth_error_p95": p95,
        "objects_3d": sum(len(m.detections) for m in answers_3d.values()),
    }


def _aligned(msg: Any, located: Any) -> np.ndarray:
    """(N, 3) the positions of a frame's Detection2Ds from its Detection3DArray (`msg_links`); NaN where none."""
    positions = np.full((len(msg.detections), 3), np.nan)
    if located is None:
        return positions
    _, points, _ = msg_to_positions(located)
    links = msg_links(msg, located)
    positions[links >= 0] = points[links[links >= 0]]
    return positions
