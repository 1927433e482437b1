"""Shared fixtures: tiny models exported on the fly (ONNX / TorchScript) into temporary directories.

`export_onnx(model, input_hw, batch=None)` and `export_torchscript(model, input_hw, labels=None)` turn any
module into a model file; `square_onnx` / `square_torchscript` are a ready-made `SquareDetector` (64x64 input,
8-pixel cells, 2 classes: red and blue squares; see test/support/networks.py) exported once per session. At the end
of a run, every test over 60 s is listed with the reason its docstring gives (test/support/slow.py).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import settings
from torch import nn

from support import slow
from support.networks import SquareDetector, save_onnx, save_torchscript

# One torch CPU thread in the test process (a library caller's own choice: `runtime.threads`; the processes the tests
# start, the CLI and the node, still fit their threads to the load themselves). On this shared 2-core machine torch's
# two threads wait on each other: test_program's settings test took 175 s on two threads and 24 s on one.
__import__("torch").set_num_threads(1)

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


def _fixture_docstrings(item: pytest.Item) -> list[str | None]:
    """The docstrings of the fixtures a test uses."""
    fixtures = getattr(item, "_fixtureinfo", None)
    definitions = fixtures.name2fixturedefs.values() if fixtures is not None else ()
    return [chain[-1].func.__doc__ for chain in definitions if chain]


_SECONDS: dict[str, float] = {}  # setup + call + teardown, by test
_SETUP: dict[str, float] = {}  # setup + teardown, by test
_REASONS: dict[str, tuple[str | None, str | None]] = {}  # ("Slow:" of the test's docstring, of its fixtures')


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds up each test's setup, call and teardown time (the time rule's input)."""
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration
    if report.when != "call":
        _SETUP[report.nodeid] = _SETUP.get(report.nodeid, 0.0) + report.duration


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Records the reasons a test's docstring and its fixtures' give for being slow."""
    own = getattr(getattr(item, "function", None), "__doc__", None)
    _REASONS[item.nodeid] = (slow.reason([own]), slow.reason(_fixture_docstrings(item)))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Every test over the time rule's limit, with its reason or "NO REASON" (never a failure: timing decides no
    test's outcome)."""
    reasons = {test: slow.explained(*why, _SETUP.get(test, 0.0)) for test, why in _REASONS.items()}
    lines = slow.report(_SECONDS, reasons)
    if lines:
        terminalreporter.write_sep("=", f"tests over {slow.LIMIT_S:.0f} s (test/support/slow.py)")
        for line in lines:
            terminalreporter.write_line(line)
