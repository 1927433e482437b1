"""How a setting's values are typed, checked and spelt: as Python values (`DetectorConfig`), as ROS 2 parameters
(the node, params files, launch arguments) and as command-line flags.

One `Kind` per shape of value. `config.Setting` names the kind of each `DetectorConfig` field (and `ros/params.py`
of each node parameter); the parameter table, its checks, its encoding and the CLI flags are all derived from it,
so adding a setting of an existing kind is one field in `config.py` (and its line in config/detector.yaml).
The kinds that name the model's classes (`Classes`, `ClassValues`) are in `settings/class_kinds.py`.
"""

from __future__ import annotations

import argparse
import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from tiled_detector.settings.options import Option, out_of_range


class ParamType(Option):
    """The ROS 2 parameter types settings are held in."""

    BOOL = "bool"
    INTEGER = "integer"
    DOUBLE = "double"
    STRING = "string"
    STRING_ARRAY = "string_array"
    DOUBLE_ARRAY = "double_array"

    @property
    def python(self) -> type:
        """The Python type of one value (arrays: list)."""
        return {"bool": bool, "integer": int, "double": float, "string": str}.get(self.value, list)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def array_items(value: Any) -> list[Any]:
    """An array parameter's items: a list, tuple or array, or one comma-separated string (blank strings are
    left out: an empty launch argument or `['']` sets nothing)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return [
        item.strip() if isinstance(item, str) else item
        for item in items
        if not (isinstance(item, str) and not item.strip())
    ]


def is_array(value: Any) -> bool:
    """A value an array parameter may hold: a list (tuple, array) or one comma-separated string."""
    return isinstance(value, str) or is_list(value)


def is_list(value: Any) -> bool:
    return isinstance(value, list | tuple | array.array)


@dataclass(frozen=True)
class Kind:
    """A scalar held in one ROS parameter named like its field. Subclasses say how their values are checked
    (`check`), spelt as parameters (`names`, `encode`, `decode`, `parameter_problem`) and as a flag (`flag`), and
    how class names in them become class ids once the model's labels are known (`resolve`)."""

    param_type: ClassVar[ParamType] = ParamType.STRING

    def check(self, name: str, value: Any) -> Any:
        """The value normalised, or ValueError stating the rule and the value received."""
        return value

    def names(self, name: str) -> tuple[str, ...]:
        """The ROS parameter names of setting `name`."""
        return (name,)

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        """Parameter values for a (checked) value."""
        return {name: value}

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        """The value held by parameter values (every name of `names`); `check` validates it afterwards."""
        return values[name]

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        """Why `value` cannot be held by ROS parameter `parameter` (type, range, choices), or None: by default
        what `check` says of it."""
        try:
            self.check(parameter, value)
        except ValueError as error:
            return str(error)
        return None

    def flag(self) -> dict[str, Any]:
        """argparse options of the setting's flag (besides its name, dest, default and help)."""
        return {"type": str}

    def resolve(self, name: str, value: Any, labels: Sequence[str] | None) -> Any:
        """The value of setting `name` as the frame program reads it: class names replaced by ids (`labels` index
        them; ValueError naming the setting and the class when it is not one of them)."""
        return value

    def describe(self) -> str:
        """The range or choices as config/detector.yaml and --help state them ('' for none)."""
        return ""


@dataclass(frozen=True)
class Number(Kind):
    """A number in [low, high]: an integer when `integer` (a parameter of either type is accepted for a decimal
    one: `conf_threshold: 1` is 1.0). `unset`: the parameter value that means not set (None), for a setting
    whose default comes from the model. `open_low`: the range is (low, high], low itself refused."""

    low: float | None = None
    high: float | None = None
    integer: bool = False
    unset: float | None = None
    open_low: bool = False

    @property
    def param_type(self) -> ParamType:  # type: ignore[override]
        return ParamType.INTEGER if self.integer else ParamType.DOUBLE

    @property
    def parameter_low(self) -> float | None:
        """The parameter's lower bound (`unset` included)."""
        return self.low if self.unset is None or self.low is None else min(self.low, self.unset)

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: self.unset if value is None else value}

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        value = values[name]
        return None if self.unset is not None and value == self.unset else value

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        if self.unset is not None and value == self.unset and not isinstance(value, bool):
            return None
        return super().parameter_problem(parameter, value)

    def check(self, name: str, value: Any) -> Any:
        if value is None and self.unset is not None:
            return None
        if self.integer and (isinstance(value, bool) or not isinstance(value, int)):
            what = "a positive integer" if self.low is not None and self.low >= 1 else "an integer"
            raise ValueError(f"{name} must be {what}, got {value!r}")
        if self.integer and self.low is not None and self.low >= 1 and value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not is_number(value):
            raise ValueError(f"{name} must be a number, got {value!r}")
        reason = out_of_range(name, value, self.low, self.high)
        if self.open_low and (reason or value == self.low):
            reason = f"{name} must be in ({self.low:g}, {self.high:g}], got {value!r}"
        if reason:
            raise ValueError(reason)
        return int(value) if self.integer else float(value)

    def flag(self) -> dict[str, Any]:
        return {"type": int if self.integer else float, "metavar": "INT" if self.integer else "FLOAT"}

    def describe(self) -> str:
        unset = "" if self.unset is None else f", {self.unset:g} = from the model"
        opening = "(" if self.open_low else "["
        return "" if self.low is None else f"{opening}{self.low:g}, {self.high:g}]{unset}"


@dataclass(frozen=True)
class Flag(Kind):
    """True or false."""

    param_type: ClassVar[ParamType] = ParamType.BOOL

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool (true or false), got {value!r}")
        return value

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        return (
            None if isinstance(value, bool) else f"{parameter} must be a bool (true or false), got {value!r}"
        )

    def flag(self) -> dict[str, Any]:
        return {"action": argparse.BooleanOptionalAction}


@dataclass(frozen=True)
class Switch(Kind):
    """True, false, or not set (None: decided by the model, `auto`). Its ROS parameter holds a bool or the string
    `auto` (dynamically typed: a params file's `masks: true` is a bool); its flag is --name / --no-name."""

    auto: str = "auto"

    def check(self, name: str, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("auto", "true", "false"):
            return {"auto": None, "true": True, "false": False}[value.strip().lower()]
        raise ValueError(f"{name} must be true, false or auto ({self.auto}), got {value!r}")

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: "auto" if value is None else value}

    def flag(self) -> dict[str, Any]:
        return {"action": argparse.BooleanOptionalAction}

    def describe(self) -> str:
        return f"true | false | auto ({self.auto})"


@dataclass(frozen=True)
class Choice(Kind):
    """One member of an `Option` enum, given by value or name in any case."""

    option: type[Option] = Option

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(member.value for member in self.option)

    def check(self, name: str, value: Any) -> Any:
        try:
            return self.option.from_value(value)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: self.option.from_value(value).value}

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        if value in self.choices:
            return None
        return f"{parameter} must be one of {', '.join(self.choices)}, got {value!r}"

    def flag(self) -> dict[str, Any]:
        return {"type": str, "choices": self.choices}

    def describe(self) -> str:
        return " | ".join(self.choices)


@dataclass(frozen=True)
class Text(Kind):
    """A string, normalised and checked by `rule` (text -> value, ValueError when invalid)."""

    rule: Callable[[str, str], str] = lambda name, text: text

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        return self.rule(name, value)

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        return None if isinstance(value, str) else f"{parameter} must be a string, got {value!r}"


@dataclass(frozen=True)
class File(Kind):
    """A file path; not set (None; the parameter "") means the setting's built-in choice (e.g. the bundled model)."""

    def check(self, name: str, value: Any) -> Any:
        if value is None or value == "":
            return None
        if not isinstance(value, str | Path):
            raise ValueError(f"{name} must be a file path, got {value!r}")
        return Path(value)

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: "" if value is None else str(value)}

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        return values[name] or None

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        return (
            None if isinstance(value, str) else f"{parameter} must be a file path (a string), got {value!r}"
        )


@dataclass(frozen=True)
class Size(Kind):
    """(width, height) in pixels, held in two integer parameters (`<name>_width`, `<name>_height`); one integer
    means a square. `optional`: not set (None; the parameters 0 0; also "auto") is allowed, meaning `unset`."""

    low: int = 1
    high: int = 1 << 16
    optional: bool = False
    unset: str = "not set"
    param_type: ClassVar[ParamType] = ParamType.INTEGER

    @property
    def parameter_low(self) -> int:
        """The parameters' lower bound (0 = not set, for an optional size)."""
        return 0 if self.optional else self.low

    def check(self, name: str, value: Any) -> Any:
        if self.optional and (value is None or value in (0, (0, 0), [0, 0], "auto")):
            return None
        pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
        try:
            width, height = pair
        except (TypeError, ValueError):
            width = height = None
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and self.low <= v <= self.high
            for v in (width, height)
        ):
            raise ValueError(
                f"{name} must be two positive integers (width, height) in [{self.low}, {self.high}], got {value!r}"
            )
        return int(width), int(height)

    def names(self, name: str) -> tuple[str, ...]:
        return (f"{name}_width", f"{name}_height")

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return dict(zip(self.names(name), (int(v) for v in value or (0, 0)), strict=True))

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        return tuple(values[n] for n in self.names(name))

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{parameter} must be an integer, got {value!r}"
        if self.optional and value == 0:
            return None
        return out_of_range(parameter, value, self.low, self.high)

    def flag(self) -> dict[str, Any]:
        return {"nargs": 2, "type": int, "metavar": ("W", "H")}

    def describe(self) -> str:
        return f"[{self.low:g}, {self.high:g}]" + (f", 0 = {self.unset}" if self.optional else "")


@dataclass(frozen=True)
class Names(Kind):
    """A list of names (a string array; one comma-separated string is accepted); empty = not set (None)."""

    param_type: ClassVar[ParamType] = ParamType.STRING_ARRAY

    def check(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        if not is_list(value) or not all(isinstance(n, str) for n in array_items(value)):
            raise ValueError(f"{name} must be None or a list of names, e.g. ['a', 'b'], got {value!r}")
        return tuple(array_items(value)) or None

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        return array_items(values[name])  # a parameter may hold one comma-separated string

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: [] if value is None else [str(v) for v in value]}

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        if is_array(value) and all(isinstance(v, str) for v in array_items(value)):
            return None
        return f"{parameter} must be a list of names, e.g. ['a', 'b'], got {value!r}"

    def flag(self) -> dict[str, Any]:
        return {"nargs": "+", "metavar": "NAME"}


@dataclass(frozen=True)
class Rectangle(Kind):
    """A rectangle x_min, y_min, x_max, y_max as fractions of the frame, each in [0, 1] with x_min < x_max and
    y_min < y_max (a double array; integers are taken as numbers)."""

    param_type: ClassVar[ParamType] = ParamType.DOUBLE_ARRAY

    def check(self, name: str, value: Any) -> Any:
        items = array_items(value) if is_array(value) else None
        try:
            numbers = [float(v) if is_number(v) else float(str(v)) for v in items or ()]
        except ValueError:
            numbers = []
        if (
            len(numbers) != 4
            or not all(0.0 <= v <= 1.0 for v in numbers)
            or numbers[0] >= numbers[2]
            or numbers[1] >= numbers[3]
        ):
            shown = list(value) if is_list(value) else value
            raise ValueError(
                f"{name} must be [x_min, y_min, x_max, y_max], fractions of the frame in [0, 1] with "
                f"x_min < x_max and y_min < y_max, got {shown!r}"
            )
        return tuple(numbers)

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: [float(v) for v in value]}

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        return list(values[name]) if is_list(values[name]) else values[name]

    def flag(self) -> dict[str, Any]:
        return {"nargs": 4, "type": float, "metavar": ("X_MIN", "Y_MIN", "X_MAX", "Y_MAX")}

    def describe(self) -> str:
        return "fractions of the frame"


@dataclass(frozen=True)
class Channels(Kind):
    """One number per input channel (a double array of 3); empty = not set (None: from the model). `nonzero`:
    no value may be 0 (a divisor)."""

    nonzero: bool = False
    param_type: ClassVar[ParamType] = ParamType.DOUBLE_ARRAY

    def check(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        items = array_items(value) if is_array(value) else None
        try:
            numbers = [float(v) if is_number(v) else float(str(v)) for v in items or ()]
        except ValueError:
            numbers = []
        if items is not None and not items:
            return None
        shown = list(value) if is_list(value) else value
        if len(numbers) != 3:
            raise ValueError(
                f"{name} must be 3 numbers, one per input channel (in the model's channel order), "
                f"got {shown!r}"
            )
        if self.nonzero and 0.0 in numbers:
            raise ValueError(f"{name} must not hold a 0 (it divides), got {shown!r}")
        return tuple(numbers)

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: [] if value is None else [float(v) for v in value]}

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        return list(values[name]) if is_list(values[name]) else values[name]

    def flag(self) -> dict[str, Any]:
        return {"nargs": 3, "type": float, "metavar": ("C0", "C1", "C2")}

    def describe(self) -> str:
        return "3 numbers, empty = from the model"


@dataclass(frozen=True)
class CameraFiles(Kind):
    """Files per camera, as a string array of "path" (every camera without its own) or "camera=path" entries
    (the camera's image topic as the node's `cameras` names it); one path alone is accepted too; empty = none.
    Held as ((camera or "", path), ...); `rule` checks each file (a ValueError naming it)."""

    rule: Callable[[Path], Any] = lambda path: path
    param_type: ClassVar[ParamType] = ParamType.STRING_ARRAY

    def check(self, name: str, value: Any) -> Any:
        if value is None:
            return ()
        if not is_array(value) and not isinstance(value, Path):
            raise ValueError(
                f"{name} must be a file path or a list of 'path' / 'camera=path' entries, got {value!r}"
            )
        entries: dict[str, Path] = {}
        for item in [value] if isinstance(value, Path) else array_items(value):
            camera, path = self._entry(name, item)
            if camera in entries:
                which = f"camera {camera}" if camera else "every camera"
                raise ValueError(f"{name}: two files for {which}: {entries[camera]} and {path}")
            entries[camera] = path
        for path in entries.values():
            self.rule(path)
        return tuple(entries.items())

    @staticmethod
    def _entry(name: str, item: Any) -> tuple[str, Path]:
        """(camera, path) of one entry: a topic name before the first '=' is the camera."""
        if isinstance(item, tuple | list) and len(item) == 2:
            return str(item[0]), Path(item[1])
        if not isinstance(item, str | Path):
            raise ValueError(f"{name} entries are 'path' or 'camera=path' strings, got {item!r}")
        camera, sep, path = str(item).partition("=")
        if sep and camera.strip() and all(c.isalnum() or c in "/_~" for c in camera.strip()):
            return camera.strip().rstrip("/"), Path(path.strip())
        return "", Path(str(item))

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: [f"{camera}={path}" if camera else str(path) for camera, path in value]}

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        return array_items(values[name])  # a parameter may hold one path (a string) or a comma-separated list

    def parameter_problem(self, parameter: str, value: Any) -> str | None:
        if is_array(value) and all(isinstance(v, str) for v in array_items(value)):
            return None
        return f"{parameter} must be a file path or a list of 'path' / 'camera=path' entries, got {value!r}"

    def flag(self) -> dict[str, Any]:
        return {"nargs": "+", "metavar": "[CAMERA=]PATH"}


@dataclass(frozen=True)
class Options(Kind):
    """A mapping of named options (not a parameter: a Python API and params-file-free setting)."""

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a mapping, got {value!r}")
        return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Parameter:
    """One ROS parameter: its name, type, default as the parameter holds it (None: not set), what it means,
    whether it is fixed at start, and the kind that checks its values."""

    name: str
    kind: Kind
    default: Any
    description: str
    read_only: bool = False
    param_type: ParamType = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_type", self.kind.param_type)

    @property
    def value_type(self) -> type:
        """Python type of the parameter's values (arrays: list)."""
        return self.param_type.python

    @property
    def dynamic(self) -> bool:
        """Whether the parameter's type may change (arrays: `[]` from the command line is a bool array; a
        `Switch`: a bool or `auto`)."""
        return self.value_type is list or isinstance(self.kind, Switch)

    @property
    def choices(self) -> tuple[str, ...]:
        return getattr(self.kind, "choices", ())

    @property
    def min_value(self) -> float | None:
        if isinstance(self.kind, Size | Number):
            return self.kind.parameter_low
        return None

    @property
    def max_value(self) -> float | None:
        return getattr(self.kind, "high", None) if isinstance(self.kind, Number | Size) else None

    def check(self, value: Any) -> str | None:
        """Why `value` is invalid for this parameter, or None when it is valid (None: not set)."""
        return None if value is None else self.kind.parameter_problem(self.name, value)


def parameters_of(name: str, kind: Kind, default: Any, description: str, read_only: bool) -> list[Parameter]:
    """The ROS parameters of one setting (most have one; a size has two); an array kind's None or empty default is
    "not set" (the parameter's default None: a params file cannot hold an empty list)."""
    unset = kind.param_type.python is list and (default is None or len(default) == 0)
    defaults = dict.fromkeys(kind.names(name)) if unset else kind.encode(name, default)
    return [Parameter(n, kind, defaults[n], description, read_only) for n in kind.names(name)]
