"""Tests for preprocess.py: tile crops, padding, letterbox, encodings and buffer reuse against numpy / OpenCV."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.pipeline.encodings import Encoding, as_frame_tensor
from tiled_detector.pipeline.preprocess import PAD_VALUE, Preprocessor
from tiled_detector.pipeline.tiling import Letterbox, make_plan
from tiled_detector.pipeline.upload import Uploader

ORDERS = {"rgb8": [0, 1, 2], "bgr8": [2, 1, 0], "rgba8": [0, 1, 2], "bgra8": [2, 1, 0], "mono8": [0, 0, 0]}


def _frame(rng: np.random.Generator, height: int, width: int, encoding: str) -> np.ndarray:
    enc = Encoding.from_value(encoding)
    high = 65536 if enc is Encoding.MONO16 else 256
    dtype = np.uint16 if enc is Encoding.MONO16 else np.uint8
    shape = (height, width) if enc.channels == 1 else (height, width, enc.channels)
    return rng.integers(0, high, shape, dtype=dtype)


def _as_rgb_float(frame: np.ndarray, encoding: str) -> np.ndarray:
    """Reference conversion: (H, W, 3) float32 RGB in [0, 1]."""
    enc = Encoding.from_value(encoding)
    pixels = frame.reshape(*frame.shape[:2], -1).astype(np.float32)
    return pixels[..., list(enc.rgb_order)] * np.float32(enc.scale)


def _reference_tile(rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Straightforward crop of one tile (padded with 114/255 past the border), (3, th, tw)."""
    x1, y1, x2, y2 = (int(v) for v in box)
    tile = np.full((y2 - y1, x2 - x1, 3), PAD_VALUE, np.float32)
    h, w = rgb.shape[:2]
    cy2, cx2 = min(y2, h), min(x2, w)
    tile[: cy2 - y1, : cx2 - x1] = rgb[y1:cy2, x1:cx2]
    return tile.transpose(2, 0, 1)


def _reference_letterbox(image: np.ndarray, box: Letterbox, input_hw: tuple[int, int]) -> np.ndarray:
    """OpenCV bilinear resize (float, so no fixed-point rounding) into a grey canvas, (3, H, W)."""
    rh, rw = box.resized_hw
    canvas = np.full((*input_hw, 3), PAD_VALUE, np.float32)
    resized = cv2.resize(image, (rw, rh), interpolation=cv2.INTER_LINEAR).reshape(rh, rw, -1)
    canvas[box.pad_y : box.pad_y + rh, box.pad_x : box.pad_x + rw] = resized
    return canvas.transpose(2, 0, 1)


@settings(max_examples=40, deadline=None)
@given(
    height=st.integers(8, 120),
    width=st.integers(8, 120),
    tile=st.integers(8, 48),
    overlap=st.floats(0.0, 0.6),
    encoding=st.sampled_from(["rgb8", "bgr8", "rgba8", "bgra8", "mono8", "mono16"]),
    seed=st.integers(0, 2**16),
)
def test_tiles_equal_reference_crops(height, width, tile, overlap, encoding, seed):
    frame = _frame(np.random.default_rng(seed), height, width, encoding)
    plan = make_plan((height, width), (tile, tile), overlap, (tile, tile), False)
    batch = Preprocessor("cpu", torch.float32, (tile, tile)).run(frame, plan, encoding).numpy()
    rgb = _as_rgb_float(frame, encoding)
    expected = np.stack([_reference_tile(rgb, box) for box in plan.tiles])
    np.testing.assert_allclose(batch, expected, rtol=0, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    height=st.integers(8, 100),
    width=st.integers(8, 100),
    tile=st.integers(8, 40),
    input_hw=st.tuples(st.integers(8, 40), st.integers(8, 40)),
    encoding=st.sampled_from(["rgb8", "bgr8", "mono8"]),
    seed=st.integers(0, 2**16),
)
def test_resized_tiles_and_full_frame_equal_opencv_letterbox(height, width, tile, input_hw, encoding, seed):
    frame = _frame(np.random.default_rng(seed), height, width, encoding)
    plan = make_plan((height, width), (tile, tile), 0.25, input_hw, True)
    batch = Preprocessor("cpu", torch.float32, input_hw).run(frame, plan, encoding).numpy()
    rgb = _as_rgb_float(frame, encoding)
    tiles = [_reference_tile(rgb, box).transpose(1, 2, 0) for box in plan.tiles]
    expected = [_reference_letterbox(t, plan.tile_letterbox, input_hw) for t in tiles]
    expected.append(_reference_letterbox(rgb, plan.frame_letterbox, input_hw))
    assert batch.shape == (plan.batch_size, 3, *input_hw)
    np.testing.assert_allclose(batch, np.stack(expected), rtol=0, atol=2e-5)


def test_padding_past_the_border_is_yolo_grey():
    frame = np.full((20, 30, 3), 255, np.uint8)
    plan = make_plan((20, 30), (32, 32), 0.2, (32, 32), False)
    batch = Preprocessor("cpu", torch.float32, (32, 32)).run(frame, plan).numpy()
    assert batch.shape == (1, 3, 32, 32)
    assert np.all(batch[0, :, :20, :30] == 1.0)
    assert np.allclose(batch[0, :, 20:, :], 114 / 255) and np.allclose(batch[0, :, :, 30:], 114 / 255)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
def test_channel_order_gives_rgb(encoding):
    pixel = {"rgb8": [10, 20, 30], "bgr8": [30, 20, 10], "rgba8": [10, 20, 30, 99], "bgra8": [30, 20, 10, 99]}
    frame = np.tile(np.array(pixel[encoding], np.uint8), (16, 16, 1))
    plan = make_plan((16, 16), (16, 16), 0.0, (16, 16), True)
    batch = Preprocessor("cpu", torch.float32, (16, 16)).run(frame, plan, encoding)
    np.testing.assert_allclose(batch[:, :, 5, 5].numpy(), [[10 / 255, 20 / 255, 30 / 255]] * 2, atol=1e-6)


def test_mono16_scales_by_65535_and_survives_fp16():
    frame = np.array([[0, 65535], [32768, 65535]], np.uint16).repeat(8, 0).repeat(8, 1)
    plan = make_plan((16, 16), (16, 16), 0.0, (16, 16), True)
    for dtype in (torch.float32, torch.float16):
        batch = Preprocessor("cpu", dtype, (16, 16)).run(frame, plan, "mono16")
        assert batch.dtype == dtype and torch.isfinite(batch).all()
        assert batch[0, :, 0, 15].tolist() == [1.0, 1.0, 1.0]
        assert batch[1, :, 15, 0].float().tolist() == pytest.approx([32768 / 65535] * 3, abs=1e-3)


def test_fp16_matches_fp32():
    frame = _frame(np.random.default_rng(1), 50, 70, "bgr8")
    plan = make_plan((50, 70), (32, 32), 0.2, (24, 24), True)
    full = Preprocessor("cpu", torch.float32, (24, 24)).run(frame, plan, "bgr8")
    half = Preprocessor("cpu", torch.float16, (24, 24)).run(frame, plan, "bgr8")
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), full, atol=2e-3, rtol=0)


def test_batch_is_reused_across_frames_and_reallocated_for_a_new_batch_size():
    rng = np.random.default_rng(2)
    pre = Preprocessor("cpu", torch.float32, (32, 32))
    plan = make_plan((60, 90), (32, 32), 0.2, (32, 32), True)
    first = pre.run(_frame(rng, 60, 90, "rgb8"), plan)
    pointer, values = first.data_ptr(), first.clone()
    second = pre.run(_frame(rng, 60, 90, "rgb8"), plan)
    assert second.data_ptr() == pointer and not torch.equal(second, values)
    other = pre.run(_frame(rng, 60, 90, "rgb8"), make_plan((60, 90), (32, 32), 0.2, (32, 32), False))
    assert other.shape[0] == plan.batch_size - 1


def test_writes_into_a_given_buffer():
    frame = _frame(np.random.default_rng(3), 40, 40, "rgb8")
    plan = make_plan((40, 40), (32, 32), 0.2, (32, 32), True)
    out = torch.zeros(8, 3, 32, 32)
    batch = Preprocessor("cpu", torch.float32, (32, 32)).run(frame, plan, out=out)
    assert batch.data_ptr() == out.data_ptr() and batch.shape[0] == plan.batch_size
    torch.testing.assert_close(batch, Preprocessor("cpu", torch.float32, (32, 32)).run(frame, plan))
    assert torch.all(out[plan.batch_size :] == 0)
    with pytest.raises(ValueError, match="out must be"):
        Preprocessor("cpu", torch.float32, (32, 32)).run(frame, plan, out=torch.zeros(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"contiguous torch\.float32"):
        Preprocessor("cpu", torch.float32, (32, 32)).run(frame, plan, out=out.half())


def test_cpu_frames_are_not_copied():
    frame = _frame(np.random.default_rng(4), 10, 12, "rgb8")
    tensor = Uploader("cpu").upload(frame, "rgb8")
    assert tensor.data_ptr() == frame.ctypes.data
    readonly = frame.copy()
    readonly.setflags(write=False)
    assert as_frame_tensor(readonly, "rgb8").shape == (10, 12, 3)
    flipped = frame[:, ::-1]
    assert torch.equal(as_frame_tensor(flipped, "rgb8"), torch.from_numpy(flipped.copy()))


@pytest.mark.gpu
@pytest.mark.parametrize(("height", "width"), [(1080, 1920), (2160, 3840), (4321, 2001)])
def test_cuda_uploads_land_whole_in_the_same_device_frame(height, width):
    # frames over upload.BAND_BYTES go in row bands (3840x2160 rgb8: 3; 4321 rows do not split evenly)
    rng = np.random.default_rng(9)
    uploader = Uploader("cuda")
    first = uploader.upload(_frame(rng, height, width, "rgb8"), "rgb8", static=True)
    for _ in range(2):
        frame = _frame(rng, height, width, "rgb8")
        tensor = uploader.upload(frame, "rgb8", static=True)
        assert tensor.data_ptr() == first.data_ptr()
        assert torch.equal(tensor.cpu(), torch.from_numpy(frame))


@pytest.mark.parametrize(
    ("shape", "dtype", "encoding", "message"),
    [
        ((10, 10, 3), np.uint8, "mono8", "HxWx1"),
        ((10, 10), np.uint8, "rgb8", "HxWx3"),
        ((10, 10, 3), np.uint16, "rgb8", "torch.uint8"),
        ((10, 10), np.uint8, "mono16", "torch.uint16"),
        ((0, 10, 3), np.uint8, "rgb8", "empty"),
        ((10, 10, 3), np.uint8, "yuv422", "unknown encoding"),
    ],
)
def test_bad_frames_raise_clear_errors(shape, dtype, encoding, message):
    with pytest.raises(ValueError, match=message):
        as_frame_tensor(np.zeros(shape, dtype), encoding)


@pytest.mark.parametrize("as_torch", [False, True])
def test_strided_frame_views_are_cropped_correctly(as_torch):
    big = _frame(np.random.default_rng(5), 90, 120, "bgra8")
    view = big[7:77, 11:111]  # row padding and an offset, like a ROS image with a step larger than width
    frame = torch.from_numpy(big)[7:77, 11:111] if as_torch else view
    plan = make_plan((70, 100), (32, 32), 0.3, (32, 32), False)
    batch = Preprocessor("cpu", torch.float32, (32, 32)).run(frame, plan, "bgra8").numpy()
    rgb = _as_rgb_float(np.ascontiguousarray(view), "bgra8")
    np.testing.assert_allclose(batch, np.stack([_reference_tile(rgb, box) for box in plan.tiles]), atol=1e-6)


def test_resized_tiles_reuse_their_scratch_tensor():
    rng = np.random.default_rng(5)
    pre = Preprocessor("cpu", torch.float32, (32, 32))
    plan = make_plan((100, 120), (48, 48), 0.2, (32, 32), True)  # 48-pixel tiles resized into the 32 input
    reference = Preprocessor("cpu", torch.float32, (32, 32))
    empties = []
    real_empty = torch.empty

    def counting_empty(*args, **kwargs):
        empties.append(args)
        return real_empty(*args, **kwargs)

    pre.run(_frame(rng, 100, 120, "rgb8"), plan)
    frame = _frame(rng, 100, 120, "rgb8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "empty", counting_empty)
        batch = pre.run(frame, plan)
    assert empties == []  # nothing allocated per frame once the sizes are known
    torch.testing.assert_close(batch, reference.run(frame, plan))


def test_channel_order_is_checked():
    with pytest.raises(ValueError, match="channel_order must be 'rgb' or 'bgr'"):
        Preprocessor("cpu", torch.float32, (32, 32), channel_order="grb")


@pytest.mark.parametrize(
    ("height", "width", "encoding"),
    # 1080 x 1920 -> 360 x 640 reads one pixel per output (zero weights on both axes), 1100 x 1920 on one axis
    [
        (2200, 3900, "bgr8"),
        (4321, 2001, "mono16"),
        (1080, 1920, "rgb8"),
        (1100, 1920, "bgr8"),
        (720, 1280, "mono8"),
        (2160, 3840, "bgr8"),
    ],
)
def test_downscaled_views_sample_only_what_bilinear_reads(height, width, encoding):
    rng = np.random.default_rng(5)
    dtype = np.uint16 if encoding == "mono16" else np.uint8
    frame = rng.integers(
        0, np.iinfo(dtype).max, (height, width, 1 if encoding.startswith("mono") else 3), dtype
    )
    plan = make_plan((height, width), (640, 640), 0.2, (640, 640), True)
    pre = Preprocessor("cpu", torch.float32, (640, 640))
    sampled = pre.run(frame, plan, encoding)[-1].clone()
    # the reference: F.interpolate of the whole frame converted to float (what the sampling avoids), its channels
    # in RGB order, placed in the letterbox
    enc = Encoding.from_value(encoding)
    whole = torch.from_numpy(frame.astype(np.float32)).permute(2, 0, 1).unsqueeze(0) * enc.scale
    box = plan.frame_letterbox
    (rh, rw), top, left = box.resized_hw, box.pad_y, box.pad_x
    resized = torch.nn.functional.interpolate(whole, size=(rh, rw), mode="bilinear", align_corners=False)
    expected = torch.full((3, 640, 640), PAD_VALUE)
    expected[:, top : top + rh, left : left + rw] = resized[0, list(enc.rgb_order)]
    torch.testing.assert_close(sampled, expected, rtol=0, atol=1e-6 if encoding != "mono16" else 2e-4)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "mono8", "rgba8", "mono16"])
# a grid of tiles inside the frame, tiles letterboxed into a smaller input, tiles past the border (a gather)
@pytest.mark.parametrize(
    ("size", "tile", "input_hw"),
    [((120, 200), (32, 32), (32, 32)), ((90, 100), (40, 40), (32, 32)), ((50, 37), (32, 32), (32, 32))],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_channels_last_batches_hold_the_same_values(encoding, size, tile, input_hw, dtype):
    frame = _frame(np.random.default_rng(11), *size, encoding)
    plan = make_plan(size, tile, 0.25, input_hw, True)
    expected = Preprocessor("cpu", dtype, input_hw).run(frame, plan, encoding)
    last = Preprocessor("cpu", dtype, input_hw, memory_format=torch.channels_last)
    batch = last.run(frame, plan, encoding)
    assert batch.is_contiguous(memory_format=torch.channels_last) and not batch.is_contiguous()
    torch.testing.assert_close(batch, expected, rtol=0, atol=0)
    out = torch.zeros(plan.batch_size + 1, 3, *input_hw, dtype=dtype).contiguous(
        memory_format=torch.channels_last
    )
    assert last.run(frame, plan, encoding, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out[: plan.batch_size], expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"channels-last contiguous .* in another layout"):
        last.run(frame, plan, encoding, out=torch.zeros_like(out, memory_format=torch.contiguous_format))


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "mono8", "rgba8", "bgra8", "mono16"])
# windows of the frame, windows letterboxed into a smaller input, tiles past the border (a gather)
@pytest.mark.parametrize(
    ("size", "tile", "input_hw"),
    [((120, 200), (32, 32), (32, 32)), ((90, 100), (40, 40), (32, 32)), ((50, 37), (32, 32), (32, 32))],
)
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chosen_tiles_equal_the_same_tiles_of_the_whole_batch(
    encoding, size, tile, input_hw, memory_format, dtype
):
    """A tile budget's chosen tiles (indices on the device), then the full-frame view: the same images as those
    views of the whole plan's batch, in the chosen order."""
    frame = _frame(np.random.default_rng(5), *size, encoding)
    plan = make_plan(size, tile, 0.25, input_hw, True)
    pre = Preprocessor("cpu", dtype, input_hw, memory_format=memory_format)
    whole = pre.run(frame, plan, encoding).clone()
    chosen = torch.tensor([plan.num_tiles - 1, 0][: plan.num_tiles])
    out = pre.new_batch(len(chosen) + 1)
    pre.prepare_chosen(
        as_frame_tensor(frame, encoding), plan, Encoding.from_value(encoding), out, chosen, True
    )
    torch.testing.assert_close(out[:-1], whole[chosen], rtol=0, atol=0)
    torch.testing.assert_close(out[-1], whole[-1], rtol=0, atol=0)


class _Written(torch.utils._python_dispatch.TorchDispatchMode):
    """The elements every aten op dispatched in its scope writes (the sum of its outputs' sizes; views write none)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.elements += sum(
                t.numel() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
            )
        return out


@pytest.mark.parametrize(
    ("encoding", "model_order"),
    [
        ("rgb8", "rgb"),
        ("bgr8", "rgb"),
        ("rgb8", "bgr"),
        ("mono8", "rgb"),
        ("mono16", "rgb"),
        ("bgra8", "rgb"),
    ],
)
@pytest.mark.parametrize("frame_hw", [(300, 400), (192, 384)])  # (the second's full view: every 3rd pixel)
def test_the_cpus_host_views_equal_the_torch_path(monkeypatch, encoding, model_order, frame_hw):
    """OpenCV / numpy tiles and full views (`host_tiles`) == the torch path's, bit for bit, on every encoding, on
    frames whose rows are padded (a message's step) and on the default input format's factor."""
    from tiled_detector.pipeline import host_tiles

    height, width = frame_hw
    wide = _frame(np.random.default_rng(3), height, width + 10, encoding)
    frame = as_frame_tensor(wide[:, :width], encoding)  # rows of width + 10 pixels, width read: a padded step
    plan = make_plan(frame_hw, (128, 128), 0.25, (128, 128), True)
    fast = Preprocessor("cpu", torch.float32, (128, 128), model_order).prepare(frame, plan, encoding).clone()
    monkeypatch.setattr(host_tiles, "readable", lambda frame: False)
    reference = Preprocessor("cpu", torch.float32, (128, 128), model_order).prepare(frame, plan, encoding)
    assert torch.equal(fast, reference)


def test_a_cpu_frames_tiles_are_no_torch_work(monkeypatch):
    """The share of preprocessing in a 1080p CPU frame (8 tiles of 640 and the full view, issue 57): the torch ops
    write nothing for the tiles (OpenCV splits their channels, numpy converts each in one contiguous pass) and only
    the full view's padding strips (its pixels, every 3rd of the frame's, converted by numpy too). Before: every
    tile converted by a strided copy and scaled again (2 x 8 x 1.2 M elements), the full view's pixels in three
    torch passes and its whole input filled (3.3 M elements)."""
    frame = torch.from_numpy(_frame(np.random.default_rng(4), 1080, 1920, "rgb8"))
    plan = make_plan((1080, 1920), (640, 640), 0.2, (640, 640), True)
    assert plan.batch_size == 9
    pre = Preprocessor("cpu", torch.float32, (640, 640))
    batch = pre.batch(4)
    pre.prepare(frame, plan, "rgb8", batch, (0, 4))  # (caches and scratch made)
    pre.prepare(frame, plan, "rgb8", batch, (8, 9))
    with _Written() as tiles:
        pre.prepare(frame, plan, "rgb8", batch, (0, 4))
    assert tiles.elements == 0
    with _Written() as full:
        pre.prepare(frame, plan, "rgb8", batch, (8, 9))
    view, image = 3 * 640 * 640, 3 * 360 * 640  # the input, the frame's image in it (letterboxed 1920x1080)
    # every 3rd pixel (1920 -> 640) converted by numpy too: torch fills the padding strips around it only (was: the
    # sampled pixels converted, scaled and placed, 3 passes of the image, and the whole input filled)
    assert full.elements <= (view - image) + 0.02 * view
