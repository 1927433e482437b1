"""Rotated-box models end to end: ultralytics OBB files (as its exporter writes them, `support.exports`) read from
their metadata (`task: obb`, end-to-end rows), files of tasks the node does not serve refused in one line, the
frame program giving rotated boxes (`Detections.obb`, hulls in `boxes`) on the exact and the sync-free path,
degenerate rows dropped and counted."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from support.exports import ObbEndToEndHead, ObbHead, ultralytics_onnx, ultralytics_torchscript
from support.networks import SquareDetector, save_torchscript
from support.sync import SyncCounter
from tiled_detector.config import DetectorConfig
from tiled_detector.model_files.resolve import file_view, resolve
from tiled_detector.pipeline.decode import decode_outputs
from tiled_detector.pipeline.layouts import OutputLayout
from tiled_detector.pipeline.rotated import obb_hulls

HW = (640, 640)
NAMES = {0: "red", 1: "blue"}


def _resolved(path, **settings):
    config = DetectorConfig(model=path, device="cpu", **settings)
    return resolve(config, file_view(config))


def test_obb_files_are_read_from_their_metadata(tmp_path):
    """`task: obb` decides the rotated layouts (end-to-end rows where `end2end`), the class count without the angle
    row: no flag, no class-count hint."""
    raw = _resolved(ultralytics_onnx(tmp_path / "obb.onnx", ObbHead(), task="obb"))
    assert raw.layout is OutputLayout.OBB and raw.num_classes == 2 and raw.labels == ("red", "blue")
    assert "task obb" in raw.decided_by
    rows = _resolved(ultralytics_onnx(tmp_path / "e2e.onnx", ObbEndToEndHead(), task="obb", end2end=True))
    assert rows.layout is OutputLayout.OBB_END2END and "end-to-end" in rows.decided_by


@pytest.mark.parametrize("task", ["classify"])  # (segment: test_masks; pose, served: test_pose)
def test_a_task_the_node_does_not_serve_is_refused_naming_it(tmp_path, task):
    """Not the class-count hint (which would read a classifier's scores as classes): one line naming the task."""
    path = ultralytics_onnx(tmp_path / f"{task}.onnx", ObbHead(), task=task)
    with pytest.raises(ValueError, match=f"task {task}") as error:
        _resolved(path)
    assert "\n" not in str(error.value) and "labels" not in str(error.value)


def test_layout_obb_on_a_file_with_no_angle_column_is_refused(tmp_path):
    """A detect file (its metadata says so, or its rows hold only 4 + classes), end-to-end rows of 6: one line."""
    detect = ultralytics_onnx(tmp_path / "detect.onnx")
    with pytest.raises(ValueError, match=r"layout obb contradicts .*'s own task detect .*no angle column"):
        _resolved(detect, layout="obb")
    plain = save_torchscript(SquareDetector((64, 64), 8), tmp_path / "plain.ts", (64, 64), ["r", "b"])
    onnx_plain = ultralytics_onnx(tmp_path / "nometa.onnx")
    import onnx

    model = onnx.load(str(onnx_plain))
    del model.metadata_props[:]
    onnx.save(model, str(onnx_plain))
    with pytest.raises(ValueError, match=r"labels: .* carries 1 classes .* but the labels setting gives 2"):
        _resolved(onnx_plain, layout="obb", labels=("r", "b"))  # (or no angle column: said in the same line)
    with pytest.raises(ValueError, match="no angle column"):
        _resolved(ultralytics_onnx(tmp_path / "e2e6.onnx", end2end=True), layout="obb_end2end")
    assert plain.exists()


def _without_metadata(path):
    import onnx

    model = onnx.load(str(path))
    del model.metadata_props[:]
    onnx.save(model, str(path))
    return path


def test_a_wrong_class_count_of_a_rotated_box_file_is_blamed_on_labels(tmp_path):
    """The labels setting's count against the classes the file carries: one line naming labels and both counts
    (was: blamed on the layout, "no angle column")."""
    path = ultralytics_onnx(tmp_path / "obb.onnx", ObbHead(), task="obb")
    with pytest.raises(ValueError) as error:
        _resolved(path, labels=("a", "b", "c"))
    text = str(error.value)
    assert (
        text.startswith("labels: ") and "carries 2 classes" in text and "gives 3" in text and "\n" not in text
    )


def test_a_layout_that_contradicts_the_files_task_is_refused_naming_both(tmp_path):
    """`layout: yolov8` on a `task: obb` file would read its angle row as a phantom class: refused, one line."""
    path = ultralytics_onnx(tmp_path / "obb.onnx", ObbHead(), task="obb")
    for layout in ("yolov8", "yolov5", "end2end"):
        with pytest.raises(
            ValueError, match=f"layout {layout} contradicts .*obb.onnx's own task obb"
        ) as error:
            _resolved(path, layout=layout)
        assert "\n" not in str(error.value) and "obb, obb_end2end" in str(error.value)


def test_a_rotated_box_file_without_metadata_is_not_read_as_one_more_class(tmp_path):
    """No task, no names: a head whose last row holds what no class score can (an angle outside [0, 1] on a grey
    image) is refused naming both readings (was: read as yolov8 with a phantom class); with names for its classes
    the class-count error says the extra row may be an angle; an upright head of scores in [0, 1] reads as before."""
    from tiled_detector.model_files.resolve import AmbiguousModelError

    path = _without_metadata(ultralytics_onnx(tmp_path / "obb.onnx", ObbHead(angle=-0.4)))
    with pytest.raises(AmbiguousModelError, match=r"fits yolov8 \(3 classes\) and obb \(2 classes") as error:
        _resolved(path)
    assert "layout" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="angle\\? then set the setting layout to obb"):
        _resolved(path, labels=("red", "blue"))
    assert _resolved(path, layout="obb").num_classes == 2
    upright = _without_metadata(ultralytics_onnx(tmp_path / "detect.onnx"))
    assert _resolved(upright).layout is OutputLayout.YOLOV8


def test_a_file_without_metadata_reads_as_obb_with_the_setting(tmp_path):
    path = ultralytics_onnx(tmp_path / "obb.onnx", ObbHead())  # metadata says detect...
    import onnx

    model = onnx.load(str(path))
    del model.metadata_props[:]
    onnx.save(model, str(path))
    found = _resolved(path, layout="obb", labels=("red", "blue"))  # ...none now: the setting decides
    assert found.layout is OutputLayout.OBB and found.num_classes == 2


def test_decoded_rows_keep_the_angle() -> None:
    """Raw OBB heads: the best class per anchor over the score rows only (never the angle row); end-to-end rows:
    boxes with their angle column."""
    head = torch.zeros(1, 4 + 2 + 1, 3)
    head[0, :4] = torch.tensor([[10.0, 20, 30], [11, 21, 31], [4, 5, 6], [2, 3, 4]])
    head[0, 4:6] = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.8, 0.1]])
    head[0, 6] = torch.tensor([5.0, 0.3, 0.7])  # an angle above every score: never read as one
    found = decode_outputs({"output0": head}, OutputLayout.OBB, 0.25, 10)
    torch.testing.assert_close(found.boxes, torch.tensor([[10, 11, 4, 2, 5.0], [20, 21, 5, 3, 0.3]]))
    assert found.class_ids.tolist() == [0, 1] and found.scores.tolist() == pytest.approx([0.9, 0.8])
    rows = torch.tensor([[[10.0, 11, 4, 2, 0.9, 1, 0.4], [1, 1, 1, 1, 0.1, 0, 0.1]]])
    found = decode_outputs({"output0": rows}, OutputLayout.OBB_END2END, 0.25, 10)
    torch.testing.assert_close(found.boxes, torch.tensor([[10, 11, 4, 2, 0.4]]))
    assert found.class_ids.tolist() == [1]


def _frame(rng: np.random.Generator, height: int, width: int, squares: int = 30) -> np.ndarray:
    frame = rng.integers(0, 30, (height, width, 1), dtype=np.uint8).repeat(3, axis=2)
    for _ in range(squares):
        side = 8 * int(rng.integers(1, 4))
        y, x = 4 * int(rng.integers(0, (height - side) // 4)), 4 * int(rng.integers(0, (width - side) // 4))
        frame[y : y + side, x : x + side] = (255, 0, 0) if rng.random() < 0.5 else (0, 0, 255)
    return frame


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("obb")
    kw = dict(imgsz=list(HW), names=NAMES, input_hw=HW)
    return {
        "detect": save_torchscript(SquareDetector(HW, 8), folder / "detect.ts", HW, ["red", "blue"]),
        "obb0": ultralytics_torchscript(folder / "obb0.ts", ObbHead(HW), task="obb", **kw),
        "obb": ultralytics_torchscript(
            folder / "obb.ts", ObbHead(HW, angle=0.3, stretch=2.0), task="obb", **kw
        ),
        "e2e": ultralytics_torchscript(
            folder / "e2e.ts", ObbEndToEndHead(HW, angle=0.3, stretch=2.0), task="obb", end2end=True, **kw
        ),
        "bad": ultralytics_torchscript(
            folder / "bad.ts", ObbHead(HW, degenerate=(0, 1, 2, 90)), task="obb", **kw
        ),
    }


OPTIONS = dict(tile_size=(640, 640), overlap=0.2, conf_threshold=0.3, backend="torch", device="cpu")


def test_unrotated_boxes_are_the_detect_models_boxes(models):
    """Angle 0 everywhere: the rotated pipeline (tiles, seams, rotated merge, hulls) gives the detect model's
    detections, and `obb` holds their centres and sizes."""
    from tiled_detector.detector import TiledDetector

    detect, obb = TiledDetector(models["detect"], **OPTIONS), TiledDetector(models["obb0"], **OPTIONS)
    assert obb.rotated and not detect.rotated
    frame = _frame(np.random.default_rng(1), 1080, 1920)
    want, got = detect.detect(frame), obb.detect(frame)
    assert want.obb is None and got.obb.shape == (len(got), 5) and len(got) > 10
    np.testing.assert_allclose(got.boxes, want.boxes, atol=1e-3)
    np.testing.assert_array_equal(got.scores, want.scores)
    np.testing.assert_array_equal(got.class_ids, want.class_ids)
    centres, sizes = (want.boxes[:, :2] + want.boxes[:, 2:]) / 2, want.boxes[:, 2:] - want.boxes[:, :2]
    np.testing.assert_allclose(got.obb[:, :2], centres, atol=1e-3)
    np.testing.assert_allclose(np.sort(got.obb[:, 2:4], 1), np.sort(sizes, 1), atol=1e-3)


@pytest.mark.parametrize("name", ["obb", "e2e"])
def test_rotated_boxes_keep_their_angle_and_hulls_are_the_boxes(models, name):
    """Raw head and end-to-end rows: the angle as the model gave it (ultralytics' regular form), `boxes` the hulls
    of `obb` (clipped to the frame), the sync-free path (the accelerator's, run here on the CPU) equal to the exact
    one, with no host read."""
    from tiled_detector.detector import TiledDetector

    exact, fast = TiledDetector(models[name], **OPTIONS), TiledDetector(models[name], **OPTIONS)
    fast._sync_free = True
    counter, program = SyncCounter(), fast._program

    def traced(*args):
        with counter:
            return program(*args)

    fast._program = traced
    frame = _frame(np.random.default_rng(2), 720, 1280)
    for _ in range(2):  # the second with the limits grown
        a, b = exact.detect(frame), fast.detect(frame)
        np.testing.assert_array_equal(a.obb, b.obb)
        np.testing.assert_array_equal(a.boxes, b.boxes)
    assert counter.found == []
    assert len(a) > 5 and np.allclose(a.obb[:, 4], 0.3, atol=1e-6)
    hulls = obb_hulls(torch.as_tensor(a.obb)).numpy()
    np.testing.assert_allclose(a.boxes, np.clip(hulls, 0, [1280, 720, 1280, 720]), atol=1e-3)
    assert a[a.scores > 0.5].obb.shape[1] == 5


def test_degenerate_rows_are_dropped_and_counted(models, caplog):
    """Rows with w 0 and a NaN angle never become detections (nor NaN boxes); the detector counts them and warns
    once."""
    from tiled_detector.detector import TiledDetector

    frame = np.zeros((640, 640, 3), np.uint8)
    frame[0:8, 0:24] = (255, 0, 0)  # the anchors made degenerate: cells 0, 1, 2 of the first row
    frame[200:208, 400:408] = (0, 0, 255)
    detector = TiledDetector(models["bad"], **{**OPTIONS, "full_frame": False})
    found = detector.detect(frame)
    assert np.isfinite(found.obb).all() and len(found) == 1 and found.class_ids.tolist() == [1]
    assert detector.degenerate_rows == 3
    detector.detect(frame)
    assert detector.degenerate_rows == 6
    assert sum("degenerate_rows" in r.message for r in caplog.records) == 1


def test_a_rotated_box_and_its_hull_in_the_frame(models):
    """A 16 x 8 box at 0.3 rad: its centre, sides and angle as the model gave them, `boxes` its hull."""
    from tiled_detector.detector import TiledDetector

    frame = np.zeros((640, 640, 3), np.uint8)
    frame[304:312, 304:312] = (255, 0, 0)  # one cell: centre (308, 308)
    found = TiledDetector(models["obb"], **{**OPTIONS, "full_frame": False}).detect(frame)
    cx, cy, w, h, angle = found.obb[0]
    assert (cx, cy, w, h) == pytest.approx((308, 308, 16, 8)) and angle == pytest.approx(0.3)
    x1, y1, x2, y2 = found.boxes[0]
    half_w, half_h = 8 * math.cos(0.3) + 4 * math.sin(0.3), 8 * math.sin(0.3) + 4 * math.cos(0.3)
    assert (x1, y1, x2, y2) == pytest.approx(
        (308 - half_w, 308 - half_h, 308 + half_w, 308 + half_h), abs=1e-3
    )


def test_detect_json_gives_obb_and_corners_beside_box(models, tmp_path, capsys):
    """`detect --json`: `obb` [cx, cy, w, h, angle] and its four `corners` beside `box` (the hull); `--out` draws
    the rectangle."""
    import json

    import cv2

    from tiled_detector.cli import main
    from tiled_detector.geometry.polygons import ANGLE, corners

    image = np.zeros((640, 640, 3), np.uint8)
    image[304:312, 304:312] = (0, 0, 255)  # red, in OpenCV's BGR
    cv2.imwrite(str(tmp_path / "one.png"), image)
    argv = ["detect", str(tmp_path / "one.png"), "--model", str(models["obb"]), "--backend", "torch"]
    assert main([*argv, "--json", "--tile-size", "640", "640", "--out", str(tmp_path / "out")]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["obb_angle"] == ANGLE  # the angle's convention, said where the JSON's reader reads
    found = answer["images"][0]["detections"]
    assert len(found) == 1 and found[0]["label"] == "red"
    assert found[0]["obb"] == pytest.approx([308, 308, 16, 8, 0.3])
    np.testing.assert_allclose(found[0]["corners"], corners(np.array(found[0]["obb"])), atol=0.01)
    xs, ys = np.array(found[0]["corners"]).T
    assert found[0]["box"] == pytest.approx([xs.min(), ys.min(), xs.max(), ys.max()], abs=0.02)
    assert (tmp_path / "out" / "one.png").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["obb", "e2e"])
def test_on_cuda_the_rotated_frame_is_one_captured_graph_equal_to_the_cpu(models, name):
    """On a GPU the whole rotated frame program (decode, frame mapping, seams, rotated merge, packing) is captured
    once and replayed, not split around the engine, and gives the CPU's rotated boxes."""
    from tiled_detector.detector import TiledDetector

    cpu = TiledDetector(models[name], **OPTIONS)
    gpu = TiledDetector(models[name], **{**OPTIONS, "device": "cuda"})
    frame = _frame(np.random.default_rng(4), 1080, 1920)
    for _ in range(3):  # the first grows the limits, the others replay the capture
        want, got = cpu.detect(frame), gpu.detect(frame)
    assert gpu._runner.captures and not gpu._runner.split
    assert len(got) == len(want) > 5
    np.testing.assert_allclose(got.obb, want.obb, atol=1e-3)
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-5)
    np.testing.assert_array_equal(got.class_ids, want.class_ids)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["nms", "nmm", "greedy_nmm"])
def test_the_rotated_merge_on_cuda_equals_the_cpu(method):
    """merge on rotated boxes: the same rows on the GPU (sync-free, fixed rounds) as on the CPU (exact)."""
    from tiled_detector.pipeline.merge import MergeRule, merge, merge_padded

    rng = np.random.default_rng(6)
    n = 300
    centres = rng.uniform(0, 400, (n // 5, 2))[rng.integers(0, n // 5, n)] + rng.normal(0, 3, (n, 2))
    boxes = torch.tensor(
        np.concatenate([centres, rng.uniform(8, 60, (n, 2)), rng.uniform(0, 1.5, (n, 1))], 1),
        dtype=torch.float32,
    )
    scores, classes = torch.rand(n), torch.randint(0, 3, (n,))
    want = merge(boxes, scores, classes, method, "iou", 0.5, use_torchvision=False)
    got = merge_padded(
        boxes.cuda(),
        scores.cuda(),
        classes.cuda(),
        torch.ones(n, dtype=torch.bool, device="cuda"),
        MergeRule(method, "iou", 0.5),
        nms_rounds=n + 1,
        slots=n + 1,
    )
    assert bool(got.exact)
    torch.testing.assert_close(got.boxes[got.valid].cpu(), want[0], atol=1e-3, rtol=0)
    assert torch.equal(got.class_ids[got.valid].cpu(), want[2])
