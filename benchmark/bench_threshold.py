"""A threshold beside a rate: what each clip keeps, and what deciding the count at admission costs.

    python benchmark/bench_threshold.py [--model-path M] [--profile small] [--threshold 0.1]
        [--thresholds 0 0.01 0.05 0.1 0.3 0.5 1] [--rounds 8] [--device cuda] [--output r.json] [--plot kept.png]

Part 1, the kept fraction: each clip (static; a small moving object on a still background; fresh noise every
frame) at each threshold of --thresholds, the share of its video tokens kept (`video_tokens_after_pruning`).

Part 2, TTFT on one server, each request streamed with one output token right after a cache flush, the three
configurations' order rotating from round to round:

    threshold     every clip at --threshold: the scheduler encodes it as it admits the request, then lays it out
    same count    every clip with `video_token_budget` = what the threshold kept of it and no rate: the same kept
                  tokens (EVS's best-ranked, which the threshold's are), laid out before encoding and encoded in
                  the first prefill; the difference from `threshold` is where the encode runs
    fixed rate    every clip at the one rate that keeps the same total over the three clips

It prints the kept fractions, each configuration's median TTFT per clip, and per-round ratios (geometric mean,
95 % interval): threshold / same count per clip (the admission encode's cost), and threshold / fixed rate over
the three clips' summed TTFT (what following the content buys at the same total).
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import requests

from sglang_evs.bench.measure import USAGE_FIELDS, streamed_chat
from sglang_evs.bench.ratios import round_ratio

CLIPS = ("static", "moving", "noise")
THRESHOLDS = (0.0, 0.01, 0.05, 0.1, 0.3, 0.5, 1.0)
CONFIGS = ("threshold", "same count", "fixed rate")


def chat_body(clip: Path, settings: dict) -> dict:
    content = [{"type": "video_url", "video_url": {"url": f"file://{clip}"}}, {"type": "text", "text": "Describe."}]
    return {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 1,
            "temperature": 0, "stream": True, **USAGE_FIELDS, "chat_template_kwargs": settings}  # fmt: skip


def kept_tokens(base_url: str, clip: Path, threshold: float) -> tuple[int, int]:
    """(video tokens kept, before pruning) of `clip` at `threshold`."""
    from sglang_evs.testing.requests import VIDEO, chat_prompt

    body = {"text": chat_prompt(VIDEO), "video_data": [str(clip)], "sampling_params": {"max_new_tokens": 1},
            "mm_processor_kwargs": {"video_pruning_threshold": threshold}}  # fmt: skip
    reply = requests.post(f"{base_url}/generate", json=body, timeout=600)
    reply.raise_for_status()
    meta = reply.json()["meta_info"]
    return int(meta["video_tokens_after_pruning"]), int(meta["video_tokens_before_pruning"])


def fixed_rate(kept: dict[str, int], tokens: dict[str, int], per_group: dict[str, int]) -> float:
    """The one rate (to 1e-3) whose EVS count, summed over the clips (`tokens` each, `per_group` in each temporal
    group), is closest to what the threshold kept in all (`kept`)."""
    from sglang_evs.methods import EVS

    def count(q: float) -> int:
        return sum(EVS.retained_token_count(per_group[c], tokens[c] // per_group[c], q) for c in tokens)

    return min((q / 1000 for q in range(1000)), key=lambda q: (abs(count(q) - sum(kept.values())), q))


def settings_for(config: str, clip: str, threshold: float, kept: dict[str, int], rate: float) -> dict:
    if config == "threshold":
        return {"video_pruning_threshold": threshold}
    if config == "same count":
        return {"video_pruning_rate": 0.0, "video_token_budget": kept[clip]}
    return {"video_pruning_rate": rate}


def measure(base_url: str, clips: dict[str, Path], threshold: float, kept: dict[str, int], rate: float,
            rounds: int) -> dict[str, dict[str, list[dict]]]:  # fmt: skip
    """`rounds` rounds (after one warm-up round) of every configuration on every clip, the configurations'
    order rotating -> config -> clip -> samples (TTFT ms, prompt tokens)."""
    samples = {config: {clip: [] for clip in clips} for config in CONFIGS}
    for round_index in range(-1, rounds):
        shift = round_index % len(CONFIGS)
        for config in CONFIGS[shift:] + CONFIGS[:shift]:
            for clip, path in clips.items():
                requests.post(f"{base_url}/flush_cache", timeout=60).raise_for_status()
                timed = streamed_chat(base_url, chat_body(path, settings_for(config, clip, threshold, kept, rate)))
                if round_index >= 0:
                    samples[config][clip].append({"ttft_ms": timed.ttft_ms, "prompt_tokens": timed.prompt_tokens})
    return samples


def summarize(samples: dict[str, dict[str, list[dict]]]) -> dict:
    """Medians per configuration and clip; per-round ratios threshold / same count per clip, and threshold /
    fixed rate over the clips' summed TTFT."""
    out: dict = {"median_ttft_ms": {}, "prompt_tokens": {}}
    for config, per_clip in samples.items():
        out["median_ttft_ms"][config] = {clip: statistics.median(s["ttft_ms"] for s in runs)
                                         for clip, runs in per_clip.items()}  # fmt: skip
        out["prompt_tokens"][config] = {clip: runs[0]["prompt_tokens"] for clip, runs in per_clip.items()}
    ttft = {config: {clip: [s["ttft_ms"] for s in runs] for clip, runs in per_clip.items()}
            for config, per_clip in samples.items()}  # fmt: skip
    out["threshold_vs_same_count"] = {clip: round_ratio(ttft["same count"][clip], ttft["threshold"][clip])
                                      for clip in ttft["threshold"]}  # fmt: skip
    summed = {
        config: [sum(values) for values in zip(*per_clip.values(), strict=True)] for config, per_clip in ttft.items()
    }
    out["threshold_vs_fixed_rate"] = round_ratio(summed["fixed rate"], summed["threshold"])
    return out


def interval(ratio: dict) -> str:
    low, high = ratio["low"], ratio["high"]
    return f"{ratio['geometric_mean']:.3f}" + ("" if low is None else f" ({low:.3f}-{high:.3f})")


def plot(fractions: dict[str, dict[float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5.5, 3.4))
    for clip, by_threshold in fractions.items():
        axes.plot(list(by_threshold), list(by_threshold.values()), marker="o", label=clip)
    axes.set_xlabel("video_pruning_threshold t")
    axes.set_ylabel("video tokens kept (share)")
    axes.set_ylim(0, 1.05)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--profile", default="small", help="the built Qwen3-VL's profile without --model-path")
    parser.add_argument("--threshold", type=float, default=0.1)
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=8, help="each clip's length at 4 fps")
    parser.add_argument("--device", default=None, help="cuda where a GPU is visible, else cpu")
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/threshold"))
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    from sglang_evs.bench.launch import serving
    from sglang_evs.testing import media, tiny_model

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.workdir = args.workdir.resolve()  # file:// URLs of its clips are absolute
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = args.model_path
    if model is None:
        model = args.workdir / f"qwen3-vl-{args.profile}"
        if not model.exists():
            tiny_model.build_tiny_model(model, profile=args.profile)
    clips = {kind: media.write_clip(args.workdir / f"{kind}.mp4", kind, num_frames=4 * args.seconds, fps=4, seed=5)
             for kind in CLIPS}  # fmt: skip
    server_args = ["--dtype", "float32"] if device == "cpu" else ["--device", device]

    start = time.perf_counter()
    with serving(model, args.workdir / "server.log", server_args) as server:
        counts = {clip: {t: kept_tokens(server.base_url, path, t) for t in args.thresholds}
                  for clip, path in clips.items()}  # fmt: skip
        kept, tokens, per_group = {}, {}, {}
        for clip, path in clips.items():
            kept[clip], tokens[clip] = kept_tokens(server.base_url, path, args.threshold)
            per_group[clip] = kept_tokens(server.base_url, path, 2.0)[0]  # t = 2 keeps group 0 alone
        rate = fixed_rate(kept, tokens, per_group)
        samples = measure(server.base_url, clips, args.threshold, kept, rate, args.rounds)
    fractions = {clip: {t: after / before for t, (after, before) in by_t.items()} for clip, by_t in counts.items()}
    result = {"model": str(model), "device": device, "threshold": args.threshold, "rounds": args.rounds,
              "kept_fraction": fractions, "kept": kept, "video_tokens": tokens, "fixed_rate": rate,
              "minutes": (time.perf_counter() - start) / 60, **summarize(samples)}  # fmt: skip

    print(f"kept share of each clip's {tokens['static']} video tokens, by threshold:")
    print(f"{'t':>6s} " + " ".join(f"{clip:>8s}" for clip in CLIPS))
    for t in args.thresholds:
        print(f"{t:6.2f} " + " ".join(f"{fractions[clip][t]:8.3f}" for clip in CLIPS))
    print(f"\nt = {args.threshold} keeps {kept}; the fixed rate keeping the same total: q = {rate:.3f}")
    print(f"{'median TTFT ms':14s} " + " ".join(f"{clip:>8s}" for clip in CLIPS))
    for config in CONFIGS:
        print(f"{config:14s} " + " ".join(f"{result['median_ttft_ms'][config][clip]:8.1f}" for clip in CLIPS))
    for clip in CLIPS:
        print(f"threshold / same count, {clip}: {interval(result['threshold_vs_same_count'][clip])}")
    print(f"threshold / fixed rate, the three clips: {interval(result['threshold_vs_fixed_rate'])}")
    if args.output:
        args.output.write_text(json.dumps(result, indent=2, default=str))
    if args.plot:
        plot(fractions, args.plot)
    return result


if __name__ == "__main__":
    main()
