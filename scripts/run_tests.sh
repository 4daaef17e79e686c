#!/usr/bin/env bash
# The test command (README, CI): sets up everything from nothing, then runs lint and the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
source scripts/cpu_env.sh
.venv/bin/ruff check python test benchmark scripts setup.py
.venv/bin/python -m pytest test "$@"
