"""The detector's settings as command-line flags, one per `DetectorConfig` setting with the same name in every
subcommand, plus `--params-file` (a ROS 2 params file such as config/detector.yaml). Flags override the file;
what neither gives keeps the built-in default. Help texts, ranges and choices come from the settings.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from tiled_detector.config import default, settings
from tiled_detector.parameters import as_parameters, read_params_file


def default_params_file() -> Path:
    """config/detector.yaml of a source checkout, else the installed share/tiled_detector copy."""
    here = Path(__file__).resolve()
    candidates = (
        here.parents[3] / "config" / "detector.yaml",
        Path(sys.prefix) / "share" / "tiled_detector" / "config" / "detector.yaml",
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("config/detector.yaml not found: pass --params-file")


def flag(name: str) -> str:
    """The command-line flag of setting `name`."""
    return "--" + (settings()[name].flag or name).replace("_", "-")


def add_settings(
    parser: argparse.ArgumentParser,
    only: Collection[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    params_file_help: str = "ROS 2 params file with the detector's settings, e.g. config/detector.yaml",
) -> None:
    """Add `--params-file` and a flag for each detector setting (those in `only`, default all); `defaults`
    replaces a built-in default where this subcommand has another one (shown in the help). Each flag's form
    (type, number of values, choices) comes from its setting's kind."""
    group = parser.add_argument_group("detector settings (flags override --params-file)")
    group.add_argument("--params-file", type=Path, default=None, help=params_file_help)
    chosen = [n for n, s in settings().items() if s.parameter and (only is None or n in only)]
    for name in chosen:
        setting = settings()[name]
        value = (defaults or {}).get(name, default(name))
        options = setting.kind.flag()  # argparse lists a flag's choices itself: ranges are added to the help
        details = [setting.kind.describe()] if setting.kind.describe() and "choices" not in options else []
        if value is not None and value != ():
            details.append(f"default {_shown(value)}")
        text = f"{setting.help} ({', '.join(details)})" if details else setting.help
        group.add_argument(flag(name), dest=name, default=None, help=text, **options)
    parser.set_defaults(setting_defaults=dict(defaults or {}), setting_flags=chosen)


def _shown(value: Any) -> str:
    """A default as a user types it: 640 640, true, nms."""
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    if isinstance(value, bool):
        return str(value).lower()
    return str(getattr(value, "value", value))


def flag_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The parameter values given as flags, by parameter name."""
    return as_parameters({n: getattr(args, n) for n in args.setting_flags if getattr(args, n) is not None})


def parameter_values(args: argparse.Namespace) -> dict[str, Any]:
    """The subcommand's own defaults, then the params file's values (when given), then the flags."""
    values = read_params_file(args.params_file) if args.params_file is not None else {}
    return {**as_parameters(args.setting_defaults), **values, **flag_parameters(args)}


def frame_size(text: str) -> tuple[int, int]:
    """A WIDTHxHEIGHT argument as (width, height)."""
    match = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not match or min(int(match[1]), int(match[2])) < 1:
        raise argparse.ArgumentTypeError(f"a frame size is WIDTHxHEIGHT, e.g. 1920x1080, got {text!r}")
    return int(match[1]), int(match[2])
