"""`eval --depth`: the 3D positions of the detector's detections on synthetic depth scenes
(`tools.depth_scenes`: objects of 8-80 px at 3-60 m, holes, noise) against the objects' true positions.

Each detection matched to a labelled object (same class, IoU >= 0.5, highest score first) and given a position is
scored by its relative error |p - p_true| / |p_true|; the median and 95th percentile are over the objects of at
least `MIN_SIZE` px (the longer side of their box; `*_all`: every size). `positions_ms` is the frame program's
positions stage per frame (the exact path's host time on a CPU; 0 inside a captured program, whose stages are not
timed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tiled_detector.pipeline.depth import DepthImage
from tiled_detector.tools.scoring import position_errors
from tiled_detector.tools.worlds.depth_scenes import make_depth_scene

MIN_SIZE = 12.0  # px: the objects the position targets are stated for


def error_percentiles(errors: list[np.ndarray]) -> tuple[float | None, float | None]:
    """The median and 95th percentile of the errors of several frames (None, None: none)."""
    values = np.concatenate(errors) if errors else np.zeros(0)
    if not len(values):
        return None, None
    median, p95 = np.percentile(values, [50, 95])
    return float(median), float(p95)


def evaluate_depth(
    detector: Any,
    frames: int,
    seed: int,
    width: int,
    height: int,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float | int | None]:
    """Position errors of `detector` (a `TiledDetector`) on `frames` synthetic depth scenes (module docstring);
    frame i is scene `seed + i`."""
    big, every, timings = [], [], []
    objects = located = without = 0
    for index in range(frames):
        scene = make_depth_scene(seed + index, width, height)
        found = detector.detect(scene.scene.image, depth=DepthImage(scene.depth, scene.camera))
        arrays = (found.boxes, found.scores, found.class_ids)
        truth = (scene.scene.boxes, scene.scene.class_ids)
        big.append(position_errors(arrays, found.positions, truth, scene.positions, MIN_SIZE))
        every.append(position_errors(arrays, found.positions, truth, scene.positions))
        has = np.isfinite(found.positions).all(axis=1)
        objects += len(scene.scene.boxes)
        located += int(has.sum())
        without += int((~has).sum())
        timings.append(found.timings.get("positions", 0.0))
        if progress is not None:
            progress(index + 1, frames)
    median, p95 = error_percentiles(big)
    median_all, p95_all = error_percentiles(every)
    return {
        "objects": objects,
        "objects_3d": located,
        "objects_without_depth": without,
        "scored": int(sum(len(e) for e in big)),
        "depth_error_median": median,
        "depth_error_p95": p95,
        "depth_error_median_all": median_all,
        "depth_error_p95_all": p95_all,
        "positions_ms": float(np.mean(timings)) if timings else None,
    }
