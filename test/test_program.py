"""The frame program over one frame or several: detect_many equals per-frame detect, in the fewest engine calls;
frames never mix in seams or merging; the runner executes the same device function eagerly or captured."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from tiled_detector.config import Applies, DetectorConfig, settings
from tiled_detector.detector import TiledDetector
from tiled_detector.pipeline.depth import DepthImage, Intrinsics
from tiled_detector.pipeline.merge import MergeRule, merge, merge_padded
from tiled_detector.pipeline.postprocess import Limits
from tiled_detector.pipeline.seams import suppress_truncated
from tiled_detector.pipeline.tiling import batch_plan, make_plan
from tiled_detector.runtime.devices import cuda_graph
from tiled_detector.tools.worlds.synthetic import make_scene

SIZES = ((640, 480), (1280, 720), (1920, 1080))  # (width, height)


def _same(a, b) -> None:
    np.testing.assert_array_equal(a.boxes, b.boxes)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.class_ids, b.class_ids)


def _counting(detector: TiledDetector, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Batch sizes of the detector's engine calls, from now on (until the test ends)."""
    calls, infer = [], detector.engine.infer

    def counted(batch):
        calls.append(batch.shape[0])
        return infer(batch)

    monkeypatch.setattr(detector.engine, "infer", counted)
    return calls


@pytest.fixture(scope="module")
def scenes():
    return [make_scene(seed, w, h).image for seed, (w, h) in enumerate(SIZES)]


@pytest.fixture(scope="module")
def bundled():
    # max_batch 32 on the CPU too: one engine call for the 18 views of `scenes`
    return TiledDetector(engine_options={"cpu_batch": 32})


@pytest.mark.parametrize("sync_free", [False, True])
def test_detect_many_equals_detect_per_frame_in_one_engine_call(bundled, scenes, sync_free, monkeypatch):
    detector = bundled.with_config()
    detector._sync_free = sync_free  # True: the accelerator's fixed-size path, run on the CPU
    alone = [detector.detect(frame) for frame in scenes]
    calls = _counting(detector, monkeypatch)
    together = detector.detect_many(scenes)
    views = sum(detector.plan_for(*frame.shape[:2]).batch_size for frame in scenes)
    assert views <= detector.engine.max_batch and calls == [views]  # 2 + 7 + 9 views, one engine call
    assert [len(d) > 3 for d in together] == [True] * 3
    for a, b in zip(alone, together, strict=True):
        _same(a, b)


def test_detect_many_splits_at_max_batch_into_the_fewest_calls(bundled, scenes, monkeypatch):
    detector = bundled.with_config()
    views = sum(detector.plan_for(*frame.shape[:2]).batch_size for frame in scenes)  # 18
    monkeypatch.setattr(detector.engine, "max_batch", 8)
    calls = _counting(detector, monkeypatch)
    together = detector.detect_many(scenes)
    assert calls == [8, 8, 2] and views == 18
    monkeypatch.undo()
    for frame, found in zip(scenes, together, strict=True):
        _same(bundled.detect(frame), found)


def test_identical_frames_are_never_merged_together_and_max_detections_is_per_frame(bundled, scenes):
    frame = scenes[1]
    one = bundled.detect(frame)
    twice = bundled.detect_many([frame, frame], ["rgb8", "rgb8"])
    _same(one, twice[0])
    _same(one, twice[1])
    capped = bundled.with_config(max_detections=3).detect_many([frame, frame, scenes[0]])
    assert [len(d) for d in capped] == [3, 3, 3]
    _same(capped[0], capped[1])
    np.testing.assert_array_equal(capped[0].scores, one.scores[:3])


def test_detect_many_takes_mixed_encodings(bundled, scenes):
    bgr = np.ascontiguousarray(scenes[0][..., ::-1])
    found = bundled.detect_many([bgr, scenes[2]], ["bgr8", "rgb8"])
    _same(found[0], bundled.detect(scenes[0]))
    _same(found[1], bundled.detect(scenes[2]))
    assert bundled.detect_many([]) == []
    with pytest.raises(ValueError, match="2 frames but 1 encodings"):
        bundled.detect_many([bgr, bgr], ["bgr8"])


def test_merge_and_seams_keep_frames_apart():
    boxes = torch.tensor([[10.0, 10, 50, 50], [10, 10, 50, 50], [12, 10, 50, 50]])
    scores, classes = torch.tensor([0.9, 0.8, 0.7]), torch.zeros(3, dtype=torch.int64)
    frames = torch.tensor([0, 1, 1])
    kept = merge(boxes, scores, classes, "nms", "iou", 0.5, frame_index=frames)
    torch.testing.assert_close(kept[1], torch.tensor([0.9, 0.8]))  # 0 and 1 overlap fully, in other frames
    padded = merge_padded(
        boxes, scores, classes, torch.ones(3, dtype=torch.bool), MergeRule("nmm"), frame_index=frames
    )
    assert padded.valid.tolist() == [True, True, False] and bool(padded.exact)
    # a box cut by a seam of frame 0 is not suppressed by a whole box of frame 1 at the same place
    plan = batch_plan([make_plan((100, 100), (60, 60), 0.2, (60, 60), False)] * 2)
    # tiles x1, y1, x2, y2: (0, 0, 60, 60), (40, 0, 100, 60), ...: a box cut at x = 60 in tile 0, whole in tile 1
    cut = torch.tensor([[45.0, 20, 60, 40], [45, 20, 70, 40]])
    image = torch.tensor([0, plan.starts[1] + 1])  # the whole box is frame 1's
    keep = suppress_truncated(cut, torch.tensor([0.9, 0.9]), torch.zeros(2, dtype=torch.int64), image, plan)
    assert keep.tolist() == [True, True]
    same_frame = torch.tensor([0, 1])
    assert suppress_truncated(
        cut, torch.tensor([0.9, 0.9]), torch.zeros(2, dtype=torch.int64), same_frame, plan
    ).tolist() == [False, True]


def _replaying_capture(log: list[str]):
    """A CPU stand-in for a CUDA graph: capture runs the function once into outputs that every replay recomputes
    in place (a graph's outputs are its static memory); replays run the same function again."""

    def capture(function):
        log.append("capture")
        outputs = function()

        def replay():
            log.append("replay")
            fresh = function()
            for static, new in zip(_tensors(outputs), _tensors(fresh), strict=True):
                static.copy_(new)

        return replay, outputs

    return capture


def _tensors(value):
    if value is None:  # an output that is absent (no masks, no payload)
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in (value.values() if isinstance(value, dict) else value) for t in _tensors(item)]


def test_the_same_frame_program_runs_eagerly_and_captured(square_torchscript):
    from test_detector import _scene

    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch")
    eager = TiledDetector(square_torchscript, **options)
    log: list[str] = []
    captured = TiledDetector(square_torchscript, capture=_replaying_capture(log), **options)
    captured._sync_free = True  # the capturable (fixed-size) path
    assert captured._runner.captures
    for seed in (0, 1, 2):
        frame, _, _ = _scene(seed)
        got = captured.detect(frame)
        _same(eager.detect(frame), got)
    assert log[:2] == ["capture", "replay"] and log.count("capture") == 1  # one key: same size and settings
    captured.update(conf_threshold=0.9)  # a new key captures once more
    frame, _, _ = _scene(3)
    _same(eager.with_config(conf_threshold=0.9).detect(frame), captured.detect(frame))
    assert log.count("capture") == 2 and captured._limits == Limits()


# For every runtime setting, a value that changes the bundled model's detections on SETTINGS_SCENE (asserted
# below, so that a replay with a stale setting could not pass unseen).
ALTERNATES = {
    "tile_size": (512, 512),
    "overlap": 0.6,  # 3 views -> 4 (0.4 and 0.5 keep the two tiles that already overlap by a third)
    "full_frame": False,
    "conf_threshold": 0.5,
    "merge": "greedy_nmm",
    "match_metric": "iou",
    "merge_threshold": 0.9,
    "class_agnostic": True,
    "nms_rounds": 1,
    "max_detections": 5,
    "classes": ["blue_square"],
    "top_k": 3,
    "seam_suppression": False,
    "profile": True,
    "class_thresholds": ["red_disc:0.9", "3:0.8"],
    "roi": (0.0, 0.5, 1.0, 1.0),
    "min_box_size": 40.0,
    "max_box_size": 30.0,
    "ignore_mask": "LEFT_HALF_MASK",  # (written by the test)
    "tracker": "bytetrack",
    "track_activation_threshold": 0.5,
    "lost_track_buffer": 3.0,
    "track_matching_threshold": 0.5,
    "tile_budget": 3,
    "max_tile_age": 2,
    "motion_compensation": "none",
    "depth_scale": 0.002,
    "depth_sync_tolerance": 0.5,
    "depth_min": 20.0,
    "depth_max": 5.0,
}
SETTINGS_SCENE = (1, 960, 540)  # make_scene seed, width, height: 2 tiles and the full view
# the scene's depth (every frame of the settings test has it): 10 m in millimetres, a half-size 16UC1 image
SETTINGS_DEPTH = DepthImage(np.full((270, 480), 10000, np.uint16), Intrinsics(675.0, 675.0, 479.5, 269.5))


def _equal(a, b) -> bool:
    pairs = [(a.boxes, b.boxes), (a.scores, b.scores), (a.class_ids, b.class_ids)]
    if a.positions is not None or b.positions is not None:
        pairs += [(a.positions, b.positions), (a.sizes, b.sizes)]
    return all(x is not None and y is not None and np.array_equal(x, y, equal_nan=True) for x, y in pairs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_every_runtime_setting_reaches_the_captured_frame_program(device, tmp_path):
    """Each runtime setting changed between two captured frames (with a depth image): the second frame follows it
    (equals an uncaptured detector with that setting), and a setting the frame program reads captures a new
    program."""
    # the mask settings change a segmentation model's frame program (test_masks: captured == exact, mask_scale)
    masked = {"masks", "mask_scale"}
    # and the keypoint settings a pose model's (test_keypoints: captured == exact for each fusion, keypoints off)
    masked |= {"keypoints", "keypoint_fusion"}
    assert set(ALTERNATES) | masked == {name for name, setting in settings().items() if setting.runtime}
    mask = np.zeros((9, 16), np.uint8)
    mask[:, :8] = 255
    cv2.imwrite(str(tmp_path / "left.png"), mask)
    alternates = {**ALTERNATES, "ignore_mask": [str(tmp_path / "left.png")]}
    eager = TiledDetector(backend="torch", device=device, conf_threshold=0.05, cuda_graph=False)
    log: list[str] = []
    capture = _replaying_capture(log) if device == "cpu" else _counting_graph(log)
    captured = TiledDetector.from_config(
        eager.config.replace(cuda_graph=True), engine=eager.engine, capture=capture
    )
    captured._sync_free = True  # the fixed-size path a capture runs (the CPU's default is the exact path)
    frame = make_scene(*SETTINGS_SCENE).image
    before = captured.detect(frame, depth=SETTINGS_DEPTH)
    assert _equal(before, eager.detect(frame, depth=SETTINGS_DEPTH)) and np.isfinite(before.positions).all()
    for name, value in alternates.items():
        captures, read = log.count("capture"), (captured.frame_settings, captured.plan_for(*frame.shape[:2]))
        captured.update(**{name: value})
        got = captured.detect(frame, depth=SETTINGS_DEPTH)
        want = eager.with_config(**{name: value}).detect(frame, depth=SETTINGS_DEPTH)
        assert _equal(got, want), (name, len(got), len(want))
        now = (captured.frame_settings, captured.plan_for(*frame.shape[:2]))
        applies = settings()[name].applies
        changed = [read[0] != now[0], read[1] is not now[1]]  # settings by value, plans (cached) by identity
        assert changed == [applies is Applies.FRAME, applies is Applies.PLAN], name  # or, host-side, neither
        if applies is not Applies.HOST:
            assert log.count("capture") == captures + 1, name  # a new key: captured again, not replayed stale
            # the scene shows the setting (it has no chain of boxes suppressing one another: test_merge shows
            # nms_rounds on both paths)
            assert name == "nms_rounds" or not _equal(want, before), name
        captured.update(**{name: getattr(eager.config, name)})


def _chosen_reference(detector: TiledDetector, frames, tiles) -> list:
    """What running only `tiles` of each frame must give: the full program's candidates of those tiles' and the
    full-frame views (each view is decoded on its own), post-processed on the exact path."""
    from tiled_detector.pipeline.encodings import Encoding
    from tiled_detector.pipeline.postprocess import postprocess, unpack

    plan = batch_plan([detector.plan_for(*f.shape[:2]) for f in frames])
    device = detector.engine.device
    tensors = [torch.from_numpy(f).to(device) for f in frames]
    found = detector._program.candidates(
        tensors, [Encoding.RGB8] * len(frames), plan, detector.frame_settings
    )
    views = [plan.starts[k] + np.r_[t, plan.plans[k].num_tiles] for k, t in enumerate(tiles)]
    wanted = torch.isin(found.image_index, torch.as_tensor(np.concatenate(views), device=device))
    packed = postprocess(found._replace(valid=found.valid & wanted), plan, detector.frame_settings, None)
    return unpack(packed.cpu().numpy(), len(frames))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_chosen_tiles_replay_one_capture_per_count_and_equal_the_full_programs_views(device, scenes):
    """A tile budget's chosen tiles (two frames of different sizes in one batch): every selection with the same
    counts replays one capture and equals the full program's candidates of those views; a selection of every
    tile equals plain detection."""
    eager = TiledDetector(backend="torch", device=device, conf_threshold=0.05, cuda_graph=False)
    log: list[str] = []
    capture = _replaying_capture(log) if device == "cpu" else _counting_graph(log)
    captured = TiledDetector.from_config(
        eager.config.replace(cuda_graph=True), engine=eager.engine, capture=capture
    )
    captured._sync_free = True
    frames = scenes[1:]  # 1280x720 (6 tiles), 1920x1080 (8 tiles)
    selections = [([0, 2], [1, 4, 7]), ([3, 5], [0, 5, 6]), ([1, 4], [2, 3, 7])]
    for _ in range(2):  # the sync-free limits settle (a grown limit is a new key)
        captured.detect_many(frames, tiles=[np.array(t) for t in selections[0]])
    log.clear()
    for tiles in selections:
        got = captured.detect_many(frames, tiles=[np.array(t) for t in tiles])
        for rows, found in zip(_chosen_reference(eager, frames, tiles), got, strict=True):
            np.testing.assert_allclose(found.boxes, rows[:, :4], atol=1e-3)
            np.testing.assert_allclose(found.scores, rows[:, 4], atol=1e-5)
            np.testing.assert_array_equal(found.class_ids, rows[:, 5].astype(np.int64))
    assert "capture" not in log  # other tiles, same counts: the same capture replayed
    assert device == "cuda" or log == ["replay"] * len(selections)
    every = [np.arange(captured.plan_for(*f.shape[:2]).num_tiles) for f in frames]
    for a, b in zip(captured.detect_many(frames, tiles=every), eager.detect_many(frames), strict=True):
        _same(a, b)
    assert log.count("capture") >= 1  # other counts: another capture


def _counting_graph(log: list[str]):
    """The real CUDA-graph capture, logged."""

    def capture(function):
        log.append("capture")
        return cuda_graph(function)

    return capture


def test_a_failed_capture_falls_back_to_eager_with_one_log_line_per_step(square_torchscript, caplog):
    from test_detector import _scene

    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch")
    eager = TiledDetector(square_torchscript, **options)
    tries: list[int] = []

    def failing(function):  # like a capture that meets a host sync: the graph cannot be made
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing\n(pages of native context)")

    detector = TiledDetector(square_torchscript, capture=failing, **options)
    detector._sync_free = True  # the capturable (fixed-size) path
    with caplog.at_level("WARNING", logger="tiled_detector.pipeline.program"):
        for seed in (0, 1):
            frame, _, _ = _scene(seed)
            _same(eager.detect(frame), detector.detect(frame))
    # tried whole, then around the engine; eager from then on
    assert tries == [1, 1] and not detector._runner.captures
    lines = [r.getMessage() for r in caplog.records if r.name == "tiled_detector.pipeline.program"]
    assert len(lines) == 2 and "capturing the frame program failed (operation not permitted" in lines[0]
    assert "the engine runs eagerly from now on, between the captured tiles/letterbox before it" in lines[0]
    assert lines[1].startswith(
        "capturing the frame program around the engine failed (operation not permitted"
    )
    assert "running it eagerly from now on" in lines[1]
    assert not any("pages of native context" in line for line in lines)


def _capture_refusing_the_engine(log: list[str], engine):
    """The CPU stand-in of a capture whose engine cannot be recorded (a forward that makes a host tensor): the
    capture fails whenever the captured function calls the engine, as torch's does."""
    capture = _replaying_capture(log)
    infer, capturing = engine.infer, []

    def guarded(batch):
        if capturing:
            raise RuntimeError("operation not permitted when stream is capturing")
        log.append("engine")
        return infer(batch)

    def refusing(function):
        capturing.append(1)
        try:
            return capture(function)
        finally:
            capturing.pop()

    engine.infer = guarded
    return refusing


def test_an_engine_that_cannot_be_captured_runs_eagerly_between_the_captured_parts(
    square_torchscript, caplog
):
    from test_detector import _scene

    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch", max_batch=5)
    eager = TiledDetector(square_torchscript, **options)
    log: list[str] = []
    detector = TiledDetector(square_torchscript, **options)
    detector = TiledDetector.from_config(
        detector.config, engine=detector.engine, capture=_capture_refusing_the_engine(log, detector.engine)
    )
    detector._sync_free = True
    with caplog.at_level("WARNING", logger="tiled_detector.pipeline.program"):
        frames = [_scene(seed)[0] for seed in (0, 1, 2)]
        for frame in frames:
            _same(eager.detect(frame), detector.detect(frame))
    assert detector._runner.captures and detector._runner.split
    views, step = detector.plan_for(*frames[0].shape[:2]).batch_size, detector.engine.max_batch
    calls = -(-views // step)  # engine calls per frame (of at most max_batch images: 4 on a CPU)
    # the whole program's capture failed once; then per key: capture before, replay it, the engine (eager),
    # capture after, replay it; later frames replay both around the eager engine
    first = ["capture", "capture", "replay", *["engine"] * calls, "capture", "replay"]
    assert log[: len(first)] == first
    assert log[len(first) :] == ["replay", *["engine"] * calls, "replay"] * 2
    lines = [r.getMessage() for r in caplog.records if r.name == "tiled_detector.pipeline.program"]
    assert len(lines) == 1 and "the engine runs eagerly from now on, between the captured" in lines[0]


def test_an_engine_that_says_it_cannot_be_captured_starts_split(square_torchscript, monkeypatch):
    from test_detector import _scene

    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch")
    log: list[str] = []
    base = TiledDetector(square_torchscript, **options)
    monkeypatch.setattr(base.engine, "capturable", False)  # like ONNX Runtime's CUDA provider
    detector = TiledDetector.from_config(base.config, engine=base.engine, capture=_replaying_capture(log))
    detector._sync_free = True
    frame, _, _ = _scene(0)
    _same(base.detect(frame), detector.detect(frame))
    assert detector._runner.split and log == ["capture", "replay", "capture", "replay"]


class _HostTensorSquares(torch.nn.Module):
    """SquareDetector plus a tensor made on the host in every forward (traced: copied over in every call), which
    loading on CUDA moves to the device (`engines.capture`)."""

    def __init__(self) -> None:
        super().__init__()
        from support.networks import SquareDetector

        self.net = SquareDetector((64, 64), 8)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.net(images)
        return out + torch.zeros(1, device="cpu").type_as(out)


class _DataShapedSquares(_HostTensorSquares):
    """SquareDetector plus a shape read from the data in every forward (the host waits for the device): no CUDA
    graph can hold it."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.net(images)
        return out * (out.flatten().nonzero().shape[0] >= 0)


@pytest.mark.gpu
def test_a_model_that_makes_a_host_tensor_is_captured_whole_and_one_that_reads_data_keeps_the_rest_captured(
    export_torchscript, caplog
):
    from test_detector import _scene

    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch", device="cuda")
    for model, whole in ((_HostTensorSquares(), True), (_DataShapedSquares(), False)):
        path = export_torchscript(model, (64, 64), ["red", "blue"])
        eager = TiledDetector(path, cuda_graph=False, **options)
        with caplog.at_level("WARNING", logger="tiled_detector.pipeline.program"):
            captured = TiledDetector(path, **options)
            for seed in (0, 1, 2):
                frame, _, _ = _scene(seed)
                _same(eager.detect(frame), captured.detect(frame))
        assert captured._runner.captures and captured._runner.split is not whole
        assert captured.engine.capturable is whole
        assert (
            whole or "aten::nonzero has a shape that depends on the data" in captured.engine.capture_problem
        )
        # known before capturing: no capture failed, no log line
        assert not [r for r in caplog.records if r.name == "tiled_detector.pipeline.program"]


def test_cuda_graph_is_the_default_where_the_frame_can_be_captured() -> None:
    from types import SimpleNamespace

    from tiled_detector.model_files.engine_setup import default_capture
    from tiled_detector.runtime.devices import cuda_graph

    config = DetectorConfig()
    assert config.cuda_graph  # on by default
    engine = SimpleNamespace(device=torch.device("cuda", 0), capturable=True)
    assert default_capture(config, engine) is cuda_graph
    assert default_capture(config.replace(cuda_graph=False), engine) is None
    assert default_capture(config.replace(sync_free=False), engine) is None  # data-dependent shapes
    # an engine that cannot be recorded is captured around (program.Runner's split form)
    assert (
        default_capture(config, SimpleNamespace(device=torch.device("cuda", 0), capturable=False))
        is cuda_graph
    )
    assert default_capture(config, SimpleNamespace(device=torch.device("cpu"), capturable=True)) is None


def test_switching_cuda_graph_off_at_runtime_keeps_the_engine(square_torchscript):
    from test_detector import _scene

    log: list[str] = []
    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch")
    detector = TiledDetector(square_torchscript, capture=_replaying_capture(log), **options)
    detector._sync_free = True
    frame, _, _ = _scene(0)
    expected = TiledDetector(square_torchscript, **options).detect(frame)
    _same(detector.detect(frame), expected)
    assert log == ["capture", "replay"]
    engine = detector.engine
    detector.update(cuda_graph=False)  # the detector is rebuilt around the same engine, uncaptured
    assert detector.engine is engine and detector.config.cuda_graph is False and not detector._runner.captures
    detector._sync_free = True
    _same(detector.detect(frame), expected)
    assert log == ["capture", "replay"]  # nothing captured or replayed any more


def test_update_keeps_engine_buffers_and_learned_limits(bundled, scenes):
    detector = bundled.with_config()
    program, uploader = detector._program, detector._uploader
    detector._limits = Limits(capacity=2048, slots=16, rounds=32)
    detector.update(conf_threshold=0.5, tile_size=(512, 512), overlap=0.1, merge="greedy_nmm")
    assert (
        detector._program is program and detector._uploader is uploader and detector._limits.capacity == 2048
    )
    _same(
        detector.detect(scenes[2]),
        bundled.with_config(conf_threshold=0.5, tile_size=(512, 512), overlap=0.1, merge="greedy_nmm").detect(
            scenes[2]
        ),
    )
    with pytest.raises(ValueError, match="needs a new engine"):
        detector.update(precision="fp16")


def test_compile_is_chosen_only_where_it_can_run(monkeypatch, caplog) -> None:
    from types import SimpleNamespace

    import tiled_detector.model_files.engine_setup as setup_module
    from tiled_detector.pipeline.program import fused

    cuda = SimpleNamespace(device=torch.device("cuda", 0))
    config = DetectorConfig()
    assert not config.compile and setup_module.default_compiler(config, cuda) is None  # off by default
    # triton "installed"
    monkeypatch.setattr(setup_module.importlib.util, "find_spec", lambda name: object())
    assert setup_module.default_compiler(config.replace(compile=True), cuda) is fused
    with caplog.at_level("WARNING", logger="tiled_detector.model_files.engine_setup"):
        cpu = SimpleNamespace(device=torch.device("cpu"))
        assert setup_module.default_compiler(config.replace(compile=True), cpu) is None
        monkeypatch.setattr(setup_module.importlib.util, "find_spec", lambda name: None)  # no triton
        assert setup_module.default_compiler(config.replace(compile=True), cuda) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "tiled_detector.model_files.engine_setup"]
    assert len(lines) == 2 and all("compile needs a CUDA device and triton" in line for line in lines)


def test_fused_runs_uncompiled_after_compiling_fails(monkeypatch, caplog) -> None:
    from tiled_detector.pipeline import program

    tries: list[int] = []

    def broken_compile(function, **options):
        assert options == {"dynamic": False}

        def compiled(*args, **kwargs):
            tries.append(1)
            raise RuntimeError("Cannot find a working triton installation\n(a long traceback)")

        return compiled

    monkeypatch.setattr(program.torch, "compile", broken_compile)

    def double(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 1:
            raise ValueError("one dimension please")
        return 2 * x

    call = program.fused(double)
    with pytest.raises(ValueError, match="one dimension"):  # the input's fault: raised, compiling stays on
        call(torch.ones(2, 2))
    with caplog.at_level("WARNING", logger="tiled_detector.pipeline.program"):
        assert call(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
        assert call(torch.ones(1)).tolist() == [2.0]
    assert len(tries) == 2  # not tried again after it failed on good input
    lines = [r.getMessage() for r in caplog.records if r.name == "tiled_detector.pipeline.program"]
    assert lines == [
        "torch.compile of double failed (Cannot find a working triton installation); running it uncompiled"
    ]


def test_fused_keeps_a_compiled_variant_per_frame_size_and_limits(monkeypatch) -> None:
    # every frame size and every grown `Limits` compiles a variant: torch's default of 8 ran a 4K flood uncompiled
    from tiled_detector.pipeline import program

    dynamo = torch._dynamo.config
    name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
    monkeypatch.setattr(dynamo, name, 8)
    program.fused(lambda x: x + 1)
    assert getattr(dynamo, name) == program.RECOMPILE_LIMIT >= 18 * 2
    monkeypatch.setattr(dynamo, name, 500)  # a larger setting of the user's stays
    program.fused(lambda x: x + 1)
    assert getattr(dynamo, name) == 500


def test_the_frame_program_runs_its_decoding_and_post_processing_through_the_compiler(
    square_torchscript, monkeypatch
):
    import tiled_detector.detector as detector_module
    from test_detector import _scene

    compiled: list[str] = []
    called: list[str] = []

    def stand_in(function):  # what torch.compile gives: an equivalent function
        compiled.append(function.__name__)

        def call(*args, **kwargs):
            called.append(function.__name__)
            return function(*args, **kwargs)

        return call

    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch")
    eager = TiledDetector(square_torchscript, **options)
    monkeypatch.setattr(detector_module, "default_compiler", lambda config, engine: stand_in)
    detector = TiledDetector(square_torchscript, compile=True, **options)
    detector._sync_free = True  # the fixed-size path, where the compiled post-processing runs
    # postprocess_rows: the same with the group map, for a segmentation model's masks
    assert compiled == ["decode_padded", "postprocess", "postprocess_rows", "locate"]
    for seed in (0, 1):
        frame, _, _ = _scene(seed)
        _same(eager.detect(frame), detector.detect(frame))
    calls = -(-detector.plan_for(*frame.shape[:2]).batch_size // detector.engine.max_batch)  # engine calls
    assert called.count("postprocess") == 2 and called.count("decode_padded") == 2 * calls
    assert "locate" not in called  # positions only with a depth image
    depth = DepthImage(np.ones(frame.shape[:2], np.float32), Intrinsics(100.0, 100.0, 50.0, 50.0))
    np.testing.assert_array_equal(
        eager.detect(frame, depth=depth).positions, detector.detect(frame, depth=depth).positions
    )
    assert called.count("locate") == 1


@pytest.mark.gpu
def test_compiled_frame_program_equals_the_uncompiled_one_on_cuda(square_torchscript, caplog):
    from test_detector import _scene

    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch", device="cuda")
    plain = TiledDetector(square_torchscript, **options)
    fast = TiledDetector(square_torchscript, compile=True, **options)
    assert fast._program.postprocess is not plain._program.postprocess
    with caplog.at_level("WARNING", logger="tiled_detector.pipeline.program"):
        for seed in (0, 1, 2):
            frame, _, _ = _scene(seed)
            _same(plain.detect(frame), fast.detect(frame))
    # compiled indeed: a stage that fails to compile runs uncompiled with one log line (and would pass above)
    assert not [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]


def test_detect_many_keeps_each_sources_upload_slot(bundled, scenes, monkeypatch):
    detector = bundled.with_config()
    used: list[int] = []
    upload = detector._uploader.upload
    monkeypatch.setattr(
        detector._uploader,
        "upload",
        lambda f, e, slot, static: used.append(slot) or upload(f, e, slot, static),
    )
    both = detector.detect_many([scenes[0], scenes[2]], slots=[0, 2])
    only_second = detector.detect_many([scenes[2]], slots=[2])  # camera 0 had no frame this time
    assert used == [0, 2, 2]
    _same(both[1], only_second[0])
    _same(both[0], detector.detect(scenes[0]))
    with pytest.raises(ValueError, match="slots must name each of the 2 frames once"):
        detector.detect_many([scenes[0], scenes[1]], slots=[1, 1])


def test_a_one_frame_flood_beyond_the_largest_capacity_stays_captured_and_equals_the_exact_path(
    square_torchscript, monkeypatch
):
    """A frame whose candidates outnumber the largest sync-free capacity (YOLOX-nano's 416 tiles at 4K with random
    weights: 85 views x top_k 100) keeps its best ones, as the exact path does, so it replays its capture instead
    of falling back to the eager exact path frame after frame."""
    import tiled_detector.pipeline.postprocess as postprocess_module
    from test_detector import _scene

    monkeypatch.setattr(postprocess_module, "MAX_CAPACITY", 16)
    monkeypatch.setattr(postprocess_module, "MAX_CANDIDATES", 16)
    options = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.2, backend="torch")
    eager = TiledDetector(square_torchscript, **options)
    log: list[str] = []
    captured = TiledDetector(square_torchscript, capture=_replaying_capture(log), **options)
    captured._sync_free, captured._limits = True, Limits(capacity=8)  # grown to the largest, 16, by the flood
    frame, _, _ = _scene(7, count=20)  # 20 squares, each seen by several views: more than 16 candidates
    plan = batch_plan([eager.plan_for(*frame.shape[:2])])
    found = eager._program.candidates([torch.from_numpy(frame)], ["rgb8"], plan, eager.frame_settings)
    assert int(found.valid.sum()) > 16
    for _ in range(4):
        got = captured.detect(frame)
    _same(eager.detect(frame), got)
    assert captured._limits.capacity == 16 and captured._exact_batches == 0  # never sent to the exact path
    assert log[-2:] == ["replay", "replay"]  # the last frames replayed one capture
