"""EVS serving benchmarks: TTFT and prompt tokens vs pruning rate, load, and plugin overhead.

Driven by ``benchmark/evs_sweep.py`` (the CLI). Each measurement launches a server
(``launch.serving``) and runs ``sglang.bench_serving`` against it as a subprocess, reading its
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
"""

import json
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import requests

from sglang_evs.bench.launch import rate_args, serving

DEFAULT_RATES = (0.0, 0.25, 0.5, 0.75, 0.9)
TEXT_TOKEN_RANGE = (10, 300)  # ordinary (non-special) token ids in the tiny tokenizer and in Qwen's
IMAGE_ARGS = ("--dataset-name", "image", "--image-count", "1", "--image-resolution", "64x64",
              "--random-input-len", "16", "--random-output-len", "4")  # fmt: skip
USAGE_FIELDS = {"stream_options": {"include_usage": True}}


# ---------------------------------------------------------------- pure functions


def summarize_bench(record: dict) -> dict:
    """One bench_serving output record -> the figures used here (times in ms, tokens per request)."""
    ok = [n for n, err in zip(record.get("input_lens", []), record.get("errors", []), strict=False) if not err]
    return {
        "completed": record["completed"],
        "mean_ttft_ms": record["mean_ttft_ms"],
        "median_ttft_ms": record["median_ttft_ms"],
        "request_throughput": record["request_throughput"],
        "mean_prompt_tokens": statistics.fmean(ok) if ok else float("nan"),
    }


def encoder_ms(video_ttft0_ms: float, prefill0_ms: float) -> float:
    """``E = TTFT_video(q=0) - P(n_0)``: the part of TTFT that pruning cannot shrink."""
    return video_ttft0_ms - prefill0_ms


def ideal_ttft_ms(encoder: float, prefill_ms: float) -> float:
    """``ideal(q) = E + P(n_q)``."""
    return encoder + prefill_ms


def reference_tokens(tokens0: float, text_tokens: float, rate: float) -> float:
    """Prompt tokens if exactly a fraction ``rate`` of the video part were dropped: text + (1-q) video.

    The video part (``tokens0 - text_tokens``) includes per-group timestamps and framing tokens that
    EVS keeps, and EVS keeps at least one whole group, so the real count is somewhat higher.
    """
    return text_tokens + (1.0 - rate) * (tokens0 - text_tokens)


def add_ratios(rows: list[dict]) -> float:
    """Fill ``ideal_ttft_ms``, ``measured_over_ideal``, ``ttft_vs_q0``, ``tokens_vs_q0`` into sweep rows.

    Rows: ``{"rate", "video": summarize_bench(...), "prefill_ms"}``, one with rate 0. Returns E (ms).
    """
    base = next(r for r in rows if r["rate"] == 0.0)
    enc = encoder_ms(base["video"]["mean_ttft_ms"], base["prefill_ms"])
    for row in rows:
        row["ideal_ttft_ms"] = ideal_ttft_ms(enc, row["prefill_ms"])
        row["measured_over_ideal"] = row["video"]["mean_ttft_ms"] / row["ideal_ttft_ms"]
        row["ttft_vs_q0"] = row["video"]["mean_ttft_ms"] / base["video"]["mean_ttft_ms"]
        row["tokens_vs_q0"] = row["video"]["mean_prompt_tokens"] / base["video"]["mean_prompt_tokens"]
    return enc


def paired_ratio(pairs: Sequence[tuple[float, float]]) -> dict:
    """``[(a, b), ...]`` measured side by side -> per-pair ``a/b``, their mean and geometric mean, and
    median(a)/median(b).

    With the order alternating between pairs, a slowdown of whichever runs second multiplies one
    pair's ratio by f and the next one's by 1/f: the geometric mean cancels it, the mean does not.
    """
    per_pair = [a / b for a, b in pairs]
    medians = statistics.median(a for a, _ in pairs) / statistics.median(b for _, b in pairs)
    return {"per_pair": per_pair, "mean": statistics.fmean(per_pair),
            "geometric_mean": statistics.geometric_mean(per_pair), "ratio_of_medians": medians}  # fmt: skip


def paired_ideal(samples: dict[float, list[dict]], rate: float) -> dict:
    """Interleaved samples ``{0.0: [...], rate: [...]}``, each ``{"video_ms", "prefill_ms", "tokens"}`` (the
    latency of one video request and of a text-only request of its prompt length, back to back) ->
    medians, ``E = median(video_ms - prefill_ms)`` over the q=0 samples, ``ideal = E + median prefill_ms``
    at ``rate``, ``measured_over_ideal`` and ``ttft_vs_q0`` (both from medians).
    """
    med = {q: {k: statistics.median(s[k] for s in samples[q]) for k in ("video_ms", "prefill_ms", "tokens")}
           for q in (0.0, rate)}  # fmt: skip
    enc = statistics.median(s["video_ms"] - s["prefill_ms"] for s in samples[0.0])
    ideal = enc + med[rate]["prefill_ms"]
    return {"rate": rate, "medians": {str(q): m for q, m in med.items()}, "encoder_ms": enc, "ideal_ms": ideal,
            "measured_over_ideal": med[rate]["video_ms"] / ideal,
            "ttft_vs_q0": med[rate]["video_ms"] / med[0.0]["video_ms"]}  # fmt: skip


# ---------------------------------------------------------------- measurements


def run_bench_serving(
    base_url: str,
    out_file: Path,
    dataset_args: Sequence[str],
    num_prompts: int,
    max_concurrency: int | None = 1,
    extra_args: Sequence[str] = (),
) -> dict:
    """Run ``python -m sglang.bench_serving`` and return its output record.

    Its own warm-up is off: it would send the first dataset request, whose media would then be cached
    when that request is measured; call :func:`warm_up` (other media) first instead.
    """
    out_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat",
           "--base-url", base_url, "--num-prompts", str(num_prompts), *dataset_args,
           "--output-file", str(out_file), "--output-details", "--warmup-requests", "0", "--flush-cache",
           "--seed", "0", *extra_args]  # fmt: skip
    if max_concurrency:
        cmd += ["--max-concurrency", str(max_concurrency)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out_file.with_suffix(".log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out_file.exists():
        raise RuntimeError(f"bench_serving failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    record = json.loads(out_file.read_text().splitlines()[-1])
    if record["completed"] < num_prompts:
        raise RuntimeError(f"bench_serving: {record['completed']}/{num_prompts} completed: {record['errors']}")
    return record


def per_request_rate(rate: float) -> dict:
    """Request-body fields that set EVS's pruning rate for one request (overriding the server's)."""
    return {"mm_processor_kwargs": {"video_pruning_rate": rate}}


def video_bench(
    base_url: str, dataset: Path, out_file: Path, num_prompts: int, concurrency: int = 1, body: dict | None = None
) -> dict:
    """bench_serving on a make_video_dataset JSONL (``body``: extra request fields) -> summarize_bench figures."""
    args = ("--dataset-name", "openai", "--dataset-path", str(dataset))
    extra = ("--extra-request-body", json.dumps(body)) if body else ()
    return summarize_bench(run_bench_serving(base_url, out_file, args, num_prompts, concurrency, extra))


def image_bench(base_url: str, out_file: Path, num_prompts: int, body: dict | None = None) -> dict:
    """bench_serving on its generated ``image`` dataset (one 64x64 image per request)."""
    extra = ("--extra-request-body", json.dumps({**USAGE_FIELDS, **(body or {})}))
    return summarize_bench(run_bench_serving(base_url, out_file, IMAGE_ARGS, num_prompts, 1, extra))


def warm_up(base_url: str, out_dir: Path, dataset: Path) -> None:
    """One video and one image chat request with media in no measured request.

    The video is the dataset's ``warmup.mp4`` (same shape as its clips, see make_video_dataset) when
    there is one: the first prefill of a new size is slow on CPU, and it must not be a measured one.
    """
    from sglang_evs.bench.make_video_dataset import WARMUP_CLIP
    from sglang_evs.testing import media

    clip, image = dataset.parent / WARMUP_CLIP, out_dir / "warmup.png"
    if not clip.exists():
        clip = media.write_clip(out_dir / WARMUP_CLIP, "moving", seed=999)
    if not image.exists():
        media.write_image(image, seed=999)
    for kind, path in (("video_url", clip), ("image_url", image)):
        content = [{"type": kind, kind: {"url": f"file://{path.resolve()}"}}, {"type": "text", "text": "Hi"}]
        body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
        requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=600).raise_for_status()


def timed_video_request(base_url: str, line: dict, rate: float) -> tuple[float, int]:
    """One dataset line at ``rate``, one output token, not streamed -> (latency ms, prompt tokens)."""
    body = {"model": "default", "messages": line["messages"], "max_tokens": 1, "temperature": 0,
            **per_request_rate(rate)}  # fmt: skip
    start = time.perf_counter()
    response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return (time.perf_counter() - start) * 1000, response.json()["usage"]["prompt_tokens"]


def prefill_ms(base_url: str, num_tokens: int, reps: int = 3, seed: int = 0) -> float:
    """Median latency (ms) of ``/generate`` on ``num_tokens`` random text ids with one output token.

    Fresh random ids per call (no prefix-cache hits); one unmeasured warm-up call first.
    """
    rng = random.Random(seed)
    times = []
    for i in range(reps + 1):
        ids = [rng.randrange(*TEXT_TOKEN_RANGE) for _ in range(num_tokens)]
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        start = time.perf_counter()
        response = requests.post(f"{base_url}/generate", json=body, timeout=600)
        response.raise_for_status()
        if i:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def text_only_tokens(base_url: str, dataset: Path) -> int:
    """Server-reported prompt tokens of the dataset's first request with its video part removed."""
    line = json.loads(dataset.read_text().splitlines()[0])
    message = line["messages"][0]
    text = [p for p in message["content"] if p.get("type") == "text"]
    body = {"model": "default", "messages": [{**message, "content": text}], "max_tokens": 1}
    response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()["usage"]["prompt_tokens"]


def plugin_loaded(log: str) -> bool:
    """Whether a server log has the plugin's announcement line (``sglang-evs <version> plugin loaded (...)``)."""
    return re.search(r"sglang-evs \S+ plugin loaded \(", log) is not None


# ---------------------------------------------------------------- modes


def sweep(
    model: str,
    dataset: Path,
    out_dir: Path,
    rates: Sequence[float] = DEFAULT_RATES,
    num_prompts: int = 4,
    image_prompts: int = 2,
    prefill_reps: int = 3,
    server_args: Sequence[str] = (),
) -> dict:
    """TTFT and prompt tokens vs pruning rate in one server; images at q=0 and max q.

    Each rate is a per-request setting (``mm_processor_kwargs.video_pruning_rate``) on one server
    started without one: on the 2-core CPU machine, TTFT differs by up to 20 % from one server start
    to the next, more than the effects measured here. No rate reuses another's vision features, since
    the item hash folds in the rate. (The server-wide setting serves ``--load`` and the tests.)
    """
    from tqdm import tqdm

    rates = sorted(set(rates) | {0.0})
    rows = []
    with serving(model, out_dir / "server-sweep.log", server_args) as server:
        warm_up(server.base_url, out_dir, dataset)
        for i, rate in enumerate(tqdm(rates, desc="pruning rates", unit="rate")):
            body = per_request_rate(rate)
            row = {"rate": rate}
            row["video"] = video_bench(server.base_url, dataset, out_dir / f"video-q{rate}.jsonl", num_prompts, 1, body)
            if rate in (0.0, max(rates)):
                row["image"] = image_bench(server.base_url, out_dir / f"image-q{rate}.jsonl", image_prompts, body)
            # a seed per rate: ids drawn from one seed would be prefixes of each other, hence cache hits
            tokens = round(row["video"]["mean_prompt_tokens"])
            row["prefill_ms"] = prefill_ms(server.base_url, tokens, prefill_reps, seed=i)
            rows.append(row)
        text_tokens = text_only_tokens(server.base_url, dataset)
    enc = add_ratios(rows)
    tokens0 = rows[0]["video"]["mean_prompt_tokens"]
    for row in rows:
        row["reference_tokens"] = reference_tokens(tokens0, text_tokens, row["rate"])
    qmax = rows[-1]
    image_ratio = {
        "tokens": qmax["image"]["mean_prompt_tokens"] / rows[0]["image"]["mean_prompt_tokens"],
        "ttft": qmax["image"]["mean_ttft_ms"] / rows[0]["image"]["mean_ttft_ms"],
    }
    evs_active = any(r["video"]["mean_prompt_tokens"] < tokens0 for r in rows[1:])
    return {"mode": "sweep", "encoder_ms": enc, "text_tokens": text_tokens, "rows": rows,
            "image_qmax_vs_q0": image_ratio, "evs_active": evs_active}  # fmt: skip


def load(
    model: str,
    dataset: Path,
    out_dir: Path,
    rates: Sequence[float] = (0.0, 0.75),
    concurrency: int = 16,
    server_args: Sequence[str] = (),
) -> dict:
    """``concurrency`` video requests at once per rate: requests/s and mean TTFT; ratios vs the first rate."""
    from tqdm import tqdm

    rows = []
    for rate in tqdm(rates, desc="load", unit="rate"):
        with serving(model, out_dir / f"server-load-q{rate}.log", [*server_args, *rate_args(rate)]) as server:
            out = out_dir / f"load-q{rate}.jsonl"
            warm_up(server.base_url, out_dir, dataset)
            rows.append({"rate": rate, "video": video_bench(server.base_url, dataset, out, concurrency, concurrency)})
    base = rows[0]["video"]
    for row in rows:
        row["throughput_vs_first"] = row["video"]["request_throughput"] / base["request_throughput"]
        row["ttft_vs_first"] = row["video"]["mean_ttft_ms"] / base["mean_ttft_ms"]
    return {"mode": "load", "concurrency": concurrency, "rows": rows}


def paired(
    model: str,
    dataset: Path,
    out_dir: Path,
    rate: float = 0.75,
    num_prompts: int = 8,
    server_args: Sequence[str] = (),
) -> dict:
    """The ideal at one rate, measured interleaved in one server: per clip, a video request at q=0 and
    at ``rate`` (order alternating), each right after a cache flush and followed by ``prefill_ms`` of its
    prompt length (an unmeasured text-only request, then the measured one). Pairs taken seconds apart
    keep the machine's drift out of E = TTFT - P."""
    from tqdm import tqdm

    lines = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()][:num_prompts]
    samples: dict[float, list[dict]] = {0.0: [], rate: []}
    with serving(model, out_dir / "server-paired.log", server_args) as server:
        warm_up(server.base_url, out_dir, dataset)
        for i, line in enumerate(tqdm(lines, desc="paired clips", unit="clip")):
            for j, q in enumerate((0.0, rate) if i % 2 == 0 else (rate, 0.0)):
                requests.post(f"{server.base_url}/flush_cache", timeout=600).raise_for_status()
                video, tokens = timed_video_request(server.base_url, line, q)
                text = prefill_ms(server.base_url, tokens, reps=1, seed=2 * i + j)
                samples[q].append({"video_ms": video, "prefill_ms": text, "tokens": tokens})
    return {"mode": "paired", "samples": {str(q): v for q, v in samples.items()}, **paired_ideal(samples, rate)}


def overhead(
    model: str, dataset: Path, out_dir: Path, rounds: int = 3, num_prompts: int = 4, server_args: Sequence[str] = ()
) -> dict:
    """Video TTFT at q=0 with the plugin vs upstream SGLang (``SGLANG_PLUGINS=none``), alternating rounds."""
    from tqdm import tqdm

    variants = {"plugin": {}, "upstream": {"SGLANG_PLUGINS": "none"}}
    runs: dict[str, list[dict]] = {"plugin": [], "upstream": []}
    for i in tqdm(range(rounds), desc="overhead rounds", unit="round"):
        for name in ("plugin", "upstream") if i % 2 == 0 else ("upstream", "plugin"):
            with serving(model, out_dir / f"server-{name}-{i}.log", server_args, variants[name]) as server:
                warm_up(server.base_url, out_dir, dataset)
                summary = video_bench(server.base_url, dataset, out_dir / f"overhead-{name}-{i}.jsonl", num_prompts)
                summary["plugin_loaded"] = plugin_loaded(server.log())
            runs[name].append(summary)
    pairs = [(p["mean_ttft_ms"], u["mean_ttft_ms"]) for p, u in zip(runs["plugin"], runs["upstream"], strict=True)]
    return {"mode": "overhead", "runs": runs, "plugin_over_upstream_ttft": paired_ratio(pairs)}


# ---------------------------------------------------------------- output


def plot_sweep(result: dict, path: Path) -> Path:
    """PNG: mean video TTFT (measured, ideal) and prompt tokens (reported, reference) vs pruning rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    q = [r["rate"] for r in rows]
    fig, (ax_t, ax_n) = plt.subplots(1, 2, figsize=(10, 4))
    ax_t.plot(q, [r["video"]["mean_ttft_ms"] for r in rows], "o-", label="measured (video)")
    ax_t.plot(q, [r["ideal_ttft_ms"] for r in rows], "--", label="ideal: E + P(tokens at q)")
    images = [r for r in rows if "image" in r]
    ax_t.plot([r["rate"] for r in images], [r["image"]["mean_ttft_ms"] for r in images], "s", label="image")
    ax_t.set(xlabel="video_pruning_rate q", ylabel="mean TTFT (ms)", title="time to first token")
    ax_n.plot(q, [r["video"]["mean_prompt_tokens"] for r in rows], "o-", label="server-reported (video)")
    ax_n.plot(q, [r["reference_tokens"] for r in rows], "--", label="text + (1-q) video")
    ax_n.plot([r["rate"] for r in images], [r["image"]["mean_prompt_tokens"] for r in images], "s", label="image")
    ax_n.set(xlabel="video_pruning_rate q", ylabel="prompt tokens per request", title="prompt tokens")
    for ax in (ax_t, ax_n):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(result: dict) -> str:
    """Human-readable ratios of a sweep/load/overhead result."""
    lines = []
    if result["mode"] == "sweep":
        lines.append(f"E (non-LM part of TTFT at q=0) = {result['encoder_ms']:.1f} ms")
        lines.append("q      tokens  tok/q0  TTFT ms  TTFT/q0  ideal ms  measured/ideal")
        for r in result["rows"]:
            v = r["video"]
            lines.append(f"{r['rate']:<6} {v['mean_prompt_tokens']:<7.0f} {r['tokens_vs_q0']:<7.3f} "
                         f"{v['mean_ttft_ms']:<8.1f} {r['ttft_vs_q0']:<8.3f} {r['ideal_ttft_ms']:<9.1f} "
                         f"{r['measured_over_ideal']:.3f}")  # fmt: skip
        im = result["image_qmax_vs_q0"]
        lines.append(f"images, max q vs q=0: tokens {im['tokens']:.3f}, TTFT {im['ttft']:.3f}")
        if not result["evs_active"]:
            lines.append("NOTE: equal prompt tokens at every rate: EVS pruning is not active on this server")
    elif result["mode"] == "load":
        for r in result["rows"]:
            v = r["video"]
            lines.append(f"q={r['rate']}: {v['request_throughput']:.3f} req/s ({r['throughput_vs_first']:.3f}x), "
                         f"mean TTFT {v['mean_ttft_ms']:.1f} ms ({r['ttft_vs_first']:.3f}x), "
                         f"{v['mean_prompt_tokens']:.0f} prompt tokens")  # fmt: skip
    elif result["mode"] == "paired":
        m0, mq = result["medians"]["0.0"], result["medians"][str(result["rate"])]
        lines.append(f"medians: q=0 video {m0['video_ms']:.0f} ms / P({m0['tokens']:.0f}) {m0['prefill_ms']:.0f} ms; "
                     f"q={result['rate']} video {mq['video_ms']:.0f} ms / P({mq['tokens']:.0f}) "
                     f"{mq['prefill_ms']:.0f} ms")  # fmt: skip
        lines.append(f"E {result['encoder_ms']:.0f} ms, ideal {result['ideal_ms']:.0f} ms, measured/ideal "
                     f"{result['measured_over_ideal']:.3f}, TTFT vs q=0 {result['ttft_vs_q0']:.3f}")  # fmt: skip
    else:
        ratio = result["plugin_over_upstream_ttft"]
        per_pair = ", ".join(f"{x:.3f}" for x in ratio["per_pair"])
        lines.append(f"TTFT plugin/upstream per round: {per_pair}; mean {ratio['mean']:.3f}, geometric mean "
                     f"{ratio['geometric_mean']:.3f}, ratio of medians {ratio['ratio_of_medians']:.3f}")  # fmt: skip
    return "\n".join(lines)


# ---------------------------------------------------------------- CLI


def cached_model(
    profile: str, architecture: str = "Qwen3VLForConditionalGeneration", cache: Path = Path(".cache/bench/models")
) -> Path:
    """Build (once per version of the builder) and return a tiny/small random checkpoint."""
    import hashlib

    from sglang_evs.testing import tiny_model

    digest = hashlib.sha256(Path(tiny_model.__file__).read_bytes()).hexdigest()[:12]
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
    parser.add_argument("--profile", choices=["tiny", "small"], default="tiny")
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
    parser.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES))
    parser.add_argument("--load-rates", type=float, nargs="+", default=[0.0, 0.75])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="overhead: alternating rounds")
    parser.add_argument("--num-prompts", type=int, default=4, help="video requests per measurement")
    parser.add_argument("--image-prompts", type=int, default=2)
    parser.add_argument("--prefill-reps", type=int, default=3)
    parser.add_argument("--dataset", type=Path, help="a make_video_dataset dataset.jsonl (default: generate)")
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
    num = args.concurrency if args.load else args.num_prompts
    dataset = args.dataset or make_video_dataset(
        out / "clips", num, args.static_share, args.kind, seconds=args.seconds, size=parse_size(args.size),
        fps=args.fps, max_tokens=args.max_tokens,
    )  # fmt: skip
    if args.load:
        result = load(model, dataset, out, args.load_rates, args.concurrency, server_args)
    elif args.paired is not None:
        result = paired(model, dataset, out, args.paired, args.num_prompts, server_args)
    elif args.overhead:
        result = overhead(model, dataset, out, args.rounds, args.num_prompts, server_args)
    else:
        result = sweep(model, dataset, out, args.rates, args.num_prompts, args.image_prompts, args.prefill_reps,
                       server_args)  # fmt: skip
        result["plot"] = str(plot_sweep(result, out / "sweep.png"))
    result["setup"] = {"model": model, "profile": None if args.model else args.profile,
                       "architecture": None if args.model else args.architecture, "dataset": str(dataset),
                       "server_args": server_args, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    name = "results.json" if result["mode"] == "sweep" else f"results-{result['mode']}.json"
    (out / name).write_text(json.dumps(result, indent=1))
    print(report(result))
    print(f"wrote {out / name}")
    return result


if __name__ == "__main__":
    main()
