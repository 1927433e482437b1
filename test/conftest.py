"""Shared fixtures: tiny models exported on the fly (ONNX / TorchScript) into temporary directories.

`export_onnx(model, input_hw, batch=None)` and `export_torchscript(model, input_hw, labels=None)` turn any
module into a model file; `square_onnx` / `square_torchscript` are a ready-made `SquareDetector` (64x64 input,
8-pixel cells, 2 classes: red and blue squares; see test/support/networks.py) exported once per session.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import settings
from torch import nn

from support.networks import SquareDetector, save_onnx, save_torchscript

# The frame program's Triton kernels are checked through Triton's interpreter where no CUDA device is seen
# (test_kernels.py); triton reads this when it is first imported.
if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# CI (CI=true) runs the property tests on a fixed, reproducible set of examples; local runs explore new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session", autouse=True)
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The engine cache (rewritten batch-1 models, Q/DQ models) of the whole session in a temporary directory, not
    the user's (tests that check the cache set their own)."""
    os.environ.setdefault("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` (CUDA-only) are skipped where torch sees no CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


SQUARE_INPUT_HW = (64, 64)
SQUARE_CELL = 8
SQUARE_LABELS = ("red", "blue")

ExportOnnx = Callable[..., Path]
ExportTorchScript = Callable[..., Path]


@pytest.fixture(scope="session")
def export_onnx(tmp_path_factory: pytest.TempPathFactory) -> ExportOnnx:
    """A function (model, input_hw, batch=None) -> path of the model exported to ONNX (dynamic batch if None)."""
    directory = tmp_path_factory.mktemp("onnx")
    counter = itertools.count()

    def export(model: nn.Module, input_hw: tuple[int, int], batch: int | None = None) -> Path:
        return save_onnx(model, directory / f"model{next(counter)}.onnx", input_hw, batch)

    return export


@pytest.fixture(scope="session")
def export_torchscript(tmp_path_factory: pytest.TempPathFactory) -> ExportTorchScript:
    """A function (model, input_hw, labels=None) -> path of the model traced to TorchScript with metadata."""
    directory = tmp_path_factory.mktemp("torchscript")
    counter = itertools.count()

    def export(model: nn.Module, input_hw: tuple[int, int], labels: Sequence[str] | None = None) -> Path:
        return save_torchscript(model, directory / f"model{next(counter)}.ts", input_hw, labels)

    return export


@pytest.fixture(scope="session")
def square_onnx(export_onnx: ExportOnnx) -> Path:
    """SquareDetector as ONNX with a dynamic batch."""
    return export_onnx(SquareDetector(SQUARE_INPUT_HW, SQUARE_CELL), SQUARE_INPUT_HW)


@pytest.fixture(scope="session")
def square_torchscript(export_torchscript: ExportTorchScript) -> Path:
    """SquareDetector as TorchScript (dynamic batch, labels red / blue)."""
    return export_torchscript(SquareDetector(SQUARE_INPUT_HW, SQUARE_CELL), SQUARE_INPUT_HW, SQUARE_LABELS)
