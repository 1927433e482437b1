"""The frame program's Triton kernels (`pipeline.fused_preprocess`, `fused_decode`, `fused_postprocess`) against the
torch stages they stand for: on the CPU through Triton's interpreter (conftest sets TRITON_INTERPRET=1 where no CUDA
device is seen; skipped where triton is not installed), on a GPU compiled (marked `gpu`), captured in a graph too.
The torch stages are the reference: the fused post-processing equals their exact result wherever the candidates
fit the capacity, the decode their rows, the preprocessing their batch to float rounding."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiled_detector.config import DetectorConfig
from tiled_detector.pipeline import kernels
from tiled_detector.pipeline.decode import PaddedDecoded, decode_padded
from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.postprocess import Limits, postprocess_rows
from tiled_detector.pipeline.preprocess import InputFormat, Preprocessor
from tiled_detector.pipeline.tiling import batch_plan, make_plan

triton_missing = kernels.triton() is None
interpreted = pytest.mark.skipif(
    triton_missing or not kernels.interpreted(),
    reason="needs triton and TRITON_INTERPRET=1 (set where no GPU is)",
)
on_gpu = pytest.mark.gpu


@pytest.fixture
def always(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels on whatever device the test uses (CPU tensors through the interpreter)."""
    monkeypatch.setenv(kernels.ENVIRONMENT, "always")


def _device(kind: str) -> torch.device:
    return torch.device("cuda" if kind == "gpu" else "cpu")


DEVICES = [pytest.param("cpu", marks=interpreted), pytest.param("gpu", marks=[on_gpu])]
PLANS = (
    make_plan((1080, 1920), (640, 640), 0.2, (640, 640), True),
    make_plan((720, 1280), (640, 640), 0.2, (640, 640), True, roi=(0.1, 0.0, 0.9, 1.0)),
)


def _candidates(rng: np.random.Generator, views: int, per_view: int, classes: int) -> PaddedDecoded:
    """Random candidates in model-input pixels, a third of them near copies of others (overlaps, seams), some
    scores tied."""
    m = views * per_view
    centres = rng.uniform(0, 640, (m, 2))
    near = m // 3
    centres[:near] = centres[rng.integers(0, m, near)] + rng.normal(0, 3, (near, 2))
    sides = rng.uniform(4, 300, (m, 2))
    boxes = np.concatenate([centres - sides / 2, centres + sides / 2], 1).astype(np.float32)
    scores = rng.uniform(0, 1, m).astype(np.float32)
    scores[rng.random(m) < 0.1] = 0.5
    return PaddedDecoded(
        torch.from_numpy(boxes),
        torch.from_numpy(scores),
        torch.from_numpy(rng.integers(0, classes, m)),
        torch.arange(views).repeat_interleave(per_view),
        torch.from_numpy(rng.random(m) < 0.5),
    )


def _kept(packed: torch.Tensor) -> torch.Tensor:
    rows = packed[:-1].cpu()
    return rows[rows[:, 6] > 0]


@pytest.mark.parametrize("kind", DEVICES)
@settings(
    max_examples=12 if kernels.interpreted() else 4,  # (each new setting compiles its kernels on a GPU)
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**31 - 1),
    frames=st.integers(1, 2),
    per_view=st.integers(0, 40),
    metric=st.sampled_from(["ios", "iou"]),
    agnostic=st.booleans(),
    seams=st.booleans(),
    max_detections=st.sampled_from([3, 100]),
    sizes=st.sampled_from([(0, 0), (20, 0), (0, 250), (10, 300)]),
    threshold=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
)
def test_fused_postprocess_equals_the_exact_torch_stages(
    always, kind, seed, frames, per_view, metric, agnostic, seams, max_detections, sizes, threshold
):
    """Property: the fused kernel's result rows (and each row's candidate) are the exact path's, its status says
    exact, and its shape is the torch stages' sync-free one."""
    device = _device(kind)
    plan = batch_plan(PLANS[:frames])
    config = DetectorConfig(
        match_metric=metric,
        merge_threshold=threshold,
        class_agnostic=agnostic,
        seam_suppression=seams,
        max_detections=max_detections,
        min_box_size=sizes[0],
        max_box_size=sizes[1],
    )
    frame_settings = config.frame_settings(("a", "b", "c"))
    found = _candidates(np.random.default_rng(seed), plan.batch_size, per_view, 3)
    found = PaddedDecoded(*(t.to(device) for t in found[:5]))
    from tiled_detector.pipeline import fused_postprocess

    limits = Limits(capacity=4096)
    assert fused_postprocess.supports(found, plan, frame_settings, limits)
    fused = fused_postprocess.postprocess_rows(found, plan, frame_settings, limits)
    exact = postprocess_rows(found, plan, frame_settings, None)
    padded = postprocess_rows(found, plan, frame_settings, limits)
    assert fused.packed.shape == padded.packed.shape
    assert torch.equal(_kept(fused.packed), _kept(exact.packed))
    rows = fused.packed[:-1, 6].cpu() > 0
    assert torch.equal(fused.members[rows, 0].cpu(), exact.members[exact.packed[:-1, 6] > 0, 0].cpu())
    status = fused.packed[-1, :4].cpu()
    assert status.tolist() == [int(found.valid.sum()), 1.0, 1.0, 0.0]


@pytest.mark.parametrize("kind", DEVICES)
def test_fused_postprocess_says_when_the_capacity_does_not_suffice(always, kind):
    """Bad input: more valid candidates than the capacity: `needed` says so (the host then redoes the batch
    exactly), never a silent cut."""
    plan = batch_plan(PLANS[:1])
    settings_ = DetectorConfig().frame_settings(("a", "b", "c"))
    found = _candidates(np.random.default_rng(1), plan.batch_size, 40, 3)
    found = PaddedDecoded(*(t.to(_device(kind)) for t in found[:5]))
    from tiled_detector.pipeline import fused_postprocess

    valid = int(found.valid.sum())
    result = fused_postprocess.postprocess_rows(found, plan, settings_, Limits(capacity=valid - 1))
    assert result.packed[-1, 0].item() == valid > valid - 1
    assert _kept(result.packed).shape[0] == 0


def _heads(generator: torch.Generator, dtype: torch.dtype) -> list[tuple[str, dict, dict]]:
    """(layout, outputs, decode keywords) of every head the fused decode covers."""
    v8 = torch.rand(3, 4 + 5, 300, generator=generator).to(dtype)
    v8[:, :4] *= 100
    rows = torch.rand(2, 84, 5 + 3, generator=generator).to(dtype)
    rows[..., :4] -= 0.5
    obb = torch.rand(2, 4 + 3 + 1, 200, generator=generator).to(dtype)
    obb[:, :4] *= 50
    seg = torch.rand(2, 4 + 3 + 8, 200, generator=generator).to(dtype)
    prototypes = torch.rand(2, 8, 16, 16, generator=generator).to(dtype)
    return [
        ("yolov8", {"o": v8}, {}),
        ("yolov8", {"o": v8}, {"class_filter": [1, 3]}),
        ("yolox", {"o": rows}, {"input_hw": (64, 64)}),
        ("yolox", {"o": rows}, {"input_hw": (64, 64), "class_filter": [2]}),
        ("yolov5", {"o": rows}, {}),
        ("yolov8_transposed", {"o": rows}, {}),
        ("obb", {"o": obb}, {}),
        ("yolov8", {"o": seg, "p": prototypes}, {}),
    ]


@pytest.mark.parametrize("kind", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_decode_equals_the_torch_decode(always, kind, dtype):
    from tiled_detector.pipeline import fused_decode

    generator = torch.Generator().manual_seed(0)
    for layout, heads, options in _heads(generator, dtype):
        outputs = {k: v.to(_device(kind)) for k, v in heads.items()}
        want = decode_padded(outputs, layout, 0.3, 20, **options)
        got = fused_decode.decode_padded(outputs, layout, 0.3, 20, **options)
        assert got is not None, layout
        valid = want.valid.cpu()
        assert torch.equal(got.valid.cpu(), valid), layout
        assert torch.equal(got.image_index.cpu(), want.image_index.cpu())
        assert torch.equal(got.class_ids.cpu()[valid], want.class_ids.cpu()[valid]), layout
        assert torch.equal(got.scores.cpu()[valid], want.scores.cpu()[valid]), layout
        # YOLOX's exp: Triton's against torch's, within float32 rounding of a few-hundred-pixel box
        torch.testing.assert_close(got.boxes.cpu()[valid], want.boxes.cpu()[valid], rtol=1e-6, atol=1e-4)
        assert (got.extra is None) == (want.extra is None)
        if want.extra is not None:
            assert torch.equal(got.extra.cpu()[valid], want.extra.cpu()[valid])
            assert got.prototypes is not None


def test_fused_decode_leaves_what_it_does_not_cover_to_torch(always):
    from tiled_detector.pipeline import fused_decode

    end2end = {"o": torch.rand(1, 300, 6)}
    assert fused_decode.decode_padded(end2end, "end2end", 0.3, 20) is None
    v8 = {"o": torch.rand(1, 6, 50)}
    assert fused_decode.decode_padded(v8, "yolov8", 0.3, 20, class_thresholds=((0, 0.5),)) is None


CASES = [  # frame size, tile, model input, encoding, dtype, input format
    ((200, 300), (64, 64), (64, 64), "rgb8", torch.float32, InputFormat()),
    (
        (200, 300),
        (80, 80),
        (64, 64),
        "bgr8",
        torch.float16,
        InputFormat(mean=(10, 20, 30), std=(5, 6, 7), scale=1.0),
    ),
    ((50, 40), (64, 64), (64, 64), "mono8", torch.float32, InputFormat(channel_order="bgr")),
    ((130, 170), (48, 48), (64, 64), "mono16", torch.float16, InputFormat(letterbox="top_left")),
    ((90, 300), (64, 64), (64, 96), "rgba8", torch.float32, InputFormat(letterbox="stretch")),
]


@pytest.mark.parametrize("kind", DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_preprocess_equals_the_torch_preprocessing(monkeypatch, kind, case):
    """Every view (tiles in and past the frame, letterboxed tiles, the full-frame view down- and upscaled), a
    chunk of them and a tile budget's chosen ones: the torch batch to float rounding (one fp16 step)."""
    hw, tile, input_hw, name, dtype, fmt = CASES[case]
    device = _device(kind)
    plan = make_plan(hw, tile, 0.2, input_hw, True, letterbox=fmt.letterbox)
    encoding = Encoding(name)
    high = 256 if encoding.itemsize == 1 else 65536
    values = np.random.default_rng(case).integers(0, high, (*hw, encoding.channels))
    frame = torch.from_numpy(values.astype(np.uint8 if encoding.itemsize == 1 else np.int32))
    frame = (frame if encoding.itemsize == 1 else frame.to(torch.uint16)).to(device)

    def preprocessor(choice: str, on: torch.device) -> Preprocessor:
        monkeypatch.setenv(kernels.ENVIRONMENT, choice)
        return Preprocessor(on, dtype, input_hw, fmt)

    # the reference: the torch preprocessing on the CPU (on CUDA it cannot gather 16-bit frames: "index_cuda" is
    # not implemented for UInt16, which the kernel does)
    step = 1e-6 if dtype == torch.float32 else 1e-3
    cpu = torch.device("cpu")
    torch_path, fused = preprocessor("torch", cpu), preprocessor("always", device)
    assert fused._fused is not None and torch_path._fused is None
    for views in (None, (1, plan.batch_size)):
        want = torch_path.prepare(frame.cpu(), plan, encoding, views=views).float()
        got = fused.prepare(frame, plan, encoding, views=views).float().cpu()
        torch.testing.assert_close(got, want, rtol=step, atol=step * (1 + float(want.abs().max())))
    outs = [torch.zeros(3, 3, *input_hw, dtype=dtype, device=d) for d in (cpu, device)]
    torch_path.prepare_chosen(
        frame.cpu(), plan, encoding, outs[0], torch.tensor([plan.num_tiles - 1, 0]), True
    )
    fused.prepare_chosen(
        frame, plan, encoding, outs[1], torch.tensor([plan.num_tiles - 1, 0], device=device), True
    )
    want, got = outs[0].float(), outs[1].float().cpu()
    torch.testing.assert_close(got, want, rtol=step, atol=step * (1 + float(want.abs().max())))


@pytest.fixture(scope="module")
def squares(tmp_path_factory) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from support.networks import SquareDetector, save_torchscript

    return save_torchscript(
        SquareDetector((64, 64), 8), tmp_path_factory.mktemp("k") / "sq.ts", (64, 64), ["r", "b"]
    )


def _scene(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    frame = rng.integers(0, 30, (height, width, 1), dtype=np.uint8).repeat(3, axis=2)
    for _ in range(12):
        side = 8 * int(rng.integers(1, 3))
        y, x = 4 * int(rng.integers(0, (height - side) // 4)), 4 * int(rng.integers(0, (width - side) // 4))
        frame[y : y + side, x : x + side] = (255, 0, 0) if rng.random() < 0.5 else (0, 0, 255)
    return frame


@pytest.mark.parametrize("kind", DEVICES)
def test_detector_through_the_kernels_equals_the_torch_stages(monkeypatch, squares, kind):
    """The whole frame (preprocess, decode, post-process through the kernels; on a GPU captured as one graph and
    replayed) gives the torch stages' detections."""
    from tiled_detector.detector import TiledDetector

    device = "cuda" if kind == "gpu" else "cpu"

    def detector(choice: str) -> TiledDetector:
        monkeypatch.setenv(kernels.ENVIRONMENT, choice)
        made = TiledDetector(squares, device=device, backend="torch", tile_size=(64, 64), conf_threshold=0.3)
        made._sync_free = True  # the accelerator's path, also on the CPU
        return made

    reference, fused = detector("torch"), detector("always")
    assert fused._program.kernels and not reference._program.kernels
    rng = np.random.default_rng(3)
    for _ in range(3):
        frame = _scene(rng, 120, 200)
        for _ in range(2):  # (on a GPU: the capture, then a replay)
            want, got = reference.detect(frame), fused.detect(frame)
            np.testing.assert_array_equal(got.boxes, want.boxes)
            np.testing.assert_array_equal(got.scores, want.scores)
            np.testing.assert_array_equal(got.class_ids, want.class_ids)


def test_without_triton_the_torch_stages_run_with_one_info_line(monkeypatch, caplog):
    """Bad input: a CUDA platform without triton (Jetson's usual torch) runs the torch stages, saying so once."""
    monkeypatch.setattr(kernels, "triton", lambda: None)
    monkeypatch.delenv(kernels.ENVIRONMENT, raising=False)
    kernels._said.cache_clear()
    with caplog.at_level(logging.INFO, logger=kernels.LOG.name):
        assert not kernels.enabled(torch.device("cuda"))
        assert not kernels.enabled(torch.device("cuda"))
    lines = [r for r in caplog.records if "triton is not available" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    monkeypatch.setenv(kernels.ENVIRONMENT, "torch")
    monkeypatch.setattr(kernels, "triton", lambda: ("triton", "language"))
    assert not kernels.enabled(torch.device("cuda"))
    monkeypatch.delenv(kernels.ENVIRONMENT)
    assert kernels.enabled(torch.device("cuda")) and not kernels.enabled(torch.device("cpu"))


def test_a_kernel_that_fails_leaves_its_torch_stage_running_with_one_warning(caplog):
    """Bad input: a platform whose triton cannot compile a kernel runs the torch stage from then on (one WARNING
    line), with the torch stage's result; an error the torch stage raises too is raised as it is."""
    calls = []

    def kernel(x):
        calls.append(x)
        raise RuntimeError("PTX assembly failed\nsecond line")

    stage = kernels.guarded(kernel, lambda x: x * 2, "testing")
    with caplog.at_level(logging.WARNING, logger=kernels.LOG.name):
        assert stage(2) == 4 and stage(3) == 6
    assert calls == [2]
    lines = [r.getMessage() for r in caplog.records if "kernels failed" in r.getMessage()]
    assert len(lines) == 1 and "PTX assembly failed" in lines[0] and "second line" not in lines[0]
    covered = kernels.guarded(lambda x: None, lambda x: -x, "testing")
    assert covered(5) == -5  # a case the kernel does not cover
    with pytest.raises(ValueError, match="bad"):
        kernels.guarded(kernel, lambda x: (_ for _ in ()).throw(ValueError("bad input")), "testing")(1)
