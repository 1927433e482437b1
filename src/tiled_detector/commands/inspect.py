"""`tiled-detector inspect MODEL [--json]`: what the node would make of a model file (any backend's), and why: its
input (name, size, batch: fixed, dynamic, or rewritten to a dynamic one and proven), its outputs, the layout its
head is decoded in and how that was decided (with the task the file's metadata names: detect, obb, segment (with
its mask prototypes), ...), the input conventions and where each came from, the class names and
their source, the tile size and the engine calls a 1080p and a 4K frame take. A file that fits several readings is
named ambiguous with its candidates and the settings that decide (exit 1)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tiled_detector.commands.settings import add_settings, parameter_values
from tiled_detector.config import settings

FRAMES = ((1920, 1080), (3840, 2160))  # the frame sizes whose engine calls are reported


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of inspect: the model, --json, and the settings that change how a file is read."""
    parser.add_argument("model", type=Path, help="model file (.onnx, .engine/.plan, .ts/.pt2)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_settings(parser, only=[n for n in settings() if n != "model"])


def _batch(config: Any, engine: Any) -> str:
    """How the engine takes views: a fixed batch, a dynamic one, or a batch-1 ONNX rewritten and proven."""
    from tiled_detector.engines.base import ModelFormat, model_format

    if model_format(config.model) is ModelFormat.ONNX:
        import onnx

        from tiled_detector.engines.rebatch import fixed_batch_one

        if fixed_batch_one(onnx.load(str(config.model), load_external_data=False)):
            if engine.fixed_batch is None:
                return f"fixed at 1 in the file: rewritten to a dynamic batch, proven equal (calls of up to {engine.max_batch})"
            return "fixed at 1: its rewrite to a dynamic batch was not proven equal, so each view is a call"
    if engine.fixed_batch is not None:
        return f"fixed at {engine.fixed_batch}"
    return f"dynamic (calls of up to {engine.max_batch} views)"


def report(config: Any) -> dict[str, Any]:
    """The inspection of `config.model` as a JSON-able dict ("ambiguous" and "candidates" where it fits several
    readings); errors that stop the node raise as they do there."""
    import math

    from tiled_detector.model_files.engine_setup import load_config_engine
    from tiled_detector.model_files.resolve import AmbiguousModelError, engine_view, resolve
    from tiled_detector.pipeline.tiling import make_plan

    engine = load_config_engine(config)
    found: dict[str, Any] = {
        "model": str(config.model),
        "backend": engine.backend.value,
        "input": {
            "name": engine.input.name,
            "shape": list(engine.input.shape),
            "dtype": str(engine.input.dtype),
            "batch": _batch(config, engine),
        },
        "outputs": {o.name: list(o.shape) for o in engine.outputs},
        "producer": engine.metadata.producer or engine.metadata.source,
        "task": engine.metadata.task,
    }
    try:
        resolved = resolve(config, engine_view(engine))
    except AmbiguousModelError as error:
        return {
            **found,
            "ambiguous": True,
            "candidates": list(error.candidates),
            "decided_by": list(error.settings),
            "error": str(error),
        }
    tile_hw = config.tile_hw_for(engine.input_hw)
    views = {
        f"{w}x{h}": make_plan(
            (h, w),
            tile_hw,
            config.overlap,
            engine.input_hw,
            config.full_frame,
            letterbox=resolved.input_format.letterbox,
        ).batch_size
        for w, h in FRAMES
    }
    labels = resolved.labels or ()
    return {
        **found,
        "ambiguous": False,
        "layout": resolved.layout.value,
        "layout_decided_by": resolved.decided_by,
        "head": resolved.head,
        "masks": resolved.masks,
        "keypoints": _keypoints(resolved.keypoints),
        "family": resolved.family,
        "input_conventions": {
            n: {"value": list(v) if isinstance(v, tuple) else getattr(v, "value", v), "from": src}
            for n, (v, src) in resolved.input_sources.items()
        },
        "labels": {"count": len(labels), "first": list(labels[:5]), "from": resolved.labels_from},
        "tile_size": {
            "value": [tile_hw[1], tile_hw[0]],
            "from": "the setting tile_size" if config.tile_size else "auto: the model's input size",
        },
        "views": views,
        "engine_calls": {size: math.ceil(n / engine.max_batch) for size, n in views.items()},
        "cuda_graph": _cuda_graph(config, engine),
    }


def _keypoints(keypoints: Any) -> dict[str, Any] | None:
    """A pose model's keypoints (joints, values per joint, names, skeleton) and where each came from; None."""
    if keypoints is None:
        return None
    return {
        "count": keypoints.joints,
        "values": keypoints.shape[1],
        "from": keypoints.shape_from,
        "names": list(keypoints.names),
        "names_from": keypoints.names_from,
        "skeleton": None if keypoints.skeleton is None else [list(p) for p in keypoints.skeleton],
        "skeleton_from": keypoints.skeleton_from,
    }


def _cuda_graph(config: Any, engine: Any) -> str:
    """How a frame would be captured on CUDA: "whole" (the engine with the frame program in one graph), or
    "split" with why the engine runs between the captured parts (a TorchScript file is read as it would be
    loaded on CUDA: `engines.capture`)."""
    from tiled_detector.engines.base import Backend, ModelFormat, model_format

    if engine.backend is Backend.TORCH and model_format(config.model) is ModelFormat.TORCHSCRIPT:
        import torch

        from tiled_detector.engines.capture import specialise

        left = specialise(torch.jit.load(str(config.model), map_location="cpu"), "cuda")
        return "whole" if not left else "split: " + "; ".join(left)
    if engine.backend is Backend.TORCH or engine.backend is Backend.TENSORRT:
        return "whole" if type(engine).capturable else f"split: {engine.capture_problem}"
    return f"split: {engine.backend.value} calls are not captured"


def _print(found: dict[str, Any]) -> None:
    lines = [
        f"model      {found['model']} ({found['backend']}; produced by {found['producer'] or 'unknown'})"
    ]
    spec = found["input"]
    lines.append(f"input      {spec['name']} {spec['shape']} {spec['dtype']}; batch {spec['batch']}")
    lines += [f"output     {name} {shape}" for name, shape in found["outputs"].items()]
    if found["ambiguous"]:
        lines.append(f"AMBIGUOUS  fits {', '.join(found['candidates'])}")
        lines.append(f"decide     with the setting {' or '.join(found['decided_by'])} ({found['error']})")
        print("\n".join(lines))
        return
    masks = f": instance masks ({found['masks']} prototypes)" if found["masks"] else ""
    lines.append(f"task       {found['task'] or 'not named in the file'}{masks}")
    lines.append(f"layout     {found['layout']} ({found['head']}), decided by {found['layout_decided_by']}")
    points = found["keypoints"]
    if points is not None:
        values = "x, y, visibility" if points["values"] == 3 else "x, y"
        lines.append(f"keypoints  {points['count']} joints ({values}) from {points['from']}")
        shown = ", ".join(points["names"][:5]) + (", ..." if points["count"] > 5 else "")
        lines.append(f"  names          {shown} from {points['names_from']}")
        lines.append(f"  skeleton       from {points['skeleton_from']}")
    lines.append(f"family     {found['family'] or 'none (ultralytics conventions)'}")
    for name, entry in found["input_conventions"].items():
        lines.append(f"  {name:<14} {entry['value']!s:<28} from {entry['from']}")
    labels = found["labels"]
    shown = ", ".join(labels["first"]) + (", ..." if labels["count"] > len(labels["first"]) else "")
    lines.append(f"labels     {labels['count']} ({shown or 'numbered'}) from {labels['from']}")
    width, height = found["tile_size"]["value"]
    lines.append(f"tile_size  {width}x{height} ({found['tile_size']['from']})")
    lines += [
        f"frame      {size}: {found['views'][size]} views, {calls} engine calls"
        for size, calls in found["engine_calls"].items()
    ]
    lines.append(f"cuda_graph {found['cuda_graph']}")
    print("\n".join(lines))


def run(args: argparse.Namespace) -> int:
    """Print the report (or its JSON); 1 when the file is ambiguous."""
    from tiled_detector.config import DetectorConfig
    from tiled_detector.parameters import config_changes

    config = DetectorConfig(**{**config_changes(parameter_values(args)), "model": args.model})
    found = report(config)
    if args.json:
        print(json.dumps(found))
    else:
        _print(found)
    return 1 if found["ambiguous"] else 0
