#!/usr/bin/env bash
# The test command: lint (ruff, py310 target), the import contracts (import-linter), the whole pytest suite inside
# the project venv (ROS 2 Jazzy from PyPI; its 25 slowest tests and any over 60 s listed at the end), then (for a full run, no arguments) the distro-dependent tests again on ROS 2
# Kilted (scripts/kilted.sh, .venv-kilted) and the core tests again under numpy 1.x (scripts/numpy1.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
.venv/bin/ruff check src test scripts launch benchmarks
.venv/bin/ruff format --check src test scripts launch benchmarks
.venv/bin/lint-imports --no-cache
.venv/bin/python -m pytest --durations=25 "$@"
if [[ $# -eq 0 ]]; then
  ./scripts/kilted.sh
  ./scripts/numpy1.sh
fi
