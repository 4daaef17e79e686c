#!/usr/bin/env bash
# The graph checks on a CUDA machine, on the GPU route (SGLang's Triton attention backend and pure-torch
# stand-ins for its CUDA kernels, SGLANG_EVS_GPU_ROUTE=1; no CPU environment), in bfloat16: the GPU tests (the
# route's ops and SGLang's layers captured in a CUDA graph: test/runtime/test_sgl_kernel_torch.py,
# test_gpu_route.py; each pruning method's mask on the device: test/methods/test_methods_gpu.py; then
# test/models/test_prefill_cuda_graph_gpu.py; at most TESTS_S seconds, default 270): the tiny Qwen3-VL with decode
# graphs and breakable prefill graphs (named by flag), q = 0 against upstream, EVS and VidCom2 at q = .75 against
# the same server eager, every media prefill and decode step replayed, every video encode a replay of SGLang's
# ViT graphs, chunked prefill and a radix repeat; each comparison prints its largest logprob gap. The TTFT and
# memory benchmarks are scripts/gpu_run.sh's `bench` and `memory` steps.
#   bash scripts/gpu_graph_check.sh [REPORT_DIR]      (default: gpu-graph-report; PYTHON picks the interpreter)
# Writes REPORT_DIR/tests.txt and summary.txt (the gaps).
# Exit status: 1 without a CUDA device; otherwise 0 only if the tests passed.
set -uo pipefail
cd "$(dirname "$0")/.."
report=${1:-gpu-graph-report}
python=${PYTHON:-python3}
mkdir -p "$report"
unset SGLANG_USE_CPU_ENGINE SGLANG_EVS_CPU_GRAPHS TORCHDYNAMO_DISABLE
export SGLANG_EVS_GPU_ROUTE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$python" -c "import sglang_evs" 2>/dev/null || export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
"$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to check')" || exit 1
device=$("$python" -c 'import torch; print(torch.cuda.get_device_name())')

# SIGINT, not TERM, at the limit: pytest then stops the servers it started (each its own
# process group) before exiting, so the next step gets the GPU's memory back.
start=$SECONDS
timeout -s INT -k 30 "${TESTS_S:-270}" "$python" -m pytest -m gpu test/runtime/test_sgl_kernel_torch.py \
  test/runtime/test_gpu_route.py test/methods/test_methods_gpu.py test/models/test_prefill_cuda_graph_gpu.py \
  -q -rA -p no:cacheprovider 2>&1 | tee "$report/tests.txt"
tests=${PIPESTATUS[0]}
tests_s=$((SECONDS - start))

{
  echo "== GPU graph checks on $device ($(date -u +%Y-%m-%dT%H:%MZ)), GPU route, bfloat16"
  echo "tests (exit $tests, ${tests_s} s): $(grep -E '[0-9]+ (passed|failed|error)' "$report/tests.txt" | tail -1)"
  grep -hE "largest logprob gap|without a prefill graph replay|decode steps replayed|ViT graph replays" \
    "$report/tests.txt" | sort -u
} | tee "$report/summary.txt"
exit $tests
