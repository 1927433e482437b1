"""What keeps a TorchScript forward out of a CUDA graph (`engines.capture`): a dynamic export's host work (anchors made
on the CPU in every forward, a constant read on the host) named, moved to the device by `specialise`, and what is
left stated by `inspect`; on CUDA the dynamic export captured whole like the default one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import SQUARE_CELL, SQUARE_INPUT_HW, SQUARE_LABELS
from support.networks import SquareDetector
from tiled_detector.cli import main
from tiled_detector.engines.capture import host_work, specialise

DYNAMIC = ("aten::arange makes a tensor on cpu", "aten::ScalarImplicit reads a device tensor on the host")


class DataShaped(SquareDetector):
    """SquareDetector whose forward also makes a shape from the data (the host waits for the device)."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        found = super().forward(images)
        return found * (found.nonzero().shape[0] >= 0)


@pytest.fixture(scope="module")
def dynamic(export_torchscript):
    return export_torchscript(
        SquareDetector(SQUARE_INPUT_HW, SQUARE_CELL, dynamic_anchors=True), SQUARE_INPUT_HW, SQUARE_LABELS
    )


def test_a_dynamic_exports_host_work_is_named_and_moved_to_the_device(dynamic, square_torchscript) -> None:
    module = torch.jit.load(str(dynamic))
    found = host_work(module, "cuda")
    assert len(found) == 2 and all(any(f.startswith(d) for f in found) for d in DYNAMIC)
    assert "(x2)" in next(f for f in found if "arange" in f)  # the rows' and the columns' ranges
    assert specialise(module, "cuda") == ()
    devices = [line for line in str(module.graph).splitlines() if ": Device = prim::Constant" in line]
    assert devices and all('value="cuda"' in line for line in devices)
    # the default export has none; a CPU engine is left as it is
    assert host_work(torch.jit.load(str(square_torchscript)), "cuda") == ()
    untouched = torch.jit.load(str(dynamic))
    assert specialise(untouched, "cpu") == () and str(untouched.graph) == str(
        torch.jit.load(str(dynamic)).graph
    )


def test_work_that_cannot_be_moved_is_named(export_torchscript) -> None:
    path = export_torchscript(DataShaped(SQUARE_INPUT_HW, SQUARE_CELL), SQUARE_INPUT_HW, SQUARE_LABELS)
    left = specialise(torch.jit.load(str(path)), "cuda")
    assert left == ("aten::nonzero has a shape that depends on the data",)


def test_inspect_states_how_a_frame_would_be_captured_on_cuda(dynamic, export_torchscript, capsys) -> None:
    assert main(["inspect", str(dynamic), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["cuda_graph"] == "whole"
    path = export_torchscript(DataShaped(SQUARE_INPUT_HW, SQUARE_CELL), SQUARE_INPUT_HW, SQUARE_LABELS)
    assert main(["inspect", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cuda_graph"))
    assert line == "cuda_graph split: aten::nonzero has a shape that depends on the data"


@pytest.mark.gpu
def test_cuda_a_dynamic_export_is_captured_whole_and_finds_what_the_cpu_finds(dynamic) -> None:
    from tiled_detector import TiledDetector

    rng = np.random.default_rng(0)
    frame = np.zeros((152, 208, 3), np.uint8)
    for y, x in rng.integers(0, 18, (6, 2)) * 8:
        frame[y : y + 8, x : x + 8] = (255, 0, 0)
    settings = dict(tile_size=SQUARE_INPUT_HW, overlap=0.25, conf_threshold=0.5)
    cuda = TiledDetector(dynamic, backend="torch", device="cuda", **settings)
    assert cuda.engine.capturable and cuda.engine.capture_problem == ""
    found = [cuda.detect(frame) for _ in range(3)]  # captured, then replayed
    assert cuda._runner.captures and not cuda._runner.split and cuda._runner.reason == ""
    cpu = TiledDetector(dynamic, backend="torch", device="cpu", **settings).detect(frame)
    for got in found:
        np.testing.assert_allclose(got.boxes, cpu.boxes, atol=1e-4)
