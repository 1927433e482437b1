#!/usr/bin/env bash
# The test command: lint (ruff, py310 target), the import contracts (import-linter), then the whole pytest
# suite, inside the project venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
.venv/bin/ruff check src test scripts launch
.venv/bin/ruff format --check src test scripts launch
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
