"""Pure arithmetic of the EVS benchmarks: summaries, the ideal TTFT, per-pair ratios (method: sweep.py)."""

import math
import statistics
from collections.abc import Sequence


def summarize_bench(record: dict) -> dict:
    """One bench_serving output record -> the figures used here (times in ms, tokens per request)."""
    ok = [n for n, err in zip(record.get("input_lens", []), record.get("errors", []), strict=False) if not err]
    return {
        "completed": record["completed"],
        "mean_ttft_ms": record["mean_ttft_ms"],
        "ttft_half_width_ms": mean_half_width(record.get("std_ttft_ms", float("nan")), record["completed"]),
        "median_ttft_ms": record["median_ttft_ms"],
        "p99_ttft_ms": record.get("p99_ttft_ms", float("nan")),
        "request_throughput": record["request_throughput"],
        "mean_tpot_ms": record["mean_tpot_ms"],
        "mean_prompt_tokens": statistics.fmean(ok) if ok else float("nan"),
    }


def mean_half_width(std: float, count: int) -> float:
    """The half-width of the 95 % Student's t interval of a mean of `count` values whose standard deviation is `std`
    as bench_serving reports it (numpy's, over the values themselves: ddof 0); nan below two values."""
    from scipy import stats

    if count < 2:
        return float("nan")
    return float(stats.t.ppf(0.975, count - 1) * std / math.sqrt(count - 1))


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
    """Interleaved samples ``{0.0: [...], rate: [...]}``, each ``{"media_ms", "prefill_ms", "tokens"}`` (the
    latency of one video or image request and of a text-only request of its prompt length, back to back) ->
    medians, ``E = median(media_ms - prefill_ms)`` over the q=0 samples, ``ideal = E + median prefill_ms``
    at ``rate``, ``measured_over_ideal`` and ``ttft_vs_q0`` (both from medians).
    """
    med = {q: {k: statistics.median(s[k] for s in samples[q]) for k in ("media_ms", "prefill_ms", "tokens")}
           for q in (0.0, rate)}  # fmt: skip
    enc = statistics.median(s["media_ms"] - s["prefill_ms"] for s in samples[0.0])
    ideal = enc + med[rate]["prefill_ms"]
    return {"rate": rate, "medians": {str(q): m for q, m in med.items()}, "encoder_ms": enc, "ideal_ms": ideal,
            "measured_over_ideal": med[rate]["media_ms"] / ideal,
            "ttft_vs_q0": med[rate]["media_ms"] / med[0.0]["media_ms"]}  # fmt: skip


def geometric_interval(ratios: list[float]) -> dict:
    """Per-pair ratios -> geometric mean and its 95 % interval: Student's t interval of the log ratios
    (`scipy.stats.t`, at every count of pairs)."""
    from scipy import stats

    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"geometric_mean": math.exp(mean), "low": None, "high": None, "pairs": len(logs)}
    spread = statistics.stdev(logs) / math.sqrt(len(logs))
    low, high = stats.t.interval(0.95, len(logs) - 1, loc=mean, scale=spread) if spread > 0 else (mean, mean)
    return {"geometric_mean": math.exp(mean), "low": math.exp(low), "high": math.exp(high), "pairs": len(logs)}


def round_ratio(baseline: list[float], other: list[float]) -> dict:
    """One figure per alternated round for each side -> per-round ratios other / baseline, their geometric
    mean and 95 % interval."""
    per_round = [o / b for b, o in zip(baseline, other, strict=True)]
    return {"per_round": per_round, **geometric_interval(per_round)}


def median_interval(values: list[float]) -> dict:
    """Per-pair values (ratios, or differences) -> their median and a distribution-free 95 % interval for
    it: the order statistics at ranks n/2 -+ 1.96 sqrt(n)/2 (the sign test, normal approximation). A
    pair another process disturbed moves it by one rank, however far off that pair is. No interval below
    8 pairs."""
    ordered = sorted(values)
    count = len(ordered)
    half = 1.96 * math.sqrt(count) / 2
    low_rank, high_rank = math.floor(count / 2 - half), math.ceil(count / 2 + half)  # 1-based
    if low_rank < 1 or high_rank > count:
        return {"median": statistics.median(ordered), "low": None, "high": None, "pairs": count}
    return {"median": statistics.median(ordered), "low": ordered[low_rank - 1], "high": ordered[high_rank - 1],
            "pairs": count}  # fmt: skip
