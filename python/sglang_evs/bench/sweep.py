"""Pruning serving benchmarks: TTFT and prompt tokens vs rate per method, load, and plugin overhead.

Driven by ``benchmark/evs_sweep.py`` (the CLI). Each measurement launches a server
(``launch.serving``) and runs SGLang's bench_serving command line against it (in this process,
``measure.bench_serving``), reading its
``--output-file`` JSONL (one JSON object per run; with ``--output-details`` it also holds the
per-request ``input_lens`` = the server-reported ``usage.prompt_tokens``, and ``ttfts`` in s).

Ideal TTFT (sweep mode). In the same server as each rate q:
  * ``P(n)``: language-model prefill time of ``n`` tokens, measured as the latency of
    text-only ``/generate`` requests of exactly ``n`` random token ids with ``max_new_tokens=1``
    (median of ``--prefill-reps``), at ``n = n_q``, the mean prompt tokens the server reported
    for the video requests at q;
  * ``E = TTFT_video(0) - P(n_0)``: everything that does not scale with the prompt length the
    language model sees (request handling, video decoding, preprocessing, vision encoder);
  * ``ideal(q) = E + P(n_q)``: the TTFT if pruning cost nothing and the language model only
    paid for the tokens it was given. ``measured/ideal`` > 1 is the overhead of pruning.
If the server reports the same prompt tokens at every rate (EVS not active), ideal(q) ~ TTFT(0).

The code: ``ratios`` (arithmetic), ``measure`` (requests against a server), ``modes`` (sweep,
load, paired, overhead, compare_methods), ``report`` (text and plot); this module is the command line.
"""

import json
import time
from collections.abc import Sequence
from pathlib import Path

from sglang_evs.bench.measure import DEFAULT_RATES
from sglang_evs.bench.modes import compare_methods, lengths, load, overhead, paired, sweep
from sglang_evs.bench.report import plot_lengths, plot_sweep, report
from sglang_evs.methods import METHODS
from sglang_evs.testing.tiny_core import PROFILES


def cached_model(
    profile: str, architecture: str = "Qwen3VLForConditionalGeneration", cache: Path = Path(".cache/bench/models")
) -> Path:
    """Build (once per version of the builder) and return a tiny/small random checkpoint."""
    from sglang_evs.testing import tiny_model

    digest = tiny_model.builders_digest()
    prefix = "" if architecture == tiny_model.DEFAULT_ARCHITECTURE else f"{architecture}-"
    out = cache / f"{prefix}{profile}-{digest}"
    if not (out / "model.safetensors").exists():
        tiny_model.build_tiny_model(out, architecture=architecture, profile=profile)
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    """Parse the CLI of ``benchmark/evs_sweep.py``, run one mode, write results.json (+ plot), print ratios."""
    import argparse
    import shlex

    from sglang_evs.bench.make_video_dataset import make_video_dataset, parse_size

    parser = argparse.ArgumentParser(description="EVS TTFT/token sweep, load and overhead benchmarks.")
    parser.add_argument("--model", help="checkpoint path or hub id (default: build the --profile random model)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="tiny",
                        help="small: language-model bound; balanced: Qwen3-VL-2B's vision:language cost")  # fmt: skip
    parser.add_argument("--architecture", default="Qwen3VLForConditionalGeneration",
                        help="architecture of the --profile random model (HF class name)")  # fmt: skip
    parser.add_argument(
        "--server-args",
        default="--dtype float32",
        help='extra launch_server args (default: fp32, fast on CPU); on a GPU e.g. "--device cuda"',
    )
    parser.add_argument("--out", type=Path, default=Path(".cache/bench/sweep"))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--load", action="store_true", help="--concurrency requests at once, --load-rates")
    mode.add_argument("--overhead", action="store_true", help="q=0 TTFT with the plugin vs SGLANG_PLUGINS=none")
    mode.add_argument("--paired", type=float, metavar="Q", help="the ideal at rate Q, interleaved with q=0")
    mode.add_argument("--compare-methods", type=float, metavar="Q",
                      help="EVS vs VidCom2 at rate Q on the same clips, interleaved")  # fmt: skip
    mode.add_argument("--lengths", type=float, nargs="+", metavar="SECONDS",
                      help="TTFT and prompt tokens against clip length at each --rates")  # fmt: skip
    parser.add_argument("--beyond-context", type=float, metavar="SECONDS",
                        help="--lengths: also send one clip this long at q=0 (expect 400) and at max q")  # fmt: skip
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=["evs"],
                        help="sweep: the pruning methods, each at every --rates")  # fmt: skip
    parser.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES))
    parser.add_argument("--load-rates", type=float, nargs="+", default=[0.0, 0.75])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="overhead, load: alternating rounds of fresh servers")
    parser.add_argument("--num-prompts", type=int, default=4, help="video requests per measurement")
    parser.add_argument("--image-prompts", type=int, default=2)
    parser.add_argument("--prefill-reps", type=int, default=3)
    parser.add_argument("--dataset", type=Path, help="a make_video_dataset dataset.jsonl (default: generate)")
    parser.add_argument("--with-sound", action="store_true",
                        help="generated dataset: a tone beside every clip, as long as it (Qwen3-Omni)")  # fmt: skip
    parser.add_argument("--static-share", type=float, default=0.5)
    parser.add_argument("--kind", choices=["moving", "noise"], default="moving")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--size", default="64x64", help="HxW of the generated clips")
    parser.add_argument("--fps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8, help="output tokens per video request")
    args = parser.parse_args(argv)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = args.model or str(cached_model(args.profile, args.architecture))
    server_args = shlex.split(args.server_args)
    if args.lengths:
        result = lengths(model, out, args.lengths, args.rates, args.num_prompts, args.prefill_reps, server_args,
                         args.beyond_context)  # fmt: skip
        result["plot"] = str(plot_lengths(result, out / "lengths.png"))
        return finish(result, args, model, server_args, None, out)
    num = args.concurrency if args.load else args.num_prompts
    dataset = args.dataset or make_video_dataset(
        out / "clips", num, args.static_share, args.kind, seconds=args.seconds, size=parse_size(args.size),
        fps=args.fps, max_tokens=args.max_tokens, with_sound=args.with_sound,
    )  # fmt: skip
    if args.load:
        result = load(model, dataset, out, args.load_rates, args.concurrency, server_args, args.rounds)
    elif args.compare_methods is not None:
        result = compare_methods(model, dataset, out, args.compare_methods, args.num_prompts, server_args)
    elif args.paired is not None:
        result = paired(model, dataset, out, args.paired, args.num_prompts, server_args)
    elif args.overhead:
        result = overhead(model, dataset, out, args.rounds, args.num_prompts, server_args)
    else:
        result = sweep(model, dataset, out, args.rates, args.num_prompts, args.image_prompts, args.prefill_reps,
                       server_args, args.methods)  # fmt: skip
        result["plot"] = str(plot_sweep(result, out / "sweep.png"))
    return finish(result, args, model, server_args, dataset, out)


def finish(result: dict, args, model: str, server_args: list[str], dataset: Path | None, out: Path) -> dict:
    """Add the setup to ``result``, write it as JSON under ``out``, print the report."""
    result["setup"] = {"model": model, "profile": None if args.model else args.profile,
                       "architecture": None if args.model else args.architecture, "dataset": str(dataset),
                       "server_args": server_args, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    name = "results.json" if result["mode"] == "sweep" else f"results-{result['mode']}.json"
    (out / name).write_text(json.dumps(result, indent=1))
    print(report(result))
    print(f"wrote {out / name}")
    return result


def cli() -> None:
    """The console script `sglang-evs-sweep`."""
    main()


if __name__ == "__main__":
    main()
