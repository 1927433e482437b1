"""The bundled rotated-box model (`obb.onnx` / `obb.ts`): small files in ultralytics' OBB layout that say
`task: obb`, both formats the same network, and through the pipeline it finds rotated objects that the full-frame
view alone misses (`eval --obb`), scored as `replay` scores a rotated recording."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from tiled_detector import TiledDetector
from tiled_detector.config import DetectorConfig
from tiled_detector.models import load_labels, obb_model_path
from tiled_detector.pipeline.layouts import OutputLayout
from tiled_detector.tools.frames import rotated_frames
from tiled_detector.tools.scores.evaluation import FRAME_NS, evaluate
from tiled_detector.tools.scores.stream_scores import score_stream
from tiled_detector.tools.scoring import rotated_iou
from tiled_detector.tools.worlds.rotated_scenes import CLASSES, make_rotated_scene


def test_bundled_files_are_small_and_say_what_they_are() -> None:
    onnx_path, ts_path = obb_model_path(), obb_model_path("torch")
    assert onnx_path.name == "obb.onnx" and ts_path.name == "obb.ts"
    assert onnx_path.stat().st_size + ts_path.stat().st_size <= 4 * 1024 * 1024
    assert load_labels(onnx_path) == list(CLASSES)
    model = onnx.load(str(onnx_path))
    assert {p.key: p.value for p in model.metadata_props} == {"task": "obb"}
    out_dims = [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert isinstance(out_dims[0], str) and out_dims[1:] == [4 + len(CLASSES) + 1, 80 * 80]
    assert "rotated-box model" in (onnx_path.parent / "MODEL_CARD.md").read_text()


@pytest.mark.filterwarnings("ignore:.*torch.jit.load.*:DeprecationWarning")
def test_torchscript_matches_onnx() -> None:
    import onnxruntime as ort

    x = torch.rand(2, 3, 640, 640, generator=torch.Generator().manual_seed(0))
    session = ort.InferenceSession(str(obb_model_path()), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        ts_out = torch.jit.load(str(obb_model_path("torch")))(x).numpy()
    np.testing.assert_allclose(ts_out, onnx_out, atol=2e-3)
    assert np.all((onnx_out[:, 4:-1] >= 0) & (onnx_out[:, 4:-1] <= 1))  # scores
    assert np.all(
        (onnx_out[:, -1] >= -np.pi / 4) & (onnx_out[:, -1] <= 3 * np.pi / 4)
    )  # ultralytics' angle range


@pytest.mark.filterwarnings("ignore:.*torch.jit.load.*:DeprecationWarning")
@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_bundled_model_finds_rotated_objects(backend: str) -> None:
    """Recall and precision at polygon IoU 0.5 (same class) on a held-out frame, no flag but the file."""
    detector = TiledDetector(obb_model_path(backend), backend=backend)
    assert detector.rotated and detector.resolved.layout is OutputLayout.OBB and detector.labels == CLASSES
    scene = make_rotated_scene(424242, 1280, 720)
    found = detector.detect(scene.image)
    hits = (rotated_iou(scene.obb, found.obb) >= 0.5) & (scene.class_ids[:, None] == found.class_ids[None])
    recall, precision = hits.any(axis=1).mean(), hits.any(axis=0).mean()
    assert recall >= 0.6, f"recall {recall:.2f} on {len(scene.obb)} objects"
    assert precision >= 0.5, f"precision {precision:.2f} of {len(found)} detections"


def test_eval_obb_tiles_find_what_the_full_view_misses() -> None:
    """DOTA's AP50 of tiles + full view against the full view alone on a held-out 1080p frame: the objects are
    14-64 px, a third of that in the letterboxed full view."""
    detector = TiledDetector(obb_model_path())
    found = evaluate(detector, 1, 11, 1920, 1080, ["full", "tiles+full"], obb=True)
    assert found["tiles+full"]["AP50"] >= 2 * found["full"]["AP50"], found
    assert found["tiles+full"]["AP50"] >= 0.4 and "AP_small" not in found["full"]


def test_a_rotated_recording_scores_as_eval_obb_motion() -> None:
    """The same frames and stamps through `score_stream` (replay's scores in process) and `eval --obb --motion`:
    the same DOTA AP50 and tracking scores (polygon IoU)."""
    detector = TiledDetector.from_config(
        DetectorConfig(model=obb_model_path(), tracker="bytetrack", full_frame=False)
    )
    frames = list(rotated_frames(4, 7, 640, 360, moving=True))
    ours = score_stream(detector, frames, [k * FRAME_NS for k in range(4)], CLASSES)
    theirs = evaluate(detector, 4, 7, 640, 360, ["tiles"], motion=True, obb=True)["tiles"]
    assert ours["AP50"] == pytest.approx(theirs["AP50"], abs=1e-9) and ours["AP50"] > 0.3
    assert {k: ours[k] for k in ("IDF1", "MOTA", "id_switches")} == {
        k: theirs[k] for k in ("IDF1", "MOTA", "id_switches")
    }
