"""The sync-free post-processing (decode_padded -> to_frame -> seam rule -> merge_padded) dispatches no op whose
output shape or value the host must read back (which would force a device sync on an accelerator), and gives
the same detections as the exact path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.sync import SyncCounter
from tiled_detector.pipeline.merge import MergeMethod, MergeRule, merge, merge_padded


@pytest.fixture(scope="module")
def square_model(tmp_path_factory):
    from support.networks import SquareDetector, save_torchscript

    return save_torchscript(
        SquareDetector((640, 640), 8), tmp_path_factory.mktemp("m") / "squares.ts", (640, 640), ["r", "b"]
    )


def _frame(rng: np.random.Generator, height: int, width: int, squares: int = 40) -> np.ndarray:
    frame = rng.integers(0, 30, (height, width, 1), dtype=np.uint8).repeat(3, axis=2)
    for _ in range(squares):
        side = 8 * int(rng.integers(1, 4))
        y, x = 4 * int(rng.integers(0, (height - side) // 4)), 4 * int(rng.integers(0, (width - side) // 4))
        frame[y : y + side, x : x + side] = (255, 0, 0) if rng.random() < 0.5 else (0, 0, 255)
    return frame


@pytest.mark.parametrize("method", list(MergeMethod))
def test_detector_post_processing_has_no_sync_and_matches_exact(square_model, method):
    from tiled_detector.detector import TiledDetector

    options = dict(tile_size=(640, 640), overlap=0.2, conf_threshold=0.3, backend="torch", merge=method)
    exact = TiledDetector(square_model, device="cpu", **options)
    fast = TiledDetector(square_model, device="cpu", **options)
    fast._sync_free = True  # the accelerator path, run on the CPU
    counter = SyncCounter()
    program, sync_free_pass = fast._program, fast._sync_free_pass
    results = []

    def traced(*args):  # the whole frame program: preprocess, infer, decode and post-process
        with counter:
            return program(*args)

    def passed(*args):
        out = sync_free_pass(*args)
        results.append(out[0] is not None)
        return out

    fast._program, fast._sync_free_pass = traced, passed
    rng = np.random.default_rng(3)
    for height, width in ((1080, 1920), (1080, 1920), (2160, 3840), (2160, 3840)):
        frame = _frame(rng, height, width)
        a, b = exact.detect(frame), fast.detect(frame)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.class_ids, b.class_ids)
    assert counter.found == []
    assert results[-1]  # the adapted capacity and slots give a proven-exact result without the fallback


@pytest.mark.parametrize("rotated", [False, True], ids=["axis-aligned", "rotated"])
@pytest.mark.parametrize("metric", ["iou", "ios"])
@pytest.mark.parametrize("method", list(MergeMethod))
def test_merge_padded_equals_merge_on_the_valid_rows(method, metric, rotated):
    """Also for rotated boxes (N, 5): the same rows, bit for bit, with no host read."""
    rng = np.random.default_rng(7)
    columns = 5 if rotated else 4
    for trial in range(40 if not rotated else 10):
        n, pad = int(rng.integers(0, 40)), int(rng.integers(0, 12))
        centers = rng.uniform(20, 120, (max(1, n // 4), 2))[rng.integers(0, max(1, n // 4), n)]
        wh = rng.uniform(4, 40, (n, 2))
        if rotated:
            boxes = np.concatenate([centers, wh, rng.uniform(0, 1.5, (n, 1))], 1).astype(np.float32)
        else:
            boxes = np.concatenate([centers - wh / 2, centers + wh / 2], 1).astype(np.float32)
        scores = (np.round(rng.uniform(0, 1, n) * 4) / 4 + 0.05).astype(np.float32)
        classes = rng.integers(0, 2, n)
        where = np.sort(rng.permutation(n + pad)[:n])
        valid = np.zeros(n + pad, bool)
        valid[where] = True
        all_boxes = rng.uniform(-1e3, 1e3, (n + pad, columns)).astype(np.float32)
        all_scores, all_classes = rng.uniform(0, 1, n + pad).astype(np.float32), rng.integers(0, 2, n + pad)
        all_boxes[where], all_scores[where], all_classes[where] = boxes, scores, classes
        threshold, agnostic = float(rng.choice([0.0, 0.3, 0.5, 0.9])), bool(trial % 3 == 0)
        want = merge(
            *map(torch.as_tensor, (boxes.reshape(-1, columns), scores, classes)),
            method,
            metric,
            threshold,
            agnostic,
            use_torchvision=False,
        )
        args = [torch.as_tensor(v) for v in (all_boxes, all_scores, all_classes, valid)]
        with SyncCounter() as counter:
            got = merge_padded(*args, MergeRule(method, metric, threshold, agnostic), slots=4)
        assert counter.found == []
        if not bool(got.exact):
            got = merge_padded(
                *args, MergeRule(method, metric, threshold, agnostic), nms_rounds=n + 1, slots=n + 1
            )
        assert bool(got.exact)
        for g, w in zip(
            (got.boxes[got.valid], got.scores[got.valid], got.class_ids[got.valid]), want, strict=True
        ):
            assert torch.equal(g, w)


def _old_overlap(a: torch.Tensor, b: torch.Tensor, metric: str) -> torch.Tensor:
    """The pairwise overlap as first written (guards on the full (N, N) denominator)."""
    iw = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp_min(0)
    ih = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp_min(0)
    inter = iw * ih
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    denom = area_a + area_b - inter if metric == "iou" else torch.minimum(area_a, area_b)
    positive = denom > 0
    return torch.where(positive, inter / torch.where(positive, denom, torch.ones_like(denom)), 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_pairwise_overlap_and_group_keys_equal_the_plain_formulas(seed):
    from tiled_detector.pipeline import merge as merge_module
    from tiled_detector.pipeline.groups import group_key
    from tiled_detector.pipeline.merge import MatchMetric, overlap

    rng = np.random.default_rng(seed)
    n = 300
    xy = rng.integers(0, 60, (n, 2)).astype(np.float32)
    wh = rng.integers(0, 12, (n, 2)).astype(np.float32)  # zero widths and heights: zero areas
    wh[rng.random(n) < 0.05] *= -1  # inverted boxes: negative areas
    boxes = torch.from_numpy(np.concatenate([xy, xy + wh], 1))
    for metric in ("ios", "iou"):
        got = overlap(boxes[:, None], boxes[None], MatchMetric(metric))
        torch.testing.assert_close(got, _old_overlap(boxes[:, None], boxes[None], metric), rtol=0, atol=0)
    classes = torch.from_numpy(rng.integers(0, 5, n))
    frames = torch.from_numpy(rng.integers(0, 3, n))
    valid = torch.from_numpy(rng.random(n) < 0.8)
    for c in (None, classes, classes - 3):  # negative class ids too
        for f in (None, frames):
            want = torch.ones(n, n, dtype=torch.bool)
            for values in (c, f):
                if values is not None:
                    want &= values[:, None] == values[None]
            key = group_key(c, f)
            if key is None:
                assert c is None and f is None
                continue
            assert bool((key >= 0).all()) and torch.equal(key[:, None] == key[None], want)
            # the match matrix: every pair that overlaps enough, keys and validity
            for agnostic in (True, False):
                match = merge_module._match_matrix(
                    boxes,
                    c if c is not None else frames,
                    f,
                    valid,
                    MatchMetric.IOS,
                    0.5,
                    c is None or agnostic,
                )
                pairs = (overlap(boxes[:, None], boxes[None], MatchMetric.IOS) >= 0.5).triu(1)
                pairs &= valid[:, None] & valid[None]
                if f is not None:
                    pairs &= f[:, None] == f[None]
                if c is not None and not agnostic:
                    pairs &= c[:, None] == c[None]
                assert torch.equal(match, pairs)
