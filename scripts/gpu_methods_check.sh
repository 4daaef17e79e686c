#!/usr/bin/env bash
# The pruning methods on a CUDA device. Needs torch, transformers and SGLang's pure-torch evs_core file only
# (no SGLang CUDA build), so it runs on any CUDA machine with this checkout:
#   1. test/methods/test_methods_gpu.py: each method's mask on the device equals the CPU's (float32) and
#      keeps the stated count (bfloat16);
#   2. benchmark/bench_retention_mask.py on the device: each mask's cost over the vision encoder's, for the
#      2B and 8B towers in bfloat16 on a 64-frame 512x896 clip.
#   bash scripts/gpu_methods_check.sh [REPORT_DIR]      (default: gpu-methods-report; PYTHON picks the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
report=${1:-gpu-methods-report}
python=${PYTHON:-python3}
mkdir -p "$report"
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
"$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to check')" || exit 1
"$python" -m pytest -m gpu test/methods/test_methods_gpu.py -q -rA -p no:cacheprovider 2>&1 | tee "$report/tests.txt"
status=${PIPESTATUS[0]}
for tower in 2b 8b; do
  "$python" benchmark/bench_retention_mask.py --device cuda --dtype bfloat16 --tower "$tower" --groups 32 --reps 5 \
    --output "$report/bench-$tower.json" 2>&1 | tee "$report/bench-$tower.txt"
  status=$(( status || PIPESTATUS[0] ))
done
exit "$status"
