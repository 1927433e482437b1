"""`tiled-detector bench`: every (backend, precision, size) is a measured row or says why it cannot run; the CSV,
the plot and the env report are written; the ratio is end to end over the same engine's model-only time."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from tiled_detector.cli import main
from tiled_detector.models import default_model_path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("bench")
    argv = [
        "bench",
        "--size",
        "640x480",
        "960x540",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--backend",
        "onnxruntime",
        "torch",
        "--precision",
        "fp32",
        "int8",
        "--out",
        str(out),
        "--peer",
        "sahi",
        "--json",
    ]
    return out, argv


def test_bench_writes_csv_plot_and_env_with_a_row_per_configuration(
    report, capsys, monkeypatch, tmp_path
) -> None:
    out, argv = report
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # int8's Q/DQ model, quantized from the sample frames
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert {"backend", "precision", "size", "total_ms", "stream_ms", "model_only_ms", "ratio", "fps"} <= set(
        rows[0]
    )
    assert "stream ms" in printed
    ours = [r for r in rows if r["backend"] != "sahi"]
    assert [(r["backend"], r["precision"], r["size"]) for r in ours] == [
        (backend, precision, size)
        for backend in ("onnxruntime", "torch")
        for precision in ("fp32", "int8")
        for size in ("640x480", "960x540")
    ]
    measured = [r for r in ours if r["status"] == "ok"]
    # the bundled model follows the backend: its ONNX file for ONNX Runtime, its TorchScript file for torch
    # int8 on ONNX Runtime: the model's Q/DQ copy (no --calibration: the bundled sample frames)
    assert [(r["backend"], r["precision"]) for r in measured] == [("onnxruntime", "fp32")] * 2 + [
        ("onnxruntime", "int8")
    ] * 2 + [("torch", "fp32")] * 2
    assert list((tmp_path / "tiled_detector" / "engines").glob("default-int8-*.qdq.onnx"))
    for r in measured:
        total, alone, ratio = float(r["total_ms"]), float(r["model_only_ms"]), float(r["ratio"])
        assert alone > 0 and total > 0 and ratio == pytest.approx(total / alone, rel=1e-2)
        # the steady time per frame over a stream of host frames, beside the one frame's latency
        streamed = float(r["stream_ms"])
        assert streamed > 0 and float(r["stream_ratio"]) == pytest.approx(streamed / alone, rel=1e-2)
        assert float(r["fps"]) == pytest.approx(1000 / total, rel=1e-2, abs=0.006)  # fps has two decimals
        assert float(r["infer_ms"]) > 0 and float(r["preprocess_p95_ms"]) >= float(r["preprocess_ms"])
        assert int(r["views"]) >= 2 and int(r["detections"]) > 0 and r["input"] == "host"
        assert 0 < float(r["tracker_300_ms"]) < 50  # the tracker's cost per frame at 300 detections (host)
    # a combination the engine cannot run is a row with its reason, never dropped
    reasons = {(r["backend"], r["precision"]): r["status"] for r in ours if r["status"] != "ok"}
    assert set(reasons) == {("torch", "int8")} and "int8 is not supported" in reasons[("torch", "int8")]
    peer = [r for r in rows if r["backend"] == "sahi"]
    # measured, or the reason: not installed, or ultralytics could not load the model
    assert len(peer) == 2 and all(r["status"].startswith(("ok", "unavailable", "failed: ")) for r in peer)
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    env = json.loads((out / "env.json").read_text())
    assert env["python"]["version"] and "gpus" in env
    assert "tracker (bytetrack, one camera, 300 detections a frame): " in printed
    last = json.loads(printed.strip().splitlines()[-1])
    assert len(last["rows"]) == len(rows)
    assert "onnxruntime  fp32      640x480" in printed


def test_bench_rejects_a_bad_size(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--size", "1920by1080"])
    assert "WIDTHxHEIGHT" in capsys.readouterr().err


def test_bench_model_only_makes_the_pipelines_engine_calls() -> None:
    from tiled_detector.detector import TiledDetector
    from tiled_detector.tools.benchmark import frame_for, model_only

    detector = TiledDetector(default_model_path(), max_batch=4)
    calls = []
    infer = detector.engine.infer
    detector.engine.infer = lambda batch: calls.append(tuple(batch.shape)) or infer(batch)
    detector.detect(frame_for(1920, 1080))  # 9 views
    pipeline, calls[:] = list(calls), []
    eager, graph = model_only(detector, 9)
    eager()
    assert graph is None  # CPU: nothing to capture
    # one bare engine call per chunk of max_batch, as the pipeline makes them (no splitting, copying or
    # concatenating inside `infer` that the pipeline does not do)
    assert calls == pipeline == [(4, 3, *detector.engine.input_hw)] * 2 + [(1, 3, *detector.engine.input_hw)]


def _stand_in_sahi(monkeypatch: pytest.MonkeyPatch, from_pretrained, get_sliced_prediction) -> None:
    """sahi and ultralytics (an optional extra, not installed here) replaced by modules with SAHI's API."""
    import sys
    import types

    sahi = types.ModuleType("sahi")
    sahi.AutoDetectionModel = types.SimpleNamespace(from_pretrained=from_pretrained)
    sahi_predict = types.ModuleType("sahi.predict")
    sahi_predict.get_sliced_prediction = get_sliced_prediction
    stand_ins = {"sahi": sahi, "sahi.predict": sahi_predict, "ultralytics": types.ModuleType("ultralytics")}
    for name, module in stand_ins.items():
        monkeypatch.setitem(sys.modules, name, module)


def test_bench_times_sahis_default_on_the_same_model_frames_and_tiling(tmp_path, monkeypatch, capsys) -> None:
    # stand-ins for sahi and ultralytics (an optional extra, not installed here): the command must call SAHI's
    # API as SAHI documents it and report the peer's row, its plot bar and the ratio to our fastest row
    import time

    loaded, predicted = [], []

    def from_pretrained(**kwargs):
        loaded.append(kwargs)
        return "sahi-model"

    def get_sliced_prediction(image, model, slice_height, slice_width, overlap_h, overlap_w, verbose):
        predicted.append((image.shape, model, slice_height, slice_width, overlap_h, overlap_w, verbose))
        time.sleep(0.3)  # slower than the bundled model here, so the ratio is > 1
        return []

    _stand_in_sahi(monkeypatch, from_pretrained, get_sliced_prediction)
    argv = [
        "bench",
        "--size",
        "640x480",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--backend",
        "onnxruntime",
        "--precision",
        "fp32",
        "--tile-size",
        "320",
        "256",
        "--overlap",
        "0.25",
        "--out",
        str(tmp_path),
        "--peer",
        "sahi",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    expected = {"model_type": "ultralytics", "model_path": str(default_model_path())}
    assert loaded == [{**expected, "confidence_threshold": 0.25, "device": "cpu"}]
    assert predicted == [((480, 640, 3), "sahi-model", 256, 320, 0.25, 0.25, 0)] * 3  # warm-up + runs
    rows = {r["backend"]: r for r in csv.DictReader((tmp_path / "bench.csv").open())}
    assert rows["sahi"]["status"] == "ok" and float(rows["sahi"]["total_ms"]) >= 300
    assert rows["sahi"]["ratio"] == "" and rows["sahi"]["model_only_ms"] == ""  # end to end only
    ratio = float(rows["sahi"]["total_ms"]) / float(rows["onnxruntime"]["total_ms"])
    assert f"640x480: SAHI's default takes {ratio:.1f}x our fastest (onnxruntime fp32)" in printed
    assert "sahi         default   640x480" in printed
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_bench_times_frames_already_on_the_device_with_no_upload(tmp_path) -> None:
    model = default_model_path().with_suffix(".ts")  # the bundled model as TorchScript
    argv = [
        "bench",
        "--model",
        str(model),
        "--size",
        "1280x720",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--backend",
        "torch",
        "--precision",
        "fp32",
        "--device",
        "cuda",
        "--input",
        "device",
        "--out",
        str(tmp_path),
    ]
    code = main(argv)
    (row,) = csv.DictReader((tmp_path / "bench.csv").open())
    assert code == 0, row["status"]
    assert row["input"] == "device" and int(row["h2d_bytes"]) == 0 and int(row["d2h_bytes"]) > 0


def test_a_peer_that_cannot_load_the_model_is_a_row_with_the_reason(monkeypatch) -> None:
    from tiled_detector.tools.benchmark import peer_sahi

    def from_pretrained(**kwargs):
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # what ultralytics does for device "cpu"
        raise TypeError("not a valid Ultralytics model path: ", AssertionError("Invalid device id"))

    _stand_in_sahi(monkeypatch, from_pretrained, None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    rows = peer_sahi(default_model_path(), [(640, 480), (1280, 720)], 2, 1, {})
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"  # later CUDA work in the process still sees the GPUs
    assert [(r.backend, r.size) for r in rows] == [("sahi", "640x480"), ("sahi", "1280x720")]
    assert all(r.status.startswith("failed: TypeError: ") and "Invalid device id" in r.status for r in rows)


def test_a_region_of_interest_row_shows_fewer_engine_views(tmp_path: Path, capsys) -> None:
    # 1080p, 640 px tiles: the lower half of the frame is 4 tiles + the full-frame view instead of 8 + 1 (at 4K:
    # 16 + 1 instead of 32 + 1, test_policy.py)
    common = [
        "bench",
        "--size",
        "1920x1080",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--backend",
        "onnxruntime",
        "--precision",
        "fp32",
    ]
    views = {}
    for name, extra in (("full", []), ("half", ["--roi", "0", "0.5", "1", "1"])):
        assert main([*common, "--out", str(tmp_path / name), *extra]) == 0
        (row,) = csv.DictReader((tmp_path / name / "bench.csv").open())
        views[name] = int(row["views"])
        lines = capsys.readouterr().out.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("backend "))
        assert lines[at].split()[3] == "views" and lines[at + 1].split()[3] == row["views"]
    assert views == {"full": 9, "half": 5}


def test_a_tile_budget_row_is_a_stream_with_its_views_per_frame(tmp_path: Path, capsys) -> None:
    # 1080p: 8 tiles; a budget of 2 runs 2 tiles + the full-frame view once the warm-up gave the stream history
    argv = [
        "bench",
        "--size",
        "1920x1080",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--backend",
        "onnxruntime",
        "--precision",
        "fp32",
        "--tile-budget",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    (row,) = csv.DictReader((tmp_path / "bench.csv").open())
    assert (row["views"], row["views_per_frame"], row["views_per_frame_max"]) == ("9", "3.0", "3")
    assert float(row["stream_ms"]) > 0  # the same stream, frames in a row
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("backend "))
    assert lines[at + 1].split()[3] == "3/9"


def test_the_csv_names_the_device_stage_and_kernel_columns() -> None:
    """Issue 59's columns, exactly: each stage's device milliseconds and the kernels of the captured frame graph
    (with the engine's alone beside them), empty where not measured (a CPU row)."""
    from tiled_detector.tools.benchmark import COLUMNS, Row, csv_text

    names = [
        f"{s}_device_ms"
        for s in ("preprocess", "model", "decode", "merge", "rotated", "masks", "labels", "download")
    ]
    assert set(names) | {"kernels", "model_kernels"} <= set(COLUMNS)
    header = (
        csv_text([Row("onnxruntime", "fp32", "640x480", values={"total_ms": 1.0})]).splitlines()[0].split(",")
    )
    assert set(names) | {"kernels"} <= set(header)


def test_the_plot_shows_each_rows_device_stages_and_kernels(tmp_path) -> None:
    """A CUDA row's device milliseconds per stage are a bar of their own below its host stages, labelled with its
    kernels; a row without them (a CPU row) has none."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    from tiled_detector.tools.benchmark import Row, plot

    gpu = Row("torch", "fp16", "1920x1080", values={"model_only_graph_ms": 0.7, "kernels": 174})
    gpu.values.update(
        preprocess_device_ms=0.05, model_device_ms=0.6, decode_device_ms=0.04, merge_device_ms=0.1
    )
    gpu.stages = {"upload": (0.4, 0.5), "graph": (1.0, 1.1), "download": (0.1, 0.1)}
    cpu = Row("onnxruntime", "fp32", "1920x1080", values={"model_only_ms": 30.0})
    cpu.stages = {"preprocess": (7.0, 8.0), "infer": (30.0, 31.0)}
    drawn = {}
    original = pyplot.subplots

    def spy(*args, **kwargs):
        drawn["figure"], drawn["axes"] = original(*args, **kwargs)
        return drawn["figure"], drawn["axes"]

    pyplot.subplots = spy
    try:
        plot([gpu, cpu], tmp_path / "bench.png")
    finally:
        pyplot.subplots = original
    labels = [t.get_text() for t in drawn["axes"].get_yticklabels()]
    assert labels == ["torch fp16 1920x1080", "  device, 174 kernels", "onnxruntime fp32 1920x1080"]
    legend = {t.get_text() for t in drawn["axes"].get_legend().get_texts()}
    assert {"model", "merge", "upload", "infer"} <= legend
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_bench_on_cuda_reports_device_stages_and_kernels(tmp_path) -> None:
    """The bundled model at 1080p fp16, frames on the device: every stage's device milliseconds and the captured
    graph's kernels; our kernels (the frame graph's less the engine's) within issue 59's 40."""
    argv = [
        "bench",
        "--size",
        "1920x1080",
        "--runs",
        "3",
        "--warmup",
        "2",
        "--backend",
        "torch",
        "--precision",
        "fp16",
        "--device",
        "cuda",
        "--input",
        "device",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    (row,) = csv.DictReader((tmp_path / "bench.csv").open())
    for stage in ("preprocess", "model", "decode", "merge", "download"):
        assert float(row[f"{stage}_device_ms"]) > 0, stage
    assert row["rotated_device_ms"] == row["masks_device_ms"] == row["labels_device_ms"] == ""
    assert int(row["kernels"]) > int(row["model_kernels"]) > 0
    assert int(row["kernels"]) - int(row["model_kernels"]) <= 40
