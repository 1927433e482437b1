"""`tiled-detector inspect MODEL`: what the node would make of a file and why (input and batch, outputs, layout and
how it was decided, input conventions and their sources, labels, tile size, engine calls), `--json` for scripts, and
an ambiguous file named so with its candidates and the deciding settings (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from support.networks import GflLike
from tiled_detector.cli import main
from tiled_detector.models import default_model_path

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
PICODET = MODELS / "picodet_s_416_coco.onnx"


class Transposed(torch.nn.Module):
    """A label-less (B, A, 4 + C) head: a YOLOv8 exported by hand and transposed (boxes in pixels)."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        rows = images.mean(dim=1).flatten(1)[..., None].expand(-1, -1, 6).clone()  # (B, 64 x 64, 6)
        return rows + torch.arange(6, dtype=rows.dtype) * 100.0  # x, y far from YOLOX's cell offsets


def inspected(argv: list[str], capsys) -> tuple[int, dict]:
    code = main(["inspect", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_bundled_model_is_read_from_its_shapes_and_labels_file(capsys) -> None:
    code, found = inspected([str(default_model_path())], capsys)
    assert code == 0 and not found["ambiguous"]
    assert (
        found["layout"] == "yolov8" and found["layout_decided_by"] == "the output shapes and the class names"
    )
    assert found["labels"]["from"] == "a labels file beside the model" and found["labels"]["count"] == 4
    assert found["input"]["batch"].startswith("dynamic")
    assert found["tile_size"] == {"value": [640, 640], "from": "auto: the model's input size"}
    assert found["input_conventions"]["channel_order"] == {"value": "rgb", "from": "ultralytics default"}
    assert found["views"] == {"1920x1080": 9, "3840x2160": 33}
    assert found["engine_calls"] == {"1920x1080": 3, "3840x2160": 9}  # calls of 4 views on this CPU


def test_settings_change_what_it_reports(capsys) -> None:
    flags = ["--tile-size", "320", "320", "--channel-order", "bgr", "--labels", "a", "b", "c", "d"]
    code, found = inspected([str(default_model_path()), *flags], capsys)
    assert code == 0
    assert found["tile_size"] == {"value": [320, 320], "from": "the setting tile_size"}
    assert found["input_conventions"]["channel_order"] == {"value": "bgr", "from": "setting"}
    assert found["labels"] == {"count": 4, "first": ["a", "b", "c", "d"], "from": "the labels setting"}


def test_an_ambiguous_file_names_its_candidates_and_the_settings_that_decide(export_onnx, capsys) -> None:
    model = export_onnx(Transposed(), (64, 64), batch=1)  # 4096 rows, 6 columns: YOLOv5 (1) or YOLOv8 (2)
    code, found = inspected([str(model)], capsys)
    assert code == 1 and found["ambiguous"]
    assert found["candidates"] == ["yolov5 (1 classes)", "yolov8_transposed (2 classes)"]
    assert found["decided_by"] == ["labels", "layout"]
    assert main(["inspect", str(model)]) == 1
    printed = capsys.readouterr().out
    assert "AMBIGUOUS  fits yolov5 (1 classes), yolov8_transposed (2 classes)" in printed
    assert "decide     with the setting labels or layout" in printed
    code, found = inspected([str(model), "--labels", "a", "b"], capsys)
    assert code == 0 and found["layout"] == "yolov8_transposed"


def test_a_batch_one_gfl_file_is_rewritten_and_its_family_named(export_onnx, capsys) -> None:
    torch.manual_seed(0)
    model = export_onnx(GflLike(classes=80, bins=8, levels=3, width=8), (96, 64), batch=1)
    code, found = inspected([str(model)], capsys)
    assert code == 0 and found["layout"] == "gfl" and found["family"] == "nanodet"  # a PyTorch export
    assert found["input"]["batch"].startswith(
        "fixed at 1 in the file: rewritten to a dynamic batch, proven equal"
    )
    assert "strides 8, 16, 32" in found["head"] and "centres at (i + 0.5) x stride" in found["head"]
    assert found["input_conventions"]["letterbox"] == {"value": "center", "from": "nanodet default"}
    assert found["labels"]["from"] == "COCO's names (an 80-class nanodet file names none)"
    assert found["tile_size"]["value"] == [64, 96]


@pytest.mark.skipif(not PICODET.is_file(), reason=f"the real PicoDet model is not at {PICODET}")
def test_the_real_picodet_file(capsys) -> None:
    assert main(["inspect", str(PICODET)]) == 0
    printed = capsys.readouterr().out
    assert "layout     gfl (GFL head: strides 8, 16, 32, 64, 80 classes, 8 bins per side" in printed
    assert "family     picodet" in printed and "letterbox      stretch" in printed
    assert "tile_size  416x416 (auto: the model's input size)" in printed
    assert "frame      3840x2160: 85 views, 22 engine calls" in printed
