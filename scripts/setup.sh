#!/usr/bin/env bash
# Set up (idempotently) the environment both README commands use: a git-ignored .venv at the
# repository root holding the package in editable mode and everything it needs.
#
# Two routes:
#   * A ROS 2 distro is sourced (ROS_DISTRO set, rclpy importable; e.g. Humble on a Jetson): the venv
#     sees the distro's rclpy / vision_msgs / torch through --system-site-packages; only missing
#     pure-Python tools are added. No ros-* wheel is installed there (they would shadow /opt/ros).
#   * No ROS 2 distro (this machine kind, CI): pinned ROS 2 Jazzy wheels from PyPI (Fast DDS 2.14;
#     requirements/ros.txt, ros-build.txt), vision_msgs and tiled_detector_msgs built from vendor/ with the
#     pip-installed rosidl tooling, CPU torch, ONNX Runtime, test tools. TILED_DETECTOR_ROS_WHEELS=kilted takes the kilted wheels
#     (Fast DDS 3; requirements/ros-kilted.txt, ros-build-kilted.txt) instead: the test command's .venv-kilted.
#
# A stamp (hash of every input of this script) makes a second run a no-op that changes nothing.
# Environment: PYTHON (interpreter for the venv, default python3), TILED_DETECTOR_VENV (default .venv),
# TILED_DETECTOR_ROS_WHEELS (jazzy, the default, or kilted: which PyPI ROS 2 wheels the PyPI route installs).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TILED_DETECTOR_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.tiled-detector-setup"
log() { printf '[setup] %s\n' "$*" >&2; }
wheels="${TILED_DETECTOR_ROS_WHEELS:-jazzy}"
case "$wheels" in
  jazzy) ros_reqs="$root/requirements/ros.txt" build_reqs="$root/requirements/ros-build.txt" ;;
  kilted) ros_reqs="$root/requirements/ros-kilted.txt" build_reqs="$root/requirements/ros-build-kilted.txt" ;;
  *) log "TILED_DETECTOR_ROS_WHEELS is '$wheels': jazzy or kilted"; exit 1 ;;
esac

ros_route() {
  [[ -n "${ROS_DISTRO:-}" ]] && "$python" -c 'import rclpy' >/dev/null 2>&1
}

inputs_hash() {
  (
    cd "$root"
    cat scripts/setup.sh requirements/*.txt setup.py setup.cfg package.xml vendor/*/CMakeLists.txt \
      vendor/*/package.xml vendor/*/msg/*.msg
    "$python" -c 'import sys; print(sys.version)'
    echo "route=$(ros_route && echo "ros-${ROS_DISTRO}" || echo "pypi-$wheels")"
  ) | sha256sum | cut -d' ' -f1
}

want="$(inputs_hash)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
  && "$venv/bin/python" -c 'import tiled_detector, rclpy, vision_msgs.msg' >/dev/null 2>&1; then
  exit 0
fi

pip_install() {
  # --disable-pip-version-check and -q keep the log short; pins come from the requirements files.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v -e 'is ignored: it is neither a file nor a directory' || true; } >&2
  return "${PIPESTATUS[0]}"
}

if ros_route; then
  log "ROS 2 ${ROS_DISTRO} is sourced: using its rclpy, messages and Python packages"
  # the venv must see the distro's (and JetPack's) packages; one made by the PyPI route is replaced
  grep -qs '^include-system-site-packages = true' "$venv/pyvenv.cfg" \
    || "$python" -m venv --clear --system-site-packages "$venv"
  if ! "$venv/bin/python" -c 'import vision_msgs.msg' >/dev/null 2>&1; then
    log "vision_msgs is missing: sudo apt install ros-${ROS_DISTRO}-vision-msgs, then run this again"
    exit 1
  fi
  if ! "$venv/bin/python" -c 'import tiled_detector_msgs.msg' >/dev/null 2>&1; then
    log "tiled_detector_msgs (the keypoints topic's messages) is not built: colcon build it from" \
      "vendor/tiled_detector_msgs (docs/NODE.md); the node publishes no keypoints without it"
  fi
  # Only what the distro / JetPack does not provide (module:requirement; pins from requirements/ros-route.txt, which
  # install on Python 3.10 and 3.12, else from the other requirements/*.txt). torch, OpenCV and TensorRT stay the
  # system's (JetPack wheels); numpy too, unless below what onnx / onnxruntime ask (jammy's 1.21.5): then the
  # ros-route.txt constraint's 1.x.
  missing=()
  for pair in onnx:onnx onnxruntime:onnxruntime rosbags:rosbags mcap:mcap filelock:filelock pycocotools:pycocotools \
    matplotlib:matplotlib pytest:pytest pytest_timeout:pytest-timeout hypothesis:hypothesis ruff:ruff \
    onnxconverter_common:onnxconverter-common importlinter:import-linter scipy:scipy motmetrics:motmetrics; do
    "$venv/bin/python" -c "import ${pair%%:*}" >/dev/null 2>&1 && continue
    pin="$(awk -v want="${pair#*:}==" 'index($0, want) == 1 { print; exit }' "$root"/requirements/ros-route.txt \
      "$root"/requirements/*.txt)"
    missing+=("${pin:-${pair#*:}}")
  done
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    pip_install -c "$root/requirements/ros-route.txt" "${missing[@]}"
  fi
  pip_install --no-deps --no-build-isolation -e "$root"
else
  log "no ROS 2 distro sourced: building $venv from PyPI ROS 2 $wheels wheels"
  if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
  fi
  prefix="$(cd "$venv" && pwd)"
  # numpy first, at its pinned version: the vision_msgs Python extension is compiled against it.
  pip_install "$(grep -E '^numpy==' "$root/requirements/python.txt")"
  pip_install -r "$ros_reqs" -r "$build_reqs"

  # The wheels' CMake exports name the include dirs of the interpreter they were built with.
  pyinc="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  npinc="$("$venv/bin/python" -c 'import numpy; print(numpy.get_include())')"
  { grep -rlE '/opt/python/cp3[0-9]+-cp3[0-9]+/' "$prefix/share" --include='*.cmake' || true; } \
    | xargs -r sed -i -E \
      -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/(_core|core)/include#${npinc}#g" \
      -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#${pyinc}#g"

  # the message packages of vendor/: vision_msgs (no wheel has it) and ours (tiled_detector_msgs: keypoints)
  for msgs in vision_msgs tiled_detector_msgs; do
    msgs_hash="$(cat "$root/vendor/$msgs/CMakeLists.txt" "$root/vendor/$msgs"/msg/*.msg \
      "$ros_reqs" | sha256sum | cut -d' ' -f1)"
    if [[ "$(cat "$prefix/share/$msgs/.tiled-detector-msgs" 2>/dev/null)" != "$msgs_hash" ]] \
      || ! "$venv/bin/python" -c "import $msgs.msg" >/dev/null 2>&1; then
      command -v cmake >/dev/null && command -v g++ >/dev/null \
        || { log "cmake and g++ are needed to build $msgs: apt-get install cmake g++"; exit 1; }
      log "building $msgs from vendor/$msgs (about 40 s)"
      build="$(mktemp -d)"
      trap 'rm -rf "$build"' EXIT
      (
        export PATH="$prefix/bin:$PATH" AMENT_PREFIX_PATH="$prefix" CMAKE_PREFIX_PATH="$prefix"
        cmake -S "$root/vendor/$msgs" -B "$build" -DCMAKE_INSTALL_PREFIX="$prefix" \
          -DPython3_EXECUTABLE="$venv/bin/python" -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release >"$build/log" 2>&1 \
          && cmake --build "$build" -j "$(nproc)" >>"$build/log" 2>&1 \
          && cmake --install "$build" >>"$build/log" 2>&1
      ) || { tail -40 "$build/log" >&2; log "$msgs build failed"; exit 1; }
      echo "$msgs_hash" >"$prefix/share/$msgs/.tiled-detector-msgs"
    fi
  done

  pip_install -r "$root/requirements/python.txt" -r "$root/requirements/test.txt" -r "$root/requirements/ros-tools.txt"
  # SAHI is only a test oracle; its metadata pulls opencv-python, which clashes with the headless build.
  pip_install --no-deps -r "$root/requirements/test-nodeps.txt"
  pip_install --no-deps -e "$root"
fi

"$venv/bin/python" -c 'import tiled_detector, rclpy, vision_msgs.msg' \
  || { log "smoke import failed"; exit 1; }
echo "$want" >"$stamp"
log "ready: $venv"
