#!/usr/bin/env bash
# The benchmark runner for a CUDA machine: the GPU checks and the GPU measurements that the README and
# docs/ pages quote, one mode or several per run (benchmarks/README.md lists what each program measures).
#
#   benchmarks/cuda_runner.sh [MODE ...]          # default: checks exports; results (logs, CSVs) under $OUT
#
# Needs: python3 with a CUDA torch and the package's requirements (requirements/*.txt). Run from anywhere: it works
# in the repository root, with src/ and benchmarks/ on PYTHONPATH. exports, policy, budget and families need
# ultralytics (and SAHI for `--peer sahi`), yolox needs onnx2torch. Models and photos the modes read: .models/ at the
# root (yolox: yolox_nano.onnx, yolox_src/, photos/; gfl: picodet_s_416_coco.onnx, nanodet_m_416.onnx, photos/).
# A machine without network: put the wheels in .whl/ (optional) and they are installed into /tmp/site first.
# OUT (default out/device) is the results folder.
#
#   checks   the CUDA-only tests (pytest -m gpu; the Triton kernels against the torch stages too) and
#            benchmarks/gpu_check.py (CPU == CUDA, graph == eager, one H2D
#            and one D2H copy per frame)
#   exports  ultralytics' own exports made there (TorchScript, ONNX), loaded with no options, bench with
#            --peer sahi (host and device input, fp32 and fp16); a YOLOv8n-sized model that makes its anchors on
#            the host (once capture-hostile; since issue 51 the torch engine moves that to the device: whole) with
#            cuda_graph off and on, normal and flood
#   policy   the detection policy's cost and savings: ultralytics' yolov8n TorchScript at 4K, fp16, the whole frame
#            against roi [0, 0.5, 1, 1] (engine views and time), and with every policy setting on; the
#            capture-hostile model again with frames already on the device (--input device)
#   budget   the tile budget on the GPU: the chosen-tiles CUDA test, captures per view count over a stream, bench
#            rows (bundled and ultralytics' yolov8n, fp16, every tile vs tile_budget 8 at 4K / 2 at 1080p)
#   budget_eval  eval --motion --budgets at 1080p and 4K (panning at 4K), torch fp16
#   motion   camera-motion compensation on the GPU: the CUDA tests (estimate on the GPU == on the CPU), the estimate's
#            cost per 1080p and 4K frame (eager, and replayed as a captured graph), eval --motion at 4K torch fp16:
#            every tile and tile_budget 12 (max_tile_age 8) with its alternatives, still and moving camera
#   families every ultralytics family (v5u, v8, v10, 11, 26, RT-DETR) exported at its defaults there (TorchScript;
#            ONNX with its batch fixed at 1), loaded with no options (benchmarks/check_families.py)
#   yolox    the real YOLOX-nano (in .models/, photos in .models/photos/): its TorchScript (onnx2torch; `stream`:
#            the real weights in YOLOX's source network) on
#            the GPU equal to torch on the CPU and ONNX Runtime, one captured graph per frame; bench torch fp32/fp16
#            at 1080p and 4K with the default tiles (auto: its 416) against SAHI on the same weights (YOLOX's own
#            pre/post-processing); the source-built one must be captured whole (`graph_ms`), <= 1.3x its model alone
#   gfl      GFL heads (PP-PicoDet / NanoDet layouts; 32 classes x 8 bins too): benchmarks/gfl_check.py (GFL networks of each export layout,
#            random weights, traced: CUDA == CPU, one whole captured graph per frame size), bench torch fp32/fp16
#            of each at 1080p and 4K (default tiles: 416), `graph_ms` and ratio checked; the real PicoDet and
#            NanoDet files (in .models/) on ONNX Runtime CPU with --peer sahi, and on the GPU converted by onnx2torch
#            (benchmarks/gfl_real_weights.py: CUDA == ONNX Runtime CPU; bench torch fp32/fp16)
#   tensorrt the TensorRT engine's CUDA side without TensorRT (benchmarks/tensorrt_stream_check.py: a stand-in
#            runtime whose kernels are torch ops on the stream it is given): the default-stream path ordered by
#            events on the engine's own stream, freed and misaligned caller batches, CUDA graphs at two batch sizes
#            replayed alternately, the engine's device current (cuda:1 checks need a second GPU)
#   stream   frames from the host at the speed of the graph (issue 51): the CUDA tests of the staging ring, the
#            TorchScript capture rewrite, nms_rounds and every runtime setting; YOLOX-nano's real weights in YOLOX's
#            source network (.models/yolox_src, .models/yolox_nano.onnx, photos in .models/photos) equal to ONNX
#            Runtime and captured whole (yolox_check.py); bench of it (fp16 / fp32, 1080p / 4K, host frames:
#            stream_ms against the model's captured graph, targets 1.15x stream and 1.3x latency), of the random
#            network (the flood case) with and without nms_rounds 2; the deepstream-sahi setting (2560x1440, 40
#            tiles of 416 + the full view, fp16, host frames) with ultralytics' YOLO26n exported at 416, default and
#            dynamic=True (.models/yolo26n_416.torchscript, .models/yolo26n_416_dynamic.torchscript): both whole
#   depth    3D positions on the GPU: the CUDA tests of the positions stage and of the captured frame program with
#            a depth image (test_depth, test_program), the positions stage alone at 4K and 1080p on 300 rows as a
#            captured graph and a whole frame with and without its depth (benchmarks/depth_cost.py: the target is <= 0.3
#            ms at 4K, 300 objects), eval --depth at 4K on the GPU (torch fp16)
#   obb      rotated boxes (issue 49): the CUDA tests, then ultralytics' YOLOv8n-obb and YOLOv8n (the detect model of
#            the same size) exported there (TorchScript, imgsz 640; or taken from $OBB_MODELS when it holds
#            yolov8n-obb.torchscript and yolov8n.torchscript), bench torch fp16 at 1080p and 4K, each at its default
#            confidence and flooded (conf 1e-5: every view's top_k through the rotated merge): the obb rows must be one
#            whole captured graph and at most 1.3x the detect rows' total. Dry run on a CPU: OBB_DEVICE=cpu
#            OBB_SIZES=1280x720 OBB_RUNS=2 OBB_PRECISION=fp32 (no graph then; the check prints the ratios only)
#   masks    instance masks on the GPU: the CUDA tests of test_masks.py (one captured graph, CUDA == CPU masks,
#            fp32 / fp16) and benchmarks/mask_cost.py (a YOLOv8n-seg-sized network, torch fp16, 100 objects a
#            frame: masks on against off at 4K and 1080p, a masked frame timed up to its label image composed on
#            the host as the node does while `masks` has a subscriber; captures, split, peak memory); the target is
#            <= 1.20x at 4K, one whole captured graph
#   pose     keypoints on the GPU: the CUDA tests of test_keypoints.py (one captured graph, CUDA == CPU keypoints,
#            fp32 / fp16, per-joint fusion and the keeper's) and benchmarks/pose_cost.py (a YOLOv8n-pose-sized
#            network, torch fp16, 100 objects a frame: keypoints fused against ignored at 4K and 1080p; captures,
#            split, peak memory); the target is <= 1.10x at 4K, one whole captured graph
#   obb_train  the bundled rotated-box model trained on the GPU as the bundled detector was
#            (python -m tiled_detector.tools.train.obb_training --device cuda; files in $OUT/obb_model)
#   obb_reference  ultralytics' YOLOv8n / YOLO11n / YOLO26n OBB trained there by ultralytics' trainer on our
#            synthetic rotated crops, exported (ONNX, YOLO26 end-to-end ONNX, TorchScript), ultralytics' own
#            predictions on the real aerial images in .models/aerial/ against our full-frame view
#            (benchmarks/obb_reference.py: boxes 1 px, angles 0.01 rad, scores 0.01); needs ultralytics;
#            OBBREF_TRAIN (1000 crops) and OBBREF_EPOCHS (20) size the training
#   obb_bench  the rotated-box model at 4K on the GPU (torch fp32 / fp16): eval --obb (tiles + full view against the
#            full view alone), bench against the same-sized detect network (the bundled default.ts): one whole
#            captured graph per frame; reads $OUT/obb_model (obb_train) or the bundled obb.ts
#   pose_train  the bundled pose model trained on the GPU (python -m tiled_detector.tools.train.pose_training --device cuda;
#            POSE_STEPS (4000) and POSE_WORKERS (14) size it; files in $OUT/pose_model)
#   pose_reference  ultralytics' YOLOv8n / YOLO11n / YOLO26n pose models trained there by ultralytics' trainer on our
#            synthetic figures, all three at once (benchmarks/pose_reference.py: POSEREF_TRAIN crops (600),
#            POSEREF_EPOCHS (30), POSEREF_HOURS (0: no time limit; else ultralytics' `time` per model)), their
#            weights in $OUT/pose_weights; then (POSEREF_STEPS, default "dataset fit predict check") exported (ONNX,
#            YOLO26 end-to-end ONNX, TorchScript) and predicted by ultralytics on the real photos in
#            .models/pose_photos/ letterboxed once, against our decoding of the same tensor (boxes and keypoints
#            1 px, scores 0.01); needs ultralytics (no polars needed)
#   kernels  the frame program's Triton kernels (issue 59): triton's presence, their CUDA tests (fused == torch stages,
#            captured), benchmarks/kernel_profile.py (kernels and device ms per stage, eager; kernels per replayed
#            frame graph; the engine's alone) for the bundled model, and where present .models/yolox_nano_real.ts
#            (real weights) and .models/yolox_nano_source.ts (random: the flood), bench fp16 host frames of the real
#            weights (stream_ms, targets 1.15x stream, 1.3x latency); with KERNELS_BASE=<another checkout's src> the
#            profiles and bench of that checkout too (the baseline, same run)
#   kernels_quick  the same in under two minutes: kernel_profile.py --check of the bundled model (kernels through the
#            kernels == through the torch stages == eager) and bench of .models/yolox_nano_real.ts (stream_ms, the
#            device ms per stage and kernels columns)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
what="${*:-checks exports}"
out="${OUT:-out/device}"
mkdir -p "$out" /tmp/site
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >"$out/pip.log" 2>&1
fi
export PYTHONPATH="$PWD/src:$PWD/benchmarks:/tmp/site" PYTHONUNBUFFERED=1 YOLO_OFFLINE=1 YOLO_CONFIG_DIR=/tmp/yolo
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
td() { python3 -m tiled_detector.cli "$@"; }
# a bench CSV's main columns, and FAIL where a torch row is not one whole captured graph (fp16: within 1.3x the
# model's own captured graph on the same views)
graph_rows() {
  python3 - "$1" <<'PY'
import csv, sys
failed = False
for row in csv.DictReader(open(sys.argv[1])):
    if row["backend"] == "sahi":
        print(f"  sahi {row['size']}: {float(row['total_ms']):.1f} ms")
        continue
    keys = ("backend", "precision", "size", "tile_size", "cuda_graph", "views", "engine_calls", "total_ms", "graph_ms",
            "model_only_ms", "model_only_graph_ms", "ratio")
    print("  " + " ".join(f"{k}={row.get(k, '')}" for k in keys))
    slow = row["precision"] == "fp16" and float(row["ratio"]) > 1.3  # the target: fp16 within 1.3x
    if row["backend"] == "torch" and (row["cuda_graph"] != "whole" or not row.get("graph_ms") or slow):
        print(f"  FAIL {row['precision']} {row['size']}: cuda_graph {row['cuda_graph']}, graph_ms {row.get('graph_ms')!r}, ratio {row['ratio']}")
        failed = True
print("  OK" if not failed else "  FAILED")
PY
}

# a bench CSV's stream columns against the targets (fp16 rows): a whole graph, stream_ms within `$2` x the model's own
# captured graph and the one frame's latency within `$3` x (empty: reported only)
stream_rows() {
  python3 - "$@" <<'PY'
import csv, sys
path, stream_max, latency_max = sys.argv[1], sys.argv[2], sys.argv[3]
failed = False
for row in csv.DictReader(open(path)):
    if row["status"] != "ok":
        print(f"  {row['precision']} {row['size']}: {row['status']}")
        continue
    print(f"  {row['precision']} {row['size']}: cuda_graph {row['cuda_graph']} {row.get('cuda_graph_reason', '')!r} "
          f"views {row['views']}: latency {row['total_ms']} ms ({row['ratio']}x), stream {row['stream_ms']} ms "
          f"({row['stream_ratio']}x), model graph {row['model_only_graph_ms']} ms, frame graph {row.get('graph_ms')} ms, "
          f"upload {row.get('upload_ms')} ms, detections {row['detections']}")
    if stream_max and row["precision"] == "fp16" and (
            row["cuda_graph"] != "whole" or float(row["stream_ratio"]) > float(stream_max)
            or float(row["ratio"]) > float(latency_max)):
        print(f"  FAIL {row['precision']} {row['size']}: targets whole, stream <= {stream_max}x, latency <= {latency_max}x")
        failed = True
print("  OK" if not failed else "  FAILED")
PY
}

if [[ " $what " == *" checks "* ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_program.py test/test_bench.py test/test_decode.py \
    test/test_engines.py test/test_jpeg.py test/test_merge.py test/test_preprocess.py test/test_policy.py \
    test/test_motion.py test/test_kernels.py test/test_masks.py test/test_rotated.py >"$out/pytest_gpu.txt" 2>&1
  grep -E "^(FAILED|ERROR|E  )|passed|failed" "$out/pytest_gpu.txt" | tail -30
  python3 benchmarks/gpu_check.py --runs 30 >"$out/gpu_check.txt" 2>&1
  grep -E "^(equality|transfers|detect_many|captured|timings|1080p|FAIL|ALL|done)" "$out/gpu_check.txt" | tail -40
fi

if [[ " $what " == *" tensorrt "* ]]; then
  python3 benchmarks/tensorrt_stream_check.py --runs 30 2>&1 | tee "$out/tensorrt_stream_check.txt" | grep -E "^(PASS|FAIL|ALL|\()"
fi

if [[ " $what " == *" depth "* ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_depth.py test/test_program.py >"$out/pytest_depth_gpu.txt" 2>&1
  grep -E "^(FAILED|ERROR|E  )|passed|failed" "$out/pytest_depth_gpu.txt" | tail -20
  for size in 3840x2160 1920x1080; do
    python3 benchmarks/depth_cost.py --device cuda --size "$size" --objects 300 --runs 500 --frame-runs 30 \
      --backend torch --precision fp16 2>"$out/depth_cost_$size.log" | tee "$out/depth_cost_$size.jsonl"
  done
  td eval --depth --device cuda --backend torch --precision fp16 --width 3840 --height 2160 --frames 20 \
    --out "$out/eval_depth_4k" --json 2>"$out/eval_depth_4k.log" | tail -1 | tee "$out/eval_depth_4k.json"
fi

if [[ " $what " == *" obb "* ]]; then
  device="${OBB_DEVICE:-cuda}" models="${OBB_MODELS:-/tmp/exports_obb}"
  read -r -a sizes <<<"${OBB_SIZES:-1920x1080 3840x2160}"
  if [[ "$device" == cuda ]]; then
    python3 -m pytest -q -p no:cacheprovider -m gpu test/test_obb.py test/test_rotated.py test/test_merge.py \
      >"$out/pytest_obb_gpu.txt" 2>&1
    grep -E "^(FAILED|ERROR|E  )|passed|failed" "$out/pytest_obb_gpu.txt" | tail -10
  fi
  if [[ ! -f "$models/yolov8n-obb.torchscript" || ! -f "$models/yolov8n.torchscript" ]]; then
    mkdir -p "$models" && (cd "$models" && python3 -c "
from ultralytics import YOLO
for name in ('yolov8n', 'yolov8n-obb'):
    print(YOLO(name + '.yaml').export(format='torchscript', imgsz=640))
" >"$out/export_obb.log" 2>&1)
    tail -2 "$out/export_obb.log"
  fi
  for name in yolov8n yolov8n-obb; do
    for conf in default 0.00001; do
      flag=(); [[ "$conf" != default ]] && flag=(--conf "$conf")
      td bench --model "$models/$name.torchscript" --backend torch --device "$device" --precision "${OBB_PRECISION:-fp16}" \
        --size "${sizes[@]}" --runs "${OBB_RUNS:-30}" --warmup "${OBB_WARMUP:-5}" "${flag[@]}" \
        --out "$out/obb_${name}_$conf" 2>&1 | grep -v "bench \[" | tail -4
    done
  done
  python3 - "$out" "$device" <<'PY' | tee "$out/obb_ratio.txt"
import csv, sys
out, device = sys.argv[1], sys.argv[2]
failed = False
for conf in ("default", "0.00001"):
    rows = {n: list(csv.DictReader(open(f"{out}/obb_{n}_{conf}/bench.csv"))) for n in ("yolov8n", "yolov8n-obb")}
    for detect, obb in zip(rows["yolov8n"], rows["yolov8n-obb"]):
        ratio = float(obb["total_ms"]) / float(detect["total_ms"])
        whole = obb["cuda_graph"] == "whole"
        print(f"conf {conf} {obb['size']} {obb['precision']}: obb {float(obb['total_ms']):.2f} ms "
              f"(cuda_graph {obb['cuda_graph']}), detect {float(detect['total_ms']):.2f} ms "
              f"(cuda_graph {detect['cuda_graph']}), ratio {ratio:.2f}")
        if device == "cuda" and (ratio > 1.3 or not whole):
            failed = True
            print(f"  FAIL: the target is one whole captured graph and <= 1.3x the detect model")
print("OK" if not failed else "FAILED")
PY
fi

if [[ " $what " == *" exports "* ]]; then
  mkdir -p /tmp/exports && cd /tmp/exports || exit 1
  python3 - <<'PY' >"$out/export.log" 2>&1
from ultralytics import YOLO
model = YOLO("yolov8n.yaml")
print(model.export(format="torchscript", imgsz=640))
print(model.export(format="onnx", imgsz=640, dynamic=True, simplify=False))
PY
  tail -3 "$out/export.log"; ls -la /tmp/exports
  cd - >/dev/null || exit 1
  # the files as written: their labels and input, no options
  python3 -c "
from tiled_detector.detector import TiledDetector
for m, b in (('/tmp/exports/yolov8n.torchscript', 'torch'), ('/tmp/exports/yolov8n.onnx', 'onnxruntime')):
    d = TiledDetector(m, backend=b, device='cuda' if b == 'torch' else 'cpu')
    print(m, d.engine.input.shape, d.engine.metadata.source, len(d.labels), d.labels[:3], d._layout.value)
" 2>&1 | tee "$out/loaded.txt"
  common=(--size 1920x1080 3840x2160 --runs 30 --warmup 5)
  td bench --model /tmp/exports/yolov8n.torchscript --backend torch --device cuda --precision fp32 fp16 \
    "${common[@]}" --peer sahi --out "$out/ul_ts_host" 2>&1 | grep -v "bench \[" | tail -12
  td bench --model /tmp/exports/yolov8n.torchscript --backend torch --device cuda --precision fp32 fp16 \
    "${common[@]}" --input device --out "$out/ul_ts_device" 2>&1 | grep -v "bench \[" | tail -6
  td bench --model /tmp/exports/yolov8n.onnx --backend onnxruntime --device cpu --precision fp32 \
    --size 1920x1080 --runs 5 --warmup 1 --out "$out/ul_onnx_cpu" 2>&1 | grep -v "bench \[" | tail -4
  python3 -c "
from pathlib import Path
from networks import YoloV8nLike, save_torchscript
save_torchscript(YoloV8nLike(host_anchors=True), Path('/tmp/exports/hostile.ts'), (640, 640))
"
  for graph in --no-cuda-graph --cuda-graph; do
    for conf in 0.25 0.00001; do
      td bench --model /tmp/exports/hostile.ts --backend torch --device cuda --precision fp16 "${common[@]}" \
        --conf "$conf" $graph --out "$out/hostile${graph}_$conf" 2>&1 | grep -v "bench \[" | tail -3
    done
  done
fi

if [[ " $what " == *" policy "* ]]; then
  if [[ ! -f /tmp/exports/yolov8n.torchscript ]]; then
    mkdir -p /tmp/exports && (cd /tmp/exports && python3 -c "
from ultralytics import YOLO
print(YOLO('yolov8n.yaml').export(format='torchscript', imgsz=640))" >"$out/export_policy.log" 2>&1)
  fi
  python3 -c "
import cv2, numpy as np
mask = np.zeros((90, 160), np.uint8); mask[:, 120:] = 255; cv2.imwrite('/tmp/exports/right.png', mask)"
  model=(--model /tmp/exports/yolov8n.torchscript --backend torch --device cuda --precision fp16 --runs 30 --warmup 5)
  td bench "${model[@]}" --size 3840x2160 1920x1080 --out "$out/policy_full" 2>&1 | grep -v "bench \[" | tail -4
  td bench "${model[@]}" --size 3840x2160 1920x1080 --roi 0 0.5 1 1 --out "$out/policy_roi" 2>&1 | grep -v "bench \[" | tail -4
  td bench "${model[@]}" --size 3840x2160 1920x1080 --class-thresholds 0:0.4 --roi 0 0.25 1 1 \
    --ignore-mask /tmp/exports/right.png --min-box-size 4 --max-box-size 600 --out "$out/policy_all" 2>&1 \
    | grep -v "bench \[" | tail -4
  python3 -c "
from pathlib import Path
from networks import YoloV8nLike, save_torchscript
save_torchscript(YoloV8nLike(host_anchors=True), Path('/tmp/exports/hostile.ts'), (640, 640))
"
  td bench --model /tmp/exports/hostile.ts --backend torch --device cuda --precision fp16 --size 1920x1080 3840x2160 \
    --runs 30 --warmup 5 --input device --out "$out/hostile_device" 2>&1 | grep -v "bench \[" | tail -4
fi

if [[ " $what " == *" budget "* ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_program.py -k "chosen or every_runtime" \
    >"$out/pytest_budget.txt" 2>&1
  tail -3 "$out/pytest_budget.txt"
  python3 - <<'PY' 2>&1 | tee "$out/captures.txt"
import numpy as np
from tiled_detector import TiledDetector
from tiled_detector.stream import Stream
from tiled_detector.tools.worlds.synthetic import make_sequence
for budget in (0, 8):
    detector = TiledDetector(backend="torch", device="cuda", precision="fp16", tracker="bytetrack", tile_budget=budget)
    stream, views, sets = Stream(detector), [], set()
    for i, scene in enumerate(make_sequence(7, 30, 3840, 2160)):
        result = stream.process([scene.image], [i * 33_333_333], ["cam"])[0]
        views.append(result.views)
    keys = list(detector._runner._captured)
    counts = sorted({k[3][0] if k[3] else None for k in keys}, key=str)
    print(f"tile_budget {budget}: views per frame {sorted(set(views))}, captures {len(keys)} "
          f"(tile counts {counts}), captured={detector._runner.captures} split={detector._runner.split}")
PY
  if [[ ! -f /tmp/exports/yolov8n.torchscript ]]; then
    mkdir -p /tmp/exports && (cd /tmp/exports && python3 -c "
from ultralytics import YOLO
print(YOLO('yolov8n.yaml').export(format='torchscript', imgsz=640))" >"$out/export_budget.log" 2>&1)
  fi
  for model in "" "--model /tmp/exports/yolov8n.torchscript"; do
    name=$([[ -z "$model" ]] && echo bundled || echo yolov8n)
    common=($model --backend torch --device cuda --precision fp16 --runs 30 --warmup 5)
    td bench "${common[@]}" --size 3840x2160 --out "$out/budget_${name}_4k_all" 2>&1 | grep -v "bench \[" | tail -2
    td bench "${common[@]}" --size 3840x2160 --tile-budget 8 --out "$out/budget_${name}_4k_8" 2>&1 | grep -v "bench \[" | tail -2
    td bench "${common[@]}" --size 1920x1080 --out "$out/budget_${name}_1080_all" 2>&1 | grep -v "bench \[" | tail -2
    td bench "${common[@]}" --size 1920x1080 --tile-budget 2 --out "$out/budget_${name}_1080_2" 2>&1 | grep -v "bench \[" | tail -2
  done
fi

if [[ " $what " == *" budget_eval "* ]]; then
  gpu=(--backend torch --device cuda --precision fp16 --motion --frames 60)
  td eval "${gpu[@]}" --width 3840 --height 2160 --budgets 8 12 --out "$out/eval_4k" 2>&1 | tail -4
  td eval "${gpu[@]}" --width 3840 --height 2160 --budgets 8 --pan 4 --out "$out/eval_4k_pan" 2>&1 | tail -3
  td eval "${gpu[@]}" --width 1920 --height 1080 --budgets 2 4 --out "$out/eval_1080" 2>&1 | tail -4
fi

if [[ " $what " == *" yolox "* ]]; then
  python3 benchmarks/yolox_check.py --onnx .models/yolox_nano.onnx --photos .models/photos --device cuda \
    --yolox-source .models/yolox_src --onnx2torch --out /tmp/yolox >"$out/yolox_check.txt" 2>&1
  grep -E "(equality|captured|input|random|real|ALL|FAIL)" "$out/yolox_check.txt" | tail -40
  yolox=(--peer sahi --size 1920x1080 3840x2160)  # default tiles: auto, the model's 416
  for ts in yolox_nano yolox_nano_source; do
    td bench --model /tmp/yolox/$ts.ts --backend torch --device cuda --precision fp32 fp16 --runs 30 \
      --warmup 5 "${yolox[@]}" --out "$out/$ts" 2>&1 | grep -v "bench \[" | tail -9
  done
  graph_rows "$out/yolox_nano_source/bench.csv"  # captured whole, <= 1.3x (onnx2torch's is split: not checked)
  td bench --model .models/yolox_nano.onnx --backend onnxruntime --device cpu --precision fp32 --runs 5 \
    --warmup 1 "${yolox[@]}" --out "$out/yolox_cpu" 2>&1 | grep -v "bench \[" | tail -6
fi

if [[ " $what " == *" stream "* ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_upload.py test/test_capture.py test/test_merge.py \
    test/test_program.py test/test_bench.py >"$out/pytest_stream.txt" 2>&1
  grep -E "^(FAILED|ERROR|E  )|passed|failed" "$out/pytest_stream.txt" | tail -20
  python3 benchmarks/yolox_check.py --onnx .models/yolox_nano.onnx --photos .models/photos --device cuda \
    --yolox-source .models/yolox_src --out /tmp/yolox >"$out/yolox_check.txt" 2>&1
  grep -E "(equality|captured|ALL|FAIL)" "$out/yolox_check.txt" | tail -40
  gpu=(--backend torch --device cuda --runs 30 --warmup 5)
  td bench --model /tmp/yolox/yolox_nano_real.ts "${gpu[@]}" --precision fp16 fp32 --size 1920x1080 3840x2160 \
    --out "$out/yolox_real" 2>&1 | grep -v "bench \[" | tail -7
  stream_rows "$out/yolox_real/bench.csv" 1.15 1.3
  td bench --model /tmp/yolox/yolox_nano_source.ts "${gpu[@]}" --precision fp16 --size 1920x1080 3840x2160 \
    --out "$out/yolox_random" 2>&1 | grep -v "bench \[" | tail -4
  stream_rows "$out/yolox_random/bench.csv" "" ""
  td bench --model /tmp/yolox/yolox_nano_source.ts "${gpu[@]}" --precision fp16 --size 1920x1080 3840x2160 \
    --nms-rounds 2 --out "$out/yolox_random_rounds2" 2>&1 | grep -v "bench \[" | tail -4
  stream_rows "$out/yolox_random_rounds2/bench.csv" "" ""
  for model in yolo26n_416 yolo26n_416_dynamic; do
    td inspect ".models/$model.torchscript" | grep cuda_graph
    td bench --model ".models/$model.torchscript" "${gpu[@]}" --precision fp16 --size 2560x1440 \
      --out "$out/$model" 2>&1 | grep -v "bench \[" | tail -3
    stream_rows "$out/$model/bench.csv" 1.15 1.3
  done
fi

if [[ " $what " == *" gfl "* ]]; then
  python3 benchmarks/gfl_check.py --device cuda --photos .models/photos --out /tmp/gfl >"$out/gfl_check.txt" 2>&1
  grep -E "(equality|captured|layout|ALL|FAIL)" "$out/gfl_check.txt" | tail -30
  for ts in picodet_like picodet32_like nanodet_like nanodet_plus_like; do
    td bench --model /tmp/gfl/$ts.ts --backend torch --device cuda --precision fp32 fp16 --runs 30 --warmup 5 \
      --size 1920x1080 3840x2160 --out "$out/gfl_$ts" 2>&1 | grep -v "bench \[" | tail -6
    graph_rows "$out/gfl_$ts/bench.csv"
  done
  python3 benchmarks/gfl_real_weights.py --models .models --photos .models/photos --out /tmp/gfl_real \
    >"$out/gfl_real_weights.txt" 2>&1
  grep -E "(equality|convert|ALL|FAIL)" "$out/gfl_real_weights.txt"
  for model in picodet_s_416_coco nanodet_m_416; do
    [[ -f /tmp/gfl_real/$model.ts ]] && td bench --model /tmp/gfl_real/$model.ts --backend torch --device cuda \
      --precision fp32 fp16 --runs 20 --warmup 5 --size 1920x1080 3840x2160 --out "$out/real_$model" 2>&1 \
      | grep -v "bench \[" | tail -6
    td inspect .models/$model.onnx | tee "$out/inspect_$model.txt" | grep -E "^(layout|family|tile_size|frame)"
    td bench --model .models/$model.onnx --backend onnxruntime --device cpu --precision fp32 --runs 5 --warmup 1 \
      --size 3840x2160 --peer sahi --out "$out/${model}_cpu" 2>&1 | grep -v "bench \[" | tail -4
  done
fi

if [[ " $what " == *" families "* ]]; then
  (cd /tmp && python3 "$OLDPWD/benchmarks/check_families.py" --out /tmp/families) >"$out/families.txt" 2>&1
  grep -E "^(family|yolo|rtdetr|ALL|[0-9]+ FAILED)" "$out/families.txt"
fi

if [[ " $what " == *" motion "* ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_motion.py >"$out/pytest_motion.txt" 2>&1
  tail -2 "$out/pytest_motion.txt"
  python3 - <<'PY' 2>&1 | tee "$out/motion_cost.txt"
import torch
from tiled_detector.tools.worlds.synthetic import MotionStyle, make_sequence
from tiled_detector.tracking import motion
for w, h in ((1920, 1080), (3840, 2160)):
    scenes = list(make_sequence(3, 2, w, h, MotionStyle(pan=4, rotate=0.1, shake=2)))
    frames = [torch.from_numpy(s.image).cuda() for s in scenes]
    factor = motion.thumb_factor(h, w)
    previous = motion.thumbnail(frames[0])
    def step():
        return motion.estimate(previous, motion.thumbnail(frames[1]), factor)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        matrix, ok = step()
    end.record(); torch.cuda.synchronize()
    eager = start.elapsed_time(end) / 100
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = step()
    start.record()
    for _ in range(100):
        graph.replay()
    end.record(); torch.cuda.synchronize()
    replay = start.elapsed_time(end) / 100
    error = motion.corner_error(matrix.cpu().numpy(), scenes[1].camera, (h, w))
    print(f"{w}x{h}: motion estimate {eager:.3f} ms eager, {replay:.3f} ms as a captured graph; ok={bool(ok)}, "
          f"error {error:.2f} px; {torch.cuda.get_device_name()}")
PY
  gpu=(--backend torch --device cuda --precision fp16 --motion --frames 60 --width 3840 --height 2160)
  td eval "${gpu[@]}" --budgets 12 --max-tile-age 8 --json --out /tmp/eval_still 2>"$out/eval_still.err" | tail -1 \
    >"$out/eval_still.json"
  td eval "${gpu[@]}" --budgets 12 --max-tile-age 8 --pan 4 --rotate 0.1 --shake 2 --json --out /tmp/eval_moving \
    2>"$out/eval_moving.err" | tail -1 >"$out/eval_moving.json"
  tail -3 "$out/eval_still.err"
  td bench --backend torch --device cuda --precision fp16 --size 3840x2160 --tracker bytetrack --runs 30 --warmup 5 \
    --out /tmp/bench_motion 2>&1 | grep -v "bench \[" | tail -3
  td bench --backend torch --device cuda --precision fp16 --size 3840x2160 --tracker bytetrack --runs 30 --warmup 5 \
    --motion-compensation none --out /tmp/bench_nomotion 2>&1 | grep -v "bench \[" | tail -3
  python3 -c "
import csv
for name in ('motion', 'nomotion'):
    row = next(csv.DictReader(open('/tmp/bench_' + name + '/bench.csv')))
    print(name, {k: v for k, v in row.items() if k.endswith('_ms') and not k.endswith('p95_ms')})
" | tee "$out/bench_motion.txt"
  python3 -c "
import json
for name in ('still', 'moving'):
    d = json.load(open('$out/eval_' + name + '.json'))
    for k, v in d['configs'].items():
        print(name, k, *(f'{m}={v[m]:.3f}' for m in ('AP50', 'IDF1', 'id_switches', 'views_per_frame', 'frames_per_second', 'latency_p95')))
"
fi

if [[ " $what " == *" masks "* ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_masks.py >"$out/pytest_masks.txt" 2>&1
  tail -2 "$out/pytest_masks.txt"
  for size in 3840x2160 1920x1080; do
    python3 benchmarks/mask_cost.py --device cuda --precision fp16 --size "$size" --objects 100 --runs 30 \
      --warmup 5 --json "$out/mask_cost_$size.json" 2>"$out/mask_cost_$size.err" | tee -a "$out/mask_cost.txt"
  done
  python3 -c "
import json
row = json.load(open('$out/mask_cost_3840x2160.json'))
ok = row['ratio'] <= 1.20 and row['captured'] and not row['split'] and row['objects'] == 100
print('  masks at 4K:', f\"{row['ratio']:.3f}x\", f\"(label image {row['ms_labels']:.2f} ms)\", 'captures', row['captures'],
      'OK' if ok else 'FAILED')
"
fi

if [[ " $what " == *" pose "* ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_keypoints.py >"$out/pytest_keypoints.txt" 2>&1
  tail -2 "$out/pytest_keypoints.txt"
  for size in 3840x2160 1920x1080; do
    python3 benchmarks/pose_cost.py --device cuda --precision fp16 --size "$size" --objects 100 --runs 30 \
      --warmup 5 --json "$out/pose_cost_$size.json" 2>"$out/pose_cost_$size.err" | tee -a "$out/pose_cost.txt"
  done
  python3 -c "
import json
row = json.load(open('$out/pose_cost_3840x2160.json'))
ok = row['ratio'] <= 1.10 and row['captured'] and not row['split'] and row['captures'] == 1 and row['objects'] == 100
print('  keypoints at 4K:', f\"{row['ratio']:.3f}x\", 'captures', row['captures'], 'OK' if ok else 'FAILED')
"
fi

if [[ " $what " == *" obb_train "* ]]; then
  python3 -m tiled_detector.tools.train.obb_training --device cuda --workers 14 --out "$out/obb_model" \
    >"$out/obb_training.log" 2>&1
  tail -2 "$out/obb_training.log"
  ls -l "$out/obb_model"
fi

if [[ " $what " == *" obb_reference "* ]]; then
  ref=/tmp/obbref
  python3 benchmarks/obb_reference.py dataset --out "$ref/data" --train "${OBBREF_TRAIN:-1000}" --val 100 \
    >"$out/obb_dataset.log" 2>&1
  python3 benchmarks/obb_reference.py train --data "$ref/data" --images .models/aerial --out "$ref" --device 0 \
    --epochs "${OBBREF_EPOCHS:-20}" --batch 32 --workers 8 >"$out/obb_reference_train.log" 2>&1
  grep -E "ultralytics found|wrote|Error" "$out/obb_reference_train.log" | tail -12
  python3 benchmarks/obb_reference.py check --out "$ref" --images .models/aerial --device cuda \
    2>&1 | tee "$out/obb_reference_check.txt" | grep -vE "^(PASS) "
fi

if [[ " $what " == *" pose_train "* ]]; then
  python3 -m tiled_detector.tools.train.pose_training --device cuda --workers "${POSE_WORKERS:-14}" \
    --steps "${POSE_STEPS:-4000}" --out "$out/pose_model" >"$out/pose_training.log" 2>&1
  tail -2 "$out/pose_training.log"
  ls -l "$out/pose_model"
fi

if [[ " $what " == *" pose_reference "* ]]; then
  ref=/tmp/poseref steps=" ${POSEREF_STEPS:-dataset fit predict check} "
  if [[ $steps == *" dataset "* ]]; then
    python3 benchmarks/pose_reference.py dataset --out "$ref/data" --train "${POSEREF_TRAIN:-600}" --val 60 \
      >"$out/pose_dataset.log" 2>&1
  fi
  if [[ $steps == *" fit "* ]]; then  # the three models at once on the one GPU
    for model in yolov8n-pose yolo11n-pose yolo26n-pose; do
      python3 benchmarks/pose_reference.py fit --data "$ref/data" --out "$ref" --device 0 --models "$model" \
        --epochs "${POSEREF_EPOCHS:-30}" --hours "${POSEREF_HOURS:-0}" --batch 32 --workers "${POSEREF_WORKERS:-4}" \
        >"$out/pose_fit_$model.log" 2>&1 &
    done
    wait
    grep -hE "trained|Error|epochs completed|all " "$out"/pose_fit_*.log | tail -12
    mkdir -p "$out/pose_weights" && cp "$ref"/weights/*.pt "$out/pose_weights/"
  fi
  if [[ $steps == *" predict "* ]]; then
    python3 benchmarks/pose_reference.py predict --out "$ref" --images .models/pose_photos \
      >"$out/pose_predict.log" 2>&1
    grep -E "ultralytics found|wrote|Error" "$out/pose_predict.log" | tail -12
  fi
  if [[ $steps == *" check "* ]]; then
    python3 benchmarks/pose_reference.py check --out "$ref" --device cuda \
      2>&1 | tee "$out/pose_reference_check.txt" | grep -vE "^(PASS) "
  fi
fi

if [[ " $what " == *" obb_bench "* ]]; then
  model="$out/obb_model/obb.ts"
  [[ -f "$model" ]] || model=src/tiled_detector/models/obb.ts
  gpu=(--backend torch --device cuda --width 3840 --height 2160)
  td eval --obb --model "$model" "${gpu[@]}" --frames 20 --configs full tiles+full --json --out /tmp/eval_obb \
    2>"$out/eval_obb.err" | tail -1 >"$out/eval_obb_4k.json"
  python3 -c "
import json
d = json.load(open('$out/eval_obb_4k.json'))
print({k: round(v['AP50'], 3) for k, v in d['configs'].items()})"
  for name in obb default; do
    file="$model"; [[ $name == default ]] && file=src/tiled_detector/models/default.ts
    td bench --model "$file" --backend torch --device cuda --precision fp32 fp16 --size 3840x2160 1920x1080 \
      --runs 30 --warmup 5 --out "/tmp/bench_$name" 2>&1 | grep -v "bench \[" | tail -3
    echo "$name:"; graph_rows "/tmp/bench_$name/bench.csv"
  done
fi

if [[ " $what " == *" kernels "* ]]; then
  python3 -c "import torch, triton; print('triton', triton.__version__, 'torch', torch.__version__)" | tee "$out/triton.txt"
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels.py test/test_sync_free.py test/test_program.py \
    >"$out/pytest_kernels.txt" 2>&1
  grep -E "^(FAILED|ERROR|E  )|passed|failed" "$out/pytest_kernels.txt" | tail -20
  for branch in ${KERNELS_BASE:+base} here; do
    src="$PWD/src"; [[ $branch == base ]] && src="$KERNELS_BASE"
    for model in bundled yolox_nano_real yolox_nano_source; do
      flag=(); [[ $model != bundled ]] && flag=(--model ".models/$model.ts")
      [[ $model != bundled && ! -f .models/$model.ts ]] && continue
      sizes=(1920x1080 3840x2160); [[ $model == yolox_nano_source ]] && sizes=(1920x1080)
      echo "== $branch $model"
      PYTHONPATH="$src:$PWD/benchmarks:/tmp/site" python3 benchmarks/kernel_profile.py "${flag[@]}" --size "${sizes[@]}" \
        --json "$out/profile_${model}_$branch.json" 2>"$out/profile_${model}_$branch.err" | grep -v "^torch "
    done
    if [[ -f .models/yolox_nano_real.ts ]]; then
      PYTHONPATH="$src:$PWD/benchmarks:/tmp/site" td bench --model .models/yolox_nano_real.ts --backend torch \
        --device cuda --precision fp16 --size 1920x1080 3840x2160 --runs 30 --warmup 5 \
        --out "$out/bench_yolox_real_$branch" 2>&1 | grep -v "bench \[" | tail -3
      stream_rows "$out/bench_yolox_real_$branch/bench.csv" 1.15 1.3
    fi
  done
fi

if [[ " $what " == *" kernels_quick "* ]]; then
  python3 -c "import torch, triton; print('triton', triton.__version__, 'torch', torch.__version__)"
  python3 benchmarks/kernel_profile.py --check --size 1920x1080 3840x2160 --json "$out/profile_bundled.json" \
    2>"$out/profile_bundled.err" | grep -v "^torch "
  if [[ -f .models/yolox_nano_real.ts ]]; then
    td bench --model .models/yolox_nano_real.ts --backend torch --device cuda --precision fp16 \
      --size 1920x1080 3840x2160 --runs 20 --warmup 3 --out "$out/bench_yolox_real" 2>&1 | grep -v "bench \[" | tail -3
    stream_rows "$out/bench_yolox_real/bench.csv" 1.15 1.3
    python3 - "$out/bench_yolox_real/bench.csv" <<'PY'
import csv, sys
for row in csv.DictReader(open(sys.argv[1])):
    print(row["size"], "kernels", row["kernels"], "model_kernels", row["model_kernels"],
          {k[:-10]: row[k] for k in row if k.endswith("_device_ms") and row[k]})
PY
  fi
fi

