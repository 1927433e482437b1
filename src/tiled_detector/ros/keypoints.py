"""The node's keypoints (a pose model): per camera the `keypoints` topic (`tiled_detector_msgs/KeypointsArray`,
beside `detections`: `<namespace>/keypoints` with several cameras), published with each frame's Detection2DArray
header, and `keypoint_info` (`KeypointInfo`: the joints' names and the skeleton, transient local, once per
configuration). Without the `tiled_detector_msgs` package (a ROS distro whose workspace did not build it) the node
publishes no keypoints, said in one WARN at configure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rclpy.qos_overriding_options import QoSOverridingOptions

from tiled_detector.messages.keypoints import keypoint_info, keypoints_to_msg
from tiled_detector.model_files.pose_model import skeleton_for
from tiled_detector.ros.cameras import CameraTopics


def keypoint_messages() -> Any:
    """The `tiled_detector_msgs.msg` module, or None where the package is not built."""
    try:
        import tiled_detector_msgs.msg as messages
    except ImportError:
        return None
    return messages


class KeypointOutputs:
    """The keypoint publishers of a node's cameras (module docstring)."""

    def __init__(
        self,
        cameras: Sequence[CameraTopics],
        names: Sequence[str],
        skeleton: Sequence[tuple[int, int]] | None,
        publisher: Callable[..., Any],
        destroy: Callable[[Any], Any],
        info_qos: Any,
        overridable: Any = None,
    ) -> None:
        messages = keypoint_messages()
        assert messages is not None
        self._names, self._skeleton = tuple(names), skeleton_for(len(names), skeleton)
        self._destroy = destroy
        self.publishers = [
            publisher(messages.KeypointsArray, t.keypoints, 10, qos_overriding_options=overridable)
            for t in cameras
        ]
        self.info_pub = publisher(messages.KeypointInfo, "keypoint_info", info_qos)

    def publish_info(self, header: Any) -> None:
        """The joints' names and skeleton (once per configuration)."""
        self.info_pub.publish(keypoint_info(self._names, self._skeleton, header))

    def publish(self, index: int, detections: Any, header: Any, track_ids: Any = None) -> None:
        """Camera `index`'s frame: its detections' keypoints (with their 3D positions where depth gave them)."""
        if detections.keypoints is None:
            return
        msg = keypoints_to_msg(detections.keypoints, header, track_ids, detections.keypoint_positions)
        self.publishers[index].publish(msg)

    def destroy(self) -> None:
        for publisher in (*self.publishers, self.info_pub):
            self._destroy(publisher)
        self.publishers = []


def keypoint_outputs(
    node: Any, detector: Any, cameras: Sequence[CameraTopics], info_qos: Any
) -> KeypointOutputs | None:
    """A pose model's keypoint publishers on `node` (None: not a pose model; or no `tiled_detector_msgs`: one
    WARN)."""
    resolved = detector.resolved
    if resolved.keypoints is None:
        return None
    if keypoint_messages() is None:
        node.get_logger().warning(
            "tiled_detector_msgs is not built: no keypoints topic (build vendor/tiled_detector_msgs in the "
            "workspace: docs/NODE.md)"
        )
        return None
    overridable = QoSOverridingOptions.with_default_policies()
    return KeypointOutputs(
        cameras,
        resolved.keypoint_names,
        resolved.skeleton,
        node.output_publisher,
        node.destroy_output,
        info_qos,
        overridable,
    )
