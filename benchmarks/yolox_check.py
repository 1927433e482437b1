"""YOLOX through the torch backend on a GPU: YOLOX-nano built from YOLOX's own source with the real weights (the ONNX
file's, its BatchNorms fused as the export fused them), captured as one CUDA graph per frame, equal to the CPU path
(torch on the CPU, and ONNX Runtime on the original file).

    PYTHONPATH=src python3 benchmarks/yolox_check.py --onnx yolox_nano.onnx --photos DIR --yolox-source SRC \
        [--device cuda] [--out DIR] [--onnx2torch]

TorchScripts, traced as YOLOX's tools/export_torchscript.py traces (raw head: decode_in_inference off), all YOLOX by
their head's shape (layout yolox, its input conventions):
- `yolox_nano_real.ts`: YOLOX-nano from the source folder SRC (the one holding `yolox/`), its BatchNorms fused into
  the convolutions (YOLOX's `fuse_model`), then every convolution given the weights and bias of the ONNX file's
  convolution at the same place in the forward order (shape, strides, padding and groups checked one by one): the
  real detector as one graph, which the torch backend captures whole;
- `yolox_nano_source.ts`: the same network with random weights (the flood case: its scores fill every view's top-k);
- with --onnx2torch, `yolox_nano.ts`: the ONNX file converted by onnx2torch (its modules read shapes on the host, so
  the frame program is captured around the engine).
Checks (FAIL lines, exit 1), TF32 off: the real weights' raw outputs equal the ONNX file's on ONNX Runtime (largest
difference printed); the same detections on the device as on the CPU, and as ONNX Runtime's for the real weights
(boxes within 0.5 px, scores within 1e-3), on the photos and synthetic 1080p / 4K frames; on CUDA one whole captured
frame program per frame size for the source-built networks. `--device cpu` is the CPU proof: torch on the CPU ==
ONNX Runtime on the same photos. Writes the TorchScripts to --out.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
from pathlib import Path

import numpy as np
import torch

from tiled_detector import TiledDetector
from tiled_detector.engines.rebatch import dynamic_batch_model
from tiled_detector.tools.frames import read_image
from tiled_detector.tools.worlds.synthetic import make_scene

SCORE_SPREAD = 0.02
CHANNELS = [256, 512, 1024]
INPUT = (1, 3, 416, 416)


def torchscript(onnx_path: Path, out: Path, extra: dict[str, str] | None = None) -> Path:
    """The ONNX model as TorchScript (onnx2torch, traced at batch 2 from its dynamic-batch rewrite), with its input
    shape and `extra` (input conventions, labels) as extra files."""
    from onnx2torch import convert

    module = convert(str(dynamic_batch_model(onnx_path))).eval()
    example = torch.rand(2, 3, 416, 416) * 255
    with torch.no_grad():
        traced = torch.jit.trace(module, example)
    path = out / f"{onnx_path.stem}.ts"
    torch.jit.save(traced, str(path), _extra_files={"input_shape": "-1,3,416,416", **(extra or {})})
    return path


class _Absent(types.ModuleType):
    """A module that is not installed: importing it works, using any of its names raises."""

    def __getattr__(self, name: str) -> object:
        raise AttributeError(f"{self.__name__} is not installed ({self.__name__}.{name} was used)")


def yolox_nano(source: Path) -> torch.nn.Module:
    """YOLOX-nano (depth 0.33, width 0.25, depthwise, SiLU, 80 classes) from YOLOX's source, raw head, eval mode.
    YOLOX's modules import loguru (training logs) and torchvision (its NMS) without using them in the network:
    where they are not installed, stand-ins are given (loguru: a logger; torchvision: a module that raises on use)."""
    sys.path.insert(0, str(source))
    for name, stand_in in (
        ("loguru", types.SimpleNamespace(logger=logging.getLogger("yolox"))),
        ("torchvision", _Absent("torchvision")),
    ):
        try:
            __import__(name)
        except ImportError:
            sys.modules[name] = stand_in  # type: ignore[assignment]
    from yolox.models import YOLOPAFPN, YOLOX, YOLOXHead

    backbone = YOLOPAFPN(0.33, 0.25, in_channels=CHANNELS, act="silu", depthwise=True)
    head = YOLOXHead(80, 0.25, in_channels=CHANNELS, act="silu", depthwise=True)
    model = YOLOX(backbone, head).eval()
    model.head.decode_in_inference = False
    return model


def _traced(model: torch.nn.Module, path: Path) -> Path:
    """`model` traced on one 416x416 image and saved with its input shape (any batch)."""
    with torch.no_grad():
        traced = torch.jit.trace(model, torch.rand(INPUT))
    torch.jit.save(traced, str(path), _extra_files={"input_shape": "-1,3,416,416"})
    return path


def source_torchscript(source: Path, out: Path) -> Path:
    """YOLOX-nano built from YOLOX's own source (random weights), traced as its tools/export_torchscript.py does."""
    torch.manual_seed(0)
    model = yolox_nano(source)
    for conv in model.modules():  # He init keeps activations alive through the net
        if isinstance(conv, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(conv.weight)
    with torch.no_grad():  # and small output layers keep the scores apart (no ties at 0 or 1)
        for conv in (*model.head.cls_preds, *model.head.obj_preds):
            conv.weight.mul_(SCORE_SPREAD)
    return _traced(model, out / "yolox_nano_source.ts")


def real_weights(source: Path, onnx_path: Path) -> torch.nn.Module:
    """YOLOX-nano from its source with the ONNX file's weights: its BatchNorms fused into the convolutions first (as
    the export's constant folding fused them), then the file's convolutions, in graph order, matched one by one to
    the network's convolutions in the order its forward calls them (a mismatch of shape, stride, padding or groups
    raises)."""
    import onnx
    from onnx import numpy_helper

    model = yolox_nano(source)
    from yolox.utils import fuse_model  # (the source is on the path now)

    model = fuse_model(model)
    called: list[torch.nn.Module] = []
    hooks = [
        m.register_forward_hook(lambda module, _, __: called.append(module))
        for m in model.modules()
        if isinstance(m, torch.nn.Conv2d)
    ]
    with torch.no_grad():
        model(torch.zeros(INPUT))
    for hook in hooks:
        hook.remove()
    graph = onnx.load(str(onnx_path)).graph
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    if len(convs) != len(called) or len({id(c) for c in called}) != len(called):
        raise ValueError(f"{onnx_path.name} has {len(convs)} convolutions, the network calls {len(called)}")
    for module, node in zip(called, convs, strict=True):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        weight = weights[node.input[1]]
        bias = weights[node.input[2]] if len(node.input) > 2 else np.zeros(weight.shape[0], np.float32)
        found = (tuple(weight.shape), attributes["strides"], attributes.get("group", 1), attributes["pads"])
        wanted = (tuple(module.weight.shape), list(module.stride), module.groups, list(module.padding) * 2)
        if found != wanted:
            raise ValueError(
                f"{node.name} of {onnx_path.name} is {found}, the network's convolution {wanted}"
            )
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(weight.copy()))
            if module.bias is None:
                module.bias = torch.nn.Parameter(torch.zeros(weight.shape[0]))
            module.bias.copy_(torch.from_numpy(bias.copy()))
    return model


def real_torchscript(source: Path, onnx_path: Path, out: Path, failures: list[str]) -> Path:
    """`real_weights` traced (as `source_torchscript`), after its raw outputs were compared with ONNX Runtime's on
    the same random 0-255 input (a FAIL beyond 1e-3)."""
    import onnxruntime

    model = real_weights(source, onnx_path)
    example = torch.rand(INPUT, generator=torch.Generator().manual_seed(1)) * 255
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    reference = session.run(None, {session.get_inputs()[0].name: example.numpy()})[0]
    with torch.no_grad():
        ours = model(example).numpy()
    difference = float(np.abs(ours - reference).max()) if ours.shape == reference.shape else float("inf")
    print(
        f"equality real weights in YOLOX's source == {onnx_path.name} on ONNX Runtime (raw outputs): largest "
        f"difference {difference:.3g}: {'ok' if difference <= 1e-3 else 'FAIL'}"
    )
    if difference > 1e-3:
        failures.append("real weights: the network's outputs differ from the ONNX file's")
    return _traced(model, out / "yolox_nano_real.ts")


def same(name: str, a, b, failures: list[str]) -> None:
    """Whether two detections agree (same count; boxes within 0.5 px, scores within 1e-3, same classes)."""
    ok, boxes, scores = len(a) == len(b), 0.0, 0.0
    if ok and len(a):
        order_a, order_b = np.lexsort(a.boxes.T[::-1]), np.lexsort(b.boxes.T[::-1])
        boxes = float(np.abs(a.boxes[order_a] - b.boxes[order_b]).max())
        scores = float(np.abs(a.scores[order_a] - b.scores[order_b]).max())
        ok = boxes <= 0.5 and scores <= 1e-3 and bool((a.class_ids[order_a] == b.class_ids[order_b]).all())
    print(
        f"equality {name}: {len(a)} vs {len(b)} detections, boxes within {boxes:.3g} px, scores within "
        f"{scores:.3g}: {'ok' if ok else 'FAIL'}"
    )
    if not ok:
        failures.append(name)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--photos", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--yolox-source", type=Path, required=True, help="the folder holding YOLOX's yolox/")
    parser.add_argument(
        "--onnx2torch", action="store_true", help="also the ONNX file converted by onnx2torch"
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # equality of the pipeline, not of TF32 convolutions (H100 cuDNN's default for fp32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    settings = dict(tile_size=(416, 416), overlap=0.2, conf_threshold=0.25)
    paths = sorted(args.photos.glob("*")) if args.photos else []
    frames = [(p.name, read_image(p).image) for p in paths if p.suffix in {".jpg", ".jpeg", ".png"}]
    frames += [(f"synthetic {w}x{h}", make_scene(1, w, h).image) for w, h in ((1920, 1080), (3840, 2160))]
    failures: list[str] = []
    real = real_torchscript(args.yolox_source, args.onnx, args.out, failures)
    # (what, TorchScript, the ONNX file it must equal, whether it must be captured whole on CUDA)
    models = [
        ("real weights (YOLOX source)", real, args.onnx, True),
        ("YOLOX source, random weights", source_torchscript(args.yolox_source, args.out), None, True),
    ]
    if args.onnx2torch:
        models.append(("real weights (onnx2torch)", torchscript(args.onnx, args.out), args.onnx, False))
    for what, ts, onnx_file, whole_wanted in models:
        print(f"{what}: {ts}")
        # random weights: the 20 best of each view above 0.5
        chosen = settings if onnx_file else {**settings, "conf_threshold": 0.5, "top_k": 20}
        device = TiledDetector(ts, backend="torch", device=args.device, **chosen)
        cpu = TiledDetector(ts, backend="torch", device="cpu", **chosen) if args.device != "cpu" else device
        ort = TiledDetector(onnx_file, backend="onnxruntime", device="cpu", **chosen) if onnx_file else None
        print(
            f"input format: {device.input_format}; layout {device._layout.value}; labels {device.labels[:3]}..."
        )
        for name, image in frames:
            device.detect(image)  # the capture (and a replay next)
            on_cpu = cpu.detect(image)
            if cpu is not device:
                same(f"{what}: {name} {args.device} == torch cpu", device.detect(image), on_cpu, failures)
            if ort is not None:
                same(f"{what}: {name} torch cpu == onnxruntime cpu", on_cpu, ort.detect(image), failures)
        runner = device._runner
        captured = len(runner._captured)
        sizes = len({image.shape[:2] for _, image in frames})
        whole = runner.captures and not runner.split
        print(f"{what}: captured {captured} frame programs for {sizes} frame sizes, whole graph: {whole}")
        # onnx2torch's modules read shapes on the host (not capturable): the engine runs between captured parts
        # (a frame size captures again when its sync-free limits grow for a candidate flood)
        if whole_wanted and args.device.startswith("cuda") and (not whole or captured < sizes):
            failures.append(f"{what}: one whole captured graph per frame size")
    print("ALL OK" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
