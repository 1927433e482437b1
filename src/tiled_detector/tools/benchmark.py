"""`tiled-detector bench`: the pipeline's time per frame against its own engine's model-only time on the same
batch, measured alternately in one loop (these machines are noisy: the ratio is what is compared).

One configuration = (backend, precision, frame size). Each gets per-stage median and p95, end to end (one frame's
latency), the steady time per frame over a stream of frames (`stream_ms`: each frame's copy to the device staged
while the one before runs), the model alone on a batch of the same size (eager, and replayed as a CUDA graph where
the engine can be captured), their ratios, frames/s, host<->device bytes per frame (counted by torch.profiler on CUDA) and peak GPU memory. A
combination an engine cannot run is a row with its reason, never dropped.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from tiled_detector.detector import TiledDetector
from tiled_detector.engines.cache import atomic_write
from tiled_detector.models import coco_labels
from tiled_detector.pipeline.encodings import Encoding
from tiled_detector.pipeline.tiling import batch_plan
from tiled_detector.runtime.devices import cuda_graph, graph_nodes
from tiled_detector.runtime.errors import one_line
from tiled_detector.stream import Job, Stream
from tiled_detector.tools.peers import FAMILIES, model_family, sahi_model
from tiled_detector.tools.worlds.synthetic import make_scene
from tiled_detector.tracking.bytetrack import TrackerKind
from tiled_detector.types import Detections

T = TypeVar("T")

# the frame program's stages whose device milliseconds `device_stages` reports (`<stage>_device_ms`): `rotated` is
# the post-processing of a rotated-box model (seam rule, merge and policy in polygon geometry), `merge` that of
# axis-aligned boxes; `labels` the label images (with `--masks-subscribed`)
DEVICE_STAGES = ("preprocess", "model", "decode", "merge", "rotated", "masks", "labels", "download")
STAGE_NAMES = {"infer": "model"}  # the frame program's stage marks -> DEVICE_STAGES
HOLD_MS = 20.0  # at least: the device held back while the host queues an eager frame (`device_stages`)
COLUMNS = (
    "backend",
    "precision",
    "size",
    "input",
    "tile_size",
    "cuda_graph",
    "cuda_graph_reason",
    "views",
    "views_per_frame",
    "views_per_frame_max",
    "engine_calls",
    "detections",
    "total_ms",
    "total_p95_ms",
    "stream_ms",
    "stream_ratio",
    "model_only_ms",
    "model_only_graph_ms",
    "ratio",
    "fps",
    "h2d_bytes",
    "d2h_bytes",
    "peak_gpu_mb",
    "kernels",
    "model_kernels",
    *(f"{stage}_device_ms" for stage in DEVICE_STAGES),
    "tracker_300_ms",
    "status",
)
TRACKED_DETECTIONS = 300  # detections per frame of the tracker's cost column
FRAME_NS = 33_333_333  # a benchmarked stream's frame period (30 Hz)
STREAM_FRAMES = 3  # distinct frame objects cycled through by `stream_ms` (copies of the benchmark frame)


@dataclass
class Row:
    """One configuration's measurements (times in ms, medians unless named p95)."""

    backend: str
    precision: str
    size: str
    status: str = "ok"
    values: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)  # stage -> (median, p95)

    def record(self) -> dict[str, Any]:
        """The CSV row: the fixed columns, then `<stage>_ms` and `<stage>_p95_ms` per stage."""
        out = {"backend": self.backend, "precision": self.precision, "size": self.size, "status": self.status}
        out.update(self.values)
        for stage, (median, p95) in self.stages.items():
            out[f"{stage}_ms"], out[f"{stage}_p95_ms"] = round(median, 3), round(p95, 3)
        return out


def _p95(samples: Sequence[float]) -> float:
    return float(np.percentile(samples, 95))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(function: Callable[[], Any], device: torch.device) -> float:
    """Wall milliseconds of `function()`, device work included."""
    _synchronize(device)
    start = time.perf_counter()
    function()
    _synchronize(device)
    return (time.perf_counter() - start) * 1000.0


def _memcpys(trace_path: Path) -> list[tuple[str, int | None]]:
    """(direction, bytes) of every memcpy in a chrome trace written by torch.profiler."""
    events = json.loads(trace_path.read_text()).get("traceEvents", [])
    copies = []
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") in {"gpu_memcpy", "Memcpy"} or name.startswith("Memcpy"):
            direction = "HtoD" if "HtoD" in name else "DtoH" if "DtoH" in name else "other"
            nbytes = event.get("args", {}).get("bytes")
            copies.append((direction, int(nbytes) if nbytes is not None else None))
    return copies


def profiled_copies(function: Callable[[], T]) -> tuple[T, list[tuple[str, int | None]], Any]:
    """`function()`'s result, every memcpy ("HtoD", "DtoH" or "other", bytes) while it ran on CUDA, and the
    profiler (for its tables)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        result = function()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        return result, _memcpys(trace), prof


def transfer_bytes(function: Callable[[], Any]) -> tuple[int, int]:
    """Host-to-device and device-to-host bytes copied while `function()` runs (CUDA, torch.profiler)."""
    _, copies, _ = profiled_copies(function)
    return tuple(sum(b or 0 for d, b in copies if d == way) for way in ("HtoD", "DtoH"))  # type: ignore[return-value]


def model_only(detector: TiledDetector, views: int) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """The engine alone on `views` images, one bare call per chunk of at most max_batch as the pipeline makes
    them, and the same calls replayed as a CUDA graph where the engine can be captured (else None: also for a
    model whose forward cannot be captured)."""
    engine = detector.engine
    shape = (views, *engine.input.shape[1:])
    # in the layout the pipeline's preprocessor writes
    batch = torch.rand(shape, generator=torch.Generator().manual_seed(0)).to(
        engine.device, engine.input.dtype, memory_format=engine.memory_format
    )
    chunks = torch.split(batch, engine.max_batch)
    eager = lambda: [engine.infer(chunk) for chunk in chunks]  # noqa: E731
    if engine.device.type != "cuda" or not engine.capturable:
        return eager, None
    try:
        replay, _ = cuda_graph(eager)
    except RuntimeError:  # a model whose forward cannot be captured (a host tensor, a host sync): eager only
        return eager, None
    return eager, replay


def measure(
    detector: TiledDetector,
    frame: np.ndarray | torch.Tensor,
    runs: int,
    warmup: int,
    row: Row,
    progress: Callable[..., None] = lambda steps=1: None,
) -> Row:
    """Alternate the pipeline and the model alone `runs` times after `warmup` rounds; fill `row`. A torch `frame`
    on the engine's device is timed from there (no host-to-device copy: GPU-decoded or zero-copy sources).

    With `tile_budget` or `tracker` the frame is a stream (the same frame every 33 ms, through `Stream`: schedule,
    camera-motion estimate and tracks included in the time, the estimate as the stage `motion`); views per frame
    are those of the timed runs, and the model alone runs that many views (the warm-up runs every tile on the
    stream's first frames)."""
    device = detector.engine.device
    plan = detector.plan_for(*frame.shape[:2])
    stream, counted = Stream(detector), []

    streaming = detector.config.tile_budget or detector.config.tracker is not TrackerKind.NONE

    def step() -> None:
        if not streaming:
            found = detector.detect(frame)
            if detector.label_images and found.masks is not None:
                found.masks.labels  # noqa: B018 (the label image, as the node publishes it)
            stages.append(found.timings)
            counted.append(plan.batch_size)
            return
        result = stream.process([frame], [len(counted) * FRAME_NS], ["bench"])[0]
        stages.append(result.detections.timings)
        counted.append(result.views)

    budget = stream.budget_for(plan)
    eager, graph = model_only(detector, budget + int(plan.full_frame) if budget else plan.batch_size)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    walls, model, model_graph, stages = [], [], [], []
    for i in range(warmup + runs):
        wall = _timed(step, device)
        model_ms = _timed(eager, device)
        graph_ms = _timed(graph, device) if graph is not None else float("nan")
        if i >= warmup:
            walls.append(wall)
            model.append(model_ms)
            model_graph.append(graph_ms)
        progress()
    per_frame = stream_time(detector, frame, runs, stream if streaming else None, len(counted))
    found = len(detector.detect(frame))
    stages = stages[warmup:]
    h2d, d2h = transfer_bytes(lambda: detector.detect(frame)) if device.type == "cuda" else (0, 0)
    total, alone = statistics.median(walls), statistics.median(model)
    best_alone = min(alone, statistics.median(model_graph)) if graph is not None else alone
    row.values.update(
        input="host" if isinstance(frame, np.ndarray) or frame.device.type == "cpu" else "device",
        tile_size="x".join(map(str, detector.tile_size)),  # auto: the model's input size
        # the frame captured whole, captured around an engine that cannot be (its calls eager), or not at all
        cuda_graph="split" if detector._runner.split else "whole" if detector._runner.captures else "off",
        # why not whole, where the frame program is captured: what the engine says, or why its capture failed
        cuda_graph_reason=detector.engine.capture_problem or detector._runner.reason
        if device.type == "cuda" and detector.config.cuda_graph
        else "",
        views=plan.batch_size,
        views_per_frame=round(float(np.mean(counted[warmup:])), 2),
        views_per_frame_max=int(max(counted[warmup:])),
        # engine calls per frame: the frame program's chunks of at most max_batch views
        engine_calls=round(float(np.mean([-(-v // detector.engine.max_batch) for v in counted[warmup:]])), 2),
        detections=found,
        total_ms=round(total, 3),
        total_p95_ms=round(_p95(walls), 3),
        stream_ms=round(per_frame, 3),
        stream_ratio=round(per_frame / best_alone, 3),
        model_only_ms=round(alone, 3),
        model_only_graph_ms=round(statistics.median(model_graph), 3) if graph is not None else "",
        ratio=round(total / best_alone, 3),
        fps=round(1000.0 / total, 2),
        h2d_bytes=h2d,
        d2h_bytes=d2h,
        peak_gpu_mb=round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        if device.type == "cuda"
        else "",
    )
    if device.type == "cuda":
        row.values.update(kernels=detector._runner.nodes() or "", model_kernels=_nodes(graph))
        row.values.update({f"{k}_device_ms": round(v, 4) for k, v in device_stages(detector, frame).items()})
    names = [n for n in stages[0] if n != "total"]
    row.stages = {
        n: (statistics.median(s.get(n, 0.0) for s in stages), _p95([s.get(n, 0.0) for s in stages]))
        for n in names
    }
    return row


def _nodes(replay: Callable[[], Any] | None) -> int | str:
    """A captured graph's node count, '' where there is none or it cannot be read."""
    count = None if replay is None else graph_nodes(replay)
    return "" if count is None else count


def device_stages(
    detector: TiledDetector, frame: np.ndarray | torch.Tensor, runs: int = 5
) -> dict[str, float]:
    """Device milliseconds of each stage of the frame program (`DEVICE_STAGES`), median of `runs`: the same program,
    settings and limits as the captured one, run eagerly with a CUDA event at each stage boundary, behind a hold of
    the device (`torch.cuda._sleep`) long enough that the host has queued the whole frame before the device starts
    it, so the events time the device's work, not the host's launches; the download into pinned memory. With
    `label_images` on (`--masks-subscribed`), the label images' composition as `labels`."""
    device = detector.engine.device
    frames = [torch.as_tensor(frame).to(device)]
    plan = batch_plan([detector.plan_for(*frames[0].shape[:2])])
    settings, limits, program = detector.frame_settings, detector._limits, detector._program
    labels = bool(detector.label_images) and detector.resolved.segments and settings.masks is not False
    merge = "rotated" if detector.rotated else "merge"
    totals: dict[str, list[float]] = {}
    hold = HOLD_MS
    for run in range(runs + 1):  # (the first, unrecorded, allocates and times the host's queueing)
        marks: list[tuple[str, Any]] = []

        def mark(stage: str, marks: list[tuple[str, Any]] = marks) -> None:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks.append((stage, event))

        torch.cuda.synchronize(device)
        if run and hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(int(hold * 2e6))  # about `hold` ms at 2 GHz: longer than the host's queueing
        mark("start")
        queued = time.perf_counter()
        packed, _, built = program([frames[0]], [Encoding.RGB8], plan, settings, limits, mark, labels=labels)
        hold = max(hold, 2.0 * (time.perf_counter() - queued) * 1e3)
        data = (
            packed if built is None else torch.cat([packed.contiguous().view(torch.uint8).reshape(-1), built])
        )
        host = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
        host.copy_(data, non_blocking=True)
        mark("download")
        torch.cuda.synchronize(device)
        if run == 0:
            continue
        spent: dict[str, float] = {}
        for (_, before), (stage, after) in itertools.pairwise(marks):
            name = STAGE_NAMES.get(stage, stage)
            name = merge if name == "merge" else name
            spent[name] = spent.get(name, 0.0) + before.elapsed_time(after)
        for name, ms in spent.items():
            totals.setdefault(name, []).append(ms)
    return {name: statistics.median(values) for name, values in totals.items() if name in DEVICE_STAGES}


def stream_time(
    detector: TiledDetector,
    frame: np.ndarray | torch.Tensor,
    count: int,
    stream: Stream | None = None,
    first: int = 0,
) -> float:
    """Milliseconds per frame over `count` frames in a row (`STREAM_FRAMES` copies of `frame` in turn, host frames
    staged while the frame before runs: `TiledDetector.stage`, as the node's worker feeds them), from the first
    call to the last result; through `stream` (frames numbered from `first`) where given."""
    device = detector.engine.device
    frames = [frame] + [
        frame.clone() if isinstance(frame, torch.Tensor) else frame.copy() for _ in range(1, STREAM_FRAMES)
    ]
    order = [frames[i % len(frames)] for i in range(count + 1)]

    def feed(i: int) -> Callable[[], None]:
        return lambda: detector.stage([order[i + 1]], slots=[0])

    _synchronize(device)
    start = time.perf_counter()
    for i in range(count):
        if stream is None:
            detector.detect_many([order[i]], slots=[0], while_running=feed(i))
        else:
            job = Job("bench", order[i], (first + i) * FRAME_NS, slot=0)
            stream.run([job], 0, feed(i))
    _synchronize(device)
    return (time.perf_counter() - start) * 1000.0 / max(count, 1)


def frame_for(width: int, height: int, rotated: bool = False) -> np.ndarray:
    """The benchmark frame of a size: a synthetic scene (objects of the bundled model's classes; `rotated`: of the
    bundled rotated-box model's, `rotated_scenes`)."""
    if rotated:
        from tiled_detector.tools.worlds.rotated_scenes import make_rotated_scene

        return make_rotated_scene(1, width, height).image
    return make_scene(1, width, height).image


def run_bench(
    settings: dict[str, Any],
    backends: Iterable[str],
    precisions: Iterable[str],
    sizes: Iterable[tuple[int, int]],
    runs: int,
    warmup: int,
    build: Callable[[dict[str, Any]], TiledDetector],
    progress: Callable[..., None] = lambda steps=1: None,
    on_device: bool = False,
    masks_subscribed: bool = False,
) -> list[Row]:
    """Every (backend, precision, size): a measured row, or a row saying why that combination cannot run;
    `on_device` times frames already on the engine's device (copied there once, before timing);
    `masks_subscribed` has each frame's label image made as the node makes it while `masks` has a subscriber
    (`TiledDetector.label_images`: on the device on CUDA) and read (`InstanceMasks.labels`)."""
    rows = []
    tracker_ms = round(tracker_cost(), 3)
    for backend in backends:
        for precision in precisions:
            try:
                detector = build({**settings, "backend": backend, "precision": precision})
                detector.label_images = masks_subscribed
                reason = None
            except (ValueError, RuntimeError, ImportError, NotImplementedError) as error:
                detector, reason = None, str(error).splitlines()[0]
            for width, height in sizes:
                name = backend if detector is None else detector.engine.backend.value
                row = Row(name, precision, f"{width}x{height}")
                if detector is None:
                    row.status = f"unsupported: {reason}"
                    progress(warmup + runs)
                else:
                    frame = frame_for(width, height, detector.rotated)
                    source = torch.from_numpy(frame).to(detector.engine.device) if on_device else frame
                    measure(detector, source, runs, warmup, row, progress)
                rows.append(row)
    for row in rows:
        if row.status == "ok":
            row.values["tracker_300_ms"] = tracker_ms
    return rows


def tracker_cost(count: int = TRACKED_DETECTIONS, frames: int = 120, passes: int = 3) -> float:
    """Milliseconds of one tracker update (ByteTrack, one camera, on the host) with `count` detections a frame:
    objects of 8-60 px moving a few pixels per frame over a 1920x1080 frame at 30 Hz. The scene is tracked
    `passes` times, each by a new tracker; the result is the lowest of the passes' median times (the best-of-n
    convention of Python's `timeit`: other processes on a shared machine only ever add time)."""
    from tiled_detector.tracking.bytetrack import TrackerSettings
    from tiled_detector.tracking.tracks import Tracks

    rng = np.random.default_rng(0)
    corner = rng.uniform(0, 1860, (count, 2))
    size = rng.uniform(8, 60, (count, 2))
    velocity = rng.normal(0, 3, (count, 2))
    classes = rng.integers(0, 4, count)
    scores = rng.uniform(0.3, 1.0, (frames, count))
    medians = []
    for _ in range(passes):
        tracks = Tracks(TrackerSettings())
        times = []
        for frame in range(frames):
            boxes = np.concatenate([corner + velocity * frame, corner + velocity * frame + size], axis=1)
            start = time.perf_counter()
            tracks.update(frame * 33_333_333, Detections(boxes, scores[frame], classes, {}))
            times.append((time.perf_counter() - start) * 1000.0)
        medians.append(statistics.median(times[frames // 4 :]))
    return min(medians)


def csv_text(rows: Sequence[Row]) -> str:
    """All rows as CSV: the fixed columns, then every stage's median and p95."""
    records = [r.record() for r in rows]
    extra = sorted({k for r in records for k in r} - set(COLUMNS))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*COLUMNS, *extra], restval="")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def _model_ms(row: Row) -> float | None:
    """The model-only time a row's ratio is taken to (CUDA graph when measured), None for a peer's row."""
    graph, eager = row.values.get("model_only_graph_ms", ""), row.values.get("model_only_ms", "")
    value = graph if graph != "" else eager
    return None if value == "" else float(value)


def table(rows: Sequence[Row]) -> str:
    """A fixed-width table of the main columns (views: engine images per frame; under a tile budget, the mean run
    per frame / the plan's)."""
    lines = [
        f"{'backend':<12} {'precision':<9} {'size':<10} {'views':>7} {'total ms':>9} {'stream ms':>9} "
        f"{'model ms':>9} {'ratio':>6} {'fps':>7}  status"
    ]
    for row in rows:
        v = row.values
        if row.status != "ok":
            lines.append(
                f"{row.backend:<12} {row.precision:<9} {row.size:<10} {'':>7} {'':>9} {'':>9} {'':>9} "
                f"{'':>6} {'':>7}  {row.status}"
            )
            continue
        model = _model_ms(row)  # None for a peer, timed end to end only
        model_text, ratio = ("", "") if model is None else (f"{model:.2f}", f"{v['ratio']:.2f}")
        views = v.get("views", "")  # with a tile budget: the mean views run per frame of the plan's
        if v.get("views_per_frame", views) != views:
            views = f"{v['views_per_frame']:g}/{views}"
        streamed = v.get("stream_ms", "")  # (a peer's row has none)
        streamed = f"{streamed:.2f}" if streamed != "" else ""
        lines.append(
            f"{row.backend:<12} {row.precision:<9} {row.size:<10} {views!s:>7} {v['total_ms']:>9.2f} "
            f"{streamed:>9} {model_text:>9} {ratio:>6} {v['fps']:>7.1f}  ok"
        )
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: Path, what: str = "") -> None:
    """Stacked stage times per configuration (PNG, written atomically); below each CUDA row its device
    milliseconds per stage (`<stage>_device_ms`) and the kernels its captured graph launches; `what` (the model and
    the machine) goes under the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r.status == "ok"]
    # (label, stage -> ms, the model alone or None): each row's host stages, then its device stages where measured
    bars: list[tuple[str, dict[str, float], float | None]] = []
    for r in measured:
        bars.append(
            (f"{r.backend} {r.precision} {r.size}", {k: v[0] for k, v in r.stages.items()}, _model_ms(r))
        )
        device = {
            s: float(r.values[f"{s}_device_ms"])
            for s in DEVICE_STAGES
            if r.values.get(f"{s}_device_ms", "") != ""
        }
        if device:
            kernels = r.values.get("kernels", "")
            bars.append((f"  device, {kernels} kernels" if kernels != "" else "  device", device, None))
    stages = list(dict.fromkeys(s for _, spent, _ in bars for s in spent))
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * max(len(bars), 1)))
    labels = [label for label, _, _ in bars]
    left = np.zeros(len(bars))
    for stage in stages:
        widths = np.array([spent.get(stage, 0.0) for _, spent, _ in bars])
        ax.barh(range(len(bars)), widths, left=left, label=stage)
        left += widths
    ax.set_yticks(range(len(bars)), labels)
    ends = [0.0 if r.stages else r.values["total_ms"] for r in measured]  # a peer: timed end to end only
    peers = np.zeros(len(bars))
    peers[[i for i, (label, _, _) in enumerate(bars) if not label.startswith(" ")]] = ends
    if peers.any():
        ax.barh(range(len(bars)), peers, left=left, label="peer, end to end", color="grey")
    for y, (_, _, model) in enumerate(bars):
        if model is not None:
            ax.plot([model, model], [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per frame (median); black: the model alone on the same batch")
    ax.set_title("tiled-detector bench: stage times" + (f"\n{what}" if what else ""))
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, buffer.getvalue())


def peer_sahi(
    model: Path, sizes: Iterable[tuple[int, int]], runs: int, warmup: int, settings: dict[str, Any]
) -> list[Row]:
    """SAHI's default sliced prediction (greedy NMM on IOS 0.5, full frame added) on the same model, frames and
    tiling (auto: the model's input size): SAHI's ultralytics model, or for a YOLOX, PP-PicoDet or NanoDet file our
    `DetectionModel` of its family (`tools.peers`: the family's own pre/post-processing on the same engine); rows
    saying why when sahi or ultralytics are not importable (an optional extra)."""
    device = settings.get("device", "cpu")
    family, input_hw = model_family(
        model, settings.get("backend", "auto"), device, settings.get("layout", "auto")
    )
    try:
        if family not in FAMILIES:
            import ultralytics  # noqa: F401 - SAHI's ultralytics model needs it
        from sahi import AutoDetectionModel
        from sahi.predict import get_sliced_prediction
    except ImportError as error:
        reason = f"unavailable: {error} (pip install sahi ultralytics)"
        return [Row("sahi", "default", f"{w}x{h}", reason) for w, h in sizes]
    tile_w, tile_h = settings.get("tile_size") or input_hw[::-1]
    overlap = float(settings.get("overlap", 0.2))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    conf = float(settings.get("conf_threshold", 0.25))
    try:
        if family in FAMILIES:  # SAHI has no model of these families: ours, with the family's own processing
            labels = settings.get("labels") or coco_labels()
            peer = sahi_model(model, family, labels, device, conf, settings.get("backend", "auto"))
        else:
            peer = AutoDetectionModel.from_pretrained(
                model_type="ultralytics", model_path=str(model), confidence_threshold=conf, device=device
            )
    except Exception as error:  # SAHI wraps whatever ultralytics raises (a format or device it cannot load)
        return [Row("sahi", "default", f"{w}x{h}", f"failed: {one_line(error)}") for w, h in sizes]
    finally:  # ultralytics hides the GPUs from the process for device "cpu": later CUDA work must still see them
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    rows = []
    for width, height in sizes:
        predict = functools.partial(
            get_sliced_prediction,
            frame_for(width, height),
            peer,
            tile_h,
            tile_w,
            overlap,
            overlap,
            verbose=0,
        )
        walls = [_timed(predict, torch.device(device)) for _ in range(warmup + runs)][warmup:]
        total = statistics.median(walls)
        row = Row("sahi", "default", f"{width}x{height}")
        row.values.update(
            total_ms=round(total, 3), total_p95_ms=round(_p95(walls), 3), fps=round(1000 / total, 2)
        )
        rows.append(row)
    return rows
