"""docs/DESIGN.md against the code: its module map names every module and only modules that exist, and its layer
diagrams are the import contracts' layers."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "tiled_detector"
DESIGN = (ROOT / "docs" / "DESIGN.md").read_text()


def _section(title: str) -> str:
    start = DESIGN.index(f"## {title}")
    end = DESIGN.find("\n## ", start + 1)
    return DESIGN[start : end if end >= 0 else None]


def test_the_module_map_names_every_module_and_only_existing_ones() -> None:
    mapped = {p for p in re.findall(r"`([\w/]+\.py)`", _section("Module map")) if not p.startswith("test/")}
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    assert sorted(mapped - modules) == [], "the map names modules that do not exist"
    assert sorted(modules - mapped) == [], "modules missing from docs/DESIGN.md's map"


def test_the_layer_diagrams_are_the_import_contracts() -> None:
    from test_import_contracts import _contracts

    blocks = re.findall(r"```\n(.*?)```", _section("Layers"), re.DOTALL)
    drawn = [[line.split("  ")[0].strip() for line in block.strip().splitlines()] for block in blocks]
    contracts = _contracts()
    assert drawn == [contracts["Layers"]["layers"], contracts["Frame-path layers"]["layers"]]


def test_the_repository_top_level_holds_only_what_the_layout_names() -> None:
    """A stray file at the top (a profile, a temp model, an output folder someone forgot to ignore) fails here."""
    import subprocess

    named = set(re.findall(r"`([^`/]+)`", "\n".join(
        line.split("|")[1] for line in _section("Repository layout").splitlines() if line.startswith("| `")
    )))  # fmt: skip
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    top = {path.split("/")[0] for path in listed}
    assert top, "git lists no file"
    assert sorted(top - named) == [], (
        "entries at the repository's top level that docs/DESIGN.md's layout does not name"
    )
