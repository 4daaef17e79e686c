"""The plugin's q = 0 cost in one process, paired: the same ForwardBatches through this project's model
(its embedding routine and `post_process`) and upstream SGLang's, alternating (method:
``sglang_evs.bench.inprocess``).

    source scripts/cpu_env.sh
    PYTHONPATH=python .venv/bin/python benchmark/bench_overhead_inprocess.py --profile small --out overhead.json

Prints per scenario (text, image, video, video in two chunks, a decode step) and pooled the geometric
mean of the per-pair ratio ours / upstream with its 95 % interval; writes the whole report as JSON.
Stops with an error if the two variants' logits ever differ. Run it in a process of its own.
"""

from sglang_evs.runtime import bootstrap

bootstrap.install()  # before anything imports SGLang or torchvision (a no-op where the .pth did it)

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from sglang_evs.bench.inprocess import Settings, measure, report_text  # noqa: E402
from sglang_evs.bench.sweep import cached_model  # noqa: E402
from sglang_evs.testing.tiny_core import PROFILES  # noqa: E402

# One torch thread: on the 2-core machine with other work beside it, a forward on two OpenMP threads
# stalls whenever another process takes one core, and the per-pair ratios spread by tens of per cent;
# on one thread far less (2026-11-23, small profile: +-0.30 % over 132 pairs, +-2.6 % over 90 in a
# control run that another job's burst hit). The plugin's added work (Python, small copies)
# does not scale with threads, so its share of a two-thread forward is at most twice the measured one.
DEFAULT_THREADS = 1
# A round of the small profile took about 15 s on one thread (2026-11-23, machine shared): 32 rounds
# (192 pairs) take about 8 minutes; --max-minutes stops a slower run early rather than pass 10 minutes.
DEFAULT_ROUNDS = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="small")
    parser.add_argument("--model", type=Path, help="a Qwen3-VL checkpoint (default: the --profile random model)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed pairs per scenario")
    parser.add_argument("--warmup", type=int, default=2, help="untimed pairs per scenario first (at least 1)")
    parser.add_argument("--max-minutes", type=float, default=9.0, help="stop the rounds early past this (0: never)")
    parser.add_argument("--clip-seconds", type=float, default=4.0, help="length of the video (4 frames/s)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="torch threads (0: torch's choice)")
    parser.add_argument("--control", action="store_true",
                        help="A/A run: upstream's model in both slots, the harness's own bias (expect 1)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args()
    model = args.model or cached_model(args.profile)
    settings = Settings(model, rounds=args.rounds, warmup=args.warmup, clip_seconds=args.clip_seconds,
                        threads=args.threads, max_minutes=args.max_minutes, control=args.control)  # fmt: skip
    report = measure(settings)
    report["profile"] = None if args.model else args.profile
    print(report_text(report))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"report: {args.out}")


if __name__ == "__main__":
    main()
