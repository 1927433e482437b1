"""Result type shared by the pipeline, the CLI and the ROS node."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Detections:
    """Detections of one frame as a struct of arrays, in frame pixel coordinates.

    boxes: (N, 4) float32 x1, y1, x2, y2; scores: (N,) float32 in [0, 1]; class_ids: (N,) int64;
    timings: stage name -> milliseconds for the call that produced them. With a depth image: positions (N, 3)
    and sizes (N, 3) float32, each object's centre and extent in metres in the colour camera's optical frame (x
    right, y down, z forward), NaN rows where it has no valid depth; None without one. From a rotated-box model:
    obb (N, 5) float32 cx, cy, w, h, angle (radians in [0, pi/2), turning +x toward +y: clockwise on screen;
    ultralytics' xywhr), whose axis-aligned hulls are `boxes`; None from an axis-aligned model.
    """

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    positions: np.ndarray | None = field(default=None, compare=False)
    sizes: np.ndarray | None = field(default=None, compare=False)
    obb: np.ndarray | None = None

    def __post_init__(self) -> None:
        boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        scores = np.asarray(self.scores, dtype=np.float32).reshape(-1)
        class_ids = np.asarray(self.class_ids, dtype=np.int64).reshape(-1)
        if not len(boxes) == len(scores) == len(class_ids):
            raise ValueError(
                f"Detections need as many boxes as scores and class ids, got "
                f"{len(boxes)}, {len(scores)} and {len(class_ids)}"
            )
        object.__setattr__(self, "boxes", boxes)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "class_ids", class_ids)
        for name, width in (("positions", 3), ("sizes", 3), ("obb", 5)):
            value = getattr(self, name)
            if value is not None:
                value = np.asarray(value, dtype=np.float32).reshape(-1, width)
                if len(value) != len(scores):
                    raise ValueError(
                        f"Detections need one row of {name} per box, got {len(value)} for {len(scores)}"
                    )
                object.__setattr__(self, name, value)

    @classmethod
    def empty(cls) -> Detections:
        """No detections."""
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.scores)

    def __getitem__(self, index: np.ndarray | slice) -> Detections:
        """Select detections by boolean mask, index array or slice (timings, positions, sizes and rotated boxes are
        kept)."""
        return Detections(
            self.boxes[index],
            self.scores[index],
            self.class_ids[index],
            dict(self.timings),
            None if self.positions is None else self.positions[index],
            None if self.sizes is None else self.sizes[index],
            None if self.obb is None else self.obb[index],
        )
