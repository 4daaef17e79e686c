"""What a benchmark run prints and plots."""

import math
from pathlib import Path


def plot_sweep(result: dict, path: Path) -> Path:
    """PNG: mean video TTFT (measured, with its 95 % interval as error bars; ideal) against prompt tokens, and prompt
    tokens against the pruning rate, one line per method (each starts at the shared q = 0 point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    base = rows[0]
    fig, (ax_t, ax_n) = plt.subplots(1, 2, figsize=(11, 4))
    for method in result.get("methods", ["evs"]):
        line = [base, *(r for r in rows if r["method"] == method)]
        tokens = [r["video"]["mean_prompt_tokens"] for r in line]
        ax_t.errorbar(tokens, [r["video"]["mean_ttft_ms"] for r in line], yerr=half_widths(line), fmt="o-", capsize=3,
                      label=f"{method}: measured (95 % interval)")  # fmt: skip
        ax_t.plot(tokens, [r["ideal_ttft_ms"] for r in line], "--", label=f"{method}: ideal E + P(tokens)")
        ax_n.plot([r["rate"] for r in line], tokens, "o-", label=f"{method}: server-reported")
    ax_t.set(xlabel="prompt tokens per video request (kept tokens + text)", ylabel="mean TTFT (ms)",
             title="time to first token")  # fmt: skip
    ax_n.plot([r["rate"] for r in rows], [r["reference_tokens"] for r in rows], "k:", label="text + (1-q) video")
    ax_n.set(xlabel="pruning rate q (VidCom2: 1 - retention ratio)", ylabel="prompt tokens per request",
             title="prompt tokens")  # fmt: skip
    for ax in (ax_t, ax_n):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_lengths(result: dict, path: Path) -> Path:
    """PNG: mean video TTFT (measured, with its 95 % interval as error bars, and the ideal dashed) and prompt tokens
    against clip length, one line per pruning rate, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_n) = plt.subplots(1, 2, figsize=(11, 4))
    for i, rate in enumerate(result["rates"]):
        rows = [r for r in result["rows"] if r["rate"] == rate]
        seconds, color = [r["seconds"] for r in rows], f"C{i}"
        ax_t.errorbar(seconds, [r["video"]["mean_ttft_ms"] / 1000 for r in rows], yerr=half_widths(rows, 1000),
                      fmt="o-", color=color, capsize=3, label=f"q = {rate}")  # fmt: skip
        if rate:
            ax_t.plot(seconds, [r["ideal_ttft_ms"] / 1000 for r in rows], "--", color=color, alpha=0.6,
                      label=f"q = {rate}: ideal E + P(tokens)")  # fmt: skip
        ax_n.plot(seconds, [r["video"]["mean_prompt_tokens"] for r in rows], "o-", color=color, label=f"q = {rate}")
    ax_t.set(xlabel="clip length (s)", ylabel="mean TTFT (s)", title="time to first token", xscale="log",
             yscale="log")  # fmt: skip
    ax_n.set(xlabel="clip length (s)", ylabel="prompt tokens per request", title="prompt tokens", xscale="log",
             yscale="log")  # fmt: skip
    for ax in (ax_t, ax_n):
        ax.set_xticks(result["seconds"], [f"{s:g}" for s in result["seconds"]], minor=False)
        ax.set_xticks([], minor=True)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def half_widths(rows: list[dict], unit: float = 1.0) -> list[float]:
    """Each row's video TTFT interval half-width (`ratios.mean_half_width`) in `unit`s of ms; 0 where a run had none
    (a record from before it was kept)."""
    widths = [row["video"].get("ttft_half_width_ms", float("nan")) / unit for row in rows]
    return [0.0 if math.isnan(width) else width for width in widths]


def interval_text(ratio: dict) -> str:
    if ratio["low"] is None:
        return f"geometric mean {ratio['geometric_mean']:.3f} (1 pair, no interval)"
    return (
        f"geometric mean {ratio['geometric_mean']:.3f} (95 % interval {ratio['low']:.3f}-{ratio['high']:.3f}, "
        f"{ratio['pairs']} pairs)"
    )


def report(result: dict) -> str:
    """Human-readable ratios of a sweep/load/overhead result."""
    lines = []
    if result["mode"] == "sweep":
        lines.append(f"E (non-LM part of TTFT at q=0) = {result['encoder_ms']:.1f} ms")
        lines.append("method   q      tokens  tok/q0  TTFT ms  TTFT/q0  ideal ms  measured/ideal")
        for r in result["rows"]:
            v = r["video"]
            lines.append(f"{r.get('method', 'evs'):<8} {r['rate']:<6} {v['mean_prompt_tokens']:<7.0f} "
                         f"{r['tokens_vs_q0']:<7.3f} {v['mean_ttft_ms']:<8.1f} {r['ttft_vs_q0']:<8.3f} "
                         f"{r['ideal_ttft_ms']:<9.1f} {r['measured_over_ideal']:.3f}")  # fmt: skip
        im = result["image_qmax_vs_q0"]
        lines.append(f"images, max q vs q=0: tokens {im['tokens']:.3f}, TTFT {im['ttft']:.3f}")
        if not result["evs_active"]:
            lines.append("NOTE: equal prompt tokens at every rate: EVS pruning is not active on this server")
    elif result["mode"] == "lengths":
        lines.append("seconds  q     tokens  TTFT ms   TTFT/q0  ideal ms  measured/ideal")
        for r in result["rows"]:
            lines.append(f"{r['seconds']:<8g} {r['rate']:<5} {r['video']['mean_prompt_tokens']:<7.0f} "
                         f"{r['video']['mean_ttft_ms']:<9.0f} {r['ttft_vs_q0']:<8.3f} {r['ideal_ttft_ms']:<9.0f} "
                         f"{r['measured_over_ideal']:.3f}")  # fmt: skip
        for q, reply in (result.get("beyond_context") or {}).items():
            lines.append(f"beyond the context, q={q}: HTTP {reply['status']} "
                         f"{reply.get('prompt_tokens', reply.get('error', ''))}")  # fmt: skip
    elif result["mode"] == "load":
        for r in result["rows"]:
            v = r["video"]
            lines.append(f"q={r['rate']}: {v['request_throughput']:.3f} req/s ({r['throughput_vs_first']:.3f}x), "
                         f"mean TTFT {v['mean_ttft_ms']:.1f} ms ({r['ttft_vs_first']:.3f}x), "
                         f"{v['mean_prompt_tokens']:.0f} prompt tokens")  # fmt: skip
        if "throughput_ratio" in result:
            lines.append(f"requests/s q={result['rows'][-1]['rate']} / q={result['rows'][0]['rate']} per round: "
                         + interval_text(result["throughput_ratio"]))  # fmt: skip
    elif result["mode"] == "paired":
        m0, mq = result["medians"]["0.0"], result["medians"][str(result["rate"])]
        lines.append(f"medians: q=0 video {m0['media_ms']:.0f} ms / P({m0['tokens']:.0f}) {m0['prefill_ms']:.0f} ms; "
                     f"q={result['rate']} video {mq['media_ms']:.0f} ms / P({mq['tokens']:.0f}) "
                     f"{mq['prefill_ms']:.0f} ms")  # fmt: skip
        lines.append(f"E {result['encoder_ms']:.0f} ms, ideal {result['ideal_ms']:.0f} ms, measured/ideal "
                     f"{result['measured_over_ideal']:.3f}, latency vs q=0 {result['ttft_vs_q0']:.3f} "
                     "(latency of a one-token streamed request)")  # fmt: skip
        if "latency_ratio" in result:
            lines.append(f"latency q={result['rate']} / q=0 per clip: " + interval_text(result["latency_ratio"]))
        if "ttft_ratio" in result:
            lines.append(f"streamed TTFT q={result['rate']} / q=0 per clip: " + interval_text(result["ttft_ratio"]))
        for q, stages in result.get("stage_medians", {}).items():
            lines.append(f"q={q} stage medians (ms): " + ", ".join(f"{k[:-3]} {v:.0f}" for k, v in stages.items()))
    elif result["mode"] == "methods":
        first, second = result["methods"]
        ratio = result["latency_ratio"]
        tokens = {m: sum(t) / len(t) for m, t in result["tokens"].items()}
        lines.append(f"q={result['rate']}: prompt tokens {first} {tokens[first]:.0f}, {second} {tokens[second]:.0f}")
        lines.append(f"one-token latency {first}/{second}: " + interval_text(ratio))
    else:
        for what, key in (
            ("TTFT", "plugin_over_upstream_ttft"),
            ("time per output token", "plugin_over_upstream_tpot"),
        ):
            if key in result:
                per_pair = ", ".join(f"{x:.3f}" for x in result[key]["per_pair"])
                lines.append(f"{what} plugin/upstream per round: {per_pair}; " + interval_text(result[key]))
    return "\n".join(lines)
