"""The main job, end to end: `tiled-detector demo` as a user runs it (node process, sample bag, report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.ros
@pytest.mark.slow
def test_demo_prints_a_json_report_and_writes_the_annotated_frame(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tiled_detector.cli", "demo", "--frames", "3", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["frames"] == report["frames_sent"] == 3
    assert report["frames_with_detections"] == 3
    assert report["detections"] > 30
    assert 0 < report["latency_ms_p50"] <= report["latency_ms_p95"]
    assert report["fps"] > 0
    assert report["AP50"] >= 0.8
    image = Path(report["annotated_image"])
    assert image.is_file() and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "sample_bag" / "metadata.yaml").is_file()
    assert (out / "replay" / "report.json").is_file()


@pytest.mark.ros
@pytest.mark.slow
def test_demo_motion_tracks_the_moving_scene_and_prints_idf1_with_ap50(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiled_detector.cli",
            "demo",
            "--motion",
            "--frames",
            "8",
            "--width",
            "960",
            "--height",
            "540",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    ap50 = next(line for line in lines if line.startswith("against ground truth: AP50 "))
    tracking = next(line for line in lines if line.startswith("tracking: IDF1 "))
    assert float(ap50.split()[4].rstrip(",")) >= 0.8 and float(tracking.split()[2].rstrip(",")) >= 0.7, lines
