"""The CLI's error contract: one line `tiled-detector CMD: cannot start: <what, why, fix>`, exit 1 (2 for usage,
130 for Ctrl-C), no traceback unless `--debug`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from tiled_detector import __version__
from tiled_detector.cli import main
from tiled_detector.models import default_model_path

MODEL = str(default_model_path())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    image = np.zeros((120, 160, 3), np.uint8)
    image[40:60, 50:90] = 220
    cv2.imwrite(str(folder / "ok.jpg"), image)
    data = (folder / "ok.jpg").read_bytes()
    (folder / "half.jpg").write_bytes(data[: len(data) // 2])  # OpenCV 4.12 decodes no cut JPEG at all
    cv2.imwrite(str(folder / "ok.png"), image)
    (folder / "cut.png").write_bytes((folder / "ok.png").read_bytes()[:-12])  # the IEND chunk missing
    (folder / "corrupt.onnx").write_bytes(Path(MODEL).read_bytes()[:3000])
    depth = np.full((120, 160), 2500, np.uint16)  # 2.5 m in millimetres, holes at the right
    depth[:, 120:] = 0
    cv2.imwrite(str(folder / "depth.png"), depth)
    (folder / "info.yaml").write_text(
        "image_width: 160\nimage_height: 120\n"
        "camera_matrix: {rows: 3, cols: 3, data: [100.0, 0.0, 79.5, 0.0, 100.0, 59.5, 0.0, 0.0, 1.0]}\n"
    )
    return folder


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *expected: str) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"tiled-detector {argv[0]}: cannot start: "), err
    for text in expected:
        assert text in err, (text, err)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "missing.onnx"], ["model file missing.onnx not found", ".onnx"]),
        (["--model", "{dir}/corrupt.onnx"], ["is not a model ONNX Runtime can load", "re-export"]),
        (["--overlap", "1.5"], ["overlap must be in [0.0, 0.95], got 1.5"]),
        (["--tile-size", "-1", "-1"], ["tile_size must be two positive integers"]),
        (["--conf", "1.5"], ["conf_threshold must be in [0.0, 1.0], got 1.5"]),
        (["--backend", "tensorrt"], ["TensorRT backend runs on CUDA devices only", "device cuda"]),
        (["--class-thresholds", "unicorn:0.5"], ["class_thresholds: unknown class 'unicorn'"]),
        (
            ["--roi", "0.5", "0", "0.2", "1"],
            ["roi must be [x_min, y_min, x_max, y_max]", "got [0.5, 0.0, 0.2, 1.0]"],
        ),
        (["--ignore-mask", "{dir}/none.png"], ["ignore_mask: cannot read", "none.png"]),
        (
            ["--min-box-size", "9", "--max-box-size", "3"],
            ["min_box_size (9) must not exceed max_box_size (3)"],
        ),
        (["--depth-scale", "0"], ["depth_scale must be in [1e-06, 1.0], got 0.0"]),
        (["--depth-min", "5", "--depth-max", "5"], ["depth_min (5) must be less than depth_max (5)"]),
        (["--depth-sync-tolerance", "-0.1"], ["depth_sync_tolerance must be in [0.0, 10.0], got -0.1"]),
        (["--depth", "{dir}/depth.png"], ["--depth needs --camera-info INFO.yaml"]),
        (["--camera-info", "{dir}/info.yaml"], ["--camera-info is for --depth"]),
        (
            ["--depth", "{dir}/depth.png", "{dir}/depth.png", "--camera-info", "{dir}/info.yaml"],
            ["--depth needs one depth image per IMAGE: got 2 for 1"],
        ),
        (["--depth", "{dir}/depth.png", "--camera-info", "{dir}/ok.png"], ["ok.png: cannot read a camera"]),
        (
            ["--depth", "{dir}/depth.png", "--camera-info", "{dir}/none.yaml"],
            ["none.yaml: cannot read a camera"],
        ),
    ],
)
def test_detect_errors_are_one_line(capsys, files: Path, args: list[str], expected: list[str]) -> None:
    argv = ["detect", str(files / "ok.jpg"), *(a.format(dir=files) for a in args)]
    _one_line_error(capsys, argv, *expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_missing_is_said_before_any_native_call(capsys, files: Path) -> None:
    _one_line_error(capsys, ["detect", str(files / "ok.jpg"), "--device", "cuda"], "has no CUDA device here")
    _one_line_error(capsys, ["build-engine", MODEL], "has no CUDA device here", "build-engine builds")


def test_eval_unknown_config_is_one_line(capsys) -> None:
    _one_line_error(
        capsys, ["eval", "--configs", "full", "bogus"], "unknown evaluation config 'bogus'", "tiles"
    )


def test_truncated_images_are_reported(capsys, files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # OpenCV 4.12 (here) decodes nothing of a cut file: one line says why
    assert main(["detect", str(files / "half.jpg"), str(files / "cut.png")]) == 1
    err = capsys.readouterr().err
    assert "half.jpg: cannot read image: truncated JPEG (no end-of-image marker)" in err
    assert "cut.png: cannot read image: truncated PNG (no IEND chunk)" in err
    # older OpenCV (e.g. JetPack's 4.8) returns the part that decoded, grey below: reported, not silently scored
    decode = cv2.imdecode

    def partial(buffer: np.ndarray, flags: int) -> np.ndarray:
        image = decode(buffer, flags)
        return np.full((120, 160, 3), 128, np.uint8) if image is None else image

    monkeypatch.setattr(cv2, "imdecode", partial)
    assert main(["detect", str(files / "cut.png"), str(files / "ok.jpg"), "--json"]) == 0
    captured = capsys.readouterr()
    cut, whole = json.loads(captured.out.strip().splitlines()[-1])["images"]
    assert cut["truncated"] is True and whole["truncated"] is False
    assert (
        "cut.png: warning: truncated PNG (no IEND chunk); detections are on the part that decoded"
        in captured.err
    )


def test_make_bag_existing_and_unwritable_targets(capsys, tmp_path: Path) -> None:
    (tmp_path / "bag").mkdir()
    _one_line_error(
        capsys, ["make-bag", str(tmp_path / "bag"), "--frames", "1"], "exists: replace it with --force"
    )
    blocker = tmp_path / "a_file"  # a target that cannot be created (root ignores read-only folders)
    blocker.write_text("")
    _one_line_error(capsys, ["make-bag", str(blocker / "bag"), "--frames", "1"], "a_file")


def test_make_bag_depth_is_for_synthetic_still_scenes(capsys, tmp_path: Path) -> None:
    _one_line_error(
        capsys, ["make-bag", str(tmp_path / "bag"), "--depth", "--motion"], "--depth makes synthetic"
    )


def test_ctrl_c_exits_130_with_one_line(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiled_detector.commands import env

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(env, "run", interrupted)
    assert main(["env"]) == 130
    assert capsys.readouterr().err.strip() == "tiled-detector env: interrupted"


def test_debug_shows_the_traceback_and_version(files: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "tiled_detector.cli",
        "detect",
        str(files / "ok.jpg"),
        "--overlap",
        "1.5",
    ]
    plain = subprocess.run(command, capture_output=True, text=True, check=False)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    debug = subprocess.run([*command, "--debug"], capture_output=True, text=True, check=False)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "cannot start" in debug.stderr
    version = subprocess.run([*command[:3], "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"tiled-detector {__version__}"


@pytest.mark.parametrize(
    ("code", "env", "expected"),
    [
        # the CLI and the node's package set a short libgomp spin before torch loads ...
        ("from tiled_detector.cli import main; main(['--version'])", {}, "30000"),
        ("import tiled_detector.ros", {}, "30000"),
        # ... unless the environment chose one, or torch was loaded first (too late: left alone)
        ("import tiled_detector.ros", {"GOMP_SPINCOUNT": "7"}, "7"),
        ("import torch, tiled_detector.ros", {}, "None"),
    ],
)
def test_our_processes_set_a_short_cpu_thread_spin_before_torch_loads(code, env, expected) -> None:
    script = f"import os, sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\nprint(os.environ.get('GOMP_SPINCOUNT'))"
    clean = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert done.stdout.split()[-1] == expected


def test_detect_ignores_a_tile_budget_on_still_images_with_a_note(capsys, files: Path) -> None:
    assert main(["detect", str(files / "ok.jpg"), "--json", "--tile-budget", "2"]) == 0
    with_budget = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert with_budget["notes"] == ["tile_budget ignored: a still image has no history (every tile ran)"]
    assert main(["detect", str(files / "ok.jpg"), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plain["notes"] == [] and plain["images"][0]["detections"] == with_budget["images"][0]["detections"]


def test_detect_with_depth_prints_positions_and_json_keys(capsys, files: Path) -> None:
    depth = ["--depth", str(files / "depth.png"), "--camera-info", str(files / "info.yaml")]
    argv = [
        "detect",
        str(files / "ok.png"),
        *depth,
        "--tile-size",
        "160",
        "120",
        "--no-full-frame",
        "--conf",
        "0.01",
    ]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    detections = report["images"][0]["detections"]
    located = [d for d in detections if "position" in d]
    assert detections and located, detections
    for d in located:  # x, y, z from the box centre at 2.5 m through fx = fy = 100, cx 79.5, cy 59.5
        (x1, y1, x2, y2), (x, y, z) = d["box"], d["position"]
        assert z == pytest.approx(2.5) and d["size"][0] == pytest.approx((x2 - x1) * 0.025, abs=1e-3)
        assert x == pytest.approx(((x1 + x2) / 2 - 80) * 0.025, abs=1e-3)
        assert y == pytest.approx(((y1 + y2) / 2 - 60) * 0.025, abs=1e-3)
    assert all("size" not in d for d in detections if "position" not in d)
    assert main(argv) == 0
    assert " at x " in capsys.readouterr().out


def test_detect_with_a_depth_image_that_is_not_aligned_fails_that_image(
    capsys, files: Path, tmp_path: Path
) -> None:
    cv2.imwrite(str(tmp_path / "square.png"), np.full((100, 100), 1000, np.uint16))
    np.save(tmp_path / "grey.npy", np.zeros((120, 160, 3), np.float32))
    for depth, said in (("square.png", "another aspect ratio"), ("grey.npy", "one channel")):
        argv = [
            "detect",
            str(files / "ok.png"),
            "--depth",
            str(tmp_path / depth),
            "--camera-info",
            str(files / "info.yaml"),
        ]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"{depth}: no depth: " in err and said in err, err


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 frames of 64x48 as images and as a video, with MOTChallenge truth files good and bad."""
    folder = tmp_path_factory.mktemp("recording")
    (folder / "img1").mkdir()
    video = cv2.VideoWriter(str(folder / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for index in range(3):
        image = np.full((48, 64, 3), 40 * index, np.uint8)
        cv2.imwrite(str(folder / "img1" / f"{index + 1:06d}.png"), image)
        video.write(image)
    video.release()
    truths = {
        "gt.txt": "1,1,5,5,10,10,1,1,1\n3,1,7,5,10,10,1,1,1\n",
        "beyond.txt": "1,1,5,5,10,10,1,1,1\n4,1,7,5,10,10,1,1,1\n",  # frame 4 of 3
        "columns.txt": "1,1,5,5,10,10\n",
    }
    for name, text in truths.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--truth", "{dir}/beyond.txt", "--truth-class", "red_disc"],
            ["--truth {dir}/beyond.txt: holds frame 4 but --images {dir}/img1 has 3 frames"],
        ),
        (
            ["--truth", "{dir}/columns.txt", "--truth-class", "red_disc"],
            ["--truth {dir}/columns.txt: row 1 has 6 columns; a MOTChallenge gt.txt has 9"],
        ),
        (
            ["--truth", "{dir}/gt.txt", "--truth-class", "red_disc", "--truth-format", "voc"],
            ["--truth-format: unknown truth format 'voc'; expected one of: mot, coco"],
        ),
        (
            ["--truth", "{dir}/gt.txt", "--truth-class", "person"],
            [
                "--truth-class person: not a class of the bundled model (its labels: red_disc, blue_square",
                "--model, --labels or --params-file",
            ],
        ),
        (["--truth", "{dir}/gt.txt"], ["--truth needs --truth-class NAME"]),
        (["--truth-class", "red_disc"], ["--truth-class needs --truth FILE"]),
        (["--truth-format", "mot"], ["--truth-format needs --truth FILE"]),
    ],
)
def test_make_bag_truth_errors_are_one_line_and_write_nothing(
    capsys, tmp_path: Path, recording: Path, args: list[str], expected: list[str]
) -> None:
    argv = ["make-bag", str(tmp_path / "bag"), "--images", str(recording / "img1")]
    _one_line_error(
        capsys,
        [*argv, *(a.format(dir=recording) for a in args)],
        *(e.format(dir=recording) for e in expected),
    )
    assert list(tmp_path.iterdir()) == []  # no bag, no staging folder


def test_make_bag_truth_found_wrong_while_the_video_is_read_writes_nothing(
    capsys, tmp_path: Path, recording: Path
) -> None:
    """The video's length is known only once read: the frames went into the staging folder, which is removed."""
    argv = [
        "make-bag",
        str(tmp_path / "bag"),
        "--truth",
        str(recording / "beyond.txt"),
        "--truth-class",
        "red_disc",
    ]
    _one_line_error(capsys, argv, "--truth needs --images or --video: the frames its boxes are on")
    _one_line_error(
        capsys,
        [*argv, "--video", str(recording / "clip.avi")],
        f"--truth {recording}/beyond.txt: holds frame 4 but --video {recording}/clip.avi has 3 frames",
    )
    assert list(tmp_path.iterdir()) == []
    # --frames cut the video on purpose: the truth's later frames go with it
    assert main([*argv, "--video", str(recording / "clip.avi"), "--frames", "3"]) == 0
    assert "ground truth: 1 red_disc boxes" in capsys.readouterr().out
