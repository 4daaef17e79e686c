#!/usr/bin/env bash
# The test command (README, CI): sets up everything from nothing, then runs lint and the suite.
#   bash scripts/run_tests.sh            the full suite (what CI runs)
#   bash scripts/run_tests.sh --quick    unit and single-server tests only (pytest -m "not slow"), for everyday work
#   bash scripts/run_tests.sh --rehearsal   the GPU machine's setup rehearsed on CPU (docs/gpu-route.md), before a
#                                           device call or after touching scripts/gpu_*; not part of the two above
# Any other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
source scripts/cpu_env.sh
# Python's own bytecode cache, even where the machine turns it off: otherwise every interpreter and server the
# suite starts compiles the plugin again, and pytest rewrites every test module's asserts at each collection.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/ruff check python test benchmark scripts setup.py
# The full tier runs on two pytest-xdist workers, each test module on one worker (its servers shared there): a third
# less time on 2 cores, where one process mostly waits on another server's. The quick tier gains too little to pay
# for a second worker's servers (docs/testing.md).
case "${1:-}" in
  --quick) shift; set -- -m "not slow and not rehearsal" "$@" ;;
  --rehearsal) shift; set -- -m rehearsal "$@" ;;
  *) set -- -m "not rehearsal" -n 2 --dist loadfile "$@" ;;
esac
.venv/bin/python -m pytest test --durations=15 "$@"  # the slowest tests, for whoever trims CI time
