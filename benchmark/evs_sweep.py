"""EVS benchmarks: TTFT and prompt tokens vs video_pruning_rate, load, plugin overhead, paired ideal.

    python benchmark/evs_sweep.py [--profile tiny|small | --model PATH] [--rates 0 .25 .5 .75 .9]
    python benchmark/evs_sweep.py --load      # 16 concurrent video requests, q=0.75 vs q=0
    python benchmark/evs_sweep.py --overhead  # q=0 TTFT, plugin vs SGLANG_PLUGINS=none, alternating
    python benchmark/evs_sweep.py --paired 0.75  # measured/ideal at q=.75, interleaved with q=0 per clip
    python benchmark/evs_sweep.py --model Qwen/Qwen3-VL-8B-Instruct --server-args "--device cuda"

Writes OUT/results*.json (and OUT/sweep.png in sweep mode) under --out (default .cache/bench/sweep).
The logic is in sglang_evs.bench.sweep; see docs/benchmarks.md for the method.
"""

from sglang_evs.bench.sweep import main

if __name__ == "__main__":
    main()
