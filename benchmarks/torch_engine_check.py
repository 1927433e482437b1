"""Which way of running a torch model is fastest on this GPU, and exact enough: fp32, .half(), autocast,
channels_last, cuDNN autotuning, torch.compile, each eager and replayed as a CUDA graph.

    PYTHONPATH=src python benchmarks/torch_engine_check.py [--runs 50] [--batches 9 33]

The model is the YOLOv8n architecture (random weights, benchmarks/networks.py) traced to TorchScript and
exported with torch.export, as the torch engine loads them. Prints one line per variant and batch: median ms
eager, median ms as a CUDA graph, and the largest absolute difference of the output from the fp32 result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from networks import YoloV8nLike


def _median_ms(function: Callable[[], object], runs: int) -> float:
    for _ in range(3):
        function()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _graph(function: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    from tiled_detector.runtime.devices import cuda_graph

    return cuda_graph(function)


def variants(
    traced: Path, exported: Path, device: torch.device, compile_too: bool
) -> dict[str, Callable[[torch.Tensor], object]]:
    """name -> (fp32 batch -> model output), each preparing its module once."""
    out: dict[str, Callable[[torch.Tensor], object]] = {}
    fp32 = torch.jit.load(str(traced), map_location=device).eval()
    half = torch.jit.load(str(traced), map_location=device).eval().half()
    half_cl = (
        torch.jit.load(str(traced), map_location=device).eval().half().to(memory_format=torch.channels_last)
    )
    out["fp32"] = fp32
    out["fp16 .half()"] = half
    out["fp16 .half() channels_last"] = lambda x: half_cl(x.contiguous(memory_format=torch.channels_last))

    def autocast(x: torch.Tensor) -> object:
        with torch.autocast("cuda", dtype=torch.float16):
            return fp32(x)

    out["fp16 autocast"] = autocast
    program = torch.export.load(str(exported)).module().to(device)
    out["fp32 torch.export"] = program
    if not compile_too:
        return out
    try:
        started = time.perf_counter()
        compiled = torch.compile(torch.export.load(str(exported)).module().to(device).half())
        compiled(torch.zeros(9, 3, 640, 640, device=device, dtype=torch.float16))
        print(f"torch.compile: first call (compile) {time.perf_counter() - started:.1f} s")
        out["fp16 torch.compile"] = compiled
    except Exception as error:  # report and go on: compile needs a working triton toolchain
        print(f"torch.compile: unavailable ({str(error).splitlines()[0][:200]})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--batches", type=int, nargs="+", default=[9, 33])
    parser.add_argument("--compile", action="store_true", help="also torch.compile (minutes)")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = YoloV8nLike().eval().to(device)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        traced = Path(tmp) / "yolo.ts"
        torch.jit.save(torch.jit.trace(model, torch.zeros(2, 3, 640, 640, device=device)), str(traced))
        exported = Path(tmp) / "yolo.pt2"
        batch_dim = torch.export.Dim("batch", min=1, max=64)
        torch.export.save(
            torch.export.export(
                model, (torch.zeros(2, 3, 640, 640, device=device),), dynamic_shapes=({0: batch_dim},)
            ),
            str(exported),
        )
        for benchmark in (False, True):
            torch.backends.cudnn.benchmark = benchmark
            table = variants(traced, exported, device, args.compile and benchmark)
            for batch in args.batches:
                x32 = torch.rand(
                    batch, 3, 640, 640, device=device, generator=torch.Generator(device).manual_seed(1)
                )
                reference = table["fp32"](x32)
                for name, run in table.items():
                    x = x32.half() if ("half" in name or "compile" in name) else x32
                    out = run(x)
                    error = (out.float() - reference).abs().max().item()
                    eager_ms = _median_ms(lambda run=run, x=x: run(x), args.runs)
                    try:
                        replay, _ = _graph(lambda run=run, x=x: run(x))
                        graph_ms = _median_ms(replay, args.runs)
                    except Exception as failure:
                        graph_ms = float("nan")
                        print(f"  {name}: no CUDA graph ({str(failure).splitlines()[0][:120]})")
                    print(
                        f"cudnn.benchmark={benchmark} batch {batch:>3} {name:<28} eager {eager_ms:7.2f} ms  "
                        f"graph {graph_ms:7.2f} ms  max |diff| vs fp32 {error:.2e}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
