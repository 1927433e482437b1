"""What a pose model file says of its keypoints, and why: the joint count and values per joint (ultralytics'
`kpt_shape`: x, y and, where 3, a visibility score), the joints' names and the skeleton, each with its source;
a pose file refused in one line where its keypoint columns, its `labels` or its `layout` do not fit.

Sources, in order: the file's metadata (`kpt_shape`, `kpt_names`, `skeleton`: `engines.metadata`); for a file
that states no `kpt_shape`, the keypoint columns' count (2 or 3 values per joint, refused where both divide it);
names: COCO's 17 person keypoints for a 17-joint file that names none, else numbered; the skeleton: only where
the file has one (drawings fall back to COCO's for 17 joints: `skeleton_for`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tiled_detector.engines.metadata import ModelMetadata
from tiled_detector.pipeline.layouts import OutputLayout

# COCO's person keypoints (pycocotools / ultralytics' coco-pose.yaml order) and their skeleton, 0-based
COCO_KEYPOINTS = (
    "nose",
    "left_eye",
    "right_eye",
    "left_ear",
    "right_ear",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
    "left_hip",
    "right_hip",
    "left_knee",
    "right_knee",
    "left_ankle",
    "right_ankle",
)
COCO_SKELETON = (
    (15, 13),
    (13, 11),
    (16, 14),
    (14, 12),
    (11, 12),
    (5, 11),
    (6, 12),
    (5, 6),
    (5, 7),
    (6, 8),
    (7, 9),
    (8, 10),
    (1, 2),
    (0, 1),
    (0, 2),
    (1, 3),
    (2, 4),
    (3, 5),
    (4, 6),
)


@dataclass(frozen=True)
class Keypoints:
    """A pose model's keypoints: `shape` (joints, values per joint: 2 or 3), the joints' `names`, the `skeleton`
    the file states (None: none), and where each came from."""

    shape: tuple[int, int]
    shape_from: str
    names: tuple[str, ...]
    names_from: str
    skeleton: tuple[tuple[int, int], ...] | None
    skeleton_from: str

    @property
    def joints(self) -> int:
        return self.shape[0]

    @property
    def columns(self) -> int:
        """The keypoint columns of each row (joints x values per joint)."""
        return self.shape[0] * self.shape[1]

    def describe(self) -> str:
        values = "x, y, visibility" if self.shape[1] == 3 else "x, y (score 1)"
        return f"{self.shape[0]} keypoints ({values})"


def skeleton_for(joints: int, stated: tuple[tuple[int, int], ...] | None) -> tuple[tuple[int, int], ...]:
    """The pairs to draw: the model's own skeleton, else COCO's for 17 joints, else none."""
    if stated:
        return tuple((a, b) for a, b in stated if 0 <= a < joints and 0 <= b < joints)
    return COCO_SKELETON if joints == len(COCO_KEYPOINTS) else ()


def keypoint_columns(
    layout: OutputLayout, outputs: Mapping[str, tuple[int, ...]], name: str, num_classes: int | None
) -> int | None:
    """The keypoint columns a pose head's rows carry (None: not known from the shapes alone): end-to-end rows
    past their 6 columns, raw rows past 4 box rows and the classes."""
    shape = outputs[name]
    if len(shape) != 3 or min(shape[1:]) < 0:
        return None
    if layout is OutputLayout.POSE_END2END:
        return shape[2] - 6
    return None if num_classes is None else shape[1] - 4 - num_classes


def _shape_of(
    model: str, columns: int | None, metadata: ModelMetadata, where: str
) -> tuple[tuple[int, int], str]:
    """(joints, values per joint) and their source: the file's `kpt_shape` (checked against `columns`), else
    `columns` read as 3 or 2 values per joint (one line naming the shapes where neither or both fit)."""
    stated = metadata.keypoint_shape
    if stated is not None:
        joints, values = stated
        if values not in (2, 3) or joints < 1:
            raise ValueError(
                f"{model}: its metadata's kpt_shape {list(stated)} is not (joints, 2 or 3): keypoints are x, y and "
                "optionally a visibility score per joint"
            )
        if columns is not None and columns != joints * values:
            raise ValueError(
                f"{model}: its output {where} carries {columns} keypoint columns, but its metadata's kpt_shape "
                f"{list(stated)} needs {joints * values}: set the setting labels (one name per class) or layout "
                "to the model's"
            )
        return (joints, values), f"the model file's metadata (kpt_shape, {metadata.source or 'its exporter'})"
    if columns is None:
        raise ValueError(
            f"{model}: a pose head {where} whose metadata states no kpt_shape: give one name per class with the "
            "setting labels, so that the keypoint columns can be counted"
        )
    fits = [(columns // v, v) for v in (3, 2) if columns > 0 and columns % v == 0]
    if len(fits) != 1:
        readings = " or ".join(f"{j} joints x {v}" for j, v in fits) or "neither"
        raise ValueError(
            f"{model}: its output {where} carries {columns} keypoint columns, which do not divide into 2 or 3 values "
            f"per joint one way ({readings}), and its metadata states no kpt_shape"
        )
    return fits[0], f"the output shapes ({columns} keypoint columns; no kpt_shape in the file)"


def read_keypoints(
    model: str,
    metadata: ModelMetadata,
    outputs: Mapping[str, tuple[int, ...]],
    name: str,
    layout: OutputLayout,
    num_classes: int | None,
) -> Keypoints:
    """The keypoints of a pose head (`layout` pose or pose_end2end, its head output `name`) with their sources;
    ValueError in one line where the columns, the metadata, the labels or the layout do not fit."""
    shape = outputs[name]
    where = f"{name!r} {list(shape)}"
    columns = keypoint_columns(layout, outputs, name, num_classes)
    if columns is not None and columns < 2:
        setting = "layout" if layout is OutputLayout.POSE_END2END else "labels"
        raise ValueError(
            f"{model}: its output {where} leaves {columns} keypoint columns for {num_classes} classes: set the "
            f"setting {setting} to the model's"
        )
    (joints, values), shape_from = _shape_of(model, columns, metadata, where)
    names = metadata.keypoint_names
    if names is not None and len(names) == joints:
        names_from = "the model file's metadata (kpt_names)"
    elif joints == len(COCO_KEYPOINTS):
        names, names_from = COCO_KEYPOINTS, "COCO's 17 person keypoints (the file names none)"
    else:
        names = tuple(f"joint{k}" for k in range(joints))
        names_from = "none: joints are numbered"
    skeleton = metadata.skeleton
    skeleton_from = (
        "the model file's metadata (skeleton)"
        if skeleton
        else (
            "none in the file (drawn with COCO's for 17 joints)" if joints == len(COCO_KEYPOINTS) else "none"
        )
    )
    return Keypoints((joints, values), shape_from, tuple(names), names_from, skeleton, skeleton_from)


def check_pose_layout(model: str, metadata: ModelMetadata, layout: OutputLayout) -> None:
    """The setting `layout` on a pose file must be a pose layout, and a pose layout needs a pose file where the
    file says its task (ValueError in one line naming the setting)."""
    pose = layout in (OutputLayout.POSE, OutputLayout.POSE_END2END)
    if metadata.task == "pose" and not pose and layout is not OutputLayout.AUTO:
        shape = f" ({metadata.keypoint_shape[0]} joints)" if metadata.keypoint_shape else ""
        end = "pose_end2end" if metadata.end2end else "pose"
        raise ValueError(
            f"layout {layout.value}: {model}'s metadata says task pose{shape}: its rows end in keypoints, not "
            f"{layout.value} rows; set the setting layout to {end} or auto"
        )
    if pose and metadata.task not in (None, "pose"):
        raise ValueError(
            f"layout {layout.value}: {model}'s metadata says task {metadata.task}, so its rows carry no keypoints; "
            "set the setting layout to auto (or the model's)"
        )
