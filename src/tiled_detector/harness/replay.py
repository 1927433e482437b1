"""Replay a bag's camera topic through the detector node, record and score its answers: a release gate.

Two modes:
- lock-step: each frame is published (raw CDR bytes from the bag, no decoding) and its detections, matched by
  header stamp, are awaited up to a per-frame timeout before the next frame goes out. A frame without an
  answer in time is counted as dropped and not re-sent: a re-send would hide a node that loses frames.
- realtime: frames go out at the bag's pace, each preceded by rosgraph_msgs/Clock on /clock carrying its bag
  time (the node runs with use_sim_time), so a node slower than the camera drops frames, as on the robot.
In both modes the first frame is re-sent every second until it is answered (DDS discovery may still be
completing on the node's side, and a best-effort subscription loses what arrives before): playback starts
with a warm node and a working path, and only the first frame's last publish counts for its latency.

Scores: AP50 (COCO, pycocotools) plus precision and recall at IoU 0.5 over the answered frames against the
bag's ground truth (`/ground_truth`); a dropped frame is counted in `dropped` / the drop rate instead. A node with
a segmentation model also publishes `masks` (label images): each answer's is checked against its array (same
stamp, values 0..N), and scored as mask AP (pycocotools `segm`) where the bag has truth masks
(`/ground_truth/masks`, from `make-bag --truth coco.json`). A node with a pose model also publishes `keypoints`
(tiled_detector_msgs/KeypointsArray, one entry per detection): each answer's is checked against its array, and
scored as keypoint AP (OKS, pycocotools `keypoints`) where the bag has truth keypoints (`/ground_truth/keypoints`,
from `make-bag --truth` of COCO person keypoints or `make-bag --pose`).
Latency per frame is the time the answer arrived minus the time the frame was published.
The ROS side goes through `tiled_detector.harness.client.DetectorClient`; rclpy is imported only there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tiled_detector.harness import bags
from tiled_detector.harness.depth_replay import DepthPlay, depth_scores, truth_positions
from tiled_detector.harness.recording import IDENTITIES, JOINTS, ROTATED
from tiled_detector.harness.report import (
    FrameRecord,
    Mode,
    ReplayReport,
    class_names,
    keypoint_scores,
    mask_scores,
    summarize,
    to_arrays,
)
from tiled_detector.messages.detections import msg_carried, msg_ids
from tiled_detector.messages.images import stamp_ns
from tiled_detector.tools.scoring import box_iou, mot_metrics, rotated_iou

RESEND_S = 1.0  # seconds between publishes of the first frame until the node answers it
DIAGNOSTICS_WAIT_S = 5.0  # seconds to wait for the node's /diagnostics to count every answered frame


class ReplayError(RuntimeError):
    """The replay could not run (bad bag, node did not start); the text says why."""


@dataclass(frozen=True)
class Thresholds:
    """Release gate: minimum AP50 / recall, maximum drop rate (fraction of frames sent); None = unchecked."""

    min_ap50: float | None = None
    min_recall: float | None = None
    max_drop_rate: float | None = None
    min_idf1: float | None = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")

    def failures(self, report: ReplayReport) -> list[str]:
        """One line per missed threshold (empty: the gate passes)."""
        out = []
        for name, value, minimum in (
            ("AP50", report.ap50, self.min_ap50),
            ("recall", report.recall, self.min_recall),
            ("IDF1", (report.tracking or {}).get("IDF1"), self.min_idf1),
        ):
            if minimum is None:
                continue
            if value is None:
                what = "with object identities (make-bag --motion or --truth) " if name == "IDF1" else ""
                out.append(
                    f"{name} >= {minimum} required but the bag has no ground truth {what}on "
                    f"{bags.GROUND_TRUTH_TOPIC}".replace("  ", " ")
                )
            elif value < minimum:
                out.append(f"{name} {value:.3f} < {minimum}")
        if self.max_drop_rate is not None and report.drop_rate > self.max_drop_rate:
            out.append(
                f"drop rate {report.drop_rate:.3f} > {self.max_drop_rate} "
                f"({report.dropped} of {report.frames_sent} frames)"
            )
        return out


@dataclass(frozen=True)
class ReplayOptions:
    """How to run the node and play the bag into it."""

    mode: Mode = Mode.LOCKSTEP
    timeout: float = (
        30.0  # lock-step: seconds per frame; realtime: seconds for the last answer after the last frame
    )
    startup_timeout: float = 120.0  # seconds for the node to come up (model loading)
    topic: str | None = None  # image topic of the bag; None = its only one
    detections_topic: str = "detections"
    attach: bool = False  # use a running node instead of starting one
    params_file: Path | None = None
    parameters: Mapping[str, object] = field(default_factory=dict)
    domain_id: int | None = None  # None: a fresh one for a started node, the environment's when attaching
    program: Sequence[str] | None = None  # node command line (default: the detector node)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.from_value(self.mode))
        if not self.timeout > 0 or not self.startup_timeout > 0:
            raise ValueError(f"timeouts must be > 0 s, got {self.timeout} and {self.startup_timeout}")


@dataclass
class _Played:
    """What one run over DDS produced: sent frames (stamp, monotonic publish time) and the answers."""

    sent: list[tuple[int, float]] = field(default_factory=list)
    answers: dict[int, Any] = field(default_factory=dict)
    arrivals: dict[int, float] = field(default_factory=dict)
    detections_topic: str = ""
    node_values: dict[str, str] = field(default_factory=dict)  # the node's last /diagnostics key/values
    masks: dict[int, Any] = field(default_factory=dict)  # a segmentation model's label images by header stamp
    keypoints: dict[int, Any] = field(default_factory=dict)  # a pose model's KeypointsArrays by header stamp


def _unique_stamps(frames: Iterable[bags.BagMessage]) -> Iterator[bags.BagMessage]:
    """The frames, checking that each has its own header stamp (answers are matched by stamp)."""
    seen: set[int] = set()
    for frame in frames:
        if frame.stamp_ns is None or frame.stamp_ns in seen:
            raise ReplayError(
                f"frame at bag time {frame.time_ns} repeats header stamp {frame.stamp_ns}: "
                "answers are matched by stamp, so every frame needs its own"
            )
        seen.add(frame.stamp_ns)
        yield frame


def _wait_for_node(client: Any, node: Any, timeout: float) -> bool:
    """Wait until the node is matched both ways; gives up early when a started node process has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.wait_for_node(timeout=min(1.0, max(deadline - time.monotonic(), 0.0))):
            return True
        if node is not None and not node.alive():
            return False
    return False


def _prime(client: Any, frame: bags.BagMessage, timeout: float) -> float:
    """Publish the first frame every `RESEND_S` until the node answers it (or `timeout` passes).

    Our side seeing the node's subscription does not mean the node's side has matched our publisher yet, and a
    best-effort subscription loses what arrives before; the first answer proves the path works both ways.
    Returns the time of the last publish.
    """
    assert frame.stamp_ns is not None
    deadline = time.monotonic() + timeout
    while True:
        sent = time.monotonic()
        client.publish(frame.data)
        remaining = deadline - sent
        if (
            client.wait_for_stamp(frame.stamp_ns, min(RESEND_S, max(remaining, 0.0))) is not None
            or remaining <= RESEND_S
        ):
            return sent


def _play(
    frames: Iterable[bags.BagMessage], compressed: bool, topic: str, options: ReplayOptions, depth: DepthPlay
) -> _Played:
    """Start (or attach to) the node, play `frames` into it (with the bag's `depth` side) and collect its
    answers."""
    from builtin_interfaces.msg import Time
    from diagnostic_msgs.msg import DiagnosticArray
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Image

    from tiled_detector.harness.client import DetectorClient
    from tiled_detector.harness.process import DETECTOR_NODE, NodeProcess, pick_domain_id

    realtime = options.mode is Mode.REALTIME
    domain = options.domain_id if options.domain_id is not None or options.attach else pick_domain_id()
    played = _Played()
    with contextlib.ExitStack() as stack:
        node = None
        if not options.attach:
            parameters = {**options.parameters, **({"transport": "compressed"} if compressed else {})}
            if realtime:
                parameters["use_sim_time"] = True
            remaps = {"image/compressed" if compressed else "image": topic, **depth.remaps()}
            node = stack.enter_context(
                NodeProcess(
                    options.params_file, parameters, remaps, domain, program=options.program or DETECTOR_NODE
                )
            )
        client = DetectorClient(
            domain_id=domain,
            image_topic=topic,
            detections_topic=options.detections_topic,
            image_reliable=True,
            compressed=compressed,
            node_name="tiled_detector_replay",
        )
        stack.callback(client.close)
        depth.start(client)
        if not _wait_for_node(client, node, options.startup_timeout):
            log = node.log_text()[-3000:] if node is not None else ""
            why = (
                "the node process exited"
                if node is not None and not node.alive()
                else (
                    f"no node subscribed to {topic} and published {options.detections_topic} within "
                    f"{options.startup_timeout} s"
                )
            )
            raise ReplayError(f"{why}{':' if log else ''}\n{log}".rstrip())
        depth.wait(client, options.startup_timeout)
        played.detections_topic = client.detections_subscription.topic_name
        diagnostics = client.subscribe(DiagnosticArray, "/diagnostics")
        labels = client.subscribe(Image, masks_topic(played.detections_topic))
        posed = _keypoint_subscription(client, played.detections_topic)
        clock = client.node.create_publisher(Clock, "/clock", 10) if realtime else None
        start, first_time = 0.0, 0
        for index, frame in enumerate(_unique_stamps(depth.frames(frames))):
            assert frame.stamp_ns is not None
            if clock is not None:
                if index:
                    time.sleep(max(0.0, start + (frame.time_ns - first_time) / 1e9 - time.monotonic()))
                sec, nanosec = divmod(frame.time_ns, 1_000_000_000)
                clock.publish(Clock(clock=Time(sec=sec, nanosec=nanosec)))
            if index == 0:
                played.sent.append((frame.stamp_ns, _prime(client, frame, options.timeout)))
                start, first_time = time.monotonic(), frame.time_ns
                continue
            played.sent.append((frame.stamp_ns, time.monotonic()))
            client.publish(frame.data)
            if not realtime:
                client.wait_for_stamp(frame.stamp_ns, options.timeout)
        if realtime and played.sent:
            client.wait_for_stamp(played.sent[-1][0], options.timeout)
        answered = sum(stamp in client.detections for stamp, _ in played.sent)
        client.wait_until(lambda: _counted(diagnostics, answered) is not None, DIAGNOSTICS_WAIT_S)
        played.node_values = _counted(diagnostics, answered) or {}
        if labels:  # the node publishes masks: the last frames' label images may still be on their way
            client.wait_until(lambda: len(labels) >= answered, DIAGNOSTICS_WAIT_S)
        played.masks = {stamp_ns(m.header.stamp): m for m in list(labels)}
        if posed:  # a pose model: its keypoints come with each answer
            client.wait_until(lambda: len(posed) >= answered, DIAGNOSTICS_WAIT_S)
        played.keypoints = {stamp_ns(m.header.stamp): m for m in list(posed)}
    stamps = {stamp for stamp, _ in played.sent}  # the client is closed: its dicts no longer change
    played.answers = {s: m for s, m in client.detections.items() if s in stamps}
    played.arrivals = {s: t for s, t in client.arrivals.items() if s in stamps}
    return played


def beside(detections_topic: str, name: str) -> str:
    """The node's topic `name` beside its detections topic (`.../detections` -> `.../name`)."""
    namespace, _, _ = detections_topic.rpartition("/")
    return f"{namespace}/{name}" if namespace or detections_topic.startswith("/") else name


def masks_topic(detections_topic: str) -> str:
    """The node's masks topic beside its detections topic (`.../detections` -> `.../masks`)."""
    return beside(detections_topic, "masks")


def _keypoint_subscription(client: Any, detections_topic: str) -> list[Any]:
    """The node's keypoints beside its detections, as they arrive (none where tiled_detector_msgs is not built)."""
    try:
        from tiled_detector_msgs.msg import KeypointsArray
    except ImportError:
        return []
    return client.subscribe(KeypointsArray, beside(detections_topic, "keypoints"))


def _counted(diagnostics: list[Any], answered: int) -> dict[str, str] | None:
    """The key/values of the newest /diagnostics status (the node's whole, not a camera's) that counts at least
    `answered` processed frames, or None."""
    for array in reversed(diagnostics):
        for status in array.status:
            values = {kv.key: kv.value for kv in status.values}
            if "views_per_frame" in values and int(values.get("frames_processed", -1)) >= answered:
                return values
    return None


def replay_bag(
    bag: str | Path, options: ReplayOptions | None = None, output: str | Path | None = None
) -> ReplayReport:
    """Replay `bag` through the node, score against its ground truth, optionally record into `output`.

    `output` receives `detections/` (a bag of the node's Detection2DArray answers, same storage as the input,
    at their header stamps) and `report.json` (summary and per-frame records). Raises ReplayError when the
    replay cannot run.
    """
    options = options or ReplayOptions()
    try:
        info = bags.bag_info(bag)
        topic = info.image_topic(options.topic)
    except (OSError, KeyError, ValueError) as error:
        raise ReplayError(f"cannot replay {bag}: {error}") from error
    compressed = info.topics[topic][0] == bags.COMPRESSED_IMAGE
    truth_messages = {}
    if bags.GROUND_TRUTH_TOPIC in info.topics:
        truth_messages = {
            m.stamp_ns: bags.deserialize(m.data, bags.DETECTIONS)
            for m in bags.read_messages(bag, [bags.GROUND_TRUTH_TOPIC])
        }
    depth = DepthPlay(info)
    played = _play(bags.read_messages(bag, [topic, *depth.topics]), compressed, topic, options, depth)
    labels = class_names([*truth_messages.values(), *played.answers.values()])
    rotated = info.custom_data.get(ROTATED) == "true"
    answers = to_arrays(played.answers, labels, rotated)
    truth = {  # rotated: with each object's difficult flag (score 0)
        stamp: (boxes, classes, scores == 0) if rotated else (boxes, classes)
        for stamp, (boxes, scores, classes) in to_arrays(truth_messages, labels, rotated).items()
    }
    records = [
        FrameRecord(
            stamp,
            (played.arrivals[stamp] - sent) * 1e3 if stamp in answers else None,
            answers.get(stamp),
            msg_ids(played.answers[stamp]) if stamp in answers else None,
        )
        for stamp, sent in played.sent
    ]
    tracking = None
    if info.custom_data.get(IDENTITIES) == "true" and truth_messages:
        empty = (np.zeros((0, 5 if rotated else 4)), np.zeros(0, np.int64))
        scored = [r for r in records if r.stamp_ns in truth_messages]  # every frame sent: a drop is a miss
        tracking = mot_metrics(
            [(truth[r.stamp_ns][0], msg_ids(truth_messages[r.stamp_ns])) for r in scored],
            [empty if r.detections is None else (r.detections[0], r.ids) for r in scored],
            overlap_of=rotated_iou if rotated else box_iou,
        )
    answered = [played.arrivals[stamp] for stamp, _ in played.sent if stamp in played.arrivals]
    elapsed = max(answered) - played.sent[0][1] if answered and played.sent else 0.0
    work = {
        "views_per_frame": float(played.node_values["views_per_frame"]) if played.node_values else None,
        "views_per_frame_max": int(played.node_values["views_per_frame_max"]) if played.node_values else None,
        "frames_per_second": len(answered) / elapsed if elapsed > 0 else None,
        "predicted_boxes": sum(msg_carried(m) for m in played.answers.values()),
        "frames_skipped": int(played.node_values["frames_skipped"])
        if "frames_skipped" in played.node_values
        else None,
    }
    report = dataclasses.replace(
        summarize(options.mode, records, truth, rotated), labels=tuple(labels), tracking=tracking, work=work
    )
    if (
        played.masks
    ):  # a segmentation model: its label images against the array, and mask AP where there is truth
        truth_masks = _truth_masks(bag, info)
        size = _frame_size(bag, topic)
        scores = mask_scores(answers, played.masks, truth, truth_masks, size)
        report = dataclasses.replace(report, masks=scores)
    if (
        played.keypoints
    ):  # a pose model: its keypoints against the array, and keypoint AP where there is truth
        try:
            scores = keypoint_scores(answers, played.keypoints, truth, _truth_keypoints(bag, info))
        except ValueError as error:
            raise ReplayError(f"cannot score the keypoints of {bag}: {error}") from None
        report = dataclasses.replace(report, keypoints=scores)
    if depth.topics:  # an RGB-D bag: the positions of the node's detections_3d against the true ones
        located = depth.answers(stamp for stamp, _ in played.sent)
        truth_3d = truth_positions(bag) if depth.truth else {}
        scores = depth_scores(answers, played.answers, located, truth, truth_3d)
        report = dataclasses.replace(report, depth=scores)
    if output is not None:
        _record(Path(output), played, info.storage, report, records, labels)
    return report


def _frame_size(bag: str | Path, topic: str) -> tuple[int, int]:
    """The (height, width) of the bag's first frame on `topic`."""
    from tiled_detector.messages.images import compressed_to_array

    first = next(iter(bags.read_messages(bag, [topic])))
    message = bags.deserialize(first.data, first.msgtype)
    if first.msgtype == bags.COMPRESSED_IMAGE:
        return compressed_to_array(message)[0].shape[:2]
    return int(message.height), int(message.width)


def _truth_masks(bag: str | Path, info: bags.BagInfo) -> dict[int, list]:
    """The bag's ground-truth masks (stamp -> one COCO RLE or None per truth box), empty when it has none."""
    if bags.GROUND_TRUTH_MASKS_TOPIC not in info.topics:
        return {}
    return {
        m.time_ns: json.loads(bags.deserialize(m.data, bags.TEXT).data)
        for m in bags.read_messages(bag, [bags.GROUND_TRUTH_MASKS_TOPIC])
    }


def _truth_keypoints(bag: str | Path, info: bags.BagInfo) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The bag's ground-truth keypoints (stamp -> (N, K, 3) x, y, visibility and (N,) areas, per truth box), empty
    when it has none."""
    if bags.GROUND_TRUTH_KEYPOINTS_TOPIC not in info.topics:
        return {}
    joints = len(json.loads(info.custom_data.get(JOINTS, "[]")))
    found = {}
    for m in bags.read_messages(bag, [bags.GROUND_TRUTH_KEYPOINTS_TOPIC]):
        frame = json.loads(bags.deserialize(m.data, bags.TEXT).data)
        areas = np.asarray(frame["areas"], np.float64).reshape(-1)
        points = np.asarray(frame["keypoints"], np.float64).reshape(len(areas), joints, 3)
        found[m.time_ns] = (points, areas)
    return found


def _record(
    output: Path,
    played: _Played,
    storage: bags.Storage,
    report: ReplayReport,
    records: Sequence[FrameRecord],
    labels: Sequence[str],
) -> None:
    """Write the node's answers as a bag and the report (summary + per-frame detections) as JSON."""
    from rclpy.serialization import serialize_message

    output.mkdir(parents=True, exist_ok=True)
    with bags.BagWriter(
        output / "detections", storage, force=True, custom_data={"source": "tiled-detector replay"}
    ) as writer:
        for stamp in sorted(played.answers):
            writer.write(
                played.detections_topic, bags.DETECTIONS, stamp, serialize_message(played.answers[stamp])
            )
    frames = []
    for record in records:
        boxes, scores, classes = record.detections or (np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))
        frames.append(
            {
                "stamp_ns": record.stamp_ns,
                "answered": record.detections is not None,
                "latency_ms": record.latency_ms,
                "detections": [
                    {"obb" if len(b) == 5 else "box": b, "score": s, "class_id": labels[c]}
                    for b, s, c in zip(boxes.tolist(), scores.tolist(), classes.tolist(), strict=True)
                ],
            }
        )
    text = json.dumps({"summary": report.summary(), "frames": frames}, indent=1)
    temporary = output / ".report.json.tmp"
    temporary.write_text(text)
    temporary.replace(output / "report.json")
