"""docs/DESIGN.md against the code: its module map names every module and only modules that exist, and its layer
diagrams are the import contracts' layers; the house stays small (module sizes, the root and tools/ counts)."""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
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


def _tracked_files() -> list[str]:
    """Every file git would commit: tracked, and untracked but not ignored."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [path for path in listed.stdout.split() if (ROOT / path).exists()]


def test_the_repository_top_level_holds_only_what_the_layout_names() -> None:
    """A stray file at the top (a profile, a temp model, an output folder someone forgot to ignore) fails here."""
    rows = [
        line.split("|")[1] for line in _section("Repository layout").splitlines() if line.startswith("| `")
    ]
    named = set(re.findall(r"`([^`/]+)`", "\n".join(rows)))
    top = {path.split("/")[0] for path in _tracked_files()}
    assert top, "git lists no file"
    assert sorted(top - named) == [], (
        "entries at the repository's top level that docs/DESIGN.md's layout does not name"
    )


SCRIPTS = {"setup.sh", "test.sh", "numpy1.sh", "kilted.sh"}  # the README's two commands and CI's (.ci/run)


def test_scripts_holds_only_the_setup_and_the_test_command() -> None:
    """A probe or measurement program belongs in benchmarks/ (with its row in benchmarks/README.md)."""
    scripts = {path.split("/", 1)[1] for path in _tracked_files() if path.startswith("scripts/")}
    assert scripts, "git lists nothing in scripts/"
    assert sorted(scripts - SCRIPTS) == [], "scripts/ holds more than the setup and the test command"


# what package.xml's rosdep keys install (python3-*), by the requirement names of requirements/python.txt
ROSDEP_PROVIDED = {"numpy", "opencv-python-headless", "pyyaml", "scipy", "filelock"}
PER_PLATFORM = {
    "torch"
}  # pip's CUDA wheel, or NVIDIA's JetPack wheel (docs/NODE.md): not installed by the setup
RESOLVED_WITH = {"pandas": "motmetrics", "xmltodict": "motmetrics"}  # pinned only for the PyPI route's venv


def test_the_ros_route_installs_what_no_rosdep_key_provides() -> None:
    """With a distro sourced, scripts/setup.sh adds every runtime requirement that package.xml's rosdep keys do not
    install: among them onnx, with which the engines read model files (engines/onnx_model.py) and which has no
    rosdep key (ros/rosdistro rosdep/python.yaml at 8468e88). Its pins come from requirements/ros-route.txt first
    (versions that install on Python 3.10: jammy, JetPack 6), which also holds numpy to 1.x."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pairs = re.search(r"for pair in (.+?); do", setup, re.S).group(1).replace("\\", " ").split()
    installs = {pair.split(":")[1].lower() for pair in pairs}
    runtime = {
        line.split("==")[0].lower()
        for line in (ROOT / "requirements" / "python.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    keys = {e.text for e in ET.parse(ROOT / "package.xml").getroot() if e.tag == "exec_depend"}
    assert {"python3-numpy", "python3-opencv", "python3-yaml", "python3-scipy", "python3-filelock"} <= keys
    left = runtime - installs - ROSDEP_PROVIDED - PER_PLATFORM - set(RESOLVED_WITH)
    assert left == set(), f"the ROS route of scripts/setup.sh installs none of {sorted(left)}"
    assert set(RESOLVED_WITH.values()) <= installs
    route = dict(
        line.split("==")
        for line in (ROOT / "requirements" / "ros-route.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert route["numpy"].startswith("1.") and set(route) - {"numpy"} <= installs
    assert "ros-route.txt" in setup.split("for pair in")[1]  # its pins first, its numpy as a constraint


def _programs_named(source: str, programs: set[str]) -> list[str]:
    """The benchmark or script modules a test's source imports, or names as a path to load or run."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in programs]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module] if node.module.split(".")[0] in programs else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [node.value] if node.value.strip("/") in {"scripts", "benchmarks"} else []
            found += [node.value] if re.match(r"(scripts|benchmarks)/\w+\.py", node.value) else []
    return found


def test_no_test_imports_or_runs_scripts_or_benchmarks() -> None:
    """Tests use the package and test/support/ only: a benchmark may change or go without breaking a test."""
    programs = {p.stem for folder in ("scripts", "benchmarks") for p in (ROOT / folder).glob("*.py")}
    assert "networks" in programs  # the benchmarks' module of networks, which tests take from test/support
    found = {
        str(path.relative_to(ROOT)): named
        for path in sorted((ROOT / "test").rglob("*.py"))
        if path != Path(__file__).resolve() and (named := _programs_named(path.read_text(), programs))
    }
    assert found == {}, "tests that import or run programs of scripts/ or benchmarks/"
    assert _programs_named('from networks import YoloV8nLike\nx = ROOT / "benchmarks"', programs) == [
        "networks",
        "benchmarks",
    ]


def test_the_numpy1_pass_names_only_test_files_that_exist() -> None:
    """A test module renamed or split must not leave the numpy 1.x pass asking for the old file."""
    named = re.findall(r"test/test_\w+\.py", (ROOT / "scripts" / "numpy1.sh").read_text())
    assert named, "scripts/numpy1.sh names no test file"
    assert [name for name in named if not (ROOT / name).is_file()] == []


MAX_LINES = 600  # a module a reader takes in at once (docs/DESIGN.md's conventions)


def test_no_module_is_longer_than_600_lines() -> None:
    """Every module of the package, the benchmarks, the scripts and the launch file: <= MAX_LINES lines."""
    roots = [PACKAGE, ROOT / "benchmarks", ROOT / "scripts", ROOT / "launch"]
    long = {
        str(path.relative_to(ROOT)): lines
        for root in roots
        for path in root.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: split them by what they do"


def test_the_package_root_and_tools_hold_few_modules() -> None:
    """The package root keeps the entry points only (<= 10 .py files, __init__.py counted); tools/ keeps <= 8
    modules itself, its concerns in sub-packages each with a docstring."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 10, root
    tools = sorted(p.name for p in (PACKAGE / "tools").glob("*.py"))
    assert len(tools) <= 8, tools
    for package in PACKAGE.rglob("__init__.py"):
        assert ast.get_docstring(ast.parse(package.read_text())), (
            f"{package.relative_to(ROOT)} has no docstring"
        )


def test_no_formatter_escapes() -> None:
    """ruff formats everything: no escape comment for the formatter (skip or off) in the package, the tests, the
    benchmarks, the scripts or the launch file."""
    marks = ("fmt: " + "skip", "fmt: " + "off")  # (spelt apart: this file is checked too)
    roots = [PACKAGE, ROOT / "test", ROOT / "benchmarks", ROOT / "scripts", ROOT / "launch"]
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for root in roots
        for path in root.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(mark in line for mark in marks)
    ]
    assert found == []


def test_a_test_over_60_s_is_listed_with_its_reason_or_without_one() -> None:
    """The time rule (test/support/slow.py, conftest's terminal summary): a test over 60 s is listed with the
    "Slow: ..." reason of its docstring (or of a fixture's where its setup alone took over 60 s), or as having none;
    faster tests are not listed."""
    import conftest
    from support import slow

    assert slow.reason([None, "Shared.\n\n    Slow: one colcon build of   the tools. Then more."]) == (
        "Slow: one colcon build of the tools"
    )
    assert slow.reason(["Quick.", None]) is None
    assert slow.explained(None, "Slow: a colcon build", setup_s=61.0) == "Slow: a colcon build"
    assert (
        slow.explained(None, "Slow: a colcon build", setup_s=5.0) is None
    )  # the test's own time is unexplained
    assert slow.explained("Slow: a 4K burst", None, setup_s=0.0) == "Slow: a 4K burst"
    seconds = {"a::fast": 59.0, "a::told": 61.0, "a::untold": 90.0}
    reasons = {"a::told": "Slow: a real 4K burst", "a::untold": None}
    assert slow.report(seconds, reasons) == [
        "   90.0s a::untold: NO REASON (docstring has no Slow:)",
        "   61.0s a::told: Slow: a real 4K burst",
    ]

    written: list[str] = []

    class Terminal:
        def write_sep(self, sep: str, title: str) -> None:
            written.append(title)

        def write_line(self, line: str) -> None:
            written.append(line)

    state = (conftest._SECONDS, conftest._SETUP, conftest._REASONS)
    saved = [dict(table) for table in state]
    fake = (
        seconds,
        {"a::untold": 80.0},
        {"a::told": ("Slow: a real 4K burst", None), "a::untold": (None, None)},
    )
    try:
        for table, values in zip(state, fake, strict=True):
            table.clear()
            table.update(values)
        conftest.pytest_terminal_summary(Terminal(), 0, None)
    finally:
        for table, values in zip(state, saved, strict=True):
            table.clear()
            table.update(values)
    assert written == ["tests over 60 s (test/support/slow.py)", *slow.report(seconds, reasons)]
