#!/usr/bin/env bash
# The main job (README): set up, then serve a video with EVS on the tiny model and show what it saved.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
source scripts/cpu_env.sh
.venv/bin/python -m sglang_evs.demo "$@"
