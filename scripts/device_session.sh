#!/usr/bin/env bash
# One batched run on a lent CUDA machine (no network; wheels carried in .whl/): the GPU acceptance checks and the
# measurements quoted in the issues' closing notes. Results (logs, CSVs) go under $OUT.
#
#   checks   the CUDA-only tests (pytest -m gpu) and scripts/gpu_check.py (CPU == CUDA, graph == eager, one H2D
#            and one D2H copy per frame)
#   exports  ultralytics' own exports made there (TorchScript, ONNX), loaded with no options, bench with
#            --peer sahi (host and device input, fp32 and fp16); a capture-hostile YOLOv8n-sized model before
#            (cuda_graph off: the whole frame eager) and after (captured around the engine), normal and flood
#   policy   the detection policy's cost and savings: ultralytics' yolov8n TorchScript at 4K, fp16, the whole frame
#            against roi [0, 0.5, 1, 1] (engine views and time), and with every policy setting on; the
#            capture-hostile model again with frames already on the device (--input device)
set -uo pipefail
what="${1:-checks exports}"
out="${OUT:-out/device}"
mkdir -p "$out" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >"$out/pip.log" 2>&1
export PYTHONPATH="$PWD/src:$PWD/scripts:/tmp/site" PYTHONUNBUFFERED=1 YOLO_OFFLINE=1 YOLO_CONFIG_DIR=/tmp/yolo
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
td() { python3 -m tiled_detector.cli "$@"; }

if [[ " $what " == *" checks "* ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/test_program.py test/test_bench.py test/test_decode.py \
    test/test_engines.py test/test_jpeg.py test/test_merge.py test/test_preprocess.py test/test_policy.py >"$out/pytest_gpu.txt" 2>&1
  grep -E "^(FAILED|ERROR|E  )|passed|failed" "$out/pytest_gpu.txt" | tail -30
  python3 scripts/gpu_check.py --runs 30 >"$out/gpu_check.txt" 2>&1
  grep -E "^(equality|transfers|detect_many|captured|timings|1080p|FAIL|ALL|done)" "$out/gpu_check.txt" | tail -40
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
import sys; sys.path.insert(0, 'scripts')
from pathlib import Path
from bench_pipeline import YoloV8nLike, save_torchscript
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
import sys; sys.path.insert(0, 'scripts')
from pathlib import Path
from bench_pipeline import YoloV8nLike, save_torchscript
save_torchscript(YoloV8nLike(host_anchors=True), Path('/tmp/exports/hostile.ts'), (640, 640))
"
  td bench --model /tmp/exports/hostile.ts --backend torch --device cuda --precision fp16 --size 1920x1080 3840x2160 \
    --runs 30 --warmup 5 --input device --out "$out/hostile_device" 2>&1 | grep -v "bench \[" | tail -4
fi
