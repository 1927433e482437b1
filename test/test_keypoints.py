"""Keypoints through tiles (`pipeline/keypoints.py`): per joint from the views that saw it whole, weighted by score x
resolution, against a hand-made object cut by a tile seam; the keeper's own joints; the fixed-size (captured) path
equal to the exact one with no host read; the joints of several frames in one batch; frames run in parts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support import exports
from support.sync import SyncCounter
from test_detector import _scene
from test_pose import corners
from test_program import _replaying_capture
from tiled_detector import TiledDetector
from tiled_detector.pipeline import keypoints
from tiled_detector.pipeline.decode import PaddedDecoded
from tiled_detector.pipeline.frame_settings import KeypointFusion
from tiled_detector.pipeline.tiling import batch_plan, make_plan

SETTINGS = dict(tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="onnxruntime")


@pytest.fixture(scope="module")
def pose_model(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("kp") / "squares-pose.onnx"
    return exports.ultralytics_onnx(path, exports.PoseHead(), task="pose", kpt_shape=[5, 3], dynamic=True)


def _seam_object():
    """A 128 x 64 frame in two 64 px tiles (an inner seam at x = 64) and the full view (letterboxed at 0.5): one
    object 40..90 x 10..50 with joints A (44, 20), B (80, 30) (right of the seam), C (60, 40) (in the left tile,
    4 px from its inner edge). The full view (score 0.9, the keeper) sees every joint 2 frame px off; the left tile
    sees A exactly but guesses B at 62 (past its edge) and C 1 px off; the right tile sees B exactly."""
    plan = batch_plan([make_plan((64, 128), (64, 64), 0.0, (64, 64), True)])
    assert plan.batch_size == 3  # left tile, right tile, full view
    to_frame = plan.tensors("cpu").to_frame
    truth = np.array([[44.0, 20.0], [80.0, 30.0], [60.0, 40.0]], np.float32)

    def candidate(view: int, box, joints, scores):
        scale, offset = to_frame[view, 0, :2].numpy(), to_frame[view, 1, :2].numpy()
        model_box = (np.array(box, np.float32).reshape(2, 2) - offset) / scale
        model_joints = (np.array(joints, np.float32) - offset) / scale
        extra = np.concatenate([model_joints, np.array(scores, np.float32)[:, None]], 1).reshape(-1)
        return model_box.reshape(-1), extra

    rows = [
        (2, (40, 10, 90, 50), truth + 2.0, (0.9, 0.8, 0.9), 0.9),  # full view
        (0, (40, 10, 64, 50), [[44, 20], [62, 30], [61, 40]], (0.9, 0.3, 0.9), 0.7),  # left tile, cut
        (1, (64, 10, 90, 50), [[66, 20], [80, 30], [66, 40]], (0.1, 0.9, 0.1), 0.6),  # right tile, cut
        (0, (0, 0, 10, 10), [[1, 1], [2, 2], [3, 3]], (1, 1, 1), 0.95),  # another object
    ]
    boxes, extra = zip(*(candidate(v, b, j, s) for v, b, j, s, _ in rows), strict=True)
    found = PaddedDecoded(
        torch.tensor(np.stack(boxes)),
        torch.tensor([r[-1] for r in rows]),
        torch.zeros(len(rows), dtype=torch.int64),
        torch.tensor([r[0] for r in rows]),
        torch.ones(len(rows), dtype=torch.bool),
        torch.tensor(np.stack(extra)),
    )
    packed = torch.tensor(
        [
            [40.0, 10, 90, 50, 0.9, 0, 1, 0],
            [0, 0, 10, 10, 0.95, 0, 1, 0],
            [0] * 8,
            [0] * 8,
        ]  # rows, empty, status
    )
    members = torch.tensor([[0], [3], [-1]])
    return plan, found, packed, members, truth, to_frame


def test_each_joint_comes_from_the_views_that_saw_it_whole_weighted_by_score_and_resolution() -> None:
    plan, found, packed, members, truth, to_frame = _seam_object()
    fused = keypoints.build(packed, members, found, plan, (3, 3))
    assert fused.shape == (3, 3, 3) and (fused[2] == 0).all()  # a row that is no result: zeros
    full_weight = 1.0 / float(to_frame[2, 0, 0])  # the full view's resolution: half the tiles'
    # A: the full view (2 px off) and the left tile (exact), by score x resolution
    w_full, w_tile = 0.9 * full_weight, 0.9
    want_a = (w_full * (truth[0] + 2) + w_tile * truth[0]) / (w_full + w_tile)
    np.testing.assert_allclose(fused[0, 0, :2].numpy(), want_a, atol=1e-4)
    np.testing.assert_allclose(fused[0, 0, 2].item(), 0.9, atol=1e-6)
    # B: the left tile guessed it past its edge: the full view and the right tile (whole there)
    w_full, w_tile = 0.8 * full_weight, 0.9
    want_b = (w_full * (truth[1] + 2) + w_tile * truth[1]) / (w_full + w_tile)
    np.testing.assert_allclose(fused[0, 1, :2].numpy(), want_b, atol=1e-4)
    want_score = (w_full * 0.8 + w_tile * 0.9) / (w_full + w_tile)
    np.testing.assert_allclose(fused[0, 1, 2].item(), want_score, atol=1e-6)
    # C: 4 px from the left tile's inner edge (within the margin): the full view alone among the views seeing it
    # whole (the right tile's C lies outside the right tile)
    np.testing.assert_allclose(fused[0, 2, :2].numpy(), truth[2] + 2, atol=1e-4)
    # the other object keeps its own joints: candidates of one object go to the one row they overlap most
    np.testing.assert_allclose(fused[1, :, :2].numpy(), [[1, 1], [2, 2], [3, 3]], atol=1e-4)


def test_the_keepers_joints_and_the_fusion_without_host_reads() -> None:
    plan, found, packed, members, truth, _ = _seam_object()
    keeper = keypoints.build(packed, members, found, plan, (3, 3), KeypointFusion.KEEPER)
    np.testing.assert_allclose(keeper[0, :, :2].numpy(), truth + 2, atol=1e-4)
    counter = SyncCounter()
    with counter:
        keypoints.build(packed, members, found, plan, (3, 3))
        keypoints.build(packed, members, found, plan, (3, 3), KeypointFusion.KEEPER)
    assert counter.found == []


def test_a_joint_no_view_saw_whole_comes_from_every_view_and_leaves_the_frame_clipped() -> None:
    plan, found, packed, members, _, _ = _seam_object()
    extra = found.extra.clone().reshape(4, 3, 3)
    extra[:3, 0, :2] = -20.0  # joint A outside the frame (and every view) in each view
    fused = keypoints.build(packed, members, found._replace(extra=extra.reshape(4, 9)), plan, (3, 3))
    assert fused[0, 0, 0] == 0.0 and fused[0, 0, 1] == 0.0  # clipped to the frame, as ultralytics clips


def _fast(detector: TiledDetector, log: list[str]) -> TiledDetector:
    fast = TiledDetector.from_config(
        detector.config.replace(cuda_graph=True), engine=detector.engine, capture=_replaying_capture(log)
    )
    fast._sync_free = True
    return fast


@pytest.mark.parametrize("fusion", ["joints", "keeper"])
@pytest.mark.parametrize("merge", ["nms", "greedy_nmm"])
def test_captured_keypoints_equal_the_exact_ones(pose_model, fusion, merge) -> None:
    """The sync-free path (a captured program) gives the exact path's keypoints, frames of two sizes in one batch,
    the known answer (each square's corners and centre) through tiles."""
    exact = TiledDetector(pose_model, keypoint_fusion=fusion, merge=merge, **SETTINGS)
    log: list[str] = []
    fast = _fast(exact, log)
    for seed in (3, 4):
        frames = [_scene(seed)[0], _scene(seed + 10, 96, 144, 4)[0]]
        for a, b in zip(exact.detect_many(frames), fast.detect_many(frames), strict=True):
            np.testing.assert_array_equal(a.boxes, b.boxes)
            np.testing.assert_allclose(a.keypoints, b.keypoints, atol=1e-5)
            np.testing.assert_allclose(a.keypoints[..., :2], corners(a.boxes), atol=1e-4)
    assert "replay" in log


def test_keypoints_of_a_frame_run_in_parts(pose_model) -> None:
    """A frame run in parts (a view cap) reports each box with the keypoints of the detection it is."""
    from tiled_detector.stream import Job, Stream

    detector = TiledDetector(pose_model, **SETTINGS)
    stream = Stream(detector)
    frame, boxes, _ = _scene(6)
    job = Job("cam", frame, 1, sequence=1)
    result = None
    for _ in range(10):
        (step,) = stream.run([job], view_cap=3)
        if step.result is not None:
            result = step.result
            break
    assert result is not None and "parts" in " ".join(result.notes)
    found = result.detections
    assert len(found) == len(boxes) and found.keypoints is not None
    np.testing.assert_allclose(found.keypoints[..., :2], corners(found.boxes), atol=1e-4)


def test_each_joint_gets_its_3d_position_from_the_depth_around_it(pose_model) -> None:
    """With a depth image every joint is back-projected from the depth around it (a flat wall at 2 m: x = (u - 0.5
    - cx) z / fx), on the exact and the captured paths; a joint over a hole has none (NaN)."""
    from tiled_detector.pipeline.depth import DepthImage, Intrinsics

    frame, _, _ = _scene(7)
    height, width = frame.shape[:2]
    depth = np.full((height, width), 2.0, np.float32)
    intrinsics = Intrinsics(100.0, 110.0, width / 2, height / 2, width, height)
    exact = TiledDetector(pose_model, **SETTINGS)
    found = exact.detect(frame, depth=DepthImage(depth, intrinsics))
    joints, where = found.keypoints, found.keypoint_positions
    assert where is not None and where.shape == joints.shape
    np.testing.assert_allclose(where[..., 2], 2.0, atol=1e-3)
    np.testing.assert_allclose(where[..., 0], (joints[..., 0] - 0.5 - width / 2) * 2.0 / 100.0, atol=1e-3)
    np.testing.assert_allclose(where[..., 1], (joints[..., 1] - 0.5 - height / 2) * 2.0 / 110.0, atol=1e-3)
    x, y = np.rint(joints[0, 4, :2]).astype(int)  # a hole around the first detection's centre joint
    depth[y - 4 : y + 5, x - 4 : x + 5] = 0.0
    fast = _fast(exact, [])
    for detector in (exact, fast):
        holed = detector.detect(frame, depth=DepthImage(depth, intrinsics))
        assert (
            np.isnan(holed.keypoint_positions[0, 4]).all()
            and np.isfinite(holed.keypoint_positions[0, :4]).all()
        )
    assert exact.detect(frame).keypoint_positions is None


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("fusion", ["joints", "keeper"])
def test_cuda_keypoints_are_one_captured_graph_per_frame_and_equal_the_cpus(tmp_path, precision, fusion):
    """The torch backend on CUDA: the frame program with its keypoint stage is one captured graph (not split),
    replayed frame after frame with no new capture, and its keypoints equal the CPU's exact path (the known answer:
    each square's corners and centre)."""
    path = exports.ultralytics_torchscript(
        tmp_path / "pose.torchscript", exports.PoseHead(), task="pose", kpt_shape=[5, 3]
    )
    options = dict(
        tile_size=(64, 64), overlap=0.25, conf_threshold=0.5, backend="torch", keypoint_fusion=fusion
    )
    cpu = TiledDetector(path, device="cpu", **options)
    gpu = TiledDetector(path, device="cuda", precision=precision, **options)
    frames = [_scene(seed, 1080, 1920, 40)[0] for seed in range(4)]
    for frame in frames[:2]:  # the limits settle (a grown limit is a new capture)
        gpu.detect(frame)
    captures = len(gpu._runner._captured)
    for frame in frames:
        a, b = cpu.detect(frame), gpu.detect(frame)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_allclose(a.keypoints, b.keypoints, atol=0.05 if precision == "fp16" else 1e-3)
        np.testing.assert_allclose(b.keypoints[..., :2], corners(b.boxes), atol=0.05)
    assert gpu._runner.captures and not gpu._runner.split
    assert len(gpu._runner._captured) == captures  # replayed, never captured again
