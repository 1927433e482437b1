"""Kinds of settings that name the model's classes, by name or id: which classes (`Classes`) and a value per class
(`ClassValues`). Names are kept as given; the frame program reads ids, resolved against the model's labels once
they are known (`resolve`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from tiled_detector.settings.kinds import Kind, ParamType, array_items, is_array, is_list, is_number
from tiled_detector.settings.options import out_of_range


def class_key(item: Any, name: str) -> int | str:
    """A class given by name or id: an id (int >= 0, also from a string of digits) or a name."""
    if isinstance(item, bool) or not isinstance(item, int | str):
        raise ValueError(f"{name}: a class is a name or an id >= 0, got {item!r}")
    text = str(item).strip()
    if text.lstrip("-").isdigit():
        if int(text) < 0:
            raise ValueError(f"{name} must be None or a list of class names or ids >= 0, got {item!r}")
        return int(text)
    if not text:
        raise ValueError(f"{name}: a class is a name or an id >= 0, got {item!r}")
    return text


def class_id(key: int | str, labels: Sequence[str] | None, name: str) -> int:
    """The id of a class given by name or id (a name must be one of `labels`; an id must index them when they
    are known)."""
    if isinstance(key, int):
        if labels and key >= len(labels):
            raise ValueError(
                f"{name}: unknown class id {key} (the model has {len(labels)} classes, 0 to "
                f"{len(labels) - 1})"
            )
        return key
    if labels and key in labels:
        return list(labels).index(key)
    known = ", ".join(labels or ()) or "no labels loaded: use numeric ids"
    raise ValueError(f"{name}: unknown class {key!r} (known: {known})")


def _sorted_keys(keys: Sequence[int | str]) -> tuple[int | str, ...]:
    """Ids first (ascending), then names (in order), each once."""
    ids = sorted({k for k in keys if isinstance(k, int)})
    return (*ids, *dict.fromkeys(k for k in keys if isinstance(k, str)))


@dataclass(frozen=True)
class Classes(Kind):
    """Classes by name or id (a string array: ["person", "3"]); empty = not set (None: every class). The frame
    program reads their ids, resolved against the model's labels."""

    param_type: ClassVar[ParamType] = ParamType.STRING_ARRAY

    def check(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        if not is_list(value):
            raise ValueError(
                f"{name} must be None or a list of class names or ids, e.g. ['car', 2], got {value!r}"
            )
        keys = [class_key(item, name) for item in array_items(value)]
        return _sorted_keys(keys) or None

    def decode(self, name: str, values: Mapping[str, Any]) -> Any:
        return array_items(values[name])  # a parameter may hold one comma-separated string

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: [] if value is None else [str(v) for v in value]}

    def flag(self) -> dict[str, Any]:
        return {"nargs": "+", "metavar": "NAME"}

    def resolve(self, name: str, value: Any, labels: Sequence[str] | None) -> Any:
        if value is None:
            return None
        return tuple(sorted({class_id(key, labels, name) for key in value}))


@dataclass(frozen=True)
class ClassValues(Kind):
    """A value in [low, high] per class, as a string array of "class:value" entries (classes by name or id:
    ["person:0.35", "3:0.6"]); empty = none. Held as ((class, value), ...) in the order given, a later entry for
    the same class replacing an earlier one; the frame program reads them with class ids (`resolve`)."""

    low: float = 0.0
    high: float = 1.0
    param_type: ClassVar[ParamType] = ParamType.STRING_ARRAY

    def check(self, name: str, value: Any) -> Any:
        if value is None:
            return ()
        if isinstance(value, Mapping):
            pairs = list(value.items())
        elif is_array(value):
            pairs = [self._pair(name, item) for item in array_items(value)]
        else:
            raise ValueError(
                f"{name} must be a list of 'class:value' entries, e.g. ['person:0.35'], got {value!r}"
            )
        entries: dict[int | str, float] = {}
        for key, number in pairs:
            if not is_number(number):
                raise ValueError(f"{name}: the value of {key!r} must be a number, got {number!r}")
            reason = out_of_range(f"{name} of {key}", number, self.low, self.high)
            if reason:
                raise ValueError(reason)
            entries[class_key(key, name)] = float(number)
        return tuple(entries.items())

    @staticmethod
    def _pair(name: str, item: Any) -> tuple[Any, Any]:
        """(class, value) of one entry: a "class:value" string or a (class, value) pair."""
        if isinstance(item, tuple | list) and len(item) == 2:
            return item[0], item[1]
        key, sep, number = str(item).rpartition(":")
        try:
            if sep:
                return key.strip(), float(number)
        except ValueError:
            pass
        raise ValueError(f"{name} entries are 'class:value' (e.g. 'person:0.35'), got {item!r}")

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        return {name: [f"{key}:{number:g}" for key, number in value]}

    def flag(self) -> dict[str, Any]:
        return {"nargs": "+", "metavar": "CLASS:VALUE"}

    def resolve(self, name: str, value: Any, labels: Sequence[str] | None) -> Any:
        # a name and its id: the last
        resolved = {class_id(key, labels, name): number for key, number in value}
        return tuple(sorted(resolved.items()))

    def describe(self) -> str:
        return f"[{self.low:g}, {self.high:g}]"
