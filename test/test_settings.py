"""One source for every setting: `DetectorConfig` field metadata -> the parameter table, config/detector.yaml (see
test_launch) and the CLI flags of every subcommand; one flag name per meaning across subcommands."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from pathlib import Path
from typing import Any

import pytest

from tiled_detector.cli import COMMANDS
from tiled_detector.commands.settings import flag, parameter_values
from tiled_detector.config import ENGINE_FIELDS, Applies, DetectorConfig, default, settings
from tiled_detector.engines.base import Backend, Precision
from tiled_detector.parameters import (
    DETECTOR_PARAMETERS,
    as_parameters,
    build_detector,
    config_changes,
    read_params_file,
)
from tiled_detector.pipeline.frame_settings import FrameSettings
from tiled_detector.pipeline.merge import MergeMethod
from tiled_detector.settings.kinds import Kind

ROOT = Path(__file__).resolve().parents[1]
# subcommands whose work depends on the detector's settings
SETTING_COMMANDS = ("demo", "detect", "eval", "replay", "build-engine", "bench")


def _parser(command: str) -> argparse.ArgumentParser:
    module = importlib.import_module(f"tiled_detector.commands.{COMMANDS[command][0]}")
    parser = argparse.ArgumentParser(prog=command)
    module.add_arguments(parser)
    return parser


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def test_every_field_has_its_setting_and_a_valid_default() -> None:
    for f in dataclasses.fields(DetectorConfig):
        setting = f.metadata["setting"]
        assert setting.help and isinstance(setting.kind, Kind), f.name
        assert setting.runtime == (setting.applies in (Applies.PLAN, Applies.FRAME, Applies.HOST)), f.name
    assert {
        "model",
        "backend",
        "device",
        "precision",
        "calibration",
        "max_batch",
        "input_size",
        "engine_options",
    } == ENGINE_FIELDS
    DetectorConfig(**{name: default(name) for name in settings()})


def test_frame_settings_are_built_from_the_table() -> None:
    # every field the frame program reads is a FrameSettings field and nothing else is: a runtime setting that
    # applies to the frame cannot be missing from the capture key
    frame_fields = {n for n, s in settings().items() if s.applies is Applies.FRAME}
    assert {f.name for f in dataclasses.fields(FrameSettings)} == frame_fields
    resolved = DetectorConfig(classes=["b", 0], merge="nmm").frame_settings(["a", "b"])
    assert resolved.classes == (0, 1) and resolved.merge is MergeMethod.NMM
    assert hash(resolved) == hash(DetectorConfig(classes=[1, "a"], merge="nmm").frame_settings(["a", "b"]))
    # the other runtime fields are the plan's (tiles) and the host's: named here, so a new one is placed on purpose
    assert {n for n, s in settings().items() if s.applies is Applies.PLAN} == {
        "tile_size",
        "overlap",
        "full_frame",
        "roi",
        "ignore_mask",
    }
    assert {n for n, s in settings().items() if s.applies is Applies.HOST} == {
        "profile",
        "tracker",
        "track_activation_threshold",
        "lost_track_buffer",
        "track_matching_threshold",
        "tile_budget",
        "max_tile_age",
        "motion_compensation",
        "depth_sync_tolerance",
    }


def test_parameters_are_derived_from_the_config_fields() -> None:
    by_name = {p.name: p for p in DETECTOR_PARAMETERS}
    assert default("tile_size") is None  # auto: the model's input size, 0 x 0 as parameters
    assert by_name["tile_width"].default == by_name["tile_height"].default == 0
    assert by_name["tile_width"].min_value == 0 and by_name["tile_width"].max_value == 8192
    assert by_name["model_channel_order"].choices == ("auto", "rgb", "bgr")
    assert by_name["precision"].default == default("precision").value == "fp32"
    assert by_name["backend"].choices == tuple(b.value for b in Backend)
    for name, setting in settings().items():
        if name in by_name:
            param = by_name[name]
            assert param.read_only == (not setting.runtime), name
            # the parameter's range: the kind's, its not-set value included
            low = getattr(setting.kind, "parameter_low", getattr(setting.kind, "low", None))
            bounds = (low, getattr(setting.kind, "high", None))
            assert (param.min_value, param.max_value) == bounds or param.param_type.python is list, name
            assert param.description == setting.help
    # the node's overlap bound is the core's: one rule, one message
    assert by_name["overlap"].check(0.96) == "overlap must be in [0.0, 0.95], got 0.96"
    with pytest.raises(ValueError, match=r"^overlap must be in \[0.0, 0.95\], got 0.96$"):
        DetectorConfig(overlap=0.96)


def test_parameter_values_and_config_fields_convert_both_ways() -> None:
    changes: dict[str, Any] = {
        "tile_size": (512, 384),
        "overlap": 0.3,
        "merge": "nmm",
        "channel_order": "bgr",
        "labels": ("a", "b", "c"),
        "classes": (2,),
        "precision": Precision.FP16,
        "seam_suppression": False,
    }
    values = as_parameters(changes)
    assert values == {
        "tile_width": 512,
        "tile_height": 384,
        "overlap": 0.3,
        "merge": "nmm",
        "model_channel_order": "bgr",
        "labels": ["a", "b", "c"],
        "classes": ["2"],
        "precision": "fp16",
        "seam_suppression": False,
    }
    back = config_changes(values)
    assert DetectorConfig(**back) == DetectorConfig(**changes)
    classes = (
        DetectorConfig(**config_changes({"classes": ["c", "0"]})).frame_settings(["a", "b", "c"]).classes
    )
    assert classes == (0, 2)
    assert config_changes({"model": ""}) == {"model": default("model")}
    assert config_changes({"transport": "compressed"}) == {}  # a node parameter of no config field


@pytest.mark.parametrize("command", SETTING_COMMANDS)
def test_every_subcommand_names_a_setting_the_same_way(command: str) -> None:
    flags = _flags(_parser(command))
    assert "--params-file" in flags
    assert not {"--output", "--save-dir", "--metric", "--tile"} & set(flags)
    for name, setting in settings().items():
        option = flag(name)
        if option not in flags:
            continue
        action = flags[option]
        assert action.dest == name, (command, option)
        if "choices" in setting.kind.flag():
            assert tuple(action.choices) == setting.kind.choices, (command, option)
    expected = {"--precision", "--max-batch", "--tile-size", "--overlap", "--device"}
    if command != "build-engine":  # build-engine takes the model as its argument
        expected |= {"--model", "--backend", "--conf", "--merge", "--match-metric", "--classes"}
    assert expected <= set(flags), expected - set(flags)
    if any(a.dest == "out" for a in flags.values()):
        assert "--out" in flags


def test_one_default_precision_for_node_cli_and_build_engine() -> None:
    node = {p.name: p for p in DETECTOR_PARAMETERS}["precision"].default
    args = _parser("build-engine").parse_args(["model.onnx"])
    built = DetectorConfig(**config_changes(parameter_values(args)))
    detect = DetectorConfig(**config_changes(parameter_values(_parser("detect").parse_args(["x.png"]))))
    assert node == built.precision.value == detect.precision.value == DetectorConfig().precision.value
    assert built.device == "cuda:0"  # build-engine's own default: engines are built on the GPU


def test_flags_override_the_params_file_which_overrides_the_defaults(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(
        "/**:\n  ros__parameters:\n    conf_threshold: 0.4\n    tile_width: 512\n    tile_height: 384\n"
        "    transport: compressed\n"
        "tiled_detector:\n  ros__parameters:\n    overlap: 0.1\n"
    )
    assert read_params_file(params)["overlap"] == 0.1
    args = _parser("detect").parse_args(["x.png", "--params-file", str(params), "--conf", "0.6"])
    detector = build_detector(parameter_values(args))
    config = detector.config
    assert (config.conf_threshold, config.tile_size, config.overlap) == (0.6, (512, 384), 0.1)
    assert config.merge_threshold == default("merge_threshold")
    args = _parser("detect").parse_args(
        ["x.png", "--classes", "1", "--no-full-frame", "--tile-size", "320", "240"]
    )
    config = build_detector(parameter_values(args)).config
    assert (config.classes, config.full_frame, config.tile_size) == ((1,), False, (320, 240))


def test_policy_flags_reach_the_node_of_replay_and_demo_as_its_parameters(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    from tiled_detector.commands.settings import flag_parameters

    cv2.imwrite(str(tmp_path / "m.png"), np.zeros((2, 2), np.uint8))
    flags = [
        "--class-thresholds",
        "red_disc:0.5",
        "3:0.7",
        "--roi",
        "0",
        "0.5",
        "1",
        "1",
        "--min-box-size",
        "4",
        "--ignore-mask",
        f"/front/image_raw={tmp_path / 'm.png'}",
        str(tmp_path / "m.png"),
    ]
    for command in ("replay", "demo"):
        args = _parser(command).parse_args(["bag", *flags] if command == "replay" else flags)
        assert flag_parameters(args) == {
            "class_thresholds": ["red_disc:0.5", "3:0.7"],
            "roi": [0.0, 0.5, 1.0, 1.0],
            "min_box_size": 4.0,
            "ignore_mask": [f"/front/image_raw={tmp_path / 'm.png'}", str(tmp_path / "m.png")],
        }
    # and back: the node's parameter values give the same config
    values = flag_parameters(args)
    assert DetectorConfig(**config_changes(values)) == DetectorConfig(
        class_thresholds=[("red_disc", 0.5), (3, 0.7)],
        roi=(0, 0.5, 1, 1),
        min_box_size=4,
        ignore_mask=[("/front/image_raw", tmp_path / "m.png"), ("", tmp_path / "m.png")],
    )


def test_a_bad_params_file_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("/**: [unclosed\n")
    with pytest.raises(ValueError, match="cannot read the params file"):
        read_params_file(bad)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"tracker": "deepsort"},
            "tracker: unknown tracker kind 'deepsort'; expected one of: none, bytetrack",
        ),
        ({"lost_track_buffer": 0.0}, "lost_track_buffer must be in \\[0.001, 3600.0\\], got 0.0"),
        ({"lost_track_buffer": -1.0}, "lost_track_buffer must be in"),
        (
            {"track_activation_threshold": 1.5},
            "track_activation_threshold must be in \\[0.0, 1.0\\], got 1.5",
        ),
        ({"track_matching_threshold": -0.1}, "track_matching_threshold must be in \\[0.0, 1.0\\], got -0.1"),
    ],
)
def test_bad_tracker_settings_are_one_line_naming_the_parameter(changes, message):
    from tiled_detector.config import DetectorConfig

    with pytest.raises(ValueError, match=message):
        DetectorConfig(**changes)
