"""How the detector reads a model file (`model_files/resolve.py`): the layout from the shapes, the class names and one probe,
never a guess between families (each ambiguous shape refused with its candidates and the deciding settings); the
GFL families by their exporter; the input conventions' precedence and sources; bad files refused in one line
before anything is loaded or cached."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from support.networks import GflLike
from tiled_detector import TiledDetector
from tiled_detector.cli import main
from tiled_detector.config import DetectorConfig
from tiled_detector.engines.metadata import ModelMetadata
from tiled_detector.model_files.resolve import AmbiguousModelError, ModelView, resolve
from tiled_detector.models import coco_labels, default_model_path
from tiled_detector.pipeline.layouts import OutputLayout, anchor_points
from tiled_detector.tools.peers import yolox_demo_postprocess

HW_416, HW_640 = (416, 416), (640, 640)


def view(outputs, input_hw=HW_416, probe=None, labels=None, producer="", inputs=()) -> ModelView:
    """A model as resolution reads it; `probe` the head's rows on a grey image (None: must not be run)."""

    def run(name: str) -> torch.Tensor:
        assert probe is not None, "the probe ran where YOLOX's raw head is not a candidate"
        return probe

    metadata = ModelMetadata(labels=labels, producer=producer, inputs=inputs, source="test" if labels else "")
    return ModelView(outputs, input_hw, labels, metadata, run)


def yolox_rows(input_hw, columns, decoded: bool) -> torch.Tensor:
    """A YOLOX head's rows: raw offsets (0.5 in each cell), or the same decoded to pixels."""
    raw = torch.zeros(1, anchor_points(input_hw), columns)
    raw[..., :2] = 0.5
    return torch.from_numpy(yolox_demo_postprocess(raw.numpy(), input_hw)) if decoded else raw


CONFIG = DetectorConfig(model="/nonexistent/model.onnx")  # no labels file beside it


def test_yolox_raw_head_is_picked_by_its_probe_and_named_coco() -> None:
    rows = anchor_points(HW_416)
    found = resolve(CONFIG, view({"output": (1, rows, 85)}, probe=yolox_rows(HW_416, 85, decoded=False)))
    assert (found.layout, found.family, found.num_classes) == (OutputLayout.YOLOX, "yolox", 80)
    assert found.labels == coco_labels() and found.coco_by_family and "raw offsets" in found.decided_by
    assert found.input_sources["channel_order"] == ("bgr", "yolox default")


def test_a_decoded_head_without_names_is_refused_and_names_decide() -> None:
    """Boxes in pixels: YOLOX's decoded rows (80 classes) or a transposed YOLOv8's (81): nothing tells them apart."""
    rows, probe = anchor_points(HW_416), yolox_rows(HW_416, 85, decoded=True)
    with pytest.raises(AmbiguousModelError) as refused:
        resolve(CONFIG, view({"output": (1, rows, 85)}, probe=probe))
    assert refused.value.candidates == (
        "yolox decoded in the graph (80 classes)",
        "yolov8_transposed (81 classes)",
    )
    assert refused.value.settings == ("labels", "layout") and "setting layout" in str(refused.value)
    named = resolve(CONFIG.replace(labels=["coco"]), view({"output": (1, rows, 85)}, probe=probe))
    assert (named.layout, named.family) == (OutputLayout.YOLOV5, "yolox")  # decoded YOLOX: YOLOv5's rows
    assert resolve(CONFIG.replace(layout="yolox"), view({"output": (1, rows, 85)}, probe=probe)).layout is (
        OutputLayout.YOLOV5
    )


def test_a_label_less_transposed_yolov8_is_refused_not_taken_for_yolox() -> None:
    """The (1, 8400, 84) head of an ultralytics YOLOv8 exported by hand and transposed: at 640 its rows are YOLOX's
    anchor points too, and its boxes are pixels: YOLOX's decoded rows (79 classes) or YOLOv8's (80)."""
    head = yolox_rows(HW_640, 84, decoded=True)
    with pytest.raises(
        AmbiguousModelError,
        match=r"fits 2 layouts: yolox decoded in the graph \(79 classes\), "
        r"yolov8_transposed \(80 classes\)",
    ):
        resolve(CONFIG, view({"output0": (1, 8400, 84)}, HW_640, probe=head))
    labelled = view({"output0": (1, 8400, 84)}, HW_640, labels=tuple(coco_labels()))  # the probe is not run
    found = resolve(CONFIG, labelled)
    assert (found.layout, found.family) == (OutputLayout.YOLOV8_TRANSPOSED, None)
    assert found.input_format.channel_order == "rgb" and found.input_format.letterbox == "center"


@pytest.mark.parametrize(
    ("shape", "input_hw", "candidates"),
    [
        ((1, 25200, 85), HW_640, ("yolov5 (80 classes)", "yolov8_transposed (81 classes)")),
        ((1, 8400, 6), HW_640, ("yolox (1 classes)", "yolov8_transposed (2 classes)")),
        ((1, 3598, 112), HW_416, ("yolov5 (107 classes)", "yolov8_transposed (108 classes)")),  # NanoDet-Plus
    ],
)
def test_each_ambiguous_shape_is_refused_naming_its_candidates(shape, input_hw, candidates) -> None:
    probe = yolox_rows(input_hw, shape[2], decoded=True) if "yolox" in candidates[0] else None
    with pytest.raises(AmbiguousModelError) as refused:
        resolve(CONFIG, view({"output0": shape}, input_hw, probe=probe))
    assert refused.value.candidates == tuple(
        c.replace("yolox (", "yolox decoded in the graph (") for c in candidates
    )


def test_nanodet_plus_joined_columns_need_the_names_then_centre_on_cell_corners() -> None:
    found = resolve(CONFIG.replace(labels=["coco"]), view({"output": (1, 3598, 112)}, producer="pytorch"))
    assert (found.layout, found.family, found.num_classes) == (OutputLayout.GFL, "nanodet", 80)
    assert "centres at i x stride" in found.head and "joined" in found.head


@pytest.mark.parametrize(
    ("producer", "family", "channel_order", "letterbox"),
    [("PaddlePaddle", "picodet", "rgb", "stretch"), ("pytorch", "nanodet", "bgr", "center")],
)
def test_gfl_families_are_told_by_their_exporter(producer, family, channel_order, letterbox) -> None:
    shapes = {
        "s8": (1, 2704, 80),
        "s16": (1, 676, 80),
        "s32": (1, 169, 80),
        "b8": (1, 2704, 32),
        "b16": (1, 676, 32),
        "b32": (1, 169, 32),
    }
    found = resolve(CONFIG, view(shapes, producer=producer))
    assert (found.layout, found.family, found.labels) == (OutputLayout.GFL, family, coco_labels())
    assert (found.input_format.channel_order, found.input_format.letterbox) == (channel_order, letterbox)
    assert found.input_sources["input_mean"][1] == f"{family} default"
    # given settings win over the file, the file over the family
    stated = view(
        shapes, producer=producer, inputs=(("channel_order", "rgb"), ("input_std", (2.0, 2.0, 2.0)))
    )
    mixed = resolve(CONFIG.replace(input_std=[1, 1, 1]), stated)
    assert mixed.input_sources["channel_order"] == ("rgb", "model file")
    assert mixed.input_sources["input_std"] == ((1.0, 1.0, 1.0), "setting")
    assert mixed.input_sources["letterbox"] == (letterbox, f"{family} default")


def test_a_gfl_head_of_no_known_exporter_must_be_told_its_input_conventions() -> None:
    shapes = {"s": (1, 3549, 80), "b": (1, 3549, 32)}
    with pytest.raises(
        ValueError,
        match=r"unknown exporter .* give channel_order, input_scale, input_mean, "
        r"input_std, letterbox \(PP-PicoDet: rgb",
    ):
        resolve(CONFIG, view(shapes))
    stated = dict(
        channel_order="bgr", input_scale=1.0, input_mean=[1, 2, 3], input_std=[4, 5, 6], letterbox="center"
    )
    found = resolve(CONFIG.replace(**stated), view(shapes))
    assert found.family is None and found.labels is None and found.num_classes == 80
    assert found.input_format.mean == (1.0, 2.0, 3.0)


@pytest.fixture(scope="module")
def gfl_onnx(export_onnx) -> Path:
    """A small GFL detector exported by PyTorch with its batch fixed at 1 (as NanoDet's files are)."""
    torch.manual_seed(0)
    return export_onnx(GflLike(classes=3, bins=4, levels=3, width=8), (64, 96), batch=1)


def test_a_pytorch_gfl_file_runs_as_nanodet_with_numbered_classes(gfl_onnx) -> None:
    detector = TiledDetector(gfl_onnx, conf_threshold=0.0, top_k=5)
    resolved = detector.resolved
    assert (resolved.layout, resolved.family, resolved.num_classes, detector.labels) == (
        OutputLayout.GFL,
        "nanodet",
        3,
        None,
    )
    assert detector.engine.max_batch > 1 and detector.tile_size == (96, 64)  # rewritten; auto tiles
    found = detector.detect(np.full((100, 150, 3), 90, np.uint8))
    assert len(found) > 0 and set(found.class_ids.tolist()) <= {0, 1, 2}


class BadHead(torch.nn.Module):
    """Outputs of the given (rows, columns) shapes, batch first."""

    def __init__(self, shapes: list[tuple[int, int]]) -> None:
        super().__init__()
        self.shapes = shapes

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base = images.mean(dim=(1, 2, 3)).view(-1, 1, 1)
        return tuple(base.expand(-1, rows, cols) + 0.0 for rows, cols in self.shapes)


@pytest.mark.parametrize(
    ("shapes", "flags", "message"),
    [
        # a GFL pair per stride and a YOLO head: families mixed
        (
            [(64, 3), (16, 3), (64, 16), (16, 16), (84, 100)],
            [],
            r"\[1, 84, 100\] mix 3 column counts: a GFL head",
        ),
        (
            [(64, 3), (16, 3), (4, 3), (64, 30), (16, 30), (4, 30)],
            [],
            r"30 columns do not divide into 4 sides",
        ),
        ([(100, 3), (25, 3), (100, 16), (25, 16)], [], r"anchor points \[100, 25\] .* 64 \(stride 8\), 16"),
        (
            [(126, 84)],
            ["--layout", "gfl"],
            r"layout gfl: .*\[1, 126, 84\]: their anchor points \[126\] are not",
        ),
    ],
)
def test_bad_gfl_files_are_one_line_at_start_and_nothing_is_cached(
    shapes, flags, message, export_onnx, tmp_path, capsys, monkeypatch
) -> None:
    import cv2

    # a batch-1 file: loading it would cache a rewrite
    model = export_onnx(BadHead(shapes), (64, 64), batch=1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    image = tmp_path / "frame.png"
    cv2.imwrite(str(image), np.zeros((64, 64, 3), np.uint8))
    assert main(["detect", str(image), "--model", str(model), *flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot start" in err[0] and str(model) in err[0], err
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "cache").exists()


def test_layout_gfl_on_a_single_output_yolo_file_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"layout gfl: .*default.onnx: outputs output0 \[-1, 8, 6400\]: their"
    ):
        TiledDetector(default_model_path(), layout="gfl")


def test_the_coco_names_line_is_logged_once_per_detector(gfl_onnx, caplog, export_onnx) -> None:
    torch.manual_seed(1)
    coco = export_onnx(GflLike(classes=80, bins=4, levels=3, width=8), (64, 96), batch=1)
    with caplog.at_level(logging.INFO):
        detector = TiledDetector(coco)
    assert detector.labels == coco_labels()
    assert sum("taken for COCO's" in r.getMessage() for r in caplog.records) == 1


def test_a_gfl_head_both_readings_fit_is_refused_naming_both_and_the_labels(
    export_onnx, tmp_path, capsys, monkeypatch
) -> None:
    """Two 32-column outputs of one anchor point at a 16 x 16 input (strides 16 and 32 have one cell each): a class
    score / box pair or joined columns of two strides. Refused at start in one line naming both and the labels;
    `inspect` lists both readings, decided by the labels; 32 names make it the pair."""
    import cv2

    model = export_onnx(BadHead([(1, 32), (1, 32)]), (16, 16), batch=1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    image = tmp_path / "frame.png"
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    assert main(["detect", str(image), "--model", str(model)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fit two GFL heads" in err[0] and "the class names (labels) decide" in err[0], (
        err
    )
    assert main(["inspect", str(model), "--json"]) == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(report["candidates"]) == 2 and report["decided_by"] == ["labels"]
    labels = [f"c{i}" for i in range(32)]
    resolved = TiledDetector(model, labels=labels).resolved
    assert resolved.layout is OutputLayout.GFL and "separate class and box outputs" in resolved.head
