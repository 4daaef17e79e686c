"""Images pruned, measured as users measure: SGLang's bench_serving image runs per rate, and TTFT against the ideal.

    python benchmark/bench_images.py [--model-path M | --profile balanced] [--resolution 1024x1024]
        [--rates 0 0.5 0.75] [--num-prompts 8] [--paired 0.75] [--pairs 8] [--method divprune|dart]
        [--server-args "--device cuda"] [--output images.json]

One server (float32 on the CPU; `--server-args` for a GPU), no default: every request names its rate.

Part 1, bench_serving: `python -m sglang.benchmark.serving --dataset-name image` (its random images, one per
request, `--image-resolution`), one request at a time, per rate of `--rates`, the rate in each request's
`chat_template_kwargs` (`--extra-request-body`): mean TTFT, mean prompt tokens (the server's usage), TTFT / q0.

Part 2, the ideal at `--paired` q: for each of `--pairs` images (written here, each unseen), in alternating order,
the image at q = 0 and at q (a cache flush before each; streamed, one output token), each followed by a text-only
request of its prompt length (`measure.prefill_ms`). `E = median(latency - text latency)` at q = 0 is what pruning
cannot shrink (decoding, the tower, handling); `ideal = E + median text latency at q`; measured / ideal is the
median latency at q over the ideal (`ratios.paired_ideal`), and TTFT at q / q0 per pair (geometric mean, 95 %).
"""

import argparse
import json
import shlex
from pathlib import Path

import requests

from sglang_evs.bench.launch import serving
from sglang_evs.bench.measure import USAGE_FIELDS, image_bench, prefill_ms, streamed_chat
from sglang_evs.bench.ratios import geometric_interval, paired_ideal
from sglang_evs.bench.sweep import cached_model
from sglang_evs.methods.images import IMAGE_METHODS
from sglang_evs.testing import media


def image_settings(rate: float, method: str) -> dict:
    return {"chat_template_kwargs": {"image_pruning_rate": rate, "image_pruning_method": method}}


def bench_serving_runs(base_url: str, out: Path, rates: list[float], method: str, resolution: str,
                       num_prompts: int) -> dict[str, dict]:  # fmt: skip
    """Part 1: bench_serving's image dataset at each rate -> its summary per rate, and TTFT / q0."""
    runs = {
        str(rate): image_bench(
            base_url, out / f"images-q{rate}.jsonl", num_prompts, image_settings(rate, method), resolution
        )  # fmt: skip
        for rate in rates
    }
    first = runs[str(rates[0])]["mean_ttft_ms"]
    for run in runs.values():
        run["ttft_vs_first"] = run["mean_ttft_ms"] / first
    return runs


def image_body(path: Path, rate: float, method: str) -> dict:
    content = [{"type": "image_url", "image_url": {"url": f"file://{path}"}}, {"type": "text", "text": "Describe."}]
    return {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 1,
            "temperature": 0, "stream": True, **USAGE_FIELDS, **image_settings(rate, method)}  # fmt: skip


def paired_runs(base_url: str, out: Path, rate: float, method: str, size: tuple[int, int], pairs: int) -> dict:
    """Part 2: per unseen image, q = 0 and q in alternating order, each with the text latency of its length."""
    samples: dict[float, list[dict]] = {0.0: [], rate: []}
    for index in range(pairs + 1):  # the first pair warms the server up, unmeasured
        image = media.write_image(out / f"paired-{index}.png", *size, seed=100 + index)
        for q in (0.0, rate) if index % 2 == 0 else (rate, 0.0):
            requests.post(f"{base_url}/flush_cache", timeout=60).raise_for_status()
            timed = streamed_chat(base_url, image_body(image, q, method))
            text = prefill_ms(base_url, timed.prompt_tokens, reps=1, seed=index)
            if index:
                samples[q].append({"media_ms": timed.latency_ms, "ttft_ms": timed.ttft_ms, "prefill_ms": text,
                                   "tokens": timed.prompt_tokens})  # fmt: skip
    result = {"samples": {str(q): v for q, v in samples.items()}, **paired_ideal(samples, rate)}
    result["ttft_ratio"] = geometric_interval(
        [b["ttft_ms"] / a["ttft_ms"] for a, b in zip(samples[0.0], samples[rate], strict=True)]
    )
    return result


def report(result: dict) -> str:
    lines = [f"{'q':>6}{'prompt tokens':>15}{'mean TTFT (ms)':>16}{'TTFT / q0':>11}"]
    for rate, run in result["bench_serving"].items():
        lines.append(f"{rate:>6}{run['mean_prompt_tokens']:>15.0f}{run['mean_ttft_ms']:>16.0f}"
                     f"{run['ttft_vs_first']:>11.3f}")  # fmt: skip
    paired = result.get("paired")
    if paired:
        ratio = paired["ttft_ratio"]
        lines.append(f"paired q={paired['rate']}: TTFT / q0 {ratio['geometric_mean']:.3f} ({ratio['low']:.3f}-"
                     f"{ratio['high']:.3f}, {ratio['pairs']} pairs); E = {paired['encoder_ms']:.0f} ms, ideal "
                     f"{paired['ideal_ms']:.0f} ms, measured / ideal {paired['measured_over_ideal']:.3f}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", help="a checkpoint (default: the random --profile model, built once)")
    parser.add_argument("--profile", default="balanced", help="the random model's profile (tiny, small, balanced)")
    parser.add_argument("--resolution", default="1024x1024", help="the images' size, HEIGHTxWIDTH")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.5, 0.75])
    parser.add_argument("--num-prompts", type=int, default=8, help="bench_serving requests per rate")
    parser.add_argument("--paired", type=float, default=0.75, help="the rate of part 2 (0: no part 2)")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--method", choices=sorted(IMAGE_METHODS), default="divprune")
    parser.add_argument("--server-args", default="--dtype float32")
    parser.add_argument("--out", type=Path, default=Path(".cache/bench/images"))
    parser.add_argument("--output", type=Path, help="write the result as JSON here too")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model_path or cached_model(args.profile)
    height, width = (int(v) for v in args.resolution.split("x"))
    result: dict = {"model": str(model), "resolution": args.resolution, "method": args.method}
    with serving(model, args.out / "server.log", shlex.split(args.server_args)) as server:
        result["bench_serving"] = bench_serving_runs(server.base_url, args.out, args.rates, args.method,
                                                     args.resolution, args.num_prompts)  # fmt: skip
        if args.paired:
            result["paired"] = paired_runs(server.base_url, args.out, args.paired, args.method, (height, width),
                                           args.pairs)  # fmt: skip
    print(report(result))
    for path in (args.out / "results.json", args.output):
        if path is not None:
            path.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
