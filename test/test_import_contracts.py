"""The import contracts of pyproject.toml hold, and a layer-breaking import makes them fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(source_root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=source_root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _contracts() -> dict[str, dict]:
    try:
        import tomllib
    except ImportError:  # Python 3.10: import-linter's own dependency
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return {c["name"].split(":")[0].split(" (")[0]: c for c in config}


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (scripts/setup.sh)")
@pytest.mark.parametrize(
    ("module", "bad_import", "broken"),
    [
        (
            "pipeline/tiling.py",
            "import tiled_detector.ros.node",
            "Layers",
        ),  # a stage reaching up into the shell
        ("pipeline/merge.py", "import rclpy", "The core imports no ROS"),
        ("detector.py", "import tiled_detector.harness.bags", "Layers"),  # the facade importing the harness
        (
            "engines/torch.py",
            "import tiled_detector.pipeline.tiling",
            "Layers",
        ),  # engines and stages: siblings
        ("pipeline/seams.py", "import tiled_detector.engines.base", "Layers"),  # a stage importing an engine
        ("pipeline/merge.py", "import tiled_detector.pipeline.postprocess", "Frame-path layers"),
        ("tools/scoring.py", "import tiled_detector.harness.report", "Layers"),
        ("tracking/bytetrack.py", "import torch", "The tracker, its schedule and its geometry are numpy"),
        ("ros/worker.py", "import rclpy", "The node's worker loop"),
        ("newstage.py", "import torch", "Layers"),  # a new module must be placed in a layer (exhaustive)
        ("pipeline/newstage.py", "import torch", "Frame-path layers"),
    ],
)
def test_a_wrong_import_breaks_a_contract(tmp_path: Path, module: str, bad_import: str, broken: str) -> None:
    assert _lint(ROOT / "src").returncode == 0
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "tiled_detector", copy / "tiled_detector")
    target = copy / "tiled_detector" / module
    target.write_text(
        (target.read_text() if target.exists() else "") + f"\n{bad_import}  # deliberately wrong\n"
    )
    result = _lint(copy)
    assert result.returncode != 0, result.stdout
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout, result.stdout


def test_the_core_contract_covers_every_layer_below_the_tools() -> None:
    contracts = _contracts()
    layers = contracts["Layers"]["layers"]
    below = [name.strip() for layer in layers[layers.index("tools") + 1 :] for name in layer.split("|")]
    sources = contracts["The core imports no ROS client library or bag library"]["source_modules"]
    assert sorted(f"tiled_detector.{name}" for name in below) == sorted(sources)
