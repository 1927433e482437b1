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
        cwd=source_root, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (scripts/setup.sh)")
@pytest.mark.parametrize(
    ("module", "bad_import", "broken"),
    [
        ("tiling.py", "import tiled_detector.ros.node", "Layers"),  # a stage reaching up into the ROS shell
        ("merge.py", "import rclpy", "The core imports no ROS"),
        (
            "detector.py",
            "import tiled_detector.harness.bags",
            "The core imports no ROS",
        ),  # the rosbags harness
        ("engines/torch.py", "import tiled_detector.pipeline.tiling", "Engines import no stage"),
        ("seams.py", "import tiled_detector.engines.base", "Layers"),  # a stage importing an engine
    ],
)
def test_a_wrong_import_breaks_a_contract(tmp_path: Path, module: str, bad_import: str, broken: str) -> None:
    assert _lint(ROOT / "src").returncode == 0
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "tiled_detector", copy / "tiled_detector")
    target = copy / "tiled_detector" / module
    target.write_text(target.read_text() + f"\n{bad_import}  # deliberately wrong\n")
    result = _lint(copy)
    assert result.returncode != 0, result.stdout
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout, result.stdout
