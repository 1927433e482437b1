"""The node's parameters as the launch file needs them, without heavy imports (no torch, no rclpy): a bringup that
includes `detector.launch.py` pays a few milliseconds for it, and works where torch is not importable by the
`ros2 launch` Python (a Jetson's venv).

`PARAMETERS` is the node's parameter table (`ros/params.PARAMS`: name, ROS type, description) written out;
`test_launch.py` checks that it equals the table, and prints the rows to paste when a setting is added.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import yaml

# (name, ROS parameter type, description): ros/params.PARAMS in order (test_launch.py compares)
PARAMETERS: tuple[tuple[str, str, str], ...] = (
    (
        "model",
        "string",
        "model file (.onnx, .engine/.plan, .ts/.pt2); empty = the bundled default model (its TorchScript file for the torch backend, else its ONNX file)",
    ),
    (
        "backend",
        "string",
        "inference backend; auto: on CUDA one that runs there (.onnx: TensorRT, else ONNX Runtime with CUDA, else the TorchScript beside it)",
    ),
    ("device", "string", "torch device of the engine: cpu, cuda or cuda:N"),
    (
        "precision",
        "string",
        "engine precision: fp16 with TensorRT or torch on CUDA; int8 with ONNX Runtime or TensorRT, from an ONNX with Q/DQ nodes (given, or made from calibration)",
    ),
    (
        "calibration",
        "string",
        "int8 calibration frames: a folder of images or a rosbag2 bag from the cameras; an ONNX model without Q/DQ nodes is quantized from them once, tiled as at run time (cached); empty = int8 needs a Q/DQ model",
    ),
    (
        "input_width",
        "integer",
        "the model's input width and height, for a model file that does not say it (not set, 0 0 = from the file)",
    ),
    (
        "input_height",
        "integer",
        "the model's input width and height, for a model file that does not say it (not set, 0 0 = from the file)",
    ),
    (
        "tile_width",
        "integer",
        "tile width and height in pixels; auto (not set, 0 0) = the model's input size",
    ),
    (
        "tile_height",
        "integer",
        "tile width and height in pixels; auto (not set, 0 0) = the model's input size",
    ),
    ("overlap", "double", "overlap ratio between neighbouring tiles"),
    ("full_frame", "bool", "also run the whole frame (letterboxed) in the same batch"),
    ("conf_threshold", "double", "minimum detection score"),
    (
        "class_thresholds",
        "string_array",
        "minimum score per class, 'class:threshold' entries (names or ids, e.g. person:0.35 3:0.6); classes not listed keep conf_threshold",
    ),
    (
        "roi",
        "double_array",
        "region of interest [x_min, y_min, x_max, y_max], fractions of the frame: tiles cover it only, and a box is kept when its centre lies in it (the full-frame view still sees the whole frame)",
    ),
    (
        "ignore_mask",
        "string_array",
        "mask images (any size, scaled to the frame; non-zero = ignored): 'path' for every camera, 'camera=path' for one; a box more than half on ignored pixels is dropped, a tile wholly on them is not run",
    ),
    ("min_box_size", "double", "smallest box kept: its shorter side in frame pixels (0 = no limit)"),
    ("max_box_size", "double", "largest box kept: its shorter side in frame pixels (0 = no limit)"),
    ("merge", "string", "how detections from overlapping tiles are merged"),
    ("match_metric", "string", "overlap measure for merging: intersection over union or over smaller"),
    ("merge_threshold", "double", "overlap above which two detections are the same object"),
    ("class_agnostic", "bool", "merge detections across classes"),
    (
        "nms_rounds",
        "integer",
        "0 = SAHI's result: the suppression of nms and greedy_nmm settled to its fixed point (its cost grows with the longest chain of boxes suppressing one another, as in a flood of candidates); N > 0 = at most N matrix rounds over all candidates, a bounded cost that CHANGES RESULTS where chains are longer than N (1: a box is dropped when any higher-ranked box matches it; measured effect on real-photo AP in docs/PERFORMANCE.md)",
    ),
    ("max_detections", "integer", "most detections per frame (highest scores kept)"),
    ("classes", "string_array", "only these classes (names or ids); not set or empty = all"),
    ("top_k", "integer", "most candidates per tile (highest scores) before merging"),
    (
        "tracker",
        "string",
        "tracker after the merge, one per camera: none, or bytetrack (Detection2D.id = the track id)",
    ),
    (
        "track_activation_threshold",
        "double",
        "tracker: a detection above this score continues a track (above it + 0.1: starts one); below it, down to 0.1, it can only continue a track",
    ),
    (
        "lost_track_buffer",
        "double",
        "tracker: seconds a track without detections is kept for one to take it up again",
    ),
    (
        "track_matching_threshold",
        "double",
        "tracker: the largest cost (1 - IoU x score) of a detection-to-track match",
    ),
    (
        "tile_budget",
        "integer",
        "tiles run per frame of a stream, chosen from the tracks (or the last detections) and each tile's age, plus the full-frame view; objects in tiles not run are reported from what was seen before; 0 = every tile every frame",
    ),
    (
        "max_tile_age",
        "integer",
        "with tile_budget: every tile runs at least once in this many frames (the latest a new object is found)",
    ),
    (
        "motion_compensation",
        "string",
        "with tracker or tile_budget: the camera's own motion between frames, estimated from each frame on the engine's device, moves the tracks, the budget's claims, carried boxes and marks the view that entered the frame (image); none: the camera is assumed still",
    ),
    (
        "depth",
        "bool",
        "3D positions from an aligned depth image: the node subscribes depth_image (16UC1 or 32FC1, registered to the colour camera) and camera_info beside each camera's image and publishes detections_3d",
    ),
    (
        "depth_scale",
        "double",
        "metres per unit of a 16UC1 depth image (millimetres: 0.001); 32FC1 is in metres",
    ),
    (
        "depth_sync_tolerance",
        "double",
        "seconds between a colour frame's stamp and its depth image's stamp (matched by stamp, the nearest)",
    ),
    ("depth_min", "double", "nearest valid depth in metres (below: a hole or an invalid code)"),
    (
        "depth_max",
        "double",
        "farthest valid depth in metres (beyond: invalid; the default is below 16UC1's largest value at 0.001, which drivers use for saturated pixels)",
    ),
    (
        "masks",
        "string",
        "instance masks of a segmentation model's detections (the masks topic, a label image; detect --json's mask): true, false, or auto (not set: true for a segmentation model)",
    ),
    (
        "mask_scale",
        "double",
        "resolution of the masks as a fraction of the frame's (the label image is the frame's size times it)",
    ),
    (
        "keypoints",
        "string",
        "keypoints of a pose model's detections (the keypoints topic; detect --json's keypoints): true, false, or auto (not set: true for a pose model)",
    ),
    (
        "keypoint_fusion",
        "string",
        "where a detection's keypoints come from: joints (each joint from the views of the object that saw it whole, weighted by its score) or keeper (the kept candidate's own)",
    ),
    ("layout", "string", "model output layout; auto detects it from the output shapes"),
    (
        "max_batch",
        "integer",
        "largest engine batch; larger tile batches are split (on a CPU at most 4 images per call, the fastest there: engine option cpu_batch)",
    ),
    ("seam_suppression", "bool", "drop a box cut by a tile seam when another view sees the whole object"),
    ("labels", "string_array", "class names by id; not set = the labels stored with the model"),
    (
        "model_channel_order",
        "string",
        "channel order the model expects; auto = the model file's, else its family's (yolox, nanodet: bgr), else rgb",
    ),
    (
        "input_scale",
        "double",
        "multiplier applied to 0-255 pixel values (not set = the model file's, else its family's: 1/255; yolox, picodet, nanodet 1.0)",
    ),
    (
        "input_mean",
        "double_array",
        "per channel, subtracted after input_scale, in the model's channel order (not set = the model file's, else its family's, else 0 0 0)",
    ),
    (
        "input_std",
        "double_array",
        "per channel, divides after input_mean, in the model's channel order (not set = the model file's, else its family's, else 1 1 1)",
    ),
    (
        "letterbox",
        "string",
        "where a resized view sits in the model input: center, top_left (padding right and below), or stretch (the whole input, aspect not kept); auto = the model file's, else its family's (yolox: top_left, picodet: stretch), else center",
    ),
    (
        "pad_value",
        "double",
        "grey level (0-255) of the letterbox padding and of tile pixels past the frame (not set = the model file's, else its family's (nanodet 0), else 114)",
    ),
    (
        "cuda_graph",
        "bool",
        "CUDA, torch or TensorRT engine: capture each frame's work (tiles to merged boxes) as one CUDA graph per frame size and settings and replay it (false: launch every kernel each frame)",
    ),
    (
        "compile",
        "bool",
        "CUDA with triton: fuse decoding and post-processing with torch.compile (fewer kernels per frame; the first frame of each size compiles, for minutes, then torch caches it on disk)",
    ),
    ("transport", "string", "raw subscribes `image`; compressed subscribes `image/compressed`"),
    ("image_reliability", "string", "QoS reliability of the image subscription (depth 1)"),
    ("diagnostics_period", "double", "seconds between /diagnostics messages"),
    (
        "cameras",
        "string_array",
        "image topics of several cameras, detected together in one engine batch; each publishes <its namespace>/detections; empty = the one `image` input",
    ),
    ("output_format", "string", "class_id field: label names (labels) or numeric ids (ids)"),
)
TYPES = {name: kind for name, kind, _ in PARAMETERS}
SPELLING_CUTOFF = 0.85  # difflib ratio above which an unknown name is taken for a misspelt argument


def typed_flag(name: str, text: str) -> bool:
    """A true / false launch argument (any case)."""
    if text.lower() not in ("true", "false"):
        raise ValueError(f"launch argument {name} must be true or false, got {text!r}")
    return text.lower() == "true"


def typed(name: str, text: str) -> object:
    """A parameter's launch argument text as the parameter's type (arrays as YAML, e.g. [car, person] or
    [0, 0.4, 1, 1])."""
    kind = TYPES[name]
    if kind == "bool":
        return typed_flag(name, text)
    if kind.endswith("_array"):
        value = yaml.safe_load(text)
        item = float if kind == "double_array" else str
        try:
            return [item(v) for v in value] if isinstance(value, list) else text
        except (TypeError, ValueError):
            raise ValueError(f"launch argument {name} must be a list of numbers, got {text!r}") from None
    try:
        return {"integer": int, "double": float, "string": str}[kind](text)
    except ValueError:
        what = "an integer" if kind == "integer" else "a number"
        raise ValueError(f"launch argument {name} must be {what}, got {text!r}") from None


def check_spelling(given: Iterable[str], declared: Iterable[str]) -> None:
    """Refuse a given argument name that is not declared but near one that is (a typo), naming the nearest."""
    names = set(declared)
    for name in sorted(set(given) - names):
        nearest = difflib.get_close_matches(name, names, n=1, cutoff=SPELLING_CUTOFF)
        if nearest:
            raise ValueError(
                f"unknown launch argument {name!r}: did you mean {nearest[0]!r}? "
                "(`ros2 launch tiled_detector detector.launch.py --show-args` lists them)"
            )
