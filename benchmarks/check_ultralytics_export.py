"""Check that a YOLOv8n ONNX exported by ultralytics itself decodes correctly in our pipeline.

Two steps, in two environments (ultralytics is no dependency of this project):

1. `export`, in a throwaway venv with ultralytics (run offline; torchvision is only needed as installed metadata,
   since ultralytics reads its version at import, and is never imported; its PyPI build cannot load beside a
   CPU torch):

       python3 -m venv /tmp/ulv && /tmp/ulv/bin/pip install torch==2.13.0
       /tmp/ulv/bin/pip install --no-deps ultralytics torchvision==0.28.0
       /tmp/ulv/bin/pip install numpy opencv-python-headless pyyaml pillow matplotlib psutil requests scipy \\
           polars ultralytics-thop onnx onnxslim onnxruntime
       YOLO_OFFLINE=1 YOLO_CONFIG_DIR=/tmp/ulcfg /tmp/ulv/bin/python benchmarks/check_ultralytics_export.py \\
           export --out /tmp/ulwork

   builds YOLOv8n from `yolov8n.yaml` (random weights), exports `yolov8n.onnx` with
   `YOLO.export(format="onnx", dynamic=True, imgsz=640, simplify=False)` (input images ['batch', 3, 'height',
   'width'], output output0 ['batch', 84, 'anchors']), `yolov8n_hw640.onnx` (the same with height and width
   pinned to 640), `yolov8n_static.onnx` (dynamic=False: 1x3x640x640 -> 1x84x8400) and `reference.npz`: the input
   batch, the PyTorch head output, and ultralytics' own `non_max_suppression` results on it (all candidates,
   iou_thres=1.0, and NMS at iou_thres=0.7). ultralytics' default initialisation makes a deep random network's
   features vanish (every score is exactly sigmoid of the head's bias prior, all classes tied), so the convs are
   re-initialised (variance-preserving, LSUV-style) first: scores and boxes then vary per anchor and class.

2. `check`, in the project venv: `.venv/bin/python benchmarks/check_ultralytics_export.py check --out /tmp/ulwork`
   compares our layout detection, engine and decoding (and NMS merge) against a numpy decoding and against
   ultralytics' results, then runs `TiledDetector` on a 1920x1080 frame. Prints PASS or FAIL per check and
   exits 1 on any FAIL. The ONNX Runtime engine needs a static input height and width, so `yolov8n.onnx`
   (dynamic=True, as ultralytics exports it) fails to load unless the engine takes them from the model's
   `imgsz` metadata.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

IOU = 0.7


def export(out: Path, conf: float, batch: int, seed: int) -> None:
    import onnx
    import torch
    import ultralytics
    from torch import nn
    from ultralytics import YOLO
    from ultralytics.utils.nms import non_max_suppression

    torch.manual_seed(seed)
    model = YOLO("yolov8n.yaml")
    net = model.model.eval()
    head = net.model[-1]
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d) and m is not head.dfl.conv]
    class_convs = [seq[-1] for seq in head.cv3]  # keep their bias prior, so scores stay low like untrained

    def unit_std(module: nn.Conv2d, inputs: object, output: torch.Tensor) -> torch.Tensor:
        scale = output.std()
        module.weight.data /= scale
        if module.bias is not None:
            module.bias.data /= scale
        return output / scale

    for conv in convs:
        nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
    hooks = [c.register_forward_hook(unit_std) for c in convs if c not in class_convs]
    with torch.no_grad():
        net(torch.rand(1, 3, 640, 640))
    for hook in hooks:
        hook.remove()

    images = torch.rand(batch, 3, 640, 640)
    with torch.no_grad():
        raw = net(images)[0]
    ref = {"images": images.numpy(), "raw": raw.numpy(), "conf": np.float32(conf)}
    for key, iou, max_det in (("cand", 1.0, raw.shape[2]), ("nms", IOU, 300)):
        dets, idx = non_max_suppression(
            raw.clone(), conf, iou, max_det=max_det, max_time_img=60.0, return_idxs=True
        )
        ref[f"{key}_dets"] = torch.cat(dets).numpy()
        ref[f"{key}_anchor"] = torch.cat([i.view(-1) for i in idx]).numpy().astype(np.int64)
        ref[f"{key}_image"] = np.repeat(np.arange(batch), [len(d) for d in dets])
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)  # ultralytics writes the ONNX next to the yaml name, in the working directory
    for name, dynamic in (("yolov8n_static.onnx", False), ("yolov8n.onnx", True)):
        Path(model.export(format="onnx", dynamic=dynamic, imgsz=640, simplify=False)).replace(out / name)
    proto = onnx.load(out / "yolov8n.onnx")  # batch stays dynamic, height and width pinned to 640
    for dim in proto.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.dim_value = 640
    onnx.save(proto, out / "yolov8n_hw640.onnx")
    np.savez(out / "reference.npz", ultralytics=ultralytics.__version__, **ref)
    print(f"ultralytics {ultralytics.__version__}: {sorted(p.name for p in out.iterdir())} in {out}")
    print(f"candidates per image: {np.bincount(ref['cand_image'], minlength=batch)}")


def numpy_decode(raw: np.ndarray, conf: float) -> dict[str, np.ndarray]:
    """Independent reference: (B, 4 + C, A) -> best class per anchor above conf, cxcywh -> xyxy."""
    scores = raw[:, 4:].max(1)
    image, anchor = np.nonzero(scores > conf)
    cx, cy, w, h = (raw[image, i, anchor] for i in range(4))
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    classes = raw[:, 4:].argmax(1)[image, anchor]
    return dict(image=image, anchor=anchor, boxes=boxes, scores=scores[image, anchor], classes=classes)


def ranked(image, scores, boxes, *more):
    """Rows ordered by image, score descending (then x1), for comparing sets of detections."""
    order = np.lexsort((boxes[:, 0], -scores, image))
    return [np.asarray(a)[order] for a in (image, scores, boxes, *more)]


def check(out: Path, frame_conf: float) -> bool:
    import torch

    from tiled_detector import TiledDetector
    from tiled_detector.engines import load_engine
    from tiled_detector.pipeline.decode import decode_outputs
    from tiled_detector.pipeline.layouts import OutputLayout, detect_layout
    from tiled_detector.pipeline.merge import merge

    ref = np.load(out / "reference.npz")
    conf, torch_raw = float(ref["conf"]), ref["raw"]
    print(f"ultralytics {ref['ultralytics']}, reference batch {ref['images'].shape}, conf {conf:g}")
    results: list[tuple[str, bool]] = []

    def report(name: str, ok: bool, detail: str) -> None:
        results.append((name, bool(ok)))
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")

    # (a) each export loads, its layout is detected, and it computes what the PyTorch model computed
    raws = {}
    for file in ("yolov8n.onnx", "yolov8n_hw640.onnx", "yolov8n_static.onnx"):
        try:
            engine = load_engine(out / file, backend="onnxruntime")
        except ValueError as error:
            report(f"{file} loads", False, str(error))
            continue
        outputs = engine.infer(torch.from_numpy(ref["images"]))
        name = next(iter(outputs))
        layout = detect_layout(outputs, len(engine.labels or ()))
        raws[file] = raw = outputs[name].numpy()
        box_d = np.abs(raw[:, :4] - torch_raw[:, :4]).max()
        score_d = np.abs(raw[:, 4:] - torch_raw[:, 4:]).max()
        report(
            f"{file} loads",
            layout is OutputLayout.YOLOV8 and box_d < 1e-2 and score_d < 1e-5,
            f"input {engine.input.name} {engine.input.shape}, output {name} {engine.outputs[0].shape} -> "
            f"{tuple(raw.shape)} {layout.value}, {len(engine.labels or ())} labels; vs PyTorch max |d| "
            f"box {box_d:.1e} px, score {score_d:.1e}",
        )

    # (b) our decoding == an independent numpy decoding, of the PyTorch head and of each ONNX head
    for source, raw in {"pytorch": torch_raw, **raws}.items():
        want = numpy_decode(raw, conf)
        b = ranked(want["image"], want["scores"], want["boxes"], want["classes"])
        for layout_arg in ("auto", "yolov8"):
            got = decode_outputs(
                {"output0": torch.from_numpy(raw)}, layout_arg, conf, raw.shape[2], num_classes=80
            )
            a = ranked(got.image_index.numpy(), got.scores.numpy(), got.boxes.numpy(), got.class_ids.numpy())
            same = len(a[0]) == len(b[0]) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
            report(
                f"decode {layout_arg} == numpy ({source})", same, f"{len(a[0])} vs {len(b[0])} rows, exact"
            )
        top = decode_outputs({"output0": torch.from_numpy(raw)}, "auto", conf, 100, num_classes=80)
        first = np.concatenate([np.nonzero(b[0] == i)[0][:100] for i in range(len(raw))])
        same = np.array_equal(top.scores.numpy(), b[1][first]) and np.array_equal(
            top.boxes.numpy(), b[2][first]
        )
        report(
            f"decode top_k=100 ({source})", same, f"{len(top.scores)} rows = the best 100 per image, exact"
        )

    # ultralytics' own candidates (non_max_suppression, iou 1.0) vs ours from the same PyTorch head, by anchor
    want, dets = numpy_decode(torch_raw, conf), ref["cand_dets"]
    ours = {(i, a): k for k, (i, a) in enumerate(zip(want["image"], want["anchor"], strict=True))}
    k = np.array([ours.get(key, -1) for key in zip(ref["cand_image"], ref["cand_anchor"], strict=True)])
    matched = len(k) == len(ours) and bool((k >= 0).all())
    box_d = np.abs(want["boxes"][k] - dets[:, :4]).max() if matched else np.inf
    score_d = np.abs(want["scores"][k] - dets[:, 4]).max() if matched else np.inf
    same_cls = matched and np.array_equal(want["classes"][k], dets[:, 5].astype(np.int64))
    report(
        "ultralytics candidates",
        matched and same_cls and box_d < 1e-3 and score_d == 0,
        f"{len(k)} vs {len(ours)} rows, same anchors {matched}, same classes {same_cls}, "
        f"max |d| box {box_d:.1e} px, score {score_d:.1e}",
    )
    for file, raw in raws.items():  # from an ONNX head only anchors within float noise of conf may differ
        onnx_want = numpy_decode(raw, conf)
        differ = set(zip(onnx_want["image"], onnx_want["anchor"], strict=True)) ^ set(ours)
        near = all(abs(torch_raw[i, 4:, a].max() - conf) < 1e-5 for i, a in differ)
        report(f"ultralytics candidates ({file})", near, f"{len(differ)} anchors differ, all at conf +- 1e-5")

    # ultralytics NMS (class-aware, IoU 0.7, max_det 300) vs our merge("nms", "iou", 0.7) of our candidates
    got = decode_outputs(
        {"output0": torch.from_numpy(torch_raw)}, "auto", conf, torch_raw.shape[2], num_classes=80
    )
    counts, worst = [], 0.0
    for i in range(len(torch_raw)):
        sel = got.image_index == i
        boxes, scores, classes = merge(got.boxes[sel], got.scores[sel], got.class_ids[sel], "nms", "iou", IOU)
        mine = torch.cat([boxes, scores[:, None], classes[:, None].float()], 1)[:300].numpy()
        theirs = ref["nms_dets"][ref["nms_image"] == i]
        counts.append((len(mine), len(theirs)))
        if len(mine) != len(theirs):
            worst = np.inf
            continue
        a, b = (ranked(np.zeros(len(d)), d[:, 4], d[:, :4], d[:, 5]) for d in (mine, theirs))
        worst = max(worst, *(float(np.abs(x - y).max(initial=0)) for x, y in zip(a, b, strict=True)))
    report(
        "ultralytics NMS", worst < 1e-3, f"kept (ours, ultralytics) per image {counts}, max |d| {worst:.1e}"
    )

    # (c) the whole pipeline on a 1920x1080 frame
    frame = np.random.default_rng(0).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    for file in raws:
        for layout_arg in ("auto", "yolov8"):
            detector = TiledDetector(out / file, "onnxruntime", conf_threshold=frame_conf, layout=layout_arg)
            found = detector.detect(frame)
            ok = (
                len(found.scores) > 0 and np.isfinite(found.boxes).all() and (found.scores > frame_conf).all()
            )
            report(
                f"TiledDetector 1920x1080 {file} layout={layout_arg}",
                ok,
                f"{detector.plan_for(1080, 1920).batch_size} views -> {len(found.scores)} detections, "
                f"{len(set(found.class_ids.tolist()))} classes, scores {found.scores.min(initial=1):.1e}.."
                f"{found.scores.max(initial=0):.1e}, {found.timings['total']:.0f} ms",
            )
    failed = [name for name, ok in results if not ok]
    print(f"\n{'PASS' if not failed else 'FAIL'}: {len(results) - len(failed)}/{len(results)} checks passed")
    for name in failed:
        print(f"  failed: {name}")
    return not failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("export", "check"))
    parser.add_argument(
        "--out", type=Path, default=Path("/tmp/ulwork"), help="holds yolov8n.onnx, reference.npz"
    )
    parser.add_argument(
        "--conf", type=float, default=1e-3, help="export: candidate threshold of the reference"
    )
    parser.add_argument("--batch", type=int, default=2, help="export: images in the reference batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frame-conf", type=float, default=1e-3, help="check: TiledDetector conf_threshold")
    args = parser.parse_args()
    if args.step == "export":
        export(args.out, args.conf, args.batch, args.seed)
        return 0
    return 0 if check(args.out, args.frame_conf) else 1


if __name__ == "__main__":
    sys.exit(main())
