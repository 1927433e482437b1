"""The detector's settings by the names users type: node parameters, params files and CLI flags.

Every parameter here is derived from a `DetectorConfig` field's `Setting` (default, range, choices, runtime):
the node declares them (`ros/params.py` adds its own transport/QoS/diagnostics parameters), config/detector.yaml
documents them (a test compares), and `commands/settings.py` turns them into flags. Names follow the field,
except where a ROS parameter cannot hold the value: tile_size is tile_width + tile_height, channel_order is
model_channel_order, and model, labels and classes are strings.
"""

from __future__ import annotations

import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiled_detector.config import DetectorConfig, Setting, default, settings
from tiled_detector.detector import TiledDetector
from tiled_detector.options import out_of_range

# field -> its parameter name(s) where they are not the field's own name
_RENAMED: Mapping[str, tuple[str, ...]] = {
    "tile_size": ("tile_width", "tile_height"),
    "channel_order": ("model_channel_order",),
}
_LISTS = frozenset({"labels", "classes"})  # string-array parameters (names or ids)


@dataclass(frozen=True)
class Parameter:
    """One parameter: name, default, description, whether it is fixed at start, choices and range."""

    name: str
    default: Any
    description: str
    read_only: bool = False
    choices: tuple[str, ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    kind: type | None = None  # for parameters whose default is None (declared by type, "not set")

    @property
    def value_type(self) -> type:
        """Python type of the parameter's values."""
        return self.kind or type(self.default)

    def check(self, value: Any) -> str | None:
        """Why `value` is invalid for this parameter, or None when it is valid."""
        if value is None:
            return None
        if self.value_type is list:
            return (
                None
                if _is_name_list(value)
                else f"{self.name} must be a list of names or ids, e.g. ['a', 'b'], got {value!r}"
            )
        if self.choices and value not in self.choices:
            return f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}"
        if self.min_value is not None:
            return out_of_range(self.name, value, self.min_value, self.max_value)
        return None


def _from_setting(name: str, field_name: str, value: Any, setting: Setting) -> Parameter:
    kind = list if field_name in _LISTS else None
    if field_name == "model":
        value = ""
    elif hasattr(value, "value"):  # an option enum member
        value = value.value
    return Parameter(
        name,
        value,
        setting.help,
        not setting.runtime,
        setting.choices,
        setting.low,
        setting.high,
        kind,
    )


def _detector_parameters() -> Iterator[Parameter]:
    for field_name, setting in settings().items():
        if not setting.parameter:
            continue
        names = _RENAMED.get(field_name, (field_name,))
        value = default(field_name)
        values = value if field_name == "tile_size" else (value,)
        for name, one in zip(names, values, strict=True):
            yield _from_setting(name, field_name, one, setting)


DETECTOR_PARAMETERS: tuple[Parameter, ...] = tuple(_detector_parameters())


def _is_name_list(value: Any) -> bool:
    """A comma-separated string, or an array of strings or integers (any empty array)."""
    if isinstance(value, str):
        return True
    return isinstance(value, list | tuple | array.array) and all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    )


def string_list(value: Any) -> list[str]:
    """A list parameter (names, ids, or one comma-separated string) as non-empty strings."""
    items = value.split(",") if isinstance(value, str) else (value or [])
    return [str(v).strip() for v in items if str(v).strip()]


def resolve_classes(names_or_ids: list[str], labels: list[str] | None) -> tuple[int, ...] | None:
    """Class filter from names or ids; None = all classes. Raises ValueError naming the unknown entry."""
    if not names_or_ids:
        return None
    ids = []
    for item in names_or_ids:
        if item.lstrip("-").isdigit():
            ids.append(int(item))
        elif labels and item in labels:
            ids.append(labels.index(item))
        else:
            known = ", ".join(labels or []) or "no labels loaded: use numeric ids"
            raise ValueError(f"classes: unknown class {item!r} (known: {known})")
    return tuple(sorted(set(ids)))


def config_changes(values: Mapping[str, Any], labels: list[str] | None = None) -> dict[str, Any]:
    """`DetectorConfig` changes for parameter values (any subset; parameters of no field are ignored).

    tile_width and tile_height go together (both must be given); classes are resolved against `labels`.
    """
    changes: dict[str, Any] = {}
    for field_name, setting in settings().items():
        names = _RENAMED.get(field_name, (field_name,))
        if not setting.parameter or not any(n in values for n in names):
            continue
        value = values[names[0]] if len(names) == 1 else tuple(int(values[n]) for n in names)
        if field_name == "model":
            value = Path(value) if value else default("model")
        elif field_name == "labels":
            value = tuple(string_list(value)) or None
        elif field_name == "classes":
            value = resolve_classes(string_list(value), labels)
        changes[field_name] = value
    return changes


def as_parameters(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Parameter values for `DetectorConfig` field values (the inverse of `config_changes`)."""
    values: dict[str, Any] = {}
    for field_name, value in changes.items():
        names = _RENAMED.get(field_name, (field_name,))
        if field_name == "tile_size":
            values.update(zip(names, (int(v) for v in value), strict=True))
        else:
            values[names[0]] = _parameter_value(field_name, value)
    return values


def _parameter_value(field_name: str, value: Any) -> Any:
    if field_name in _LISTS:
        return [str(v) for v in value] if value is not None else []
    if field_name == "model":
        return str(value) if value else ""
    return value.value if hasattr(value, "value") else value


def read_params_file(path: Path) -> dict[str, Any]:
    """The parameters of a ROS 2 params file (`/**` and every node section merged, in file order)."""
    import yaml

    try:
        sections = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"cannot read the params file {path}: {error}") from error
    values: dict[str, Any] = {}
    for section in sections.values() if isinstance(sections, dict) else ():
        values.update((section or {}).get("ros__parameters", {}))
    return values


def runtime_changes(values: Mapping[str, Any], labels: list[str] | None) -> dict[str, Any]:
    """`config_changes` of the parameters that change at runtime (read-only ones are ignored)."""
    runtime = {p.name for p in DETECTOR_PARAMETERS if not p.read_only}
    return config_changes({k: v for k, v in values.items() if k in runtime}, labels)


def build_detector(values: Mapping[str, Any]) -> TiledDetector:
    """A `TiledDetector` for parameter values (defaults for the rest); classes by name need the model's
    labels, so they are applied once the engine is loaded. Raises ValueError naming a bad value."""
    start = {k: v for k, v in values.items() if k != "classes"}
    detector = TiledDetector.from_config(DetectorConfig(**config_changes(start)))
    if "classes" in values:
        detector.update(**config_changes({"classes": values["classes"]}, list(detector.labels or ())))
    return detector
