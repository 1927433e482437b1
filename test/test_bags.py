"""Bags: written with rosbags, read back with rosbags, mcap, sqlite3 and rclpy; metadata; atomic writes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.cli import main as cli_main
from tiled_detector.harness import bags, recording
from tiled_detector.tools.worlds.synthetic import CLASSES, make_scene

W, H, N, SEED = 320, 240, 3, 11


@pytest.fixture(scope="module", params=["sqlite3", "mcap"])
def synthetic_bag(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "bag"
    return recording.make_synthetic_bag(out, N, SEED, W, H, rate=10.0, storage=request.param)


def test_rosbags_round_trip_keeps_frames_and_stamps(synthetic_bag: Path) -> None:
    images = [m for m in bags.read_messages(synthetic_bag) if m.topic == "/camera/image_raw"]
    assert [m.stamp_ns for m in images] == [bags.START_NS + i * 100_000_000 for i in range(N)]
    assert [m.time_ns for m in images] == [m.stamp_ns for m in images]
    for index, message in enumerate(images):
        msg = bags.deserialize(message.data, bags.IMAGE)
        assert (msg.width, msg.height, msg.encoding, msg.step) == (W, H, "rgb8", W * 3)
        assert msg.header.frame_id == "camera"
        np.testing.assert_array_equal(msg.data.reshape(H, W, 3), make_scene(SEED + index, W, H).image)


def test_ground_truth_round_trip(synthetic_bag: Path) -> None:
    truth = bags.read_detections(synthetic_bag, labels=CLASSES)
    assert sorted(truth) == [bags.START_NS + i * 100_000_000 for i in range(N)]
    for index, stamp in enumerate(sorted(truth)):
        scene = make_scene(SEED + index, W, H)
        boxes, scores, class_ids = truth[stamp]
        np.testing.assert_allclose(boxes, scene.boxes, atol=1e-3)
        np.testing.assert_array_equal(class_ids, scene.class_ids)
        np.testing.assert_array_equal(scores, np.ones(len(scene.class_ids), np.float32))


def test_rclpy_reads_the_same_messages(synthetic_bag: Path) -> None:
    """Bag bytes deserialize in rclpy to the same content (what `publish(raw)` hands the node)."""
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import Image
    from vision_msgs.msg import Detection2DArray

    from tiled_detector.messages.detections import msg_to_detections

    messages = list(bags.read_messages(synthetic_bag))
    image = deserialize_message(messages[0].data, Image)
    assert bags.stamp_ns(image.header.stamp) == messages[0].stamp_ns
    np.testing.assert_array_equal(
        np.frombuffer(image.data, np.uint8).reshape(H, W, 3), make_scene(SEED, W, H).image
    )
    truth = deserialize_message(messages[1].data, Detection2DArray)
    boxes, _, class_ids = msg_to_detections(truth, CLASSES)
    np.testing.assert_allclose(boxes, make_scene(SEED, W, H).boxes, atol=1e-3)
    np.testing.assert_array_equal(class_ids, make_scene(SEED, W, H).class_ids)


def test_independent_readers_see_the_same_bag(synthetic_bag: Path) -> None:
    """mcap storage through the `mcap` library, sqlite3 storage through sqlite3 itself."""
    expected = [(m.topic, m.time_ns, m.data) for m in bags.read_messages(synthetic_bag)]
    info = bags.bag_info(synthetic_bag)
    if info.storage is bags.Storage.MCAP:
        from mcap.reader import make_reader

        (path,) = synthetic_bag.glob("*.mcap")
        with path.open("rb") as stream:
            reader = make_reader(stream)
            assert reader.get_header().profile == "ros2"
            seen = [
                (channel.topic, message.log_time, message.data, schema.name, schema.encoding)
                for schema, channel, message in reader.iter_messages(log_time_order=True)
            ]
        assert {(s[3], s[4]) for s in seen} == {(bags.IMAGE, "ros2msg"), (bags.DETECTIONS, "ros2msg")}
    else:
        (path,) = synthetic_bag.glob("*.db3")
        with sqlite3.connect(path) as db:
            seen = db.execute(
                "SELECT topics.name, messages.timestamp, messages.data FROM messages "
                "JOIN topics ON topics.id = messages.topic_id ORDER BY messages.timestamp, messages.id"
            ).fetchall()
    assert sorted((t, ts, bytes(d)) for t, ts, d, *_ in seen) == sorted(expected)


def test_metadata_is_version_8_and_decodable_by_humble(synthetic_bag: Path) -> None:
    """Humble (BagMetadata v5) reads fields behind `version >= N` gates and needs string QoS profiles."""
    metadata = yaml.safe_load((synthetic_bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert metadata["version"] == bags.METADATA_VERSION == 8 > bags.HUMBLE_METADATA_VERSION
    assert isinstance(metadata["storage_identifier"], str)
    assert all((synthetic_bag / p).is_file() for p in metadata["relative_file_paths"])
    assert isinstance(metadata["duration"]["nanoseconds"], int)
    assert metadata["starting_time"]["nanoseconds_since_epoch"] == bags.START_NS
    assert metadata["message_count"] == 2 * N
    assert metadata["compression_format"] == metadata["compression_mode"] == ""
    assert [f["message_count"] for f in metadata["files"]] == [2 * N]
    for entry in metadata["topics_with_message_count"]:
        topic = entry["topic_metadata"]
        assert isinstance(topic["offered_qos_profiles"], str)  # a YAML list here breaks Humble (v9)
        assert topic["serialization_format"] == "cdr"
        assert topic["type_description_hash"].startswith("RIHS01_")
    assert isinstance(metadata["custom_data"], dict)  # Iron+ decode custom_data as a map: never null
    assert metadata["custom_data"]["seed"] == str(SEED)


@pytest.mark.parametrize("msgtype", [bags.IMAGE, bags.COMPRESSED_IMAGE, bags.DETECTIONS])
def test_type_hashes_equal_rosidl(msgtype: str) -> None:
    """The hashes written into bags equal the ones rosidl generated for the installed types."""
    package, _, name = msgtype.split("/")
    generated = json.loads((Path(sys.prefix) / "share" / package / "msg" / f"{name}.json").read_text())
    expected = {entry["type_name"]: entry["hash_string"] for entry in generated["type_hashes"]}[msgtype]
    assert bags.typestore().hash_rihs01(msgtype) == expected


def test_writes_are_atomic_and_refuse_to_overwrite(tmp_path: Path) -> None:
    frame = recording.Frame(np.zeros((16, 16, 3), np.uint8))
    out = recording.write_image_bag(tmp_path / "bag", [frame])
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(FileExistsError, match="--force"):
        recording.write_image_bag(out, [frame])
    with pytest.raises(RuntimeError, match="boom"), bags.BagWriter(tmp_path / "broken") as writer:
        writer.write("/x", bags.IMAGE, 1, bags.image_message(frame.image, 1, "f"))
        raise RuntimeError("boom")
    assert not (tmp_path / "broken").exists()
    recording.write_image_bag(out, [frame, frame], force=True, storage="mcap")
    assert bags.bag_info(out).topics == {"/camera/image_raw": (bags.IMAGE, 2)}
    assert sorted(p.name for p in out.iterdir()) != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bag"]  # no staging folders left


def test_compressed_frames_are_jpeg(tmp_path: Path) -> None:
    scene = make_scene(3, 160, 120)
    out = recording.write_image_bag(tmp_path / "c", [recording.Frame(scene.image)], compressed=True)
    (message,) = bags.read_messages(out)
    msg = bags.deserialize(message.data, bags.COMPRESSED_IMAGE)
    assert msg.format == "rgb8; jpeg compressed bgr8"
    decoded = cv2.imdecode(msg.data, cv2.IMREAD_COLOR)[..., ::-1]
    assert np.abs(decoded.astype(int) - scene.image).mean() < 8


def test_cli_from_images_and_video(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "shots"
    folder.mkdir()
    for index in range(3):
        cv2.imwrite(str(folder / f"{index}.png"), make_scene(index, 64, 48).image[..., ::-1])
    assert cli_main(["make-bag", str(tmp_path / "from_images"), "--images", str(folder), "--rate", "5"]) == 0
    info = bags.bag_info(tmp_path / "from_images")
    assert info.topics == {"/camera/image_raw": (bags.IMAGE, 3)}  # no ground truth for plain images
    first = bags.deserialize(next(bags.read_messages(info.path)).data, bags.IMAGE)
    np.testing.assert_array_equal(first.data.reshape(48, 64, 3), make_scene(0, 64, 48).image)

    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for index in range(5):
        writer.write(make_scene(index, 64, 48).image[..., ::-1].copy())
    writer.release()
    assert (
        cli_main(
            [
                "make-bag",
                str(tmp_path / "from_video"),
                "--video",
                str(video),
                "--frames",
                "4",
                "--topic",
                "/front/image",
                "--storage",
                "mcap",
            ]
        )
        == 0
    )
    assert bags.bag_info(tmp_path / "from_video").topics == {"/front/image": (bags.IMAGE, 4)}
    assert "wrote" in capsys.readouterr().out
    assert cli_main(["make-bag", str(tmp_path / "from_video"), "--video", str(video)]) == 1
    assert "exists: replace it with --force" in capsys.readouterr().err


def test_cli_truth_on_unpadded_names_and_a_box_outside_its_frame(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """frame1.png ... frame11.png with a MOT gt.txt: each frame's boxes on its own image (natural order), a box
    wholly outside its frame left out and counted; names that do not number the frames one to one: exit 1, one
    line naming two of them, nothing written."""
    folder = tmp_path / "img1"
    folder.mkdir()
    for n in range(1, 12):
        cv2.imwrite(str(folder / f"frame{n}.png"), np.full((48, 64, 3), n, np.uint8))
    rows = [f"{n},1,{n},1,10,10,1,1,1" for n in range(1, 12)] + [
        "2,2,100,1,10,10,1,1,1"
    ]  # id 2: right of frame 2
    gt = tmp_path / "gt.txt"
    gt.write_text("\n".join(rows) + "\n")
    argv = [
        "make-bag",
        str(tmp_path / "bag"),
        "--images",
        str(folder),
        "--truth",
        str(gt),
        "--truth-class",
        "person",
    ]
    argv += ["--labels", "red", "person", "yellow", "green"]
    assert cli_main(argv) == 0
    assert (
        "11 person boxes" in (out := capsys.readouterr().out) and "1 with no area inside their frame" in out
    )
    truth = bags.read_detections(tmp_path / "bag", labels=["person"])
    lefts = [float(truth[stamp][0][0, 0]) for stamp in sorted(truth)]
    assert lefts == [n - 1.0 for n in range(1, 12)]  # frame n's box (left n, 1-based) on framen.png
    (folder / "frame12.png").write_bytes((folder / "frame11.png").read_bytes())
    (folder / "frame11.png").unlink()  # frame10.png is followed by frame12.png
    assert cli_main([*argv, "--force"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--images {folder}: frame10.png is followed by frame12.png" in err[0], err
    assert bags.bag_info(tmp_path / "bag").topics["/camera/image_raw"][1] == 11  # the old bag, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bag", "gt.txt", "img1"]  # nothing half written


def test_image_topic_selection(synthetic_bag: Path) -> None:
    info = bags.bag_info(synthetic_bag)
    assert info.image_topic() == "/camera/image_raw"
    with pytest.raises(ValueError, match="not an image topic"):
        info.image_topic("/ground_truth")


def test_option_and_message_errors() -> None:
    assert bags.Storage.from_value("MCAP") is bags.Storage.MCAP
    with pytest.raises(ValueError, match="sqlite3, mcap"):
        bags.Storage.from_value("bag")
    with pytest.raises(ValueError, match="no field"):
        bags.new_message(bags.IMAGE, colour=1)
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        bags.image_message(np.zeros((4, 4), np.uint8), 0, "f")
    with pytest.raises(ValueError, match="both"):
        recording.Frame(np.zeros((4, 4, 3), np.uint8), boxes=np.zeros((0, 4)))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1900),
            st.floats(0, 1060),
            st.floats(0.5, 200),
            st.floats(0.5, 200),
            st.floats(0, 1),
            st.integers(0, len(CLASSES) - 1),
        ),
        max_size=20,
    ),
    st.integers(0, 2**31 * 1_000_000_000 - 1),
)
def test_detections_survive_cdr(rows: list[tuple[float, ...]], stamp: int) -> None:
    """Boxes, scores, classes and stamp of a Detection2DArray survive serialize -> deserialize (geometry)."""
    from tiled_detector.messages.detections import msg_to_detections

    values = np.array(rows, np.float64).reshape(-1, 6)
    boxes = np.concatenate([values[:, :2], values[:, :2] + values[:, 2:4]], axis=1)
    msg = bags.detections_message(boxes, values[:, 4], values[:, 5].astype(int), stamp, "cam", CLASSES)
    back = bags.deserialize(bags.serialize(msg, bags.DETECTIONS), bags.DETECTIONS)
    assert bags.stamp_ns(back.header.stamp) == stamp
    got_boxes, got_scores, got_ids = msg_to_detections(back, CLASSES)
    np.testing.assert_allclose(got_boxes, boxes, atol=1e-3 * max(1.0, float(np.abs(boxes).max(initial=1))))
    np.testing.assert_allclose(got_scores, values[:, 4], atol=1e-6)
    np.testing.assert_array_equal(got_ids, values[:, 5].astype(int))


def test_staging_left_by_a_killed_writer_is_removed_by_the_next(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead = tmp_path / f".bag.{done.stdout.strip()}.abc123.partial"  # as a SIGKILLed make-bag leaves it
    live = tmp_path / f".bag.{os.getpid()}.def456.partial"  # a write still running elsewhere
    for staging in (dead, live):
        (staging / "bag").mkdir(parents=True)
    frame = np.zeros((8, 8, 3), np.uint8)
    recording.write_image_bag(tmp_path / "bag", [recording.Frame(frame)])
    assert not dead.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["bag", live.name])


def test_cli_with_the_ground_truth_of_a_mot_or_coco_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--truth`: each frame's boxes (0-based pixel edges, clipped to the frame) on /ground_truth with the class
    named by `--truth-class` (one of the labels of the model `--model` / `--labels` name) and the identities."""
    from tiled_detector.messages.detections import msg_ids

    folder = tmp_path / "img1"
    folder.mkdir()
    for index in range(3):
        cv2.imwrite(str(folder / f"{index + 1:06d}.png"), make_scene(index, 64, 48).image[..., ::-1])
    gt = tmp_path / "gt.txt"  # a pedestrian, a car (left out), the pedestrian again reaching past the corner
    gt.write_text("1,5,1,1,10,20,1,1,1\n1,6,30,30,5,5,1,3,1\n2,5,60,40,10,20,1,1,0.3\n")
    argv = ["make-bag", str(tmp_path / "mot"), "--images", str(folder), "--truth", str(gt), "--rate", "10"]
    assert cli_main([*argv, "--truth-class", "person", "--labels", "red", "person", "yellow", "green"]) == 0
    assert f"ground truth: 2 person boxes from {gt}, with identities; 1 rows" in capsys.readouterr().out
    info = bags.bag_info(tmp_path / "mot")
    assert info.topics[bags.GROUND_TRUTH_TOPIC] == (bags.DETECTIONS, 3)  # the frame with no row: no objects
    assert info.custom_data[recording.IDENTITIES] == "true" and info.custom_data["truth_class"] == "person"
    truth = bags.read_detections(info.path, labels=["person"])
    stamps = sorted(truth)
    assert stamps == [recording.frame_stamp(i, 10.0) for i in range(3)]
    np.testing.assert_allclose(truth[stamps[0]][0], [[0, 0, 10, 20]], atol=1e-4)
    np.testing.assert_allclose(truth[stamps[1]][0], [[59, 39, 64, 48]], atol=1e-4)  # clipped to 64x48
    assert truth[stamps[2]][0].shape == (0, 4) and truth[stamps[0]][2].tolist() == [0]
    messages = {
        m.stamp_ns: bags.deserialize(m.data, bags.DETECTIONS)
        for m in bags.read_messages(info.path, [bags.GROUND_TRUTH_TOPIC])
    }
    assert [msg_ids(messages[s]).tolist() for s in stamps] == [[5], [5], []]
    assert [d.results[0].hypothesis.class_id for d in messages[stamps[0]].detections] == ["person"]

    video = tmp_path / "clip.avi"  # COCO on a video: its images in frame_index order, no track ids
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for index in range(3):
        writer.write(make_scene(index, 64, 48).image[..., ::-1].copy())
    writer.release()
    coco = tmp_path / "truth.json"
    coco.write_text(
        json.dumps(
            {
                "images": [
                    {"id": 1, "frame_index": 1},
                    {"id": 2, "frame_index": 0},
                    {"id": 3, "frame_index": 2},
                ],
                "annotations": [
                    {"id": 1, "image_id": 1, "category_id": 4, "bbox": [2, 3, 10, 10]},
                    {"id": 2, "image_id": 2, "category_id": 9, "bbox": [2, 3, 10, 10]},
                ],
                "categories": [{"id": 4, "name": "blue_square"}, {"id": 9, "name": "red_disc"}],
            }
        )
    )
    assert (
        cli_main(
            [
                "make-bag",
                str(tmp_path / "coco"),
                "--video",
                str(video),
                "--frames",
                "2",
                "--truth",
                str(coco),
                "--truth-class",
                "blue_square",
            ]
        )
        == 0
    )
    assert "no identities (AP50 only)" in capsys.readouterr().out
    info = bags.bag_info(tmp_path / "coco")
    assert info.custom_data[recording.IDENTITIES] == "false"
    truth = bags.read_detections(info.path, labels=["blue_square"])
    assert [len(truth[s][0]) for s in sorted(truth)] == [0, 1]  # image 1 is the second frame
    np.testing.assert_allclose(truth[sorted(truth)[1]][0], [[2, 3, 12, 13]], atol=1e-4)
