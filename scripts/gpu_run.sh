#!/usr/bin/env bash
# The one script the GPU machine runs, in one device call of at most 7 minutes (docs/gpu-route.md, "Carrying and
# running"; the plan and each step's budget: docs/benchmarks.md, "The GPU run in one call"):
#   1. installs the carried wheels (.whl/run*/, from scripts/gpu_wheels.py) offline into a private venv over
#      the machine's python3 (scripts/gpu_pack/install.sh: the machine's torch 2.11 stays, .pth files work);
#   2. sets the GPU route's environment (SGLANG_EVS_GPU_ROUTE=1, offline hub) and runs the default steps in this
#      order, each under its own time limit (a cap that stops a hung step) and all by the deadline: TOTAL_BUDGET_S
#      (default 390 s) after this script started, or CHECK_BUDGET_S (default 375 s) after the install, whichever
#      is first:
#        facts    versions and device                                              limit 20 s (measured 6-7 s)
#        route    the route's import check (`python -m sglang_evs.runtime.gpu_route_check`)  60 s (26 s)
#        serve    the tiny-model serve check (scripts/gpu_pack/serve_check.py: a video at q = 0.75)  45 s
#        graph    the GPU tests (scripts/gpu_graph_check.sh, their TESTS_S 10 s less: the route's ops and layers,
#                 the methods on the device, the tiny Qwen3-VL's prefill, decode and ViT graphs)  130 s
#        bench    the TTFT benchmark's compact run, both parts (benchmark/bench_gpu_ttft.py --compact): what is
#                 left, at most BENCH_S (default 110 s), less the memory step's MEMORY_S
#        memory   32 concurrent 120-s clips at the plugin's default hold bound (benchmark/bench_gpu_memory.py):
#                 what is left, at least MEMORY_S (default 75 s) kept for it
#      and, in no default: `import` (SGLang's server modules alone), `methods` (scripts/gpu_methods_check.sh: the
#      methods' GPU tests, which the graph step runs too, and the keep-mask benchmark), `stream` (the live-stream
#      benchmark, benchmark/bench_stream.py --gpu), `images` (images pruned: benchmark/bench_images.py's
#      bench_serving image runs at q = 0, .5, .75 and the paired ideal at .75, 1024 x 1024 images, the 2B-shaped
#      balanced model in bfloat16); `bench` with BENCH_PART=1 or 2 runs that full part instead
#      of the compact run, with everything left (a call of its own);
#   3. writes $OUT/report.md (pass/fail, seconds and figures of each step), $OUT/serve-check.json, the
#      benchmarks' files (the TTFT benchmark's samples, gpu-ttft-compact.jsonl or gpu-ttft-part$BENCH_PART.jsonl,
#      written as they are measured; gpu-memory.json; methods-bench-{2b,8b}.json) and $OUT/logs.tar.gz (every
#      step's log and report folder); OUT defaults to gpu-run-report.
# A step stopped at its limit gets SIGINT, then SIGKILL 20 s later: the last step ends by TOTAL_BUDGET_S + 20 s,
# and the report follows in a few seconds, so a device call of timeout_s=420 holds it.
# Exit status: 0 when every step that ran passed.
#   bash scripts/gpu_run.sh                  PYTHON: the machine's interpreter (python3)
#   STEPS="install facts route" bash scripts/gpu_run.sh     only these steps (the CPU rehearsal's plumbing check)
#   STEPS="install bench" BENCH_PART=1 bash scripts/gpu_run.sh    one full part of the TTFT benchmark (then part 2)
#   STEPS="install stream" bash scripts/gpu_run.sh           the live-stream benchmark (benchmark/bench_stream.py --gpu)
#   STEPS="install images" bash scripts/gpu_run.sh           images pruned (benchmark/bench_images.py on the GPU)
set -uo pipefail
script_start=$(date +%s)
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:-gpu-run-report}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${SGLANG_EVS_GPU_WORK:-/tmp/sglang-evs-gpu}
rm -rf "$work/logs"
mkdir -p "$work/logs"
base=${PYTHON:-python3}
venv=$work/venv
steps=${STEPS:-install facts route serve graph bench memory}
budget=${CHECK_BUDGET_S:-375}
report=$out/report.md
failed=0
skipped=0
: > "$work/summary.md"

wanted() { [[ " $steps " == *" $1 "* ]]; }
record() {  # step, result, seconds, figures
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >> "$work/summary.md"
  echo "== $1: $2 (${3} s) $4"
}
# run_step NAME LIMIT_S CMD...: the command's output in logs/NAME.txt; it is stopped (SIGINT, then SIGKILL)
# at LIMIT_S or at what is left of the check budget, whichever comes first. Under 20 s it is not run: its result
# (step_result, which the caller records) says it was skipped for time.
run_step() {
  local name=$1 limit=$2
  shift 2
  [ -n "${deadline:-}" ] && limit=$(limit_for "$limit")
  if [ "$limit" -lt 20 ]; then
    step_result="skipped (no time left)" step_seconds=0 skipped=$((skipped + 1))
    return 1
  fi
  local start=$(date +%s)
  timeout --signal=INT --kill-after=20 "$limit" "$@" > "$work/logs/$name.txt" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then step_result=pass; else step_result="FAIL (exit $rc$( [ $rc -eq 124 ] && echo ", over ${limit} s"))"; failed=1; fi
  step_seconds=$took
  return $rc
}
tail_of() { tail -n "${2:-3}" "$work/logs/$1.txt" 2>/dev/null | tr '\n|' '  ' | cut -c1-400; }
# limit_for LIMIT_S [KEEP_S]: LIMIT_S, or what is left before the deadline less KEEP_S (a later step's), if less
limit_for() {
  local left=$(( deadline - $(date +%s) - ${2:-0} ))
  if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

if wanted install; then
  shopt -s nullglob
  dirs=("${WHEELS_DIR:-.whl}"/run*/)
  shopt -u nullglob
  if [ ${#dirs[@]} -eq 0 ]; then
    record install "FAIL (no .whl/run*/: run scripts/gpu_wheels.py here and carry .whl/run1)" 0 ""
    failed=1
  else
    run_step install 30 bash scripts/gpu_pack/install.sh "$base" "$venv" "${dirs[@]}"
    record install "$step_result" "$step_seconds" "$(ls "${dirs[@]}" | grep -c '\.whl$') wheels from ${dirs[*]}; $(tail_of install 1)"
  fi
fi
[ -x "$venv/bin/python" ] && export PATH=$venv/bin:$PATH   # `python` and `python3` of every check: the venv's
export SGLANG_EVS_GPU_ROUTE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# (the route sets the rest of its environment in every process: sglang_evs.runtime.gpu_route.ENVIRONMENT)
unset SGLANG_USE_CPU_ENGINE SGLANG_EVS_CPU_GRAPHS
# The checks end by CHECK_BUDGET_S after the install and by TOTAL_BUDGET_S after this script started, whichever is
# first (the header: one device call of 420 s).
deadline=$(( $(date +%s) + budget ))
total=${TOTAL_BUDGET_S:-390}
[ "$deadline" -gt $(( script_start + total )) ] && deadline=$(( script_start + total ))

if wanted facts; then
  run_step facts 20 python - <<'PY'
import importlib.metadata as m, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("torch", "triton", "transformers", "sglang", "sglang-evs", "numpy", "opencv-python-headless"):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, "MISSING")
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
PY
  record facts "$step_result" "$step_seconds" "$(tail_of facts 9)"
fi

if wanted route; then
  if [ -f python/sglang_evs/runtime/gpu_route.py ]; then
    run_step route 60 python -m sglang_evs.runtime.gpu_route_check
    record route "$step_result" "$step_seconds" "$(tail_of route 2)"
  else
    record route "skipped (python/sglang_evs/runtime/gpu_route.py not in this checkout)" 0 ""
  fi
fi

if wanted import; then
  run_step import 120 python -c "import sglang.srt.entrypoints.http_server, sglang_evs.plugin; print('SGLang server modules import')"
  record import "$step_result" "$step_seconds" "$(tail_of import 2)"
fi

if wanted serve; then
  run_step serve 45 python scripts/gpu_pack/serve_check.py --device cuda --work "$work/serve" --timeout 35 \
    --report "$out/serve-check.json"
  figures=$(python -c "
import json; r = json.load(open('$out/serve-check.json'))
lines = r.get('error', '').strip().splitlines()
if lines: r['error'] = lines[0][:200] + (' ... ' + lines[-1][:300] if len(lines) > 1 else '')
print(', '.join(f'{k} {r[k]}' for k in ('server_start_s', 'video_tokens_before', 'video_tokens_kept', 'chat_status', 'error') if k in r))" 2>/dev/null)
  record serve "$step_result" "$step_seconds" "$figures"
  cp "$work/serve/server.log" "$work/logs/serve-server.log" 2>/dev/null
fi

if wanted graph; then
  if [ -f scripts/gpu_graph_check.sh ]; then
    # the tests stop by themselves (SIGINT to pytest, which stops its servers) 10 s before the step's limit
    limit=$(limit_for 130)
    TESTS_S=${TESTS_S:-$(( limit - 10 ))} run_step graph "$limit" bash scripts/gpu_graph_check.sh "$work/graph"
    record graph "$step_result" "$step_seconds" "$(tail_of graph 3)"
  else
    record graph "skipped (scripts/gpu_graph_check.sh not in this checkout)" 0 ""
  fi
fi

if wanted methods; then
  if [ -f scripts/gpu_methods_check.sh ]; then
    run_step methods 180 bash scripts/gpu_methods_check.sh "$work/methods"
    figures="$(grep -hE "passed|failed" "$work/methods/tests.txt" 2>/dev/null | tail -1); $(grep -hiE "encoder|mask" "$work"/methods/bench-*.txt 2>/dev/null | tail -4 | tr '\n|' '  ')"
    record methods "$step_result" "$step_seconds" "${figures:0:600}"
  else
    record methods "skipped (scripts/gpu_methods_check.sh not in this checkout)" 0 ""
  fi
fi

if wanted bench; then
  # The compact run (both parts, few clips) within BENCH_S, or BENCH_PART's full part with everything left; either
  # leaves the memory step its MEMORY_S. The benchmark starts no work that would end past its budget (the limit
  # less the servers' stop and the report: 15 s, a minute for a full part), and a stop at the limit (SIGINT) keeps
  # every sample written so far. BENCH_ARGS: more of its flags (e.g. "--load-seconds 48 --concurrency 1 8").
  keep=0
  wanted memory && keep=${MEMORY_S:-75}
  if [ -n "${BENCH_PART:-}" ]; then
    mode=(--part "$BENCH_PART") samples=$out/gpu-ttft-part$BENCH_PART.jsonl cap=$(( deadline - $(date +%s) )) stop_s=60
  else
    mode=(--compact) samples=$out/gpu-ttft-compact.jsonl cap=${BENCH_S:-110} stop_s=15
  fi
  limit=$(limit_for "$cap" "$keep")
  run_step bench "$limit" python benchmark/bench_gpu_ttft.py "${mode[@]}" --budget-s $(( limit > stop_s ? limit - stop_s : 1 )) \
    --workdir "$work/bench" --output "$samples" ${BENCH_ARGS:-}
  figures="$(cat "$samples" 2>/dev/null | grep -c '"step": "\(requests\|load\)"') samples; $(grep -hE \
    "s clips: TTFT q=0(\.75)?/upstream|: req/s q=0\.75/upstream" "$work/logs/bench.txt" | tr '\n|' '  ')"
  record bench "$step_result" "$step_seconds" "${figures:0:700}"
  mkdir -p "$work/logs/bench-report" && cp "$work"/bench/*.log "$work/logs/bench-report/" 2>/dev/null
fi

if wanted memory; then
  # 32 concurrent 120-s clips on one 8B-shaped server at SGLang's memory defaults, SGLang's embedding cache off and
  # the plugin's default hold bound: every request answered, no out-of-memory line; the peak held bytes beside the
  # KV pool. Everything left (at least MEMORY_S, kept by the bench step); its own budget 10 s less, for the stop.
  # MEMORY_ARGS: more of its flags (e.g. "--rate 0" for unpruned clips, a call of its own).
  limit=$(( deadline - $(date +%s) ))
  run_step memory "$limit" python benchmark/bench_gpu_memory.py --budget-s $(( limit > 10 ? limit - 10 : 1 )) \
    --workdir "$work/memory" --output "$out/gpu-memory.json" ${MEMORY_ARGS:-}
  figures="$(grep -hE "answered at once|held at peak|KV pool|device memory in use" "$work/logs/memory.txt" | tr '\n|' '  ')"
  record memory "$step_result" "$step_seconds" "${figures:0:700}"
  cp "$work/memory/server.log" "$work/logs/memory-server.log" 2>/dev/null
fi

if wanted images; then
  # Images pruned: bench_serving's image dataset per rate and the paired ideal (benchmark/bench_images.py), on the
  # balanced (Qwen3-VL-2B-shaped) random model in bfloat16; everything left. IMAGES_ARGS: more of its flags.
  left=$(( deadline - $(date +%s) ))
  run_step images "$left" python benchmark/bench_images.py --profile balanced --resolution 1024x1024 \
    --num-prompts 16 --pairs 8 --server-args "--device cuda --dtype bfloat16" --out "$work/images" \
    --output "$out/gpu-images.json" ${IMAGES_ARGS:-}
  figures="$(grep -hE "^ +[0-9.]+ +[0-9]+ |paired q=" "$work/logs/images.txt" | tr '\n|' '  ')"
  record images "$step_result" "$step_seconds" "${figures:0:700}"
  cp "$work/images/server.log" "$work/logs/images-server.log" 2>/dev/null
fi

if wanted stream; then
  # A live stream served turn by turn through a streaming session (benchmark/bench_stream.py --gpu): per-segment
  # TTFT at q = 0, q = .75 and a threshold, side by side; its samples written as they are measured.
  left=$(( deadline - $(date +%s) ))
  run_step stream "$left" python benchmark/bench_stream.py --gpu --output "$work/stream/gpu-stream.json"
  cp "$work"/stream/gpu-stream.json* "$out/" 2>/dev/null
  figures="$(grep -hE "TTFT / TTFT" "$work/logs/stream.txt" | tr '\n|' '  ')"
  record stream "$step_result" "$step_seconds" "${figures:0:700}"
fi

{
  echo "# sglang-evs on the GPU machine ($(date -u +%FT%TZ))"
  echo
  echo "device: $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi')"
  echo "checkout: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null) $(git -C "$repo" status --porcelain 2>/dev/null | grep -c . ) changed files"
  echo "result: $([ $failed -eq 0 ] && echo PASS || echo FAIL)$([ $skipped -gt 0 ] && echo ", $skipped step(s) skipped for time")"
  echo
  echo "| step | result | s | figures |"
  echo "| --- | --- | --- | --- |"
  cat "$work/summary.md"
} > "$report"
for sub in graph methods; do [ -d "$work/$sub" ] && cp -r "$work/$sub" "$work/logs/$sub-report"; done
# the benchmarks' figures beside the report too ($OUT takes 8 files at most)
for tower in 2b 8b; do cp "$work/methods/bench-$tower.json" "$out/methods-bench-$tower.json" 2>/dev/null; done
tar -czf "$out/logs.tar.gz" -C "$work" logs
cat "$report"
exit $failed
