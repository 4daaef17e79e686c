"""The benchmark modes, each on its own servers: sweep, load, paired, overhead (method: sweep.py)."""

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import requests

from sglang_evs.bench.launch import rate_args, serving
from sglang_evs.bench.measure import (
    DEFAULT_RATES,
    image_bench,
    plugin_loaded,
    prefill_ms,
    stage_times,
    text_only_tokens,
    timed_video_request,
    trace_size,
    video_bench,
    warm_up,
)
from sglang_evs.bench.ratios import (
    add_ratios,
    geometric_interval,
    paired_ideal,
    paired_ratio,
    reference_tokens,
    round_ratio,
)
from sglang_evs.testing.requests import flush_cache, per_request_rate


def sweep(
    model: str,
    dataset: Path,
    out_dir: Path,
    rates: Sequence[float] = DEFAULT_RATES,
    num_prompts: int = 4,
    image_prompts: int = 2,
    prefill_reps: int = 3,
    server_args: Sequence[str] = (),
    methods: Sequence[str] = ("evs",),
) -> dict:
    """TTFT and prompt tokens vs pruning rate, per method, in one server; images at q=0 and max q.

    Each (method, rate) is a per-request setting (``mm_processor_kwargs``) on one server started
    without one: on the 2-core CPU machine, TTFT differs by up to 20 % from one server start
    to the next, more than the effects measured here. No (method, rate) reuses another's vision
    features, since the item hash folds in both. q = 0 is one row (no method prunes at 0).
    (The server-wide setting serves ``--load`` and the tests.)
    """
    from tqdm import tqdm

    points = [("evs", 0.0)] + [(m, q) for q in sorted(set(rates) - {0.0}) for m in methods]
    qmax = max(q for _, q in points)
    rows = []
    with serving(model, out_dir / "server-sweep.log", server_args) as server:
        warm_up(server.base_url, out_dir, dataset)
        for i, (method, rate) in enumerate(tqdm(points, desc="methods x rates", unit="point")):
            body = per_request_rate(rate, method)
            row = {"method": method if rate else "none", "rate": rate}
            name = f"{method}-q{rate}" if rate else "q0"
            row["video"] = video_bench(server.base_url, dataset, out_dir / f"video-{name}.jsonl", num_prompts, 1, body)
            if rate in (0.0, qmax) and method == methods[0]:
                row["image"] = image_bench(server.base_url, out_dir / f"image-{name}.jsonl", image_prompts, body)
            # a seed per point: ids drawn from one seed would be prefixes of each other, hence cache hits
            tokens = round(row["video"]["mean_prompt_tokens"])
            row["prefill_ms"] = prefill_ms(server.base_url, tokens, prefill_reps, seed=i)
            rows.append(row)
        text_tokens = text_only_tokens(server.base_url, dataset)
    enc = add_ratios(rows)
    tokens0 = rows[0]["video"]["mean_prompt_tokens"]
    for row in rows:
        row["reference_tokens"] = reference_tokens(tokens0, text_tokens, row["rate"])
    with_images = [r for r in rows if "image" in r]
    image_ratio = {
        "tokens": with_images[-1]["image"]["mean_prompt_tokens"] / rows[0]["image"]["mean_prompt_tokens"],
        "ttft": with_images[-1]["image"]["mean_ttft_ms"] / rows[0]["image"]["mean_ttft_ms"],
    }
    evs_active = any(r["video"]["mean_prompt_tokens"] < tokens0 for r in rows[1:])
    return {"mode": "sweep", "methods": list(methods), "encoder_ms": enc, "text_tokens": text_tokens,
            "rows": rows, "image_qmax_vs_q0": image_ratio, "evs_active": evs_active}  # fmt: skip


def load(
    model: str,
    dataset: Path,
    out_dir: Path,
    rates: Sequence[float] = (0.0, 0.75),
    concurrency: int = 16,
    server_args: Sequence[str] = (),
    rounds: int = 1,
) -> dict:
    """``concurrency`` video requests at once per rate, a fresh server per rate and round, the order of
    the rates alternating between rounds (q = 0 is not always first): requests/s and mean TTFT per
    run; rows hold their means over rounds, with ratios vs the first rate, and with two rates or
    more and two rounds or more, the per-round ratios of the last rate to the first with a 95 %
    interval."""
    from tqdm import tqdm

    runs: list[dict] = []
    schedule = [(r, rate) for r in range(rounds) for rate in (rates if r % 2 == 0 else list(reversed(rates)))]
    for r, rate in tqdm(schedule, desc="load", unit="server"):
        log = out_dir / f"server-load-q{rate}-round{r}.log"
        with serving(model, log, [*server_args, *rate_args(rate)]) as server:
            out = out_dir / f"load-q{rate}-round{r}.jsonl"
            warm_up(server.base_url, out_dir, dataset)
            runs.append({"round": r, "rate": rate, "video": video_bench(server.base_url, dataset, out, concurrency,
                                                                        concurrency)})  # fmt: skip
    fields = ("request_throughput", "mean_ttft_ms", "mean_prompt_tokens")
    rows = []
    for rate in rates:
        mine = [run["video"] for run in runs if run["rate"] == rate]
        rows.append({"rate": rate, "video": {k: statistics.fmean(v[k] for v in mine) for k in fields}})
    base = rows[0]["video"]
    for row in rows:
        row["throughput_vs_first"] = row["video"]["request_throughput"] / base["request_throughput"]
        row["ttft_vs_first"] = row["video"]["mean_ttft_ms"] / base["mean_ttft_ms"]
    result = {"mode": "load", "concurrency": concurrency, "rounds": rounds, "rows": rows, "runs": runs}
    if rounds >= 2 and len(rates) >= 2:
        throughput = {(run["round"], run["rate"]): run["video"]["request_throughput"] for run in runs}
        result["throughput_ratio"] = round_ratio(
            [throughput[r, rates[0]] for r in range(rounds)], [throughput[r, rates[-1]] for r in range(rounds)]
        )
    return result


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
    trace_path = out_dir / "trace-paired.jsonl"
    trace_path.unlink(missing_ok=True)
    with serving(model, out_dir / "server-paired.log", server_args, {"SGLANG_EVS_TRACE": str(trace_path)}) as server:
        warm_up(server.base_url, out_dir, dataset)
        for i, line in enumerate(tqdm(lines, desc="paired clips", unit="clip")):
            for j, q in enumerate((0.0, rate) if i % 2 == 0 else (rate, 0.0)):
                flush_cache(server.base_url)
                since = trace_size(trace_path)
                timed = timed_video_request(server.base_url, line, q)
                stages = stage_times(trace_path, since)
                text = prefill_ms(server.base_url, timed.prompt_tokens, reps=1, seed=2 * i + j)
                samples[q].append({"media_ms": timed.latency_ms, "ttft_ms": timed.ttft_ms, "prefill_ms": text,
                                   "tokens": timed.prompt_tokens, "stages": stages})  # fmt: skip
    result = {"mode": "paired", "samples": {str(q): v for q, v in samples.items()}, **paired_ideal(samples, rate)}
    for key, name in (("media_ms", "latency_ratio"), ("ttft_ms", "ttft_ratio")):
        per_pair = [b[key] / a[key] for a, b in zip(samples[0.0], samples[rate], strict=True)]
        result[name] = geometric_interval(per_pair)
    result["stage_medians"] = {
        str(q): {k: statistics.median(s["stages"][k] for s in v) for k in v[0]["stages"]} for q, v in samples.items()
    }
    return result


def overhead(
    model: str, dataset: Path, out_dir: Path, rounds: int = 3, num_prompts: int = 4, server_args: Sequence[str] = ()
) -> dict:
    """Video TTFT and time per output token (decode) at q=0 with the plugin vs upstream SGLang
    (``SGLANG_PLUGINS=none``), a fresh server per variant and round, the order alternating."""
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
    result = {"mode": "overhead", "runs": runs}
    for key, name in (("mean_ttft_ms", "plugin_over_upstream_ttft"), ("mean_tpot_ms", "plugin_over_upstream_tpot")):
        pairs = [(p[key], u[key]) for p, u in zip(runs["plugin"], runs["upstream"], strict=True)]
        result[name] = {**paired_ratio(pairs), **geometric_interval([a / b for a, b in pairs])}
    return result


def compare_methods(
    model: str,
    dataset: Path,
    out_dir: Path,
    rate: float = 0.75,
    num_prompts: int = 8,
    server_args: Sequence[str] = (),
    methods: Sequence[str] = ("evs", "vidcom2"),
) -> dict:
    """The same clips pruned at ``rate`` by two methods, interleaved in one server: per clip, one
    request per method (order alternating), each right after a cache flush; TTFT and latency of one
    streamed output token, and prompt tokens. The latency ratio ``first/second`` per clip, with its
    interval."""
    from tqdm import tqdm

    first, second = methods
    lines = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()][:num_prompts]
    samples: dict[str, list[dict]] = {first: [], second: []}
    with serving(model, out_dir / "server-methods.log", server_args) as server:
        warm_up(server.base_url, out_dir, dataset)
        for i, line in enumerate(tqdm(lines, desc="clips", unit="clip")):
            for method in (first, second) if i % 2 == 0 else (second, first):
                flush_cache(server.base_url)
                timed = timed_video_request(server.base_url, line, rate, method)
                samples[method].append({"latency_ms": timed.latency_ms, "ttft_ms": timed.ttft_ms,
                                        "tokens": timed.prompt_tokens})  # fmt: skip
    pairs = [(a["latency_ms"], b["latency_ms"]) for a, b in zip(samples[first], samples[second], strict=True)]
    return {"mode": "methods", "rate": rate, "methods": [first, second], "samples": samples,
            "tokens": {m: [s["tokens"] for s in samples[m]] for m in methods},
            "latency_ratio": {**paired_ratio(pairs), **geometric_interval([a / b for a, b in pairs])}}  # fmt: skip


def lengths(
    model: str,
    out_dir: Path,
    seconds: Sequence[float] = (2, 4, 8, 16, 32, 64),
    rates: Sequence[float] = (0.0, 0.5, 0.75, 0.9),
    num_prompts: int = 2,
    prefill_reps: int = 2,
    server_args: Sequence[str] = (),
    beyond_context_seconds: float | None = None,
) -> dict:
    """TTFT and prompt tokens against clip length, at each rate, in one server.

    Per length: fresh clips (``num_prompts``, half static), a warm-up clip of that length, then the
    rates in an order rotated per length (q = 0 is not always first), streamed TTFT through
    bench_serving, and the text prefill ``P(n)`` at each rate's prompt length. The ideal at each
    length is ``E(L) + P(n_q)``, with ``E(L) = TTFT(L, 0) - P(n_0)``. With ``beyond_context_seconds``,
    one clip that long is sent at q = 0 (expected: HTTP 400 naming both counts) and at the highest
    rate (expected: served); the replies are recorded.
    """
    from tqdm import tqdm

    from sglang_evs.bench.make_video_dataset import make_video_dataset

    rates = sorted(set(rates) | {0.0})
    rows = []
    with serving(model, out_dir / "server-lengths.log", server_args) as server:
        for i, length in enumerate(tqdm(seconds, desc="clip lengths", unit="length")):
            dataset = make_video_dataset(out_dir / f"clips-{length:g}s", num_prompts, seconds=length, seed=100 * i)
            warm_up(server.base_url, out_dir, dataset)
            for j, rate in enumerate(rates[i % len(rates) :] + rates[: i % len(rates)]):
                name = f"lengths-{length:g}s-q{rate}.jsonl"
                video = video_bench(server.base_url, dataset, out_dir / name, num_prompts, 1, per_request_rate(rate))
                tokens = round(video["mean_prompt_tokens"])
                prefill = prefill_ms(server.base_url, tokens, prefill_reps, seed=1000 * i + j)
                rows.append({"seconds": length, "rate": rate, "video": video, "prefill_ms": prefill})
        beyond = beyond_context(server.base_url, out_dir, beyond_context_seconds, max(rates)) if (
            beyond_context_seconds) else None  # fmt: skip
    for length in seconds:
        add_ratios([r for r in rows if r["seconds"] == length])  # E(L) from this length's q = 0 row
    rows.sort(key=lambda r: (r["seconds"], r["rate"]))
    return {"mode": "lengths", "seconds": list(seconds), "rates": rates, "rows": rows, "beyond_context": beyond}


def beyond_context(base_url: str, out_dir: Path, seconds: float, rate: float) -> dict:
    """One clip of ``seconds`` at q = 0 and at ``rate``: ``{str(q): {"status", "prompt_tokens" or "error"}}``."""
    from sglang_evs.bench.make_video_dataset import make_video_dataset

    dataset = make_video_dataset(out_dir / f"clips-{seconds:g}s-beyond", 1, static_share=0.0, seconds=seconds)
    line = json.loads(dataset.read_text().splitlines()[0])
    replies = {}
    for q in (0.0, rate):
        body = {"model": "default", "messages": line["messages"], "max_tokens": 1, **per_request_rate(q)}
        response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=1800)
        reply = {"status": response.status_code}
        if response.ok:
            reply["prompt_tokens"] = response.json()["usage"]["prompt_tokens"]
        else:
            reply["error"] = response.text[:500]
        replies[str(q)] = reply
    return replies
