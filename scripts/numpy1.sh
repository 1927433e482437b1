#!/usr/bin/env bash
# The core tests again under numpy 1.x (JetPack 6's Humble ships numpy 1.x; the README says both work): a venv of
# its own, .venv-numpy1 at the repository root (git-ignored), made once from requirements/numpy1.txt (numpy 1.26.4,
# OpenCV 4.10 built for it, the rest at the main venv's pins) and kept while its inputs are unchanged, like .venv;
# then the tests of the ROS-free core (no rclpy there) with its interpreter. Called by scripts/test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-numpy1"
stamp="$venv/.tiled-detector-numpy1"
python="${PYTHON:-python3}"
want="$(cat "$root/scripts/numpy1.sh" "$root/requirements/numpy1.txt" "$root/requirements/test-nodeps.txt" \
  "$root/setup.py" | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]] || ! "$venv/bin/python" -c 'import tiled_detector' 2>/dev/null; then
  printf '[numpy1] building %s (numpy 1.26)\n' "$venv" >&2
  "$python" -m venv --clear "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" -r "$root/requirements/numpy1.txt" 2>&1 | { grep -v 'is ignored: it is neither' || true; } >&2
  "${pip[@]}" --no-deps -r "$root/requirements/test-nodeps.txt" 2>&1 \
    | { grep -v 'is ignored: it is neither' || true; } >&2
  "${pip[@]}" --no-deps --no-build-isolation -e "$root" 2>&1 | { grep -v 'is ignored: it is neither' || true; } >&2
  echo "$want" >"$stamp"
fi
"$venv/bin/python" - <<'PY'
import numpy, cv2
assert numpy.__version__.startswith("1."), f"the numpy 1.x pass runs numpy {numpy.__version__}"
print(f"[numpy1] numpy {numpy.__version__}, OpenCV {cv2.__version__}")
PY
cd "$root"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider test/test_tiling.py test/test_merge.py test/test_decode.py \
  test/test_preprocess.py test/test_detector.py test/test_policy.py test/test_bytetrack.py test/test_tracks.py \
  test/test_looks.py test/test_geometry.py test/test_schedule.py test/test_stream.py test/test_positions.py \
  test/test_depth.py test/test_depth_sync.py test/test_quantize.py test/test_engines.py test/test_exports.py \
  test/test_rebatch.py test/test_yolox.py test/test_gfl.py test/test_resolve.py
