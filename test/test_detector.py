"""Tests for config.py and detector.py: end to end on SquareDetector, whose right answer is known exactly."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.utils.dlpack

from conftest import SQUARE_CELL, SQUARE_INPUT_HW, SQUARE_LABELS
from tiled_detector.config import DetectorConfig
from tiled_detector.detector import TiledDetector
from tiled_detector.engines.base import Backend, Precision
from tiled_detector.pipeline.depth import DepthError, DepthImage, Intrinsics
from tiled_detector.pipeline.layouts import OutputLayout
from tiled_detector.pipeline.merge import MatchMetric, MergeMethod
from tiled_detector.pipeline.postprocess import Limits
from tiled_detector.pipeline.zero_copy import ZeroCopyError

STAGES = {"upload", "preprocess", "infer", "decode", "merge", "download", "total"}
COLOURS = {0: (255, 0, 0), 1: (0, 0, 255)}  # class -> RGB


def _scene(
    seed: int, height: int = 152, width: int = 208, count: int = 6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A dark RGB frame with `count` red / blue cell-aligned squares that do not touch; expected boxes, classes."""
    rng = np.random.default_rng(seed)
    frame = np.zeros((height, width, 3), np.uint8)
    cells = [(y, x) for y in range(0, height // SQUARE_CELL, 2) for x in range(0, width // SQUARE_CELL, 2)]
    picked = rng.choice(len(cells), count, replace=False)
    boxes, classes = [], []
    for i in picked:
        y, x = (v * SQUARE_CELL for v in cells[i])
        cls = int(rng.integers(0, 2))
        frame[y : y + SQUARE_CELL, x : x + SQUARE_CELL] = COLOURS[cls]
        boxes.append([x, y, x + SQUARE_CELL, y + SQUARE_CELL])
        classes.append(cls)
    return frame, np.array(boxes, np.float32), np.array(classes, np.int64)


def _sorted(boxes: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((boxes[:, 1], boxes[:, 0]))
    return boxes[order], classes[order]


@pytest.fixture(scope="module")
def detector(square_onnx) -> TiledDetector:
    # tiles of 64 with overlap 0.25 start at multiples of 8 on frames whose sides are multiples of 8
    return TiledDetector(square_onnx, tile_size=SQUARE_INPUT_HW, overlap=0.25, conf_threshold=0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finds_exactly_the_squares(detector, seed):
    frame, boxes, classes = _scene(seed)
    dets = detector.detect(frame)
    assert detector.plan_for(*frame.shape[:2]).num_tiles == 12
    got_boxes, got_classes = _sorted(dets.boxes, dets.class_ids)
    want_boxes, want_classes = _sorted(boxes, classes)
    np.testing.assert_array_equal(got_boxes, want_boxes)
    np.testing.assert_array_equal(got_classes, want_classes)
    np.testing.assert_allclose(dets.scores, 1.0)
    assert set(dets.timings) == STAGES and all(v >= 0 for v in dets.timings.values())


def test_a_square_in_the_overlap_of_four_tiles_is_reported_once(detector):
    frame = np.zeros((152, 208, 3), np.uint8)
    frame[48:56, 48:56] = COLOURS[1]  # inside tiles (0,0), (48,0), (0,48) and (48,48)
    dets = detector.detect(frame)
    np.testing.assert_array_equal(dets.boxes, [[48, 48, 56, 56]])
    assert dets.class_ids.tolist() == [1]


@pytest.mark.parametrize("encoding", ["bgr8", "rgba8", "bgra8"])
def test_encodings_give_the_same_detections(detector, encoding):
    frame, boxes, classes = _scene(3)
    converted = {
        "bgr8": frame[..., ::-1],
        "rgba8": np.dstack([frame, np.full(frame.shape[:2], 7, np.uint8)]),
        "bgra8": np.dstack([frame[..., ::-1], np.full(frame.shape[:2], 7, np.uint8)]),
    }[encoding]
    dets = detector.detect(np.ascontiguousarray(converted), encoding=encoding)
    np.testing.assert_array_equal(_sorted(dets.boxes, dets.class_ids)[1], _sorted(boxes, classes)[1])


def test_frame_smaller_than_a_tile_is_padded(detector):
    frame = np.zeros((40, 48, 3), np.uint8)
    frame[32:40, 40:48] = COLOURS[0]  # bottom-right corner, next to the grey padding
    dets = detector.detect(frame)
    np.testing.assert_array_equal(dets.boxes, [[40, 32, 48, 40]])


def test_torchscript_backend_agrees_and_reads_labels(square_torchscript, detector):
    ts = TiledDetector(square_torchscript, tile_size=(64, 64), overlap=0.25, conf_threshold=0.5)
    assert ts.engine.backend is Backend.TORCH and ts.labels == SQUARE_LABELS
    frame = _scene(4)[0]
    a, b = ts.detect(frame), detector.detect(frame)
    np.testing.assert_array_equal(_sorted(a.boxes, a.class_ids)[0], _sorted(b.boxes, b.class_ids)[0])


def test_detect_device_takes_tensors_on_the_engine_device(detector):
    frame = _scene(5)[0]
    dets = detector.detect_device(torch.from_numpy(frame))
    np.testing.assert_array_equal(dets.boxes, detector.detect(frame).boxes)
    assert set(dets.timings) == STAGES - {"upload"}
    capsule = torch.utils.dlpack.to_dlpack(torch.from_numpy(frame))
    np.testing.assert_array_equal(detector.detect_device(capsule).boxes, dets.boxes)  # DLPack, no copy
    with pytest.raises(ZeroCopyError, match="without a copy"):
        detector.detect_device(torch.from_numpy(frame).to("meta"))


def test_with_config_reuses_the_engine(detector):
    frame, _, classes = _scene(6)
    blue = detector.with_config(classes=[1])
    assert blue.engine is detector.engine and blue.config.classes == (1,)
    assert blue.detect(frame).class_ids.tolist() == [1] * int((classes == 1).sum())
    assert len(detector.with_config(max_detections=2).detect(frame)) == 2
    assert len(detector.with_config(conf_threshold=1.0).detect(frame)) == 0
    smaller = detector.with_config(tile_size=(48, 48), full_frame=False, overlap=0.0)
    assert smaller.plan_for(152, 208).num_tiles == 4 * 5 and not smaller.plan_for(152, 208).full_frame
    with pytest.raises(ValueError, match="device needs a new engine"):
        detector.with_config(device="cuda")
    with pytest.raises(ValueError, match="unknown detector settings"):
        detector.with_config(treshold=0.3)


def test_fixed_batch_engine_and_resized_tiles(export_onnx):
    from support.networks import SquareDetector

    fixed = export_onnx(SquareDetector(SQUARE_INPUT_HW, SQUARE_CELL), SQUARE_INPUT_HW, batch=4)
    # 128-pixel tiles are halved into the 64-pixel input: a 16-pixel square fills one 8-pixel cell
    det = TiledDetector(fixed, tile_size=(128, 128), overlap=0.25, conf_threshold=0.5, full_frame=False)
    assert det.engine.max_batch == 4
    frame = np.zeros((304, 416, 3), np.uint8)
    frame[96:112, 208:224] = COLOURS[0]
    dets = det.detect(frame)
    assert det.plan_for(304, 416).num_tiles > 4
    np.testing.assert_array_equal(dets.boxes, [[208, 96, 224, 112]])


def test_config_normalises_options(square_onnx):
    cfg = DetectorConfig(
        model=str(square_onnx),
        backend="ONNXRuntime",
        precision="FP32",
        merge="NMS",
        match_metric="IoU",
        layout="yolov8",
        tile_size=[32, 48],
        classes=[3, 1, 3],
        labels=["a", "b"],
        device="CUDA:1",
    )
    assert cfg.backend is Backend.ONNXRUNTIME and cfg.precision is Precision.FP32
    assert (
        cfg.merge is MergeMethod.NMS
        and cfg.match_metric is MatchMetric.IOU
        and cfg.layout is OutputLayout.YOLOV8
    )
    assert cfg.tile_size == (32, 48) and cfg.tile_hw_for((640, 640)) == (48, 32) and cfg.classes == (1, 3)
    assert cfg.labels == ("a", "b") and cfg.device == "cuda:1"
    assert cfg.replace(overlap=0.5).overlap == 0.5
    assert cfg.replace(classes=[]).classes is None  # empty = every class, as the setting's help says
    assert cfg.replace(classes=["b", 0]).classes == (0, "b")  # names stay names until the labels are known


def test_tiles_are_the_models_input_size_unless_set(export_onnx) -> None:
    """tile_size auto (the default; 0 0 or "auto"): a model's own input size, so a view is never shrunk; a size set
    is used as it is."""
    from support.networks import SquareDetector

    path = export_onnx(SquareDetector((48, 80), 8), (48, 80))  # input 80 wide, 48 high
    auto = TiledDetector(path)
    assert auto.config.tile_size is None and auto.tile_size == (80, 48)
    plan = auto.plan_for(200, 300)
    assert plan.tile_hw == (48, 80) and plan.tiles[0].tolist() == [0, 0, 80, 48]
    assert (
        DetectorConfig(tile_size=(0, 0)).tile_size is None
        and DetectorConfig(tile_size="auto").tile_size is None
    )
    fixed = auto.with_config(tile_size=(64, 32))
    assert fixed.tile_size == (64, 32) and fixed.plan_for(200, 300).tile_hw == (32, 64)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"overlap": 1.0}, r"overlap must be in \[0.0, 0.95\], got 1.0"),
        ({"conf_threshold": -0.1}, "conf_threshold must be in"),
        ({"merge_threshold": 2}, "merge_threshold must be in"),
        ({"tile_size": (0, 640)}, "tile_size must be two positive integers"),
        ({"tile_size": (640,)}, "tile_size must be two positive integers"),
        ({"max_detections": 0}, "max_detections must be a positive integer, got 0"),
        ({"top_k": 1.5}, "top_k must be a positive integer"),
        ({"classes": [-1]}, "classes must be None or"),
        ({"classes": "car"}, "classes must be None or"),
        ({"labels": "person"}, "labels must be None or"),
        ({"full_frame": "yes"}, "full_frame must be a bool"),
        ({"device": "gpu"}, "device must be"),
        ({"merge": "wbf"}, "unknown merge method"),
        ({"backend": "openvino"}, "unknown backend"),
        ({"engine_options": [1]}, "engine_options must be a mapping"),
    ],
)
def test_config_rejects_bad_values(square_onnx, changes, message):
    with pytest.raises(ValueError, match=message):
        DetectorConfig(model=square_onnx, **changes)


def test_detect_command_prints_lines_json_and_annotated_images(square_onnx, tmp_path, capsys):
    import json

    import cv2

    from tiled_detector.cli import main

    frame, boxes, _ = _scene(7)
    image = tmp_path / "scene.png"
    cv2.imwrite(str(image), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    argv = ["detect", str(image), str(tmp_path / "missing.png"), "--model", str(square_onnx), "--json"]
    argv += [
        "--tile-size",
        "64",
        "64",
        "--overlap",
        "0.25",
        "--conf",
        "0.5",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 1  # one image could not be read
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert lines[0].startswith(f"{image}: {len(boxes)} detections")
    assert "missing.png: cannot read image" in captured.err
    report = json.loads(lines[-1])
    found = sorted(d["box"] for d in report["images"][0]["detections"])
    assert found == sorted(boxes.tolist())
    assert (tmp_path / "out" / "scene.png").is_file()


def test_engine_buffer_is_only_asked_for_batches_the_engine_takes_at_once(square_onnx):
    det = TiledDetector(square_onnx, tile_size=SQUARE_INPUT_HW, overlap=0.25, conf_threshold=0.5, max_batch=2)
    asked = []

    def input_buffer(batch_size):  # like TensorRTEngine before: raises above max_batch
        asked.append(batch_size)
        if batch_size > det.engine.max_batch:
            raise ValueError("batch too large")

    det.engine.input_buffer = input_buffer
    frame, boxes, classes = _scene(0)
    assert det.plan_for(*frame.shape[:2]).batch_size > 2
    dets = det.detect(frame)
    batch = det.plan_for(*frame.shape[:2]).batch_size
    # the plan's views go through in chunks of max_batch, each into the engine's buffer
    assert asked == [2] * (batch // 2) + ([batch % 2] if batch % 2 else [])
    np.testing.assert_array_equal(_sorted(dets.boxes, dets.class_ids)[0], _sorted(boxes, classes)[0])
    asked.clear()
    det.detect(np.zeros((40, 40, 3), np.uint8))  # one tile + the full-frame view: 2 images, one call
    assert asked == [2]


def test_stage_times_of_a_repeated_stage_add_up():
    from tiled_detector.runtime.stage_clock import StageClock

    clock = StageClock(torch.device("cpu"), sync=False)
    clock._start = 0.0
    clock._marks = [("decode", 0.001), ("merge", 0.003), ("decode", 0.006), ("merge", 0.010)]
    times = clock.timings()
    assert times["decode"] == pytest.approx(1.0 + 3.0) and times["merge"] == pytest.approx(2.0 + 4.0)
    assert times["total"] == pytest.approx(10.0)


def _sync_free(square_onnx, monkeypatch, **options):
    """A detector taking the accelerator's sync-free path on the CPU, recording merge_padded's limits."""
    import tiled_detector.pipeline.postprocess as postprocess_module

    det = TiledDetector(square_onnx, tile_size=SQUARE_INPUT_HW, overlap=0.25, conf_threshold=0.5, **options)
    det._sync_free = True
    calls = []
    real = postprocess_module.merge_padded

    def merge_padded(*args, **kwargs):
        if kwargs["slots"] is not None:  # the sync-free pass (the exact path takes its sizes from the data)
            calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(postprocess_module, "merge_padded", merge_padded)
    return det, calls


def test_sync_free_merge_walks_the_adapted_slots(square_onnx, monkeypatch):
    det, calls = _sync_free(square_onnx, monkeypatch, merge="greedy_nmm", seam_suppression=False)
    det._limits = Limits(slots=1)  # too few for a square seen by four tiles
    frame = np.zeros((152, 208, 3), np.uint8)
    frame[48:56, 48:56] = COLOURS[1]  # inside tiles (0,0), (48,0), (0,48) and (48,48)
    for _ in range(2):
        dets = det.detect(frame)
        np.testing.assert_array_equal(dets.boxes, [[48, 48, 56, 56]])
    assert calls[0]["slots"] == 1 and calls[1]["slots"] == det._limits.slots > 1


def test_sync_free_nms_rounds_grow_when_nms_did_not_settle(square_onnx, monkeypatch):
    import tiled_detector.pipeline.postprocess as postprocess_module

    det, calls = _sync_free(square_onnx, monkeypatch, merge="nms")
    recorded = postprocess_module.merge_padded

    def unsettled_once(*args, **kwargs):  # the status row of a frame whose NMS chain outran the rounds
        out = recorded(*args, **kwargs)
        return out._replace(exact=out.exact & (len(calls) > 1))

    monkeypatch.setattr(postprocess_module, "merge_padded", unsettled_once)
    frame, boxes, classes = _scene(2)
    for _ in range(2):
        dets = det.detect(frame)
        np.testing.assert_array_equal(_sorted(dets.boxes, dets.class_ids)[0], _sorted(boxes, classes)[0])
    assert calls[1]["nms_rounds"] == 2 * calls[0]["nms_rounds"] == det._limits.rounds


def test_overflow_at_the_largest_capacity_skips_the_sync_free_pass_for_a_while(square_onnx, monkeypatch):
    import tiled_detector.detector as detector_module
    import tiled_detector.pipeline.postprocess as postprocess_module

    det, calls = _sync_free(square_onnx, monkeypatch)
    monkeypatch.setattr(postprocess_module, "MAX_CAPACITY", 2)
    det._limits = Limits(capacity=2)  # every frame of _scene has more candidates
    frame, boxes, classes = _scene(3)
    for _ in range(detector_module._RETRY_AFTER + 2):
        dets = det.detect(frame)
        np.testing.assert_array_equal(_sorted(dets.boxes, dets.class_ids)[0], _sorted(boxes, classes)[0])
        assert set(dets.timings) == STAGES
    assert len(calls) == 2  # the first frame, then one retry after _RETRY_AFTER exact-only frames


@pytest.mark.parametrize(
    ("shape", "encoding", "step_pad"),
    [
        ((1, 1280, 3), "rgb8", 0),  # 1 px tall, wider than a tile: the full-frame view is 1 px tall
        ((1300, 1, 3), "rgb8", 0),
        ((2, 30000, 3), "rgb8", 0),
        ((1, 1, 3), "rgb8", 0),
        ((40, 50), "mono16", 1),  # 16-bit rows with an odd step: not viewable in place, copied
    ],
)
def test_degenerate_but_legal_frames_are_answered(detector, shape, encoding, step_pad):
    h, w = shape[:2]
    itemsize = 2 if encoding == "mono16" else 1
    row = w * (shape[2] if len(shape) == 3 else 1) * itemsize + step_pad
    buffer = np.random.default_rng(0).integers(0, 255, h * row, np.uint8)
    dtype = np.uint16 if encoding == "mono16" else np.uint8
    frame = np.ndarray(shape, dtype, buffer, strides=(row, *np.array(np.empty(shape, dtype).strides[1:])))
    dets = detector.detect(frame, encoding)
    assert dets.boxes.shape[1] == 4 and "total" in dets.timings
    assert (dets.boxes[:, [0, 2]] <= w).all() and (dets.boxes[:, [1, 3]] <= h).all()


def test_a_frame_with_more_views_than_max_batch_runs_in_chunks_with_the_same_result(square_onnx):
    frame, _, _ = _scene(1)
    settings = {
        "tile_size": (24, 24),
        "overlap": 0.25,
        "conf_threshold": 0.3,
        "engine_options": {"cpu_batch": 256},
    }
    whole = TiledDetector(square_onnx, max_batch=256, **settings)  # no CPU cap: the whole batch in one call
    chunked = TiledDetector(square_onnx, max_batch=5, **settings)
    batch = whole.plan_for(*frame.shape[:2]).batch_size
    assert batch > 3 * 5  # several chunks, the last one partial
    seen = []
    infer = chunked.engine.infer
    chunked.engine.infer = lambda b: seen.append(len(b)) or infer(b)
    expected, got = whole.detect(frame), chunked.detect(frame)
    assert max(seen) == 5 and sum(seen) == batch  # never more than max_batch images at once
    assert len(got) == len(expected) > 0
    np.testing.assert_array_equal(got.boxes, expected.boxes)
    np.testing.assert_array_equal(got.scores, expected.scores)
    np.testing.assert_array_equal(got.class_ids, expected.class_ids)


@pytest.mark.slow
def test_a_12000x9000_frame_stays_under_2_gb_peak_rss() -> None:
    """The bundled model on a 108-megapixel frame (433 views): chunks of max_batch and a sampled full-frame
    view keep the whole process (torch, ONNX Runtime, the 324 MB frame) under 2 GB."""
    code = (
        "import resource, numpy as np\n"
        "from tiled_detector import TiledDetector\n"
        "detector = TiledDetector()\n"
        "frame = np.frombuffer(np.random.default_rng(0).bytes(9000 * 12000 * 3), np.uint8).reshape(9000, 12000, 3)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
        "dets = detector.detect(frame)\n"
        "print(len(dets), before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    count, before_mb, peak_mb = map(int, done.stdout.split())
    assert count > 0
    assert peak_mb - before_mb <= 1024, (before_mb, peak_mb)  # what the frame's processing adds
    assert peak_mb <= 2048, peak_mb


def test_a_candidate_flood_is_cut_to_the_best_before_the_pairwise_merge(square_onnx, monkeypatch):
    from tiled_detector.pipeline import postprocess as postprocess_module

    det = TiledDetector(square_onnx, tile_size=SQUARE_INPUT_HW, overlap=0.25, conf_threshold=0.5)
    frame, _, _ = _scene(0)
    everything = det.detect(frame)
    monkeypatch.setattr(postprocess_module, "MAX_CANDIDATES", 4)  # (N, N) matrices of at most 4 x 4
    capped = det.detect(frame)
    assert 0 < len(capped) <= 4 < len(everything)
    np.testing.assert_array_equal(capped.scores, everything.scores[: len(capped)])  # the best ones survive


@pytest.mark.parametrize("sync_free", [False, True])
def test_a_depth_image_adds_positions_and_leaves_the_2d_detections_bit_identical(square_onnx, sync_free):
    det = TiledDetector(square_onnx, tile_size=SQUARE_INPUT_HW, overlap=0.25, conf_threshold=0.5)
    det._sync_free = sync_free  # the accelerator's fixed-size path, or the exact one
    frames = [_scene(3)[0], _scene(4)[0]]
    camera = Intrinsics(200.0, 200.0, 103.5, 75.5)
    depth = DepthImage(np.full((76, 104), 7500, np.uint16), camera)  # half size, 7.5 m in millimetres
    without = det.detect_many(frames)
    located = det.detect_many(frames, depths=[depth, None])
    for plain, with_depth in zip(without, located, strict=True):
        for name in ("boxes", "scores", "class_ids"):
            a, b = getattr(plain, name), getattr(with_depth, name)
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    assert without[0].positions is None and located[1].positions is None  # no depth: no positions
    assert located[0].positions.shape == (6, 3) and np.allclose(located[0].positions[:, 2], 7.5)
    assert np.allclose(located[0].sizes[:, :2], SQUARE_CELL * 7.5 / 200.0)
    with pytest.raises(DepthError, match="another aspect ratio"):
        det.detect(frames[0], depth=DepthImage(np.ones((100, 100), np.float32), camera))
