"""The detector's settings by the names users type: node parameters, params files and CLI flags.

Every parameter here is derived from a `DetectorConfig` field's `Setting` (its kind spells it: names, type,
default, range or choices; its `applies` says whether it changes at runtime): the node declares them
(`ros/params.py` adds its own transport/QoS/diagnostics parameters), config/detector.yaml documents them (a test
compares), and `commands/settings.py` turns them into flags. Names follow the field, except where the setting
names another (`Setting.ros_name`: tile_size is tile_width + tile_height, channel_order is model_channel_order).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tiled_detector.config import DetectorConfig, Setting, default, settings
from tiled_detector.detector import TiledDetector
from tiled_detector.model_files.engine_setup import load_config_engine
from tiled_detector.settings.kinds import Parameter, parameters_of


def parameter_base(name: str, setting: Setting) -> str:
    """The name a setting's kind spells its parameters from (the field's, or `Setting.ros_name`)."""
    return setting.ros_name or name


def _detector_parameters() -> Iterator[Parameter]:
    for name, setting in settings().items():
        if setting.parameter:
            base = parameter_base(name, setting)
            yield from parameters_of(base, setting.kind, default(name), setting.help, not setting.runtime)


DETECTOR_PARAMETERS: tuple[Parameter, ...] = tuple(_detector_parameters())


def config_changes(values: Mapping[str, Any]) -> dict[str, Any]:
    """`DetectorConfig` changes for parameter values (any subset; parameters of no field are ignored). A setting
    held in several parameters (tile_width and tile_height) needs all of them."""
    changes: dict[str, Any] = {}
    for name, setting in settings().items():
        base = parameter_base(name, setting)
        if setting.parameter and any(n in values for n in setting.kind.names(base)):
            changes[name] = setting.kind.decode(base, values)
    return changes


def as_parameters(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Parameter values for `DetectorConfig` field values (the inverse of `config_changes`)."""
    values: dict[str, Any] = {}
    for name, value in changes.items():
        setting = settings()[name]
        values.update(setting.kind.encode(parameter_base(name, setting), setting.kind.check(name, value)))
    return values


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


def runtime_changes(values: Mapping[str, Any]) -> dict[str, Any]:
    """`config_changes` of the parameters that change at runtime (read-only ones are ignored)."""
    runtime = {p.name for p in DETECTOR_PARAMETERS if not p.read_only}
    return config_changes({k: v for k, v in values.items() if k in runtime})


def build_detector(values: Mapping[str, Any], sample_calibration: bool = False) -> TiledDetector:
    """A `TiledDetector` for parameter values (defaults for the rest). Raises ValueError naming a bad value
    (class names are checked against the model's labels once it is loaded). precision int8 loads the model's
    Q/DQ copy (`tools.calibration.int8_model`: quantized from `calibration` on first use; from the bundled
    sample frames, with a warning, when `sample_calibration` and no calibration is set)."""
    from tiled_detector.tools.calibration import int8_model

    config = DetectorConfig(**config_changes(values))
    model = int8_model(config, sample_default=sample_calibration)
    engine = load_config_engine(config, model) if model != config.model else None
    return TiledDetector.from_config(config, engine)
