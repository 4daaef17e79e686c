#!/usr/bin/env bash
# The graph checks a CUDA machine runs as it is (SGLang 0.5.23's CUDA build and this package installed;
# the CPU route's environment not set), ending in a short report:
#   1. the GPU tests: the GPU's defaults at q = 0 against upstream and pruned against eager, and each
#      prefill graph backend (breakable, full) against eager, every media forward replayed
#      (test/models/test_prefill_cuda_graph_gpu.py);
#   2. the prefill-graph benchmark: eager/graph TTFT of short multimodal prefills, side by side
#      (benchmark/bench_prefill_graph.py).
#   bash scripts/gpu_graph_check.sh [REPORT_DIR]      (default: gpu-graph-report)
set -uo pipefail
cd "$(dirname "$0")/.."
report=${1:-gpu-graph-report}
mkdir -p "$report"
unset SGLANG_USE_CPU_ENGINE SGLANG_EVS_CPU_GRAPHS
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to check')" || exit 1
python -m pytest -m gpu test/models/test_prefill_cuda_graph_gpu.py -q -rA -p no:cacheprovider 2>&1 | tee "$report/tests.txt"
tests=${PIPESTATUS[0]}
python benchmark/bench_prefill_graph.py --backend breakable --pairs 30 --output "$report/bench.json" 2>&1 \
  | tee "$report/bench.txt"
bench=${PIPESTATUS[0]}
echo
echo "== report ($(python -c 'import torch; print(torch.cuda.get_device_name())'))"
grep -E "passed|failed|error" "$report/tests.txt" | tail -1
grep -E "eager/graph TTFT" "$report/bench.txt" || echo "benchmark: no result"
exit $(( tests || bench ))
