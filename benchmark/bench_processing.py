"""The tokenizer's processing of a pruned video beside an unpruned one's, on one server.

    python benchmark/bench_processing.py [--model-path M] [--pairs 8] [--frames 32] [--size 448x448] [--rate 0.75]
        [--output r.json]

One CPU server of the tiny Qwen3-VL, traced. Each pair is two clips no request sent before (distinct content, so
SGLang's caches hold neither), one sent at q = 0 and the other at `--rate`, the order alternated from pair to pair.
Per request: the tokenizer's processing time, the plugin trace's `processed` event (SGLang's processor, then the
plugin's layout). Printed: the median of each side and processing(q) / processing(0) per pair, its geometric mean
and 95 % interval (`bench.ratios.round_ratio`). Goal: within 5 % of 1 (the pruned video's key is folded into the
hash SGLang computes anyway, where it computes it, `pruning/keys.py`).
"""

import argparse
import json
import statistics
from pathlib import Path

from sglang_evs import trace
from sglang_evs.bench.launch import benchmark_model
from sglang_evs.bench.ratios import round_ratio
from sglang_evs.testing import media
from sglang_evs.testing.requests import VIDEO, chat_prompt, generate, media_kwargs, per_request_rate
from sglang_evs.testing.server import running_server


def processing_ms(base_url: str, trace_path: Path, clip: Path, rate: float) -> float:
    """The `processed` time of one request for `clip` at `rate`."""
    before = len(trace.read(trace_path, "processed"))
    generate(base_url, chat_prompt(VIDEO), 1, **media_kwargs(videos=[clip]), **per_request_rate(rate))
    (event,) = trace.read(trace_path, "processed")[before:]
    return float(event["ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: the tiny Qwen3-VL, built in the work folder")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--size", default="448x448")
    parser.add_argument("--rate", type=float, default=0.75)
    parser.add_argument("--output", type=Path, default=Path("bench-processing.json"))
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    work = args.output.resolve().parent / "bench-processing"
    work.mkdir(parents=True, exist_ok=True)
    clips = [
        media.write_clip(
            work / f"clip-{i}.mp4", "moving", fps=4, num_frames=args.frames, height=height, width=width, seed=7000 + i
        )  # fmt: skip
        for i in range(2 * args.pairs + 2)
    ]
    trace_path = work / "trace.jsonl"
    trace_path.unlink(missing_ok=True)
    model = benchmark_model(args.model_path, work)
    with running_server(model, work / "server.log", ["--dtype", "float32"], {trace.ENV: str(trace_path)}) as server:
        for clip, rate in zip(clips[:2], (0.0, args.rate), strict=True):  # warm-up: SGLang's first media request
            processing_ms(server.base_url, trace_path, clip, rate)
        unpruned, pruned = [], []
        for pair in range(args.pairs):
            first, second = clips[2 + 2 * pair], clips[3 + 2 * pair]
            order = ((0.0, unpruned), (args.rate, pruned))
            for clip, (rate, side) in zip((first, second), order if pair % 2 == 0 else order[::-1], strict=True):
                side.append(processing_ms(server.base_url, trace_path, clip, rate))
    result = {
        "rate": args.rate, "frames": args.frames, "size": args.size,
        "median_ms": {"q=0": statistics.median(unpruned), f"q={args.rate}": statistics.median(pruned)},
        "ratio": round_ratio(unpruned, pruned), "samples": {"q=0": unpruned, f"q={args.rate}": pruned},
    }  # fmt: skip
    args.output.write_text(json.dumps(result, indent=1))
    ratio = result["ratio"]
    print(f"processing, median: q=0 {result['median_ms']['q=0']:.1f} ms, q={args.rate} "
          f"{result['median_ms'][f'q={args.rate}']:.1f} ms")  # fmt: skip
    interval = "" if ratio["low"] is None else f" (95 %: {ratio['low']:.3f}-{ratio['high']:.3f})"
    print(f"processing(q={args.rate}) / processing(0), {args.pairs} pairs: {ratio['geometric_mean']:.3f}{interval}")


if __name__ == "__main__":
    main()
