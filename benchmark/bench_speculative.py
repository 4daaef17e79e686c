"""MTP speculation and video pruning, alone and together: TTFT and time per output token, side by side.

    python benchmark/bench_speculative.py [--model-path M] [--rate 0.75] [--rounds 12] [--tokens 32]
        [--device cuda] [--output result.json]
    python benchmark/bench_speculative.py --report result.jsonl [--output result.json]   # again, from the samples

Two servers on the same checkpoint run at once: one speculating with its MTP head
(`--speculative-algorithm NEXTN`, chain of 2 steps, 3 verify tokens), one not. Each round sends the same
video request four ways, in an order that rotates from round to round:

    neither        no speculation, q = 0
    pruning        no speculation, q = rate (EVS, the request's own rate)
    MTP            speculating,    q = 0
    MTP + pruning  speculating,    q = rate

streamed /generate, `max_new_tokens` fixed (`ignore_eos`), radix cache off (every request prefills its
whole prompt). TTFT: until the first streamed chunk. Time per output token: the rest of the stream over
the tokens after the first. It reports each configuration's medians and, per round, each one's ratio to
`neither`: geometric mean and 95 % interval. The run's setup, then each request's sample as it is measured, go
to a JSONL beside `--output` (`result.json` -> `result.jsonl`; without it `WORKDIR/samples.jsonl`), so a run cut
short keeps what it measured; the result is computed from that file alone (`--report`), from the rounds that
measured all four.

Without --model-path it serves the tiny Qwen3.5 with an MTP head built offline (the head agrees with the
target, so drafts are accepted). On a GPU (found by itself) give --model-path a released Qwen3.5 / 3.6;
nothing else changes.
"""

import argparse
import json
import statistics
from pathlib import Path

from sglang_evs.bench.ratios import round_ratio
from sglang_evs.bench.samples import SampleLog, read_records, samples_path
from sglang_evs.streamed import streamed_chunks

NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "3"]  # fmt: skip
CONFIGS = {  # name -> (speculating server?, rate)
    "neither": (False, 0.0),
    "pruning": (False, None),
    "MTP": (True, 0.0),
    "MTP + pruning": (True, None),
}


def timed(base_url: str, body: dict) -> dict:
    """One streamed /generate request -> TTFT, time per output token after the first (ms), tokens."""
    chunks = list(streamed_chunks(f"{base_url}/generate", {**body, "stream": True}))
    (first, _), (end, last) = chunks[0], chunks[-1]
    meta = last.get("meta_info", {})
    tokens = int(meta["completion_tokens"])
    return {"ttft_ms": first * 1000, "tpot_ms": (end - first) * 1000 / max(tokens - 1, 1),
            "tokens": tokens, "prompt_tokens": int(meta["prompt_tokens"]),
            "accept_length": meta.get("spec_accept_length")}  # fmt: skip


def body(clip: Path, rate: float, tokens: int) -> dict:
    from sglang_evs.testing.requests import VIDEO, chat_prompt, per_request_rate

    return {"text": chat_prompt(VIDEO), "video_data": [str(clip)], **per_request_rate(rate),
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}  # fmt: skip


def measure(
    servers: dict[bool, str], clip: Path, rate: float, rounds: int, tokens: int, log: SampleLog | None = None
) -> dict[str, list[dict]]:
    """`servers`: speculating? -> base URL. One warm-up request per configuration, then `rounds` rounds of
    all four, their order rotating. Returns each configuration's `timed` samples (each also a sample of `log`)."""
    names = list(CONFIGS)
    samples = []
    for round_index in range(-1, rounds):  # round -1: the warm-up, not kept
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            speculating, configured = CONFIGS[name]
            sample = timed(servers[speculating], body(clip, rate if configured is None else configured, tokens))
            if round_index >= 0:
                samples.append({"round": round_index, "config": name, **sample})
                if log is not None:
                    log.sample(samples[-1])
    return by_config(samples)


def by_config(samples: list[dict]) -> dict[str, list[dict]]:
    """Samples -> each configuration's, in round order, of the rounds that measured all four (a run cut short may
    stop inside a round)."""
    complete = set.intersection(*({s["round"] for s in samples if s["config"] == name} for name in CONFIGS))
    ordered = sorted((s for s in samples if s["round"] in complete), key=lambda s: s["round"])
    return {name: [s for s in ordered if s["config"] == name] for name in CONFIGS}


def summarize(samples: dict[str, list[dict]]) -> dict:
    """Per configuration: medians, prompt tokens, mean acceptance length, and the per-round ratios to
    `neither` (geometric mean, 95 % interval)."""
    baseline = samples["neither"]
    out = {}
    for name, runs in samples.items():
        accepted = [r["accept_length"] for r in runs if r["accept_length"] is not None]
        out[name] = {
            "median_ttft_ms": statistics.median(r["ttft_ms"] for r in runs),
            "median_tpot_ms": statistics.median(r["tpot_ms"] for r in runs),
            "prompt_tokens": runs[0]["prompt_tokens"],
            "mean_accept_length": statistics.fmean(accepted) if accepted else None,
            "ttft_vs_neither": round_ratio([r["ttft_ms"] for r in baseline], [r["ttft_ms"] for r in runs]),
            "tpot_vs_neither": round_ratio([r["tpot_ms"] for r in baseline], [r["tpot_ms"] for r in runs]),
        }
    return out


def print_table(configs: dict) -> None:
    print(f"{'':15s} {'prompt':>6s} {'accept':>6s} {'TTFT ms':>8s} {'vs neither (95 %)':>22s} "
          f"{'TPOT ms':>8s} {'vs neither (95 %)':>22s}")  # fmt: skip
    for name, row in configs.items():
        accept = "-" if row["mean_accept_length"] is None else f"{row['mean_accept_length']:.2f}"
        cells = []
        for key in ("ttft", "tpot"):
            ratio = row[f"{key}_vs_neither"]
            low, high = ratio["low"], ratio["high"]
            interval = "" if low is None else f" ({low:.2f}-{high:.2f})"
            cells.append(f"{row[f'median_{key}_ms']:8.1f} {ratio['geometric_mean']:>9.2f}x{interval:>12s}")
        print(f"{name:15s} {row['prompt_tokens']:6d} {accept:>6s} {cells[0]} {cells[1]}")


def result_of(records: list[dict]) -> dict:
    """A run's JSONL (its setup, then its samples) -> its result."""
    setup, *samples = records
    configs = by_config(samples)
    return {**setup, "rounds": len(configs["neither"]), "configs": summarize(configs)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--rate", type=float, default=0.75)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--device", default=None, help="cuda where a GPU is visible, else cpu")
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/speculative"))
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="only the result of this JSONL's samples")
    args = parser.parse_args(argv)
    if args.report:
        return finish(result_of(read_records([args.report])), args.output)

    import torch

    from sglang_evs.bench.launch import serving
    from sglang_evs.testing import media, tiny_model

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    args.workdir.mkdir(parents=True, exist_ok=True)
    model = args.model_path
    if model is None:
        overrides = {"text_config": {"mtp_num_hidden_layers": 1}}
        model = args.workdir / "tiny-qwen3.5-mtp"
        if not model.exists():
            tiny_model.build_tiny_model(model, "Qwen3_5ForConditionalGeneration", config_overrides=overrides)
    clip = media.write_clip(args.workdir / "clip.mp4", "moving", num_frames=32, fps=4, seed=5)
    common = ["--disable-radix-cache", *([] if args.device == "cpu" else ["--device", args.device])]
    env = {"SGLANG_MAMBA_CONV_DTYPE": "float32"} if args.device == "cpu" else None

    path = samples_path(args.output, args.workdir)
    with (
        SampleLog(path, len(CONFIGS) * args.rounds, "requests", "request") as log,
        serving(model, args.workdir / "speculating.log", [*common, *NEXTN], env) as speculating,
        serving(model, args.workdir / "plain.log", common, env) as plain,
    ):
        log.write({"model": str(model), "rate": args.rate, "tokens": args.tokens})
        measure({True: speculating.base_url, False: plain.base_url}, clip, args.rate, args.rounds, args.tokens, log)
    result = finish(result_of(read_records([path])), args.output)
    print(f"samples: {path}")
    return result


def finish(result: dict, output: Path | None) -> dict:
    """Prints the result's table and writes it to `output` (JSON), where given."""
    print(f"{result['rounds']} rounds, {result['tokens']} output tokens, q = {result['rate']}, {result['model']}")
    print_table(result["configs"])
    if output:
        output.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
