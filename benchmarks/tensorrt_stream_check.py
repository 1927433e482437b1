"""The TensorRT engine's CUDA side on a GPU without TensorRT: streams, events, CUDA graphs, the device.

    PYTHONPATH=src python3 benchmarks/tensorrt_stream_check.py            # a CUDA machine (cuda:1 too when there)
    PYTHONPATH=src python3 benchmarks/tensorrt_stream_check.py --device cpu   # dry run: the stand-in's own logic

`TensorRTEngine` runs over a stand-in of TensorRT's runtime (no TensorRT needed) whose "kernels" are torch ops
enqueued on the stream handle the engine gives `execute_async_v3` (`torch.cuda.ExternalStream`), each after
`torch.cuda._sleep`, so that a missing wait between streams shows up as a wrong result rather than passing by luck:
- eager on torch's default stream: the engine enqueues on its own stream (never a default stream), the input
  written before and the output read after on torch's stream are ordered by the events;
- a caller's batch bound in place and freed at once (its memory reused on torch's stream) is read intact
  (record_stream);
- a misaligned caller batch is copied, and read intact;
- CUDA graphs captured at two batch sizes (one execution context each) and replayed alternately with new inputs
  give each size's result;
- with a second GPU: the engine on cuda:1 while torch's current device is 0 makes cuda:1 current for every call
  into the runtime, and computes there.
What it cannot check: TensorRT itself (its kernels, its host-side state in a captured graph): see docs/TENSORRT.md.
Prints PASS / FAIL per check and ALL PASS at the end (exit status 1 on a failure).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import types
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tiled_detector.engines import base as engine_base
from tiled_detector.engines import tensorrt as trt_mod

C, H, W, K = 3, 64, 64, 16  # input (C, H, W); output (K,) per image: the first K values of the image, doubled
MAX_BATCH = 8
SLEEP_CYCLES = (
    5_000_000  # a few milliseconds per enqueue: long enough for an unordered read to see stale memory
)


class Registry:
    """The tensors behind the addresses the engine hands the runtime (TensorRT gets raw pointers); held weakly, so
    that a caller's batch is freed when the caller drops it."""

    def __init__(self) -> None:
        self.tensors: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    def add(self, tensor: torch.Tensor) -> torch.Tensor:
        self.tensors[tensor.data_ptr()] = tensor
        return tensor

    def view(self, address: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The memory at `address` as a tensor of `shape` (inside a registered tensor)."""
        for start, tensor in list(self.tensors.items()):
            offset = address - start
            size = tensor.numel() * tensor.element_size()
            if 0 <= offset < size:
                flat = tensor.view(-1)
                first = offset // tensor.element_size()
                count = int(torch.Size(shape).numel())
                return flat[first : first + count].view(shape)
        raise AssertionError(f"address {address:#x} is not inside any registered tensor")


class Context:
    """An IExecutionContext stand-in: its input shape set once, its kernel torch ops on the given stream."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.shape: tuple[int, ...] | None = None
        self.addresses: dict[str, int] = {}
        self.shape_sets = 0

    def set_device_memory(self, memory: int, size: int) -> None:
        self.runtime.check_device("set_device_memory")

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shape, self.shape_sets = tuple(shape), self.shape_sets + 1
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        assert self.shape is not None
        return (self.shape[0], K)

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        self.runtime.check_device("execute_async_v3")
        self.runtime.handles.append(stream_handle)
        assert self.shape is not None
        source = self.runtime.registry.view(self.addresses["images"], self.shape)
        target = self.runtime.registry.view(self.addresses["output0"], (self.shape[0], K))
        if source.device.type != "cuda":  # the dry run
            target.copy_(source.flatten(1)[:, :K] * 2)
            return True
        with torch.cuda.stream(torch.cuda.ExternalStream(stream_handle, device=source.device)):
            torch.cuda._sleep(SLEEP_CYCLES)
            target.copy_(source.flatten(1)[:, :K] * 2)
        return True


class Engine:
    """An ICudaEngine stand-in: input "images" (-1, C, H, W) float, output "output0" (-1, K) float."""

    num_io_tensors = 2
    device_memory_size_v2 = 1 << 20

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.contexts: list[Context] = []

    def get_tensor_name(self, index: int) -> str:
        return ("images", "output0")[index]

    def get_tensor_mode(self, name: str) -> str:
        return "INPUT" if name == "images" else "OUTPUT"

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (-1, C, H, W) if name == "images" else (-1, K)

    def get_tensor_dtype(self, name: str) -> Any:
        return types.SimpleNamespace(name="FLOAT")

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
        return [(1, C, H, W), (MAX_BATCH, C, H, W), (MAX_BATCH, C, H, W)]

    def create_execution_context(self, strategy: str) -> Context:
        assert strategy == "USER_MANAGED", strategy
        self.runtime.check_device("create_execution_context")
        self.contexts.append(Context(self.runtime))
        return self.contexts[-1]


class Runtime:
    """An IRuntime stand-in; notes the stream handles enqueued on and the current device at every call."""

    registry = Registry()
    device_index: int | None = None  # the device that must be current at every call (CUDA only)
    handles: list[int] = []  # noqa: RUF012 - one run, one list
    wrong_device: list[str] = []  # noqa: RUF012
    engines: list[Engine] = []  # noqa: RUF012

    def __init__(self, logger: Any) -> None:
        self.engine_host_code_allowed = False

    def check_device(self, call: str) -> None:
        if self.device_index is not None and torch.cuda.current_device() != self.device_index:
            self.wrong_device.append(f"{call} on cuda:{torch.cuda.current_device()}")

    def deserialize_cuda_engine(self, data: bytes) -> Engine:
        self.check_device("deserialize_cuda_engine")
        self.engines.append(Engine(self))
        return self.engines[-1]


class Logger:
    Severity = types.SimpleNamespace(INTERNAL_ERROR=0, ERROR=1, WARNING=2, INFO=3, VERBOSE=4)

    def __init__(self) -> None:
        pass


STANDIN = types.SimpleNamespace(
    __name__="tensorrt_standin",
    __version__="11.4.0 (stand-in)",
    ILogger=Logger,
    Runtime=Runtime,
    TensorIOMode=types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT"),
    ExecutionContextAllocationStrategy=types.SimpleNamespace(USER_MANAGED="USER_MANAGED"),
)


@contextlib.contextmanager
def standin(cpu: bool) -> Iterator[None]:
    """The engine module wired to the stand-in runtime (and, for the dry run, CPU memory and no streams)."""
    saved = {n: getattr(trt_mod, n) for n in ("import_tensorrt", "allocate")}
    allocate = saved["allocate"]
    trt_mod.import_tensorrt = lambda: STANDIN
    if cpu:
        saved |= {n: getattr(trt_mod, n) for n in ("current_stream", "new_stream", "new_event", "keep_alive")}
        saved["made_current"] = trt_mod.made_current
        saved["same_device"] = engine_base.same_device
        quiet = types.SimpleNamespace(wait_stream=lambda s: None, wait_event=lambda e: None)
        trt_mod.current_stream = lambda device: types.SimpleNamespace(cuda_stream=0, **vars(quiet))
        trt_mod.new_stream = lambda device: types.SimpleNamespace(cuda_stream=0x5EED, **vars(quiet))
        trt_mod.new_event = lambda: types.SimpleNamespace(record=lambda stream: None)
        trt_mod.keep_alive = lambda tensor, stream: None
        trt_mod.made_current = lambda device: contextlib.nullcontext()
        engine_base.same_device = lambda have, want: True
        trt_mod.allocate = lambda shape, dtype, device: Runtime.registry.add(torch.empty(shape, dtype=dtype))
    else:
        trt_mod.allocate = lambda shape, dtype, device: Runtime.registry.add(allocate(shape, dtype, device))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(engine_base if name == "same_device" else trt_mod, name, value)


def expected(batch: torch.Tensor) -> torch.Tensor:
    """What the stand-in computes for `batch`."""
    return batch.flatten(1)[:, :K] * 2


def make_engine(device: torch.device, folder: Path, cpu: bool = False) -> trt_mod.TensorRTEngine:
    """The engine on `device` over the stand-in runtime (the dry run: CPU memory, no device checked)."""
    path = folder / "standin.engine"
    path.write_bytes(b"standin")
    Runtime.device_index = None if cpu else device.index
    return trt_mod.TensorRTEngine(path, device=device, max_batch=MAX_BATCH)


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)
    return ok


def eager_checks(device: torch.device, folder: Path, runs: int, cpu: bool) -> list[bool]:
    """The default-stream path: ordering, the engine's own stream, freed caller batches, misaligned batches."""
    memory = torch.device("cpu") if cpu else device
    engine = make_engine(device, folder, cpu)
    results = []
    Runtime.handles.clear()
    wrong = []
    for n in itertools.islice(itertools.cycle((MAX_BATCH, 3, 5)), runs):
        batch = engine.input_buffer(n)
        batch.copy_(torch.rand(n, C, H, W, device=memory))  # written on torch's (default) stream
        want = expected(batch).clone()
        got = engine.infer(batch)["output0"].clone()  # read on torch's stream right after the call
        if not torch.equal(got, want):
            wrong.append(n)
    results.append(
        check(f"eager on the default stream ({runs} calls)", not wrong, f"wrong results at {wrong}")
    )
    own = sorted({h for h in Runtime.handles if h in trt_mod.DEFAULT_STREAMS})
    results.append(
        check("enqueued on the engine's own stream, never a default one", not own, f"handles {own}")
    )
    wrong = []
    for n in (2, 6):
        caller = torch.rand(2 * MAX_BATCH, C, H, W, device=memory)[:n].clone()
        Runtime.registry.add(caller)
        want = expected(caller).clone()
        out = engine.infer(caller)["output0"]
        del caller  # freed at once: its memory may serve the next allocation on torch's stream
        torch.zeros(n, C, H, W, device=memory).fill_(-1.0)
        if not torch.equal(out.clone(), want):
            wrong.append(n)
    results.append(check("a caller's batch freed right after infer is read intact", not wrong, f"{wrong}"))
    storage = Runtime.registry.add(torch.rand(4 * C * H * W + 64, device=memory))
    misaligned = storage[1 : 1 + 4 * C * H * W].view(4, C, H, W)
    out = engine.infer(misaligned)["output0"].clone()
    results.append(
        check("a misaligned batch is copied and read intact", torch.equal(out, expected(misaligned)))
    )
    shapes = sorted(c.shape[0] for c in Runtime.engines[-1].contexts)  # type: ignore[index]
    sets = {c.shape_sets for c in Runtime.engines[-1].contexts}
    results.append(
        check("one context per batch size, its shape set once", sets == {1}, f"{shapes}, sets {sets}")
    )
    return results


def graph_checks(device: torch.device, folder: Path, runs: int) -> list[bool]:
    """CUDA graphs captured at two batch sizes, replayed alternately with new inputs."""
    from tiled_detector.runtime.devices import cuda_graph

    engine = make_engine(device, folder)
    graphs = {}
    for n in (3, 5):
        batch = engine.input_buffer(n)
        batch.copy_(torch.rand(n, C, H, W, device=device))
        graphs[n] = cuda_graph(lambda n=n: engine.infer(engine.input_buffer(n))["output0"])
    wrong = []
    for n in itertools.islice(itertools.cycle((3, 5)), runs):
        replay, out = graphs[n]
        batch = engine.input_buffer(n)
        batch.copy_(torch.rand(n, C, H, W, device=device))
        want = expected(batch).clone()
        replay()
        if not torch.equal(out[:n].clone(), want):
            wrong.append(n)
    return [
        check(f"CUDA graphs at batch 3 and 5 replayed alternately ({runs} replays)", not wrong, f"{wrong}")
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (cuda:1 too when there) or cpu (dry run)")
    parser.add_argument("--runs", type=int, default=30, help="calls per check")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("FAIL no CUDA device (use --device cpu for the dry run)")
        return 1
    import tempfile

    results = []
    with tempfile.TemporaryDirectory() as tmp, standin(cpu):
        folder = Path(tmp)
        results += eager_checks(torch.device("cuda", 0), folder, args.runs, cpu)
        if not cpu:
            results += graph_checks(torch.device("cuda", 0), folder, args.runs)
            if torch.cuda.device_count() > 1:
                torch.cuda.set_device(0)
                Runtime.wrong_device.clear()
                results += eager_checks(torch.device("cuda", 1), folder, args.runs, cpu)
                results.append(
                    check(
                        "cuda:1 current for every runtime call",
                        not Runtime.wrong_device,
                        f"{Runtime.wrong_device}",
                    )
                )
            else:
                print("(one GPU: the cuda:1 checks need two)")
            results.append(check("no runtime call on another device", not Runtime.wrong_device))
    print("ALL PASS" if all(results) else "FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
