"""Cost of the EVS keep-mask next to the vision merger it follows.

Times ``sglang_evs.evs.retention_mask`` on a realistic clip (T = 32 temporal
groups of 16 x 28 merged tokens, rows = main merger output concatenated with
the 3 deepstack levels) and one matrix multiply the size of Qwen3-VL-8B's
patch-merger output projection (``linear_fc2``: ``[T*h*w, 4*1152] @
[4*1152, 4096]``; vision hidden 1152, spatial_merge_size 2, out_hidden_size
4096).  Prints medians and their ratio.

    PYTHONPATH=python python benchmark/bench_retention_mask.py

Row widths: ``4 * 2048`` (a 2048-wide LM, e.g. Qwen3-VL-2B) and ``4 * 4096``
(Qwen3-VL-8B).  On CPUs without bf16 matrix instructions a bf16 GEMM of this
size takes many minutes, so the matmul runs in fp32 unless
``--matmul-dtypes`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from sglang_evs.evs import retained_token_count, retention_mask

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def median_seconds(fn: Callable[[], object], reps: int, warmup: int = 1) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=32, help="temporal groups T")
    p.add_argument("--height", type=int, default=16, help="merged rows h per group")
    p.add_argument("--width", type=int, default=28, help="merged cols w per group")
    p.add_argument("--widths", type=int, nargs="+", default=[4 * 2048, 4 * 4096], help="row widths D")
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=DTYPES)
    p.add_argument("--pruning-rate", type=float, default=0.75)
    p.add_argument("--merger-in", type=int, default=4 * 1152, help="merger input width")
    p.add_argument("--merger-out", type=int, default=4096, help="merger output width")
    p.add_argument("--matmul-dtypes", nargs="+", default=["fp32"], choices=DTYPES)
    p.add_argument("--reps", type=int, default=5, help="timed repetitions of the mask")
    p.add_argument("--matmul-reps", type=int, default=3, help="timed repetitions of the matmul")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    t, h, w = args.groups, args.height, args.width
    rows = t * h * w
    grid = (t, 2 * h, 2 * w)  # before the 2 x 2 spatial merge
    keep = retained_token_count(h * w, t, args.pruning_rate)
    print(f"torch {torch.__version__}, {cpu_name()}, {os.cpu_count()} CPUs, {args.threads} threads")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(f"clip: T={t} groups x {h}x{w} merged tokens = {rows} rows, q={args.pruning_rate}, keeps {keep}")

    gen = torch.Generator().manual_seed(0)
    matmul: dict[str, float] = {}
    for name in args.matmul_dtypes:
        dtype = DTYPES[name]
        a = torch.randn(rows, args.merger_in, generator=gen).to(dtype)
        b = torch.randn(args.merger_in, args.merger_out, generator=gen).to(dtype)
        med, times = median_seconds(lambda a=a, b=b: a @ b, args.matmul_reps)
        matmul[name] = med
        print(
            f"merger matmul [{rows}, {args.merger_in}] @ [{args.merger_in}, {args.merger_out}] "
            f"{name}: median {med * 1e3:.1f} ms  (runs: {', '.join(f'{x * 1e3:.1f}' for x in times)})"
        )
        del a, b

    ref_name = args.matmul_dtypes[0]
    print(f"\n{'D':>6} {'dtype':>5} {'retention_mask ms':>18} {'ratio vs ' + ref_name + ' matmul':>22}  runs")
    for d in args.widths:
        base = torch.randn(1, h * w, d, generator=gen)
        drift = torch.randn(t, h * w, d, generator=gen).mul_(0.3).cumsum_(0)
        x32 = (base + drift).reshape(rows, d)
        del base, drift
        for name in args.dtypes:
            x = x32.to(DTYPES[name])
            med, times = median_seconds(lambda x=x: retention_mask(x, grid, 2, args.pruning_rate), args.reps)
            ratio = med / matmul[ref_name]
            runs = ", ".join(f"{v * 1e3:.1f}" for v in times)
            print(f"{d:>6} {name:>5} {med * 1e3:>18.1f} {ratio:>22.3f}  {runs}")
            del x
        del x32
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
