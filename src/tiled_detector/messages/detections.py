"""Detection arrays <-> vision_msgs/Detection2DArray (and positions -> Detection3DArray) for vision_msgs 2.x, 3.x
and 4.x.

The message layout is found by feature detection on message instances, not by distro name:
- 4.x (Humble+): bbox.center.position.x/y (vision_msgs/Pose2D), results[].hypothesis.class_id/score;
- 3.x (Galactic): bbox.center.x/y (geometry_msgs/Pose2D), results[].hypothesis.class_id/score;
- 2.x (Foxy): bbox.center.x/y, results[].id/score.
Boxes are in the image's pixel frame. Each Detection2D carries the image header and one hypothesis whose
class id is the label name when known, else the decimal class id. Detection2D.id is what vision_msgs 4.1.1 makes
it: an identity across messages ("Detections of the same object in different detection messages should have the
same id. This field may be empty."): with track ids given (the node's `tracker` on) the track id ("17", the same
string for the same object in every frame of its track), else empty. The node publishes detections best score
first. A detection reported from an earlier frame (a tile budget's tile not run in this one: `seen_ns`) carries
that frame's stamp in its own header; every other detection carries the array's header.

A Detection3DArray (`detections_3d_to_msg`) holds the objects of the same frame that have a position, in the
order of its Detection2DArray (the same stamp), each with its Detection2D's id (the track id, or empty) and class
and score, and the position as its hypothesis' pose (`PoseWithCovariance`, covariance from the depth spread). So a
3D object is its 2D detection by track id when tracked; untracked, by order and hypothesis (`msg_links`): the k-th
3D object is the first 2D detection after the (k-1)-th's match with the same class_id and score (ambiguous only
between neighbours of equal class and score of which some have no position: a consumer that needs every link
exact runs the tracker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tiled_detector.geometry.polygons import corners, hulls, regularized

Labels = Sequence[str] | Mapping[int, str]


def _label_map(labels: Labels | None) -> dict[int, str]:
    """Class id -> name, from a list of names (index = id) or a mapping."""
    if labels is None:
        return {}
    if isinstance(labels, Mapping):
        return {int(key): str(value) for key, value in labels.items()}
    return {index: str(name) for index, name in enumerate(labels)}


def _center(bbox: Any) -> Any:
    """The object holding x / y of a BoundingBox2D centre (4.x nests it in center.position)."""
    return getattr(bbox.center, "position", bbox.center)


def _hypothesis(result: Any) -> tuple[Any, str]:
    """The object holding class id and score of an ObjectHypothesisWithPose, and the class id field name."""
    hypothesis = getattr(result, "hypothesis", result)  # 3.x / 4.x nest an ObjectHypothesis
    return hypothesis, ("class_id" if hasattr(hypothesis, "class_id") else "id")


def _checked_arrays(boxes: Any, scores: Any, class_ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    boxes = np.asarray(boxes, dtype=np.float64)
    if boxes.size == 0:
        boxes = boxes.reshape(0, 4)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    ids = np.asarray(class_ids).reshape(-1)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must have shape (N, 4), got {boxes.shape}")
    if not len(boxes) == len(scores) == len(ids):
        raise ValueError(
            f"need as many boxes as scores and class ids, got {len(boxes)}, {len(scores)} and {len(ids)}"
        )
    if not (np.isfinite(boxes).all() and np.isfinite(scores).all()):
        raise ValueError("boxes and scores must be finite")
    if (boxes[:, 2:] < boxes[:, :2]).any():
        raise ValueError("boxes must be x1, y1, x2, y2 with x2 >= x1 and y2 >= y1")
    if ids.size and not (ids.dtype.kind in "iu" or np.array_equal(ids, np.round(ids))):
        raise ValueError(f"class ids must be integers, got {ids.dtype} values")
    return boxes, scores, ids.astype(np.int64)


def detections_to_msg(
    boxes: Any,
    scores: Any,
    class_ids: Any,
    header: Any,
    labels: Labels | None = None,
    *,
    track_ids: Any = None,
    seen_ns: Any = None,
    msg_types: Any = None,
    obb: Any = None,
) -> Any:
    """Boxes (N, 4) x1, y1, x2, y2 in image pixels, scores (clipped to [0, 1]), class ids -> Detection2DArray.

    With rotated boxes `obb` (N, 5) cx, cy, w, h, angle (`Detections.obb`; `boxes` their hulls): bbox.center is the
    centre, `center.theta` the angle (`polygons.ANGLE`: radians, turning the image's +x axis toward +y, clockwise on
    screen, in [0, pi/2), as ultralytics' and yolo_ros'; a box given in another form is written in that one),
    size_x / size_y are w / h (the rectangle's own sides, before turning).

    `header` (stamp, frame_id) is set on the array and on every detection; `track_ids` (N,) become the detections'
    ids (default: none, the id is empty). `seen_ns` (N,) int: the stamp each detection was last seen at; one that differs from
    the header's gets a copy of the header at that stamp. `msg_types` is a namespace with Detection2DArray, Detection2D and
    ObjectHypothesisWithPose (default: vision_msgs.msg).
    """
    if msg_types is None:
        import vision_msgs.msg as msg_types
    boxes, scores, ids = _checked_arrays(boxes, scores, class_ids)
    names = _label_map(labels)
    centres = ((boxes[:, :2] + boxes[:, 2:]) / 2).tolist()
    sizes = (boxes[:, 2:] - boxes[:, :2]).tolist()
    thetas = [None] * len(centres)
    if obb is not None:
        rotated = np.asarray(obb, np.float64).reshape(-1, 5)
        if len(rotated) != len(centres) or not np.isfinite(rotated).all():
            raise ValueError(
                f"need one finite rotated box per detection, got {len(rotated)} for {len(centres)}"
            )
        rotated = regularized(rotated)  # the one convention's form: theta in [0, pi/2), the same rectangle
        centres, sizes, thetas = rotated[:, :2].tolist(), rotated[:, 2:4].tolist(), rotated[:, 4].tolist()
    class_names = [names.get(class_id, str(class_id)) for class_id in ids.tolist()]
    tags = [str(int(t)) for t in np.asarray(track_ids).reshape(-1)] if track_ids is not None else None
    if tags is not None and len(tags) != len(class_names):
        raise ValueError(f"need one track id per detection, got {len(tags)} for {len(class_names)}")
    headers = _headers(header, seen_ns, len(class_names))
    detections = []
    for rank, ((cx, cy), (width, height), theta, score, name) in enumerate(
        zip(centres, sizes, thetas, np.clip(scores, 0.0, 1.0).tolist(), class_names, strict=True)
    ):
        detection = msg_types.Detection2D()
        detection.header = headers[rank]
        if hasattr(detection, "id") and tags is not None:  # vision_msgs >= 3
            detection.id = tags[rank]
        center = _center(detection.bbox)
        center.x, center.y = cx, cy
        if theta is not None:
            detection.bbox.center.theta = theta
        detection.bbox.size_x, detection.bbox.size_y = width, height
        detection.results = [_result(msg_types, name, score)]
        detections.append(detection)
    array_msg = msg_types.Detection2DArray()
    array_msg.header = header
    array_msg.detections = detections
    return array_msg


def _headers(header: Any, seen_ns: Any, count: int) -> list[Any]:
    """Each detection's header: the array's, or a copy at the stamp it was last seen at (`seen_ns`)."""
    frame_ns = int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)
    seen = [frame_ns] * count if seen_ns is None else np.asarray(seen_ns, np.int64).reshape(-1).tolist()
    if len(seen) != count:
        raise ValueError(f"need one seen stamp per detection, got {len(seen)} for {count}")
    return [header if stamp == frame_ns else _at(header, stamp) for stamp in seen]


def _result(msg_types: Any, name: str, score: float) -> Any:
    """An ObjectHypothesisWithPose of class `name` with `score`."""
    result = msg_types.ObjectHypothesisWithPose()
    hypothesis, id_field = _hypothesis(result)
    setattr(hypothesis, id_field, name)
    hypothesis.score = score
    return result


# the variance of a degree of freedom not estimated (a 3D pose's orientation): large, so that a consumer fusing the
# pose (robot_localization, Nav2) reads it as unknown; 0 would say "exactly known"
UNKNOWN_VARIANCE = 1e9


def position_covariance(positions: Any, sizes: Any) -> np.ndarray:
    """(N, 3, 3) covariances of object positions from their depth spread: the depth's variance along the ray from
    the camera through the position, sigma_z^2 r r^T with r = (x / z, y / z, 1), sigma_z the standard deviation of
    the object's depths (its depth extent, size z, spans sqrt(12) of them: `pipeline.depth.EXTENT`). Across the
    ray nothing is measured beyond the box (a degenerate covariance: consumers that invert it add their own
    floor)."""
    positions = np.asarray(positions, np.float64).reshape(-1, 3)
    sigma_z = np.asarray(sizes, np.float64).reshape(-1, 3)[:, 2] / np.sqrt(12.0)
    ray = positions / positions[:, 2:3]
    return sigma_z[:, None, None] ** 2 * ray[:, :, None] * ray[:, None, :]


def detections_3d_to_msg(
    positions: Any,
    sizes: Any,
    scores: Any,
    class_ids: Any,
    header: Any,
    labels: Labels | None = None,
    *,
    track_ids: Any = None,
    seen_ns: Any = None,
    msg_types: Any = None,
) -> Any:
    """3D positions, sizes, scores and class ids -> Detection3DArray of the objects with a finite position.

    Positions and sizes are (N, 3) in metres in the header's frame (the colour camera's optical frame); an object
    whose position is not finite has no valid depth and is left out.

    Each Detection3D has the class and score of its Detection2D (`detections_to_msg` with the same arguments) and
    its id (the track id, or empty), in the order of the 2D array; its hypothesis' pose is the position with
    `position_covariance` (orientation not estimated: identity, its variances `UNKNOWN_VARIANCE`). `seen_ns` gives a
    carried object its own header as there. The box is axis-aligned in that frame (identity orientation). `msg_types` is
    a namespace with Detection3DArray, Detection3D and ObjectHypothesisWithPose (default: vision_msgs.msg).
    """
    if msg_types is None:
        import vision_msgs.msg as msg_types
    positions = np.asarray(positions, np.float64).reshape(-1, 3)
    sizes = np.asarray(sizes, np.float64).reshape(-1, 3)
    scores = np.clip(np.asarray(scores, np.float64).reshape(-1), 0.0, 1.0)
    ids = np.asarray(class_ids).reshape(-1).astype(np.int64)
    if not len(positions) == len(sizes) == len(scores) == len(ids):
        counts = f"{len(sizes)}, {len(scores)} and {len(ids)} for {len(positions)}"
        raise ValueError(f"need one size, score and class per position, got {counts}")
    tags = [str(int(t)) for t in np.asarray(track_ids).reshape(-1)] if track_ids is not None else None
    if tags is not None and len(tags) != len(ids):
        raise ValueError(f"need one track id per detection, got {len(tags)} for {len(ids)}")
    names = _label_map(labels)
    headers = _headers(header, seen_ns, len(ids))
    located = np.isfinite(positions).all(axis=1) & np.isfinite(sizes).all(axis=1) & (positions[:, 2] > 0)
    covariances = position_covariance(positions[located], sizes[located])
    detections = []
    for index, covariance in zip(np.flatnonzero(located).tolist(), covariances, strict=True):
        detection = msg_types.Detection3D()
        detection.header = headers[index]
        if hasattr(detection, "id") and tags is not None:  # vision_msgs >= 3
            detection.id = tags[index]
        point, size = detection.bbox.center.position, detection.bbox.size
        point.x, point.y, point.z = positions[index].tolist()
        size.x, size.y, size.z = sizes[index].tolist()
        detection.bbox.center.orientation.w = 1.0
        class_id = int(ids[index])
        result = _result(msg_types, names.get(class_id, str(class_id)), float(scores[index]))
        result.pose.pose = detection.bbox.center
        pose_covariance = np.diag([0.0, 0.0, 0.0, *[UNKNOWN_VARIANCE] * 3])
        pose_covariance[:3, :3] = covariance
        result.pose.covariance = pose_covariance.reshape(-1)
        detection.results = [result]
        detections.append(detection)
    array_msg = msg_types.Detection3DArray()
    array_msg.header = header
    array_msg.detections = detections
    return array_msg


def msg_links(msg: Any, msg_3d: Any) -> np.ndarray:
    """(N,) for each detection of a Detection2DArray the index of its object in the Detection3DArray of the same
    frame (-1: none): by id where the 3D object has one (a track id), else by the documented order (module
    docstring): the next 2D detection, after the last one linked, with the same class_id and score."""
    links = np.full(len(msg.detections), -1, np.int64)
    by_id = {str(getattr(d, "id", "")): k for k, d in enumerate(msg.detections) if getattr(d, "id", "")}
    after = 0
    for index, detection in enumerate(msg_3d.detections):
        tag = str(getattr(detection, "id", ""))
        if tag:
            if tag in by_id:
                links[by_id[tag]] = index
            continue
        key = _hypothesis_key(detection)
        at = next((k for k in range(after, len(links)) if _hypothesis_key(msg.detections[k]) == key), None)
        if at is not None:
            links[at], after = index, at + 1
    return links


def _hypothesis_key(detection: Any) -> tuple[str, float] | None:
    """A detection's first hypothesis as (class id, score), None without one."""
    if not detection.results:
        return None
    hypothesis, id_field = _hypothesis(detection.results[0])
    return str(getattr(hypothesis, id_field)), float(hypothesis.score)


def msg_to_positions(msg: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Detection3DArray -> (the detections' ids, positions (N, 3) float64, sizes (N, 3) float64)."""
    ids = [str(getattr(d, "id", "")) for d in msg.detections]
    points = [d.bbox.center.position for d in msg.detections]
    positions = [(p.x, p.y, p.z) for p in points]
    sizes = [(d.bbox.size.x, d.bbox.size.y, d.bbox.size.z) for d in msg.detections]
    return ids, np.asarray(positions, np.float64).reshape(-1, 3), np.asarray(sizes, np.float64).reshape(-1, 3)


def msg_to_detections(msg: Any, labels: Labels | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Detection2DArray -> (boxes (N, 4) float32 x1, y1, x2, y2, scores (N,) float32, class ids (N,) int64).

    Each detection contributes its highest-scoring hypothesis; detections without any are skipped. Class ids
    are looked up in `labels` by name, else parsed as integers (ValueError if neither works). A rotated box
    (`center.theta` not 0: `polygons.ANGLE`) gives the axis-aligned box around its rectangle (its hull), as the
    node's `Detections.boxes` are: its rotated box itself is `msg_obb`'s.
    """
    ids_by_name = {name: class_id for class_id, name in _label_map(labels).items()}
    rows: list[tuple[float, float, float, float, float]] = []
    class_ids: list[int] = []
    for detection in msg.detections:
        if not detection.results:
            continue
        hypotheses = (_hypothesis(result) for result in detection.results)
        hypothesis, id_field = max(hypotheses, key=lambda pair: pair[0].score)
        name = str(getattr(hypothesis, id_field))
        if name in ids_by_name:
            class_ids.append(ids_by_name[name])
        else:
            try:
                class_ids.append(int(name))
            except ValueError:
                raise ValueError(f"class id {name!r} is neither a known label nor an integer") from None
        rows.append((*_rectangle(detection.bbox), hypothesis.score))
    values = np.asarray(rows, dtype=np.float64).reshape(-1, 6)
    boxes = hulls(corners(values[:, :5]))
    return boxes.astype(np.float32), values[:, 5].astype(np.float32), np.asarray(class_ids, dtype=np.int64)


def _rectangle(bbox: Any) -> tuple[float, float, float, float, float]:
    """A BoundingBox2D's cx, cy, w, h, theta (0 where the layout has no angle)."""
    center = _center(bbox)
    return center.x, center.y, bbox.size_x, bbox.size_y, float(getattr(bbox.center, "theta", 0.0))


def msg_obb(msg: Any) -> np.ndarray:
    """Detection2DArray -> (N, 5) float32 rotated boxes cx, cy, w, h, theta (`detections_to_msg`'s obb), one per
    detection with a hypothesis, in `msg_to_detections`' order; read in the one convention (`polygons.ANGLE`) and
    given in its regular form (theta in [0, pi/2): the same rectangle, whatever form a publisher wrote)."""
    rows = [_rectangle(d.bbox) for d in msg.detections if d.results]
    return regularized(np.asarray(rows, np.float64).reshape(-1, 5)).astype(np.float32)


def _at(header: Any, stamp: int) -> Any:
    """A copy of a std_msgs Header at another stamp (ns)."""
    sec, nanosec = divmod(int(stamp), 1_000_000_000)
    return type(header)(stamp=type(header.stamp)(sec=sec, nanosec=nanosec), frame_id=header.frame_id)


def msg_carried(msg: Any) -> int:
    """How many detections of a Detection2DArray were reported from an earlier frame (their header's stamp is not
    the array's)."""
    stamp = (msg.header.stamp.sec, msg.header.stamp.nanosec)
    return sum((d.header.stamp.sec, d.header.stamp.nanosec) != stamp for d in msg.detections)


def msg_ids(msg: Any) -> np.ndarray:
    """The Detection2D ids of a Detection2DArray as integers (N,) int64 (-1 where an id is not a whole number, or
    the message predates vision_msgs 3)."""
    ids = [getattr(d, "id", "") for d in msg.detections]
    return np.array([int(i) if str(i).lstrip("-").isdigit() else -1 for i in ids], np.int64)
