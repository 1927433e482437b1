"""README.md and docs/ (and benchmarks/README.md, the model card) against the repository and the CLI: every
relative link reaches a file (and, for an #anchor into a markdown file, one of its headings), every
`tiled-detector SUB --flag` written in them is a flag of SUB's own parser, and the README stays a five-minute
read: at most 300 lines, pictures from docs/images/ (each at most 400 KB, each shown somewhere)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
IMAGES = ROOT / "docs" / "images"
README_LINES = 300
IMAGE_BYTES = 400_000

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
IMAGE = re.compile(r"!\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)")
COMMAND = re.compile(r"(?:^|(?<=[\s`(/]))tiled-detector\s+([^\s:]+)(?=\s|$)(.*)")
FLAG = re.compile(r"(?:^|(?<=[\s\[(|=,]))(--[a-z][a-z0-9-]*)")
SHELL_SPLIT = re.compile(r"&&|;|\s\|\s|\$\(")


def _documents() -> list[Path]:
    """README.md, docs/ and the two other pages they send readers to."""
    others = [ROOT / "benchmarks/README.md", ROOT / "src/tiled_detector/models/MODEL_CARD.md"]
    return [README, *sorted((ROOT / "docs").rglob("*.md")), *others]


def _without_code(text: str) -> str:
    """The text with fenced blocks blanked (line numbers kept) and inline code spans removed."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub("", text)


def _code(text: str) -> list[str]:
    """Every command line of the fenced blocks (continuation lines joined, shell comments cut) and every inline
    code span of the text outside them (one that starts with a subcommand and a flag, `eval --motion`, read as
    `tiled-detector eval --motion`)."""
    from tiled_detector.cli import COMMANDS

    subcommand = re.compile(rf"^(?:{'|'.join(map(re.escape, COMMANDS))})\s+--")
    pieces = []
    for block in FENCE.finditer(text):
        body = block.group(0).split("\n")[1:-1]
        for line in "\n".join(body).replace("\\\n", " ").split("\n"):
            pieces.append(re.sub(r"(^|\s)#.*", "", line))
    prose = FENCE.sub("", text)
    spans = [m.group(2).replace("\\|", "|") for m in INLINE_CODE.finditer(prose)]
    pieces += [f"tiled-detector {span}" if subcommand.match(span) else span for span in spans]
    return pieces


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (links reduced to their text) lower-cased, everything but letters,
    digits, spaces, hyphens and underscores dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors a markdown file's headings make (a repeated one gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(path: Path) -> list[str]:
    """The relative links of a markdown file that reach no file, or no heading of the markdown file they name."""
    prose = _without_code(path.read_text())
    broken = []
    for target in [*LINK.findall(prose), *REFERENCE.findall(prose)]:
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|//", target):
            continue  # http(s):, mailto: and the like: not the repository's
        name, _, anchor = unquote(target).partition("#")
        destination = (path.parent / name).resolve() if name else path
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading makes #{anchor}")
    return broken


@cache
def _flags(command: str) -> frozenset[str]:
    """Every option string of a subcommand's parser (`--version`, `--debug`, ... for the command itself)."""
    from tiled_detector.cli import subcommand, top_parser

    parser = top_parser() if command == "" else subcommand(command)[1]
    return frozenset(s for action in parser._actions for s in action.option_strings)


def unknown_flags(path: Path) -> list[str]:
    """`tiled-detector SUB --flag` written in a markdown file (code blocks and code spans) where SUB is no
    subcommand or --flag is none of its flags."""
    from tiled_detector.cli import COMMANDS

    problems = []
    for piece in _code(path.read_text()):
        for command in SHELL_SPLIT.split(piece):
            match = COMMAND.search(command)
            if match is None:
                continue
            name, rest = match.groups()
            if name.startswith("-"):
                name, rest = "", f"{name} {rest}"
            elif name not in COMMANDS:
                problems.append(f"tiled-detector {name}: no such subcommand")
                continue
            prog = f"tiled-detector {name}".strip()
            problems += [
                f"{prog} {flag}: not a flag of `{prog} --help`"
                for flag in FLAG.findall(rest)
                if flag not in _flags(name)
            ]
    return problems


@pytest.mark.parametrize("path", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_its_heading(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_written_is_one_the_cli_takes(path: Path) -> None:
    assert unknown_flags(path) == []


def test_the_readme_is_short_and_shows_pictures_from_docs_images() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES, (
        f"README.md is over {README_LINES} lines: move a topic to docs/"
    )
    pictures = [ROOT / target for target in IMAGE.findall(_without_code(text))]
    assert len({p for p in pictures if p.parent == IMAGES and p.is_file()}) >= 2


def test_every_picture_is_small_and_shown() -> None:
    shown = {
        (path.parent / target).resolve()
        for path in _documents()
        for target in IMAGE.findall(_without_code(path.read_text()))
    }
    pictures = sorted(p for p in IMAGES.iterdir() if p.is_file())
    assert pictures, "docs/images holds no picture"
    assert [p.name for p in pictures if p.stat().st_size > IMAGE_BYTES] == []
    assert [p.name for p in pictures if p.resolve() not in shown] == [], "pictures no page shows"


def test_the_checks_find_a_broken_link_a_missing_heading_and_an_unknown_flag(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# A page\n\n## Its `second` section (2)\n\n```bash\n# not a heading\n```\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "See [it](other.md#its-second-section-2), [top](#local), [web](https://example.com/x.md),\n"
        "[gone](missing.md), [no heading](other.md#not-a-heading) and `[not a link](nowhere.md)`.\n\n"
        "## Local\n\n"
        "Run `tiled-detector bench --runs 3 --no-such-flag`, `tiled-detector --version` or `eval --motion --fast`.\n\n"
        "```bash\n"
        "./scripts/setup.sh && .venv/bin/tiled-detector detect a.png \\\n"
        "  --json --overlap 0.3 --nope   # a comment naming --ignored\n"
        "tiled-detector teleport --now\n"
        "```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#not-a-heading: no heading makes #not-a-heading",
    ]
    assert unknown_flags(page) == [
        "tiled-detector detect --nope: not a flag of `tiled-detector detect --help`",
        "tiled-detector teleport: no such subcommand",
        "tiled-detector bench --no-such-flag: not a flag of `tiled-detector bench --help`",
        "tiled-detector eval --fast: not a flag of `tiled-detector eval --help`",
    ]
