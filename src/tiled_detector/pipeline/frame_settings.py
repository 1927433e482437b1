"""`FrameSettings`: the settings the frame program reads, built from a `DetectorConfig` by its table (every field
whose `Setting` applies to the frame: `DetectorConfig.frame_settings`), class names already resolved to ids.

Frozen and hashable: it is the settings part of the capture key, so a captured frame program is replayed only for
the settings it was captured with, and a new value of any of them captures (or finds) its own program.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiled_detector.pipeline.merge import MatchMetric, MergeMethod, MergeRule
from tiled_detector.settings.options import Option


class KeypointFusion(Option):
    """Where a kept detection's keypoints come from (`pipeline.keypoints`)."""

    JOINTS = "joints"  # each joint from the views of the object that saw it whole, weighted by its score
    KEEPER = "keeper"  # the kept candidate's own joints


@dataclass(frozen=True)
class FrameSettings:
    """Decoding (thresholds, top-k, class filter), the seam rule, the merge, the box size limits, the
    per-frame cut, the depth's scale and valid range, the instance masks (`masks` None: a segmentation
    head's) and their resolution, and the keypoints (`keypoints` None: a pose head's) and how they are fused."""

    conf_threshold: float
    class_thresholds: tuple[tuple[int, float], ...]
    merge: MergeMethod
    match_metric: MatchMetric
    merge_threshold: float
    class_agnostic: bool
    nms_rounds: int
    max_detections: int
    classes: tuple[int, ...] | None
    top_k: int
    seam_suppression: bool
    min_box_size: float
    max_box_size: float
    depth_scale: float
    depth_min: float
    depth_max: float
    masks: bool | None = None
    mask_scale: float = 1.0
    keypoints: bool | None = None
    keypoint_fusion: KeypointFusion = KeypointFusion.JOINTS

    @property
    def merge_rule(self) -> MergeRule:
        """How overlapping detections are merged."""
        return MergeRule(
            self.merge, self.match_metric, self.merge_threshold, self.class_agnostic, self.nms_rounds
        )
