"""The node's parameters at work: declared from the table (`ros/params.py`), overrides of the wrong type refused,
unknown ones warned about, runtime changes validated into a new `DetectorConfig` (applied by the worker between
frames). Mixed into the detector nodes (plain and managed)."""

from __future__ import annotations

import difflib
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter

from tiled_detector.config import DetectorConfig
from tiled_detector.parameters import runtime_changes
from tiled_detector.ros.cameras import check_mask_cameras
from tiled_detector.ros.params import BY_NAME, PARAMS, declared_value, descriptor


def _section_matches(key: str, node: str) -> bool:
    """Whether a params-file section (`/**`, `/**/name`, `name`, `/ns/name`, with `*` / `**` wildcards, as rcl
    reads them) applies to the node of fully qualified name `node`."""
    pattern = key if key.startswith("/") else f"/{key}"
    regex = "".join(
        {"/**/": "/(.*/)?", "**": ".*", "*": "[^/]*"}.get(token, re.escape(token))
        for token in re.split(r"(/\*\*/|\*\*|\*)", pattern)
    )
    return re.fullmatch(regex, node) is not None


def given_parameters(argv: Sequence[str], node: str) -> dict[str, tuple[Any, str]]:
    """The parameter values the command line gives node `node` (fully qualified), each with where it came from,
    as rcl applies them: every --params-file in order (its `/**` section and those matching the node, in file
    order), then every `-p NAME:=VALUE` (or `-p NODE:NAME:=VALUE`) on top; a later value replaces an earlier one.
    (rcl itself keeps the first value's type and silently drops a later value of another type.)"""
    files: list[str] = []
    flags: list[str] = []
    ros = False
    tokens = iter(argv)
    for token in tokens:
        if token in ("--ros-args", "--"):
            ros = token == "--ros-args"
        elif ros and token == "--params-file":
            files.append(next(tokens, ""))
        elif ros and token in ("-p", "--param"):
            flags.append(next(tokens, ""))
    given: dict[str, tuple[Any, str]] = {}
    for path in files:
        try:
            sections = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue  # rcl has refused it already
        for key, section in sections.items() if isinstance(sections, dict) else ():
            if isinstance(section, dict) and _section_matches(str(key), node):
                values = section.get("ros__parameters") or {}
                given.update((name, (value, Path(path).name)) for name, value in values.items())
    name_only = node.rsplit("/", 1)[-1]
    for flag in flags:
        target, sep, text = flag.partition(":=")
        owner, _, name = target.rpartition(":")
        if sep and owner in ("", name_only, node):
            given[name] = (yaml.safe_load(text), "-p")
    return given


class NodeParameters:
    """Parameter handling of a detector node (an rclpy node): `_state` holds the detector settings and the
    parameter values they come from, swapped together under `_state_lock` (None until configured).

    The plain node's read-only parameters are fixed for its life; a managed node's (`MANAGED`) can be set while it
    is unconfigured and are refused while it is configured (they are read when it configures)."""

    MANAGED = False
    _state: tuple[DetectorConfig, dict[str, Any]] | None = None
    labels: list[str] = []  # noqa: RUF012 -- the loaded model's class names, set when configured
    _given: dict[str, Any] | None = None  # a managed node's values given before `_show_loaded` replaced them

    def _descriptor(self, param: Any) -> Any:
        """The rcl descriptor of `param` for this node (a managed node's read-only ones are writable)."""
        described = descriptor(param)
        if self.MANAGED and param.read_only:
            described.read_only = False
            described.additional_constraints = "; ".join(
                filter(None, [described.additional_constraints, "set while the node is unconfigured"])
            )
        return described

    def _declare(self) -> None:
        """Declare every parameter (overrides of the wrong type refused, unknown ones warned about) and
        validate changes from now on."""
        self._check_override_types()
        for param in PARAMS:
            described = self._descriptor(param)
            # `model` and `labels` become read-only once the loaded values are known (_show_loaded)
            described.read_only &= param.name not in ("model", "labels")
            self.declare_parameter(param.name, declared_value(param), described)
        self._warn_unknown_overrides()
        self._state_lock = threading.Lock()
        self.add_on_set_parameters_callback(self._on_set_parameters)

    def _check_override_types(self) -> None:
        """Refuse a parameter of the wrong type anywhere in the override chain; give the node the last value.

        The chain: params files in order, then -p. rcl keeps the first value's type and drops later ones of
        another type, where a wrong type should be an error; an integer for a floating-point parameter
        (`conf_threshold: 1`) is taken as that number."""
        overrides = getattr(self, "_parameter_overrides", {})
        given = given_parameters(getattr(self, "_argv", None) or sys.argv, self.get_fully_qualified_name())
        for param in PARAMS:
            value, source = given.get(param.name, (None, ""))
            if value is None and param.name in overrides:
                value, source = overrides[param.name].value, "the params file or -p"
            if value is None or param.dynamic:
                continue
            if param.value_type is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            elif not isinstance(value, param.value_type) or isinstance(value, bool) != (
                param.value_type is bool
            ):
                example = param.default if param.default is not None else "..."
                where = source if source in ("-p", "the params file or -p") else f"the params file {source}"
                raise ValueError(
                    f"parameter {param.name} must be a {param.value_type.__name__} (e.g. {param.name}: {example!r}), "
                    f"got {value!r} ({type(value).__name__}) from {where}"
                )
            overrides[param.name] = Parameter(param.name, value=value)

    def _warn_unknown_overrides(self) -> None:
        """One WARN per parameter given (params file, -p) that the node does not have, naming the nearest."""
        known = set(self._parameters)
        for name in sorted(set(getattr(self, "_parameter_overrides", {})) - known):
            if name.startswith("qos_overrides."):
                continue
            nearest = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
            self.get_logger().warning(f"unknown parameter {name!r} ignored{hint}")

    def _show_loaded(self, name: str, value: Any) -> Any:
        """Re-declare parameter `name` with the value actually loaded (the bundled model's path, the model's class
        names): read-only in the plain node (the first stays), writable in a managed node, which gets the given
        value back when it is cleaned up (`_restore_given`: a new model is not read with the old one's names)."""
        if self.describe_parameter(name).read_only:
            return self.get_parameter(name).value
        if self.MANAGED:
            self._given = self._given or {}
            self._given.setdefault(name, self.get_parameter(name).value)
        self.undeclare_parameter(name)
        self.declare_parameter(name, value, self._descriptor(BY_NAME[name]), ignore_override=True)
        return value

    def _restore_given(self) -> None:
        """A managed node cleaned up: the parameters `_show_loaded` replaced hold the given values again."""
        for name, value in (self._given or {}).items():
            self.undeclare_parameter(name)
            self.declare_parameter(name, value, self._descriptor(BY_NAME[name]), ignore_override=True)
        self._given = None

    def _on_set_parameters(self, params: Sequence[Parameter]) -> SetParametersResult:
        changed = {p.name: p.value for p in params if p.name in BY_NAME}
        for name, value in changed.items():
            reason = BY_NAME[name].check(value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        if self._state is None:  # not configured yet (lifecycle): the values are read at configure
            return SetParametersResult(successful=True)
        fixed = sorted(name for name in changed if BY_NAME[name].read_only)
        if fixed:  # (the plain node's are read-only: rclpy refuses them before this callback)
            return SetParametersResult(
                successful=False,
                reason=f"{', '.join(fixed)}: read when the node configures; set while it is unconfigured "
                "(ros2 lifecycle set <node> cleanup, set it, configure)",
            )
        current, values = self._current()
        merged = {**values, **changed}
        try:  # every runtime setting from the merged values (a size's two parameters together)
            candidate = current.replace(**runtime_changes(merged))
            candidate.frame_settings(self.labels)  # class names must be the model's
            check_mask_cameras(candidate.ignore_mask, merged["cameras"])
            self._check_runtime(candidate)
        except ValueError as error:
            return SetParametersResult(successful=False, reason=str(error))
        with self._state_lock:
            self._state = (candidate, merged)
        self._changed(current, candidate)
        return SetParametersResult(successful=True)

    def _changed(self, before: DetectorConfig, after: DetectorConfig) -> None:
        """Runtime settings changed from `before` to `after` (the node's hook)."""

    def _check_runtime(self, candidate: DetectorConfig) -> None:
        """Raise ValueError when new runtime settings cannot apply to what the node has seen (the node's check)."""

    def _current(self) -> tuple[DetectorConfig, dict[str, Any]]:
        with self._state_lock:
            assert self._state is not None, "not configured"
            return self._state
