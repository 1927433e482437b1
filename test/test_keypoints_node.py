"""Keypoints over DDS: the real node with a pose model publishes each frame's `tiled_detector_msgs/KeypointsArray`
on `keypoints` with the header of its Detection2DArray, entry k linked to detection k (index, and its
`Detection2D.id` with the tracker), the joints equal to the ROS-free pipeline's, and the model's joint names and
skeleton once on the transient-local `keypoint_info`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip("rclpy")
pytest.importorskip("tiled_detector_msgs.msg")

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from tiled_detector_msgs.msg import KeypointInfo, KeypointsArray  # noqa: E402

from support import exports  # noqa: E402
from test_detector import _scene  # noqa: E402
from test_node import _image, _send, _stamp, _write_params  # noqa: E402
from test_pose import NAMES  # noqa: E402
from tiled_detector.detector import TiledDetector  # noqa: E402
from tiled_detector.harness.client import DetectorClient  # noqa: E402
from tiled_detector.harness.process import NodeProcess, pick_domain_id  # noqa: E402
from tiled_detector.messages.detections import msg_ids, msg_to_detections  # noqa: E402
from tiled_detector.messages.keypoints import msg_to_keypoints  # noqa: E402

INFO_QOS = QoSProfile(
    depth=1,
    history=HistoryPolicy.KEEP_LAST,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.TRANSIENT_LOCAL,
)


def test_the_node_publishes_keypoints_linked_to_its_detections(tmp_path: Path) -> None:
    model = exports.ultralytics_onnx(
        tmp_path / "pose.onnx",
        exports.PoseHead(),
        dynamic=True,
        task="pose",
        kpt_shape=[5, 3],
        kpt_names={0: NAMES},
    )
    settings = dict(tile_width=64, tile_height=64, overlap=0.25, conf_threshold=0.5)
    params = _write_params(tmp_path / "params.yaml", model=str(model), tracker="bytetrack", **settings)
    frames = [_scene(6)[0], _scene(6)[0]]
    domain = pick_domain_id()
    with NodeProcess(params, domain_id=domain) as node:
        client = DetectorClient(domain_id=domain)
        try:
            assert client.wait_for_node(timeout=60), node.log_text()
            joints = client.subscribe(KeypointsArray, "keypoints")
            info = client.subscribe(KeypointInfo, "keypoint_info", INFO_QOS)
            replies = [_send(client, _image(f, k), _stamp(k)) for k, f in enumerate(frames)]
            stamps = [_stamp(k) for k in range(len(frames))]

            def stamped(msg) -> int:
                return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec

            assert client.wait_until(lambda: {stamped(m) for m in joints} >= set(stamps) and info, 20)
        finally:
            client.close()
    assert node.returncode == 0 and "Traceback" not in node.log_text(), node.log_text()
    assert list(info[0].names) == NAMES and list(info[0].skeleton) == []  # the file states no skeleton
    want = TiledDetector(model, tile_size=(64, 64), overlap=0.25, conf_threshold=0.5).detect(frames[0])
    for reply, stamp in zip(replies, stamps, strict=True):
        (msg,) = [m for m in joints if stamped(m) == stamp]
        assert msg.header.frame_id == reply.header.frame_id == "cam_optical"
        assert [e.index for e in msg.keypoints] == list(range(len(reply.detections)))
        ids = msg_ids(reply)
        assert (ids > 0).all() and [int(e.id) for e in msg.keypoints] == ids.tolist()  # the track ids
        points, positions = msg_to_keypoints(msg)
        assert np.isnan(positions).all()  # no depth
        boxes, _, _ = msg_to_detections(reply, list(exports.NAMES.values()))
        order = [int(np.argmin(np.abs(want.boxes - b).sum(1))) for b in boxes]
        np.testing.assert_allclose(points, want.keypoints[order], atol=1e-3)
