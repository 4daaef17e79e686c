#!/usr/bin/env bash
# The test command (README, CI): sets up everything from nothing, then runs lint and the suite.
#   bash scripts/run_tests.sh            the full suite (what CI runs)
#   bash scripts/run_tests.sh --quick    unit and single-server tests only (pytest -m "not slow"), for everyday work
# Any other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
source scripts/cpu_env.sh
.venv/bin/ruff check python test benchmark scripts setup.py
if [ "${1:-}" = "--quick" ]; then
  shift
  set -- -m "not slow" "$@"
fi
.venv/bin/python -m pytest test --durations=15 "$@"  # the slowest tests, for whoever trims CI time
