"""rosbag2 bags of camera frames and detections, written and read with `rosbags` (no ROS install needed).

Bags are written with rosbag2 metadata version 8 (`METADATA_VERSION`): Humble's rosbag2 (0.15.x, which itself
writes version 5) decodes metadata field by field behind `version >= N` gates with no upper bound and ignores
keys it does not know, so it reads version 8 as long as `offered_qos_profiles` is a YAML string, which
version 8 keeps; version 9 turns it into a list that Humble rejects ("yaml-cpp: bad conversion",
ros2/rosbag2#2013).
Every write is atomic: the bag is built in a hidden folder next to its destination and renamed at the end.
vision_msgs types are registered in the rosbags typestore from the installed .msg files (or the vendored
copy), so their RIHS01 hashes equal rosidl's. This module imports no rclpy.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace, TracebackType
from typing import Any

import numpy as np
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

from tiled_detector.messages.images import stamp_ns
from tiled_detector.settings.options import Option

METADATA_VERSION = 8  # newest version Humble's `ros2 bag info/play` can read (see the module docstring)
HUMBLE_METADATA_VERSION = 5  # the version Humble's rosbag2 itself writes
IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
DETECTIONS = "vision_msgs/msg/Detection2DArray"
CLOCK = "rosgraph_msgs/msg/Clock"
IMAGE_TYPES = (IMAGE, COMPRESSED_IMAGE)
GROUND_TRUTH_TOPIC = "/ground_truth"
# the true camera motion of a moving synthetic scene per frame: the previous frame's pixels -> this frame's, a 2 x 3
# matrix row by row (`tools.synthetic.frame_motion`)
CAMERA_MOTION_TOPIC = "/ground_truth/camera_motion"
# the ground truth's masks: per frame a JSON list, one COCO RLE (or null) per box of its `GROUND_TRUTH_TOPIC` array
GROUND_TRUTH_MASKS_TOPIC = "/ground_truth/masks"
# the ground truth's keypoints: per frame a JSON object {"keypoints": per box of its `GROUND_TRUTH_TOPIC` array a
# list of [x, y, visibility] per joint, "areas": per box the area OKS scales by}
GROUND_TRUTH_KEYPOINTS_TOPIC = "/ground_truth/keypoints"
TEXT = "std_msgs/msg/String"
CAMERA_MOTION = "std_msgs/msg/Float64MultiArray"
START_NS = 1_700_000_000 * 1_000_000_000  # stamp of the first frame of a written bag
DEPTH_TOPIC_KEY = "depth_topic"  # bag metadata: the topic of the depth images aligned to the image topic
# dependency order
_VISION_MSGS = (
    "Point2D",
    "Pose2D",
    "BoundingBox2D",
    "ObjectHypothesis",
    "ObjectHypothesisWithPose",
    "Detection2D",
    "Detection2DArray",
    "VisionInfo",
    "BoundingBox3D",
    "Detection3D",
    "Detection3DArray",
)
_DTYPES = {
    "bool": np.bool_,
    "byte": np.uint8,
    "char": np.uint8,
    "uint8": np.uint8,
    "int8": np.int8,
    "uint16": np.uint16,
    "int16": np.int16,
    "uint32": np.uint32,
    "int32": np.int32,
    "uint64": np.uint64,
    "int64": np.int64,
    "float32": np.float32,
    "float64": np.float64,
}


class Storage(Option):
    """rosbag2 storage plugin."""

    SQLITE3 = "sqlite3"
    MCAP = "mcap"

    @property
    def plugin(self) -> StoragePlugin:
        return StoragePlugin[self.name]


def vision_msgs_dir() -> Path:
    """Folder of the vision_msgs .msg files: the installed package's share dir, else the vendored copy."""
    candidates = []
    try:
        os.environ.setdefault("AMENT_PREFIX_PATH", sys.prefix)
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("vision_msgs")) / "msg")
    except (ImportError, LookupError, OSError):
        pass  # no ament index: try the locations below
    candidates.append(Path(sys.prefix) / "share" / "vision_msgs" / "msg")
    # a source checkout
    candidates.append(Path(__file__).resolve().parents[3] / "vendor" / "vision_msgs" / "msg")
    for candidate in candidates:
        if (candidate / "Detection2DArray.msg").is_file():
            return candidate
    raise FileNotFoundError(f"vision_msgs .msg files not found in {', '.join(map(str, candidates))}")


@functools.cache
def typestore() -> Typestore:
    """The ROS 2 Jazzy typestore plus vision_msgs (built once; message classes are shared)."""
    store = get_typestore(Stores.ROS2_JAZZY)
    folder = vision_msgs_dir()
    types: dict[str, Any] = {}
    for name in _VISION_MSGS:
        types.update(get_types_from_msg((folder / f"{name}.msg").read_text(), f"vision_msgs/msg/{name}"))
    store.register(types)
    return store


def _default(node: tuple[Any, Any]) -> Any:
    """Default value of one field type node of a rosbags field definition."""
    kind, spec = node
    if kind.name == "BASE":
        name = spec[0]
        return "" if name in ("string", "wstring") else _DTYPES[name](0).item()
    if kind.name == "NAME":
        return new_message(spec)
    element, length = spec
    if element[0].name == "BASE" and element[1][0] in _DTYPES:
        return np.zeros(length if kind.name == "ARRAY" else 0, _DTYPES[element[1][0]])
    return [_default(element) for _ in range(length)] if kind.name == "ARRAY" else []


def new_message(msgtype: str, **fields: Any) -> Any:
    """A rosbags message of `msgtype` with every field not given set to its default (recursively)."""
    store = typestore()
    _, definitions = store.fielddefs[msgtype]
    values = {name: fields.pop(name) if name in fields else _default(node) for name, node in definitions}
    if fields:
        raise ValueError(f"{msgtype} has no field(s) {', '.join(fields)}")
    return store.types[msgtype](**values)


def stamp_message(stamp_ns: int) -> Any:
    """builtin_interfaces/Time from integer nanoseconds."""
    sec, nanosec = divmod(int(stamp_ns), 1_000_000_000)
    return new_message("builtin_interfaces/msg/Time", sec=sec, nanosec=nanosec)


def header(stamp: int, frame_id: str) -> Any:
    """std_msgs/Header."""
    return new_message("std_msgs/msg/Header", stamp=stamp_message(stamp), frame_id=frame_id)


def image_message(image: np.ndarray, stamp: int, frame_id: str, compressed: bool = False) -> Any:
    """HxWx3 uint8 RGB -> sensor_msgs/Image rgb8, or CompressedImage JPEG ("rgb8; jpeg compressed bgr8")."""
    image = np.ascontiguousarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"frames must be HxWx3 uint8 RGB, got {image.shape} {image.dtype}")
    if compressed:
        import cv2

        ok, encoded = cv2.imencode(".jpg", image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
        if not ok:
            raise ValueError("OpenCV could not encode a frame as JPEG")
        return new_message(
            COMPRESSED_IMAGE,
            header=header(stamp, frame_id),
            format="rgb8; jpeg compressed bgr8",
            data=encoded.reshape(-1),
        )
    height, width = image.shape[:2]
    return new_message(
        IMAGE,
        header=header(stamp, frame_id),
        height=height,
        width=width,
        encoding="rgb8",
        step=width * 3,
        data=image.reshape(-1),
    )


def camera_motion_message(matrix: np.ndarray) -> Any:
    """std_msgs/Float64MultiArray of a (2, 3) camera motion (`CAMERA_MOTION_TOPIC`)."""
    dims = [
        new_message("std_msgs/msg/MultiArrayDimension", label=label, size=size, stride=stride)
        for label, size, stride in (("rows", 2, 6), ("columns", 3, 3))
    ]
    layout = new_message("std_msgs/msg/MultiArrayLayout", dim=dims, data_offset=0)
    return new_message(CAMERA_MOTION, layout=layout, data=np.asarray(matrix, np.float64).reshape(6))


def text_message(text: str) -> Any:
    """std_msgs/String holding `text`."""
    return new_message(TEXT, data=text)


def detections_message(
    boxes: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    stamp: int,
    frame_id: str,
    labels: Sequence[str],
    track_ids: np.ndarray | None = None,
    obb: np.ndarray | None = None,
) -> Any:
    """vision_msgs/Detection2DArray (rosbags type), built by the same converter the node uses (rotated boxes `obb`:
    center.theta the angle)."""
    from tiled_detector.messages.detections import detections_to_msg

    return detections_to_msg(
        boxes,
        scores,
        class_ids,
        header(stamp, frame_id),
        labels,
        track_ids=track_ids,
        msg_types=_factories(),
        obb=obb,
    )


def detections_3d_message(
    positions: np.ndarray,
    sizes: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    stamp: int,
    frame_id: str,
    labels: Sequence[str],
) -> Any:
    """vision_msgs/Detection3DArray (rosbags type), built by the same converter the node uses."""
    from tiled_detector.messages.detections import detections_3d_to_msg

    return detections_3d_to_msg(
        positions, sizes, scores, class_ids, header(stamp, frame_id), labels, msg_types=_factories()
    )


def _factories() -> SimpleNamespace:
    """The vision_msgs message types as factories of rosbags messages."""
    return SimpleNamespace(
        **{name: functools.partial(new_message, f"vision_msgs/msg/{name}") for name in _VISION_MSGS}
    )


def serialize(msg: Any, msgtype: str) -> bytes:
    """CDR bytes of a rosbags message."""
    return bytes(typestore().serialize_cdr(msg, msgtype))


def deserialize(data: bytes | memoryview, msgtype: str) -> Any:
    """A rosbags message from CDR bytes."""
    return typestore().deserialize_cdr(data, msgtype)


def _remove_orphaned_staging(path: Path) -> None:
    """Delete staging folders of earlier writes of `path` whose process is gone (killed, e.g. SIGKILL)."""
    for staging in path.parent.glob(f".{path.name}.*.partial"):
        pid = staging.name[len(path.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class BagWriter:
    """Writes one bag atomically: into a hidden staging folder next to `path`, renamed there on success.

    `write(topic, msgtype, time_ns, msg_or_cdr_bytes)` adds topics as they first appear. Refuses to replace an
    existing `path` unless `force`. On an exception inside the `with` block nothing is left behind.
    """

    def __init__(
        self,
        path: str | Path,
        storage: Storage | str = Storage.SQLITE3,
        force: bool = False,
        custom_data: Mapping[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.storage = Storage.from_value(storage)
        if self.path.exists() and not force:
            raise FileExistsError(
                f"{self.path} exists: replace it with --force (force=True), or pick another name"
            )
        self.force = force
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphaned_staging(self.path)
        self._staging = Path(
            tempfile.mkdtemp(
                prefix=f".{self.path.name}.{os.getpid()}.", suffix=".partial", dir=self.path.parent
            )
        )
        self._writer = Writer(
            self._staging / self.path.name, version=METADATA_VERSION, storage_plugin=self.storage.plugin
        )
        for key, value in {"generator": "tiled_detector", **(custom_data or {})}.items():
            self._writer.set_custom_data(key, str(value))
        self._connections: dict[str, Any] = {}

    def __enter__(self) -> BagWriter:
        self._writer.open()
        return self

    def write(self, topic: str, msgtype: str, time_ns: int, msg: Any) -> None:
        """Write a rosbags message, or its CDR bytes (e.g. from rclpy), at bag time `time_ns`."""
        connection = self._connections.get(topic)
        if connection is None:
            connection = self._writer.add_connection(topic, msgtype, typestore=typestore())
            self._connections[topic] = connection
        elif connection.msgtype != msgtype:
            raise ValueError(f"topic {topic} holds {connection.msgtype}, cannot write a {msgtype}")
        data = msg if isinstance(msg, (bytes, bytearray, memoryview)) else serialize(msg, msgtype)
        self._writer.write(connection, int(time_ns), data)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc_type is not None:
                self._writer.abort()
                return
            self._writer.close()
            self._publish()
        finally:
            shutil.rmtree(self._staging, ignore_errors=True)

    def _publish(self) -> None:
        """Rename the finished bag into place (replacing an old one only when forced)."""
        built = self._staging / self.path.name
        if not self.path.exists():
            built.rename(self.path)
            return
        if not self.force:
            raise FileExistsError(f"{self.path} appeared while writing; the new bag was discarded")
        old = self._staging / "replaced"
        self.path.rename(old)
        built.rename(self.path)


@dataclass(frozen=True)
class BagMessage:
    """One message of a bag: topic, type, bag time, header stamp (ns; None without a header) and CDR bytes."""

    topic: str
    msgtype: str
    time_ns: int
    stamp_ns: int | None
    data: bytes


@dataclass(frozen=True)
class BagInfo:
    """What a bag holds: storage, topic -> (type, message count), and its custom metadata."""

    path: Path
    storage: Storage
    topics: dict[str, tuple[str, int]]
    custom_data: dict[str, str]

    def image_topic(self, topic: str | None = None) -> str:
        """`topic` if it holds images, else the bag's only image topic besides its depth images (ValueError when
        ambiguous or none)."""
        depth = self.custom_data.get(DEPTH_TOPIC_KEY)  # a depth image topic goes with the colour one
        images = [
            name for name, (msgtype, _) in self.topics.items() if msgtype in IMAGE_TYPES and name != depth
        ]
        if topic is not None:
            if topic not in images:
                raise ValueError(f"{topic} is not an image topic of {self.path}; image topics: {images}")
            return topic
        if len(images) != 1:
            raise ValueError(f"{self.path} has {len(images)} image topics {images}: choose one with --topic")
        return images[0]


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The `rosbag2_bagfile_information` mapping of a bag's metadata.yaml."""
    import yaml

    text = (Path(path) / "metadata.yaml").read_text()
    return yaml.safe_load(text)["rosbag2_bagfile_information"]


def bag_info(path: str | Path) -> BagInfo:
    """Topics, types, counts, storage and custom metadata of a bag."""
    metadata = read_metadata(path)
    topics = {
        entry["topic_metadata"]["name"]: (entry["topic_metadata"]["type"], int(entry["message_count"]))
        for entry in metadata["topics_with_message_count"]
    }
    custom = {str(k): str(v) for k, v in (metadata.get("custom_data") or {}).items()}
    return BagInfo(Path(path), Storage.from_value(metadata["storage_identifier"]), topics, custom)


def read_messages(path: str | Path, topics: Sequence[str] | None = None) -> Iterator[BagMessage]:
    """The messages of `topics` (default: all) in bag-time order, with their header stamps."""
    with Reader(path) as reader:
        connections = [c for c in reader.connections if topics is None or c.topic in topics]
        for connection, time_ns, data in reader.messages(connections=connections):
            yield BagMessage(
                connection.topic,
                connection.msgtype,
                time_ns,
                _header_stamp(data, connection.msgtype),
                bytes(data),
            )


def _header_stamp(data: bytes | memoryview, msgtype: str) -> int | None:
    """Header stamp (ns) of a message whose first field is a std_msgs/Header, else None."""
    _, fields = typestore().fielddefs[msgtype]
    if not fields or fields[0][1][1] != "std_msgs/msg/Header":
        return None
    return stamp_ns(deserialize(data, msgtype).header.stamp)


def read_detections(
    path: str | Path,
    topic: str = GROUND_TRUTH_TOPIC,
    labels: Sequence[str] | None = None,
    rotated: bool = False,
) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Header stamp (ns) -> (boxes, scores, class_ids) of every Detection2DArray on `topic`: boxes x1, y1, x2, y2 (a
    rotated box's hull), or with `rotated` the rotated boxes (N, 5) cx, cy, w, h, theta (`msg_obb`)."""
    from tiled_detector.messages.detections import msg_obb, msg_to_detections

    out = {}
    for message in read_messages(path, [topic]):
        if message.msgtype != DETECTIONS:
            raise ValueError(f"{topic} holds {message.msgtype}, not {DETECTIONS}")
        assert message.stamp_ns is not None
        msg = deserialize(message.data, DETECTIONS)
        boxes, scores, class_ids = msg_to_detections(msg, labels)
        out[message.stamp_ns] = (msg_obb(msg) if rotated else boxes, scores, class_ids)
    return out
