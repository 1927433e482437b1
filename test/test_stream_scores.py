"""A recording scored in this process: the same numbers as `eval --motion`'s stream on the same frames and stamps,
classes matched by name, and no tracking scores without identities."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tiled_detector import TiledDetector
from tiled_detector.config import DetectorConfig
from tiled_detector.tools.frames import Frame
from tiled_detector.tools.scores.evaluation import FRAME_NS, evaluate
from tiled_detector.tools.scores.stream_scores import score_stream
from tiled_detector.tools.worlds.synthetic import CLASSES, MotionStyle, make_sequence

SEED, COUNT, WIDTH, HEIGHT = 7, 4, 640, 360
STAMPS = [index * FRAME_NS for index in range(COUNT)]  # eval --motion's


@pytest.fixture(scope="module")
def detector() -> TiledDetector:
    """The bundled model with the tracker, one view a frame (no full-frame view: the frames are one tile)."""
    return TiledDetector.from_config(DetectorConfig(tracker="bytetrack", full_frame=False))


@pytest.fixture(scope="module")
def frames() -> list[Frame]:
    scenes = make_sequence(SEED, COUNT, WIDTH, HEIGHT, MotionStyle())
    return [Frame(s.image, s.boxes, s.class_ids, ids=s.ids) for s in scenes]


@pytest.fixture(scope="module")
def reference(detector: TiledDetector, frames: list[Frame]) -> dict[str, float | int | None]:
    return score_stream(detector, frames, STAMPS, CLASSES)


def test_the_scores_are_those_of_eval_motion_on_the_same_frames(
    detector: TiledDetector, reference: dict
) -> None:
    theirs = evaluate(detector, COUNT, SEED, WIDTH, HEIGHT, ["tiles"], motion=True)["tiles"]
    assert reference["frames"] == COUNT and reference["IDF1"] > 0.7
    tracking = ("IDF1", "MOTA", "id_switches")
    assert {k: reference[k] for k in tracking} == {k: theirs[k] for k in tracking}
    assert reference["AP50"] == pytest.approx(theirs["AP50"], abs=1e-9)  # under 100 boxes a frame: the same


def test_classes_are_matched_by_name(detector: TiledDetector, frames: list[Frame], reference: dict) -> None:
    reversed_names = [*reversed(CLASSES)]  # the truth's own class order: its ids differ from the detector's
    renamed = [dataclasses.replace(f, class_ids=len(CLASSES) - 1 - f.class_ids) for f in frames]
    assert score_stream(detector, renamed, STAMPS, reversed_names)["AP50"] == pytest.approx(reference["AP50"])
    wrong = [dataclasses.replace(f, class_ids=(f.class_ids + 1) % len(CLASSES)) for f in frames]
    assert score_stream(detector, wrong, STAMPS, CLASSES)["AP50"] < 0.2


def test_without_identities_or_boxes_the_scores_that_need_them_are_none(
    detector: TiledDetector, frames: list[Frame], reference: dict
) -> None:
    boxes_only = score_stream(detector, [dataclasses.replace(f, ids=None) for f in frames], STAMPS, CLASSES)
    assert boxes_only["AP50"] == pytest.approx(reference["AP50"])
    assert (boxes_only["IDF1"], boxes_only["MOTA"], boxes_only["id_switches"]) == (None, None, None)
    partly = [dataclasses.replace(frames[0], ids=None), frames[1]]  # one frame without: no identities
    assert score_stream(detector, partly, STAMPS, CLASSES)["IDF1"] is None
    empty = Frame(frames[0].image, np.zeros((0, 4)), np.zeros(0, np.int64), ids=np.zeros(0, np.int64))
    assert score_stream(detector, [empty], STAMPS, CLASSES)["AP50"] is None
    with pytest.raises(ValueError, match="every frame scored needs its ground truth"):
        score_stream(detector, [Frame(frames[0].image)], STAMPS, CLASSES)
