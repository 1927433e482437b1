"""Positions from an aligned depth image (`pipeline/depth.py`): the robust depth of a box (holes, NaN, the
background beside a small object, a few near outliers, the valid range), back-projection through the camera
matrix, a depth image of another size, and no host read in the kernel (it runs inside the captured program)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from test_sync_free import SyncCounter
from tiled_detector.pipeline.depth import (
    DepthError,
    DepthImage,
    Intrinsics,
    aligned,
    locate,
    robust_depth,
    unpack_positions,
)

SETTINGS = (0.001, 0.1, 65.0)  # depth_scale, depth_min, depth_max
CAMERA = Intrinsics(500.0, 500.0, 99.5, 74.5)  # a 200 x 150 frame


def _rows(*boxes: tuple[float, float, float, float], frame: int = 0) -> torch.Tensor:
    """Packed result rows (x1, y1, x2, y2, score, class, valid, frame) and a status row."""
    rows = torch.zeros((len(boxes) + 1, 8))
    for i, box in enumerate(boxes):
        rows[i, :4] = torch.tensor(box)
        rows[i, 4:8] = torch.tensor([0.9, 0.0, 1.0, float(frame)])
    rows[-1, :3] = torch.tensor([1.0, 1.0, 1.0])  # status: ignored by locate
    rows[-1, 7] = 1.0  # (frame index 1: no such frame)
    return rows


def _locate(depth: np.ndarray, *boxes, camera: Intrinsics = CAMERA, settings=SETTINGS) -> torch.Tensor:
    frame_hw = (150, 200)
    image = aligned(DepthImage(depth, camera), frame_hw)
    return locate(_rows(*boxes), [frame_hw], [image], *settings)


def _noisy(rng: np.random.Generator, depth: np.ndarray, noise: float = 0.01) -> np.ndarray:
    return (depth * (1 + noise * rng.standard_normal(depth.shape))).astype(np.float32)


def test_holes_and_nan_do_not_pull_the_depth() -> None:
    rng = np.random.default_rng(0)
    depth = _noisy(rng, np.full((150, 200), 4.0, np.float32))
    holes = rng.random(depth.shape)
    depth[holes < 0.3] = 0.0  # 30 % holes, 20 % NaN
    depth[(holes >= 0.3) & (holes < 0.5)] = np.nan
    found = _locate(depth, (60, 40, 100, 80))
    assert found[0, 6] == 1.0
    assert found[0, 2].item() == pytest.approx(4.0, rel=0.005)


def test_the_background_beside_a_small_object_does_not_pull_it() -> None:
    rng = np.random.default_rng(1)
    depth = np.full((150, 200), 30.0, np.float32)  # background 30 m
    depth[70:82, 95:107] = 6.0  # a 12 px object at 6 m
    depth = _noisy(rng, depth)
    # a detection box a little larger than the object: its inner half is the object, the rest background
    found = _locate(depth, (92, 67, 110, 85))
    assert found[0, 2].item() == pytest.approx(6.0, rel=0.01)
    # an off-centre box whose inner part the object covers a quarter of: still the nearest dense cluster
    found = _locate(depth, (95, 70, 119, 94))
    assert found[0, 2].item() == pytest.approx(6.0, rel=0.01)


def test_a_few_near_outliers_are_not_the_object() -> None:
    depth = np.full((150, 200), 12.0, np.float32)
    depth[60:62, 60:62] = 1.0  # a speck (flying pixels) far below the share of a cluster
    found = _locate(depth, (50, 50, 90, 90))
    assert found[0, 2].item() == pytest.approx(12.0, rel=1e-4)


def test_a_box_without_enough_valid_depth_has_no_position() -> None:
    depth = np.zeros((150, 200), np.float32)
    depth[0, 0] = 5.0
    found = _locate(depth, (50, 50, 90, 90))
    assert found[0].tolist() == [0.0] * 7
    rows = torch.cat([_rows((50, 50, 90, 90))[:, :8], found], dim=1).numpy()
    (positions, sizes), _ = unpack_positions(rows, 8, 2)
    assert np.isnan(positions).all() and np.isnan(sizes).all() and positions.shape == (1, 3)


def test_depths_outside_the_valid_range_are_holes_and_16uc1_is_scaled() -> None:
    depth = np.full((150, 200), 5000, np.uint16)  # 5 m in millimetres
    depth[:, :100] = 65535  # saturated: beyond depth_max
    found = _locate(depth, (40, 40, 160, 110))
    assert found[0, 2].item() == pytest.approx(5.0)
    assert _locate(depth, (40, 40, 160, 110), settings=(0.002, 0.1, 65.0))[0, 2].item() == pytest.approx(10.0)
    assert _locate(depth, (40, 40, 160, 110), settings=(0.001, 6.0, 65.0))[0, 6] == 0.0  # all below depth_min


def test_centre_and_extent_back_project_through_the_camera_matrix() -> None:
    depth = np.full((150, 200), 10.0, np.float32)
    # a box centred on the principal point (pixel centres at integers: box edges 89.5 + 0.5 .. )
    found = _locate(depth, (90.0, 65.0, 110.0, 85.0))
    x, y, z, sx, sy, sz, ok = found[0].tolist()
    assert ok == 1.0 and z == pytest.approx(10.0)
    assert (x, y) == (pytest.approx(0.0, abs=1e-6), pytest.approx(0.0, abs=1e-6))
    assert (sx, sy) == (pytest.approx(20 * 10 / 500), pytest.approx(20 * 10 / 500))
    assert sz == pytest.approx(0.0, abs=1e-3)  # a flat object
    # another camera matrix moves the point the same box is seen at
    other = _locate(depth, (90.0, 65.0, 110.0, 85.0), camera=Intrinsics(250.0, 400.0, 50.0, 30.0))
    assert other[0, 0].item() == pytest.approx((99.5 - 50.0) * 10 / 250)
    assert other[0, 1].item() == pytest.approx((74.5 - 30.0) * 10 / 400)


def test_depth_extent_follows_the_spread_of_a_receding_surface() -> None:
    ramp = np.linspace(8.0, 9.0, 200, dtype=np.float32)[None].repeat(150, axis=0)  # 8 m to 9 m left to right
    found = _locate(ramp, (0, 0, 200, 150))
    # the inner half of the box spans 8.25 m to 8.75 m
    assert found[0, 5].item() == pytest.approx(0.5, rel=0.05)


@given(
    box=st.tuples(st.floats(0, 180), st.floats(0, 130), st.floats(4, 20), st.floats(4, 20)),
    z=st.floats(0.5, 60.0),
    fx=st.floats(100.0, 2000.0),
    fy=st.floats(100.0, 2000.0),
    cx=st.floats(0.0, 200.0),
    cy=st.floats(0.0, 150.0),
)
def test_a_position_projects_back_onto_its_box_centre(box, z, fx, fy, cx, cy) -> None:
    x1, y1, w, h = box
    depth = np.full((150, 200), z, np.float32)
    found = _locate(depth, (x1, y1, x1 + w, y1 + h), camera=Intrinsics(fx, fy, cx, cy))
    x, y, zz, sx, sy = found[0, :5].tolist()
    assert zz == pytest.approx(z, rel=1e-5)
    # the pinhole projection of the centre is the box centre (pixel-centre coordinates), the size its width
    assert fx * x / zz + cx == pytest.approx(x1 + w / 2 - 0.5, abs=1e-2)
    assert fy * y / zz + cy == pytest.approx(y1 + h / 2 - 0.5, abs=1e-2)
    assert (sx * fx / zz, sy * fy / zz) == (pytest.approx(w, rel=1e-4), pytest.approx(h, rel=1e-4))


def test_a_depth_image_of_another_size_with_the_same_aspect_gives_the_same_position() -> None:
    rng = np.random.default_rng(2)
    full = np.full((150, 200), 25.0, np.float32)
    full[60:90, 80:120] = 7.0
    half = full[::2, ::2].copy()  # 100 x 75: the same view at half the resolution
    box = (78, 58, 122, 92)
    same = _locate(_noisy(rng, full, 0.0), box)
    small = _locate(_noisy(rng, half, 0.0), box)
    assert small[0, :3].tolist() == pytest.approx(same[0, :3].tolist(), rel=1e-5)
    with pytest.raises(DepthError, match=r"another aspect ratio.*not aligned"):
        aligned(DepthImage(np.zeros((150, 150), np.float32), CAMERA), (150, 200))


def test_the_camera_matrix_follows_the_frame_size_and_refuses_bad_values() -> None:
    calibrated = Intrinsics(1000.0, 1000.0, 959.5, 539.5, 1920, 1080)
    half = calibrated.for_frame(540, 960)
    assert (half.fx, half.fy, half.cx, half.cy) == (500.0, 500.0, 479.5, 269.5)
    assert calibrated.for_frame(1080, 1920) is calibrated
    with pytest.raises(DepthError, match="another aspect ratio"):
        calibrated.for_frame(480, 640)
    with pytest.raises(DepthError, match="zero or negative focal length"):
        Intrinsics(0.0, 500.0, 1.0, 1.0)
    with pytest.raises(DepthError, match=r"uint16 \(16UC1\) or float32"):
        aligned(DepthImage(np.zeros((150, 200), np.int32), CAMERA), (150, 200))


def test_frames_without_depth_and_other_frames_get_their_own() -> None:
    near, far = np.full((150, 200), 3.0, np.float32), np.full((150, 200), 9.0, np.float32)
    box = (10, 10, 50, 50)
    rows = torch.cat([_rows(box, frame=0)[:1], _rows(box, frame=1)[:1], _rows(box, frame=2)])
    depths = [DepthImage(torch.from_numpy(near), CAMERA), None, DepthImage(torch.from_numpy(far), CAMERA)]
    found = locate(rows, [(150, 200)] * 3, depths, *SETTINGS)
    assert found[:3, 2].tolist() == [3.0, 0.0, 9.0]
    assert found[:3, 6].tolist() == [1.0, 0.0, 1.0]


def test_no_rows_locate_to_no_positions() -> None:
    depth = DepthImage(torch.ones((150, 200)), CAMERA)
    assert locate(torch.zeros((0, 8)), [(150, 200)], [depth], *SETTINGS).shape == (0, 7)


def test_the_kernel_reads_nothing_back_on_the_host() -> None:
    depth = torch.from_numpy(np.full((150, 200), 4000, np.uint16))
    with SyncCounter() as counter:
        locate(
            _rows((10, 10, 50, 50), (60, 60, 90, 90)), [(150, 200)], [DepthImage(depth, CAMERA)], *SETTINGS
        )
    assert counter.found == []


def test_robust_depth_picks_the_nearest_dense_cluster_not_the_largest() -> None:
    samples = torch.tensor([[5.0] * 30 + [20.0] * 70 + [0.0] * 28])  # 30 % at 5 m, 70 % background, holes
    z, _, ok = robust_depth(samples, 0.1, 65.0)
    assert ok.item() and z.item() == pytest.approx(5.0)


@pytest.mark.gpu
def test_on_cuda_the_stage_equals_the_cpus_and_replays_as_one_captured_graph() -> None:
    from tiled_detector.runtime.devices import cuda_graph

    rng = np.random.default_rng(5)
    depth = _noisy(rng, np.full((150, 200), 9.0, np.float32))
    depth[rng.random(depth.shape) < 0.1] = 0.0
    rows = _rows((20, 20, 60, 50), (100, 80, 112, 92), (0, 0, 200, 150))
    on_cpu = locate(rows, [(150, 200)], [DepthImage(torch.from_numpy(depth), CAMERA)], *SETTINGS)
    image = torch.from_numpy(depth).cuda()
    cuda_rows = rows.cuda()

    def step() -> torch.Tensor:
        return locate(cuda_rows, [(150, 200)], [DepthImage(image, CAMERA)], *SETTINGS)

    torch.testing.assert_close(step().cpu(), on_cpu, atol=1e-4, rtol=1e-5)
    replay, outputs = cuda_graph(step)
    image.mul_(2.0)  # the next frame's depth, written into the same buffer
    replay()
    torch.testing.assert_close(outputs, step())
    assert outputs[0, 2].item() == pytest.approx(18.0, rel=0.01)
