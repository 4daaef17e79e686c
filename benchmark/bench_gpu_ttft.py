"""GPU: video TTFT on a Qwen3-VL-8B-shaped server at q = 0, .5, .75, beside the vision tower's time and the
ideal; prefill CUDA graphs against eager, side by side.

    SGLANG_EVS_GPU_ROUTE=1 python benchmark/bench_gpu_ttft.py [--model-path M] [--clips 6] [--seconds 8]
        [--size 448x448] [--fps 2] [--rates 0 0.5 0.75] [--method evs] [--output bench.json]
    python benchmark/bench_gpu_ttft.py --smoke [--model-path TINY]   # CPU, tiny model, seconds: the plumbing

Two servers at once on one GPU, both the GPU route's (`sglang_evs.runtime.gpu_route.SERVER_ARGS`) in bfloat16 with
random weights (`--load-format dummy`) on the Qwen3-VL-8B-shaped config (`testing/qwen3_vl_8b_shape.py`):
`graph` with decode graphs and breakable prefill graphs (buckets of 256-4096 tokens, so that a prompt pads at
most 2x), the prefill backend named (`--cuda-graph-backend-prefill breakable`: the plugin turns its models' prefill
graphs on by itself only where the server's default prunes, and this server has none, each request naming its
rate) and `eager` (prefill graphs off). Clips from `bench/make_video_dataset.py` (half
static, half a moving square). For each clip the rates go in an order rotated per clip and, for each rate,
the two servers in alternating order; each measurement is, on a flushed radix cache:
  - a streamed video chat request with one output token: TTFT, and the prompt tokens the server reports;
  - the vision tower's time in that request, `T_vit`, from the plugin's trace (`video_encoded`, timed to the
    end of its kernels);
  - a text-only request of the same prompt length: `T_lm(kept)` = P(n_q) (`bench/measure.prefill_ms`).
Reported per server and rate (medians over clips): prompt tokens, TTFT, T_vit, T_lm(kept), the tower's
ideal `T_vit + T_lm(kept)` and TTFT over it; the ideal of `bench/ratios.py`, `E + P(n_q)` with
`E = median(TTFT - P(n_0))` at q = 0, and TTFT over it; per clip TTFT(q)/TTFT(0) (geometric mean and 95 %
interval); per (clip, rate) eager/graph TTFT. The graph server's trace also tells whether each timed request
replayed a prefill graph (a request that did not is counted, not timed as eager).

`--smoke`: the tiny Qwen3-VL in float32 on one CPU server in graph mode (SGLang's graph runners replaying on
CPU stand-ins) standing for both sides, 2 s clips of 64 x 64: every step runs, replays are counted, the
figures say nothing (`test/bench/test_bench_gpu_ttft.py` runs it with one clip).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPLAY_PHASE = "prefill"
BUCKETS = (256, 512, 1024, 2048, 4096)  # prefill graph buckets (tokens): each at most twice the one below


def gpu_server_args(prefill_graphs: bool, chunk: int = BUCKETS[-1]) -> list[str]:
    """One side's server: the GPU route in bfloat16 with random weights; prefill graphs on (breakable, named)
    or off."""
    from sglang_evs.runtime.gpu_route import SERVER_ARGS
    from sglang_evs.testing.gpu import without_prefill_graphs
    from sglang_evs.testing.server import PREFILL_GRAPHS_BY_FLAG

    args = [
        *SERVER_ARGS, "--dtype", "bfloat16", "--load-format", "dummy", "--chunked-prefill-size", str(chunk),
        "--cuda-graph-bs-prefill", *(str(b) for b in BUCKETS if b <= chunk), "--cuda-graph-max-bs-decode", "4",
        "--mem-fraction-static", "0.4", "--context-length", "32768",
    ]  # fmt: skip
    return [*args, *PREFILL_GRAPHS_BY_FLAG] if prefill_graphs else without_prefill_graphs(args)


# --smoke: float32 on CPU in graph mode (SGLang's graph runners replaying on CPU stand-ins), prefill graphs of
# one bucket, a chunk that holds a whole 2 s clip's prompt (each pads under 2x), decode graphs for 1 and 2
SMOKE_ARGS = ["--dtype", "float32", "--chunked-prefill-size", "256", "--cuda-graph-bs-prefill", "256",
              "--cuda-graph-max-bs-decode", "2"]  # fmt: skip


def launch(model: str, work: Path, side: str, trace_path: Path, smoke: bool):
    """The server of one side (`testing.server.Launch`), traced; --smoke: a CPU server."""
    from sglang_evs.testing.gpu import ROUTE_ON
    from sglang_evs.testing.server import Launch

    env = {"SGLANG_EVS_TRACE": str(trace_path), **({} if smoke else ROUTE_ON)}
    from sglang_evs.testing.server import PREFILL_GRAPHS_BY_FLAG

    args = [*SMOKE_ARGS, *PREFILL_GRAPHS_BY_FLAG] if smoke else gpu_server_args(side == "graph")
    return Launch(model, work / f"{side}.log", args, env, cpu=smoke, graph_mode=smoke)


def prefill_replays(trace_path: Path, since: int) -> int:
    from sglang_evs.bench.measure import trace_size

    if trace_size(trace_path) <= since:
        return 0
    with trace_path.open() as lines:
        lines.seek(since)
        events = [json.loads(line) for line in lines if line.strip()]
    return sum(e["event"] == "graph_replay" and e["phase"] == REPLAY_PHASE for e in events)


def measure(base_url: str, line: dict, rate: float, method: str, trace_path: Path, seed: int) -> dict:
    """One video request at `rate` on a flushed cache, its stage times, then P(n) of its prompt length."""
    from sglang_evs.bench.measure import prefill_ms, stage_times, timed_video_request, trace_size
    from sglang_evs.testing.requests import flush_cache

    flush_cache(base_url)
    since = trace_size(trace_path)
    timed = timed_video_request(base_url, line, rate, method)
    stages = stage_times(trace_path, since)
    replays = prefill_replays(trace_path, since)
    lm_ms = prefill_ms(base_url, timed.prompt_tokens, reps=1, seed=seed)
    return {"rate": rate, "ttft_ms": timed.ttft_ms, "tokens": timed.prompt_tokens, "vit_ms": stages["encoder_ms"],
            "lm_ms": lm_ms, "prefill_replays": replays, "stages": stages}  # fmt: skip


def schedule(clips: int, rates: list[float]) -> list[tuple[int, float, tuple[str, str]]]:
    """(clip, rate, side order): rates rotated per clip, sides alternating from one measurement to the next."""
    out = []
    for clip in range(clips):
        for rate in rates[clip % len(rates) :] + rates[: clip % len(rates)]:
            out.append((clip, rate, ("graph", "eager") if len(out) % 2 == 0 else ("eager", "graph")))
    return out


def complete_clips(samples: list[dict], rates: list[float]) -> list[dict]:
    """The samples of the clips measured at every rate on both servers (a run stopped early leaves one part-done)."""
    done = {(s["clip"], s["side"], s["rate"]) for s in samples}
    full = {c for c, _, _ in done if all((c, side, q) in done for side in ("graph", "eager") for q in rates)}
    return [s for s in samples if s["clip"] in full]


def summarize(samples: list[dict], rates: list[float]) -> dict:
    """Samples `{"clip", "side", "rate", "ttft_ms", "tokens", "vit_ms", "lm_ms", ...}` -> per side and rate
    the medians and both ideals, TTFT against q = 0 per clip, eager over graph per (clip, rate)."""
    from sglang_evs.bench.ratios import geometric_interval, ideal_ttft_ms

    by = {(s["side"], s["clip"], s["rate"]): s for s in samples}
    sides = sorted({s["side"] for s in samples})
    rows, ttft_vs_q0 = [], {}
    for side in sides:
        mine = [s for s in samples if s["side"] == side]
        encoder = statistics.median(s["ttft_ms"] - s["lm_ms"] for s in mine if s["rate"] == 0.0)
        for rate in rates:
            at = [s for s in mine if s["rate"] == rate]
            med = {k: statistics.median(s[k] for s in at) for k in ("ttft_ms", "tokens", "vit_ms", "lm_ms")}
            ideal_vit, ideal_e = med["vit_ms"] + med["lm_ms"], ideal_ttft_ms(encoder, med["lm_ms"])
            rows.append({"side": side, "rate": rate, **med, "ideal_vit_ms": ideal_vit,
                         "ttft_over_ideal_vit": med["ttft_ms"] / ideal_vit, "encoder_e_ms": encoder,
                         "ideal_e_ms": ideal_e, "ttft_over_ideal_e": med["ttft_ms"] / ideal_e})  # fmt: skip
        clips = sorted({s["clip"] for s in mine})
        ttft_vs_q0[side] = {
            str(rate): geometric_interval([by[side, c, rate]["ttft_ms"] / by[side, c, 0.0]["ttft_ms"] for c in clips])
            for rate in rates
            if rate
        }
    eager_over_graph = {}
    if {"graph", "eager"} <= set(sides):
        keys = sorted({(s["clip"], s["rate"]) for s in samples})
        for rate in rates:
            ratios = [by["eager", c, q]["ttft_ms"] / by["graph", c, q]["ttft_ms"] for c, q in keys if q == rate]
            eager_over_graph[str(rate)] = geometric_interval(ratios)
        eager_over_graph["all"] = geometric_interval(
            [by["eager", c, q]["ttft_ms"] / by["graph", c, q]["ttft_ms"] for c, q in keys]
        )
    graph = [s for s in samples if s["side"] == "graph"]
    replayed = {"timed": len(graph), "replayed_a_prefill_graph": sum(s["prefill_replays"] > 0 for s in graph)}
    return {
        "rows": rows,
        "ttft_vs_q0": ttft_vs_q0,
        "eager_over_graph_ttft": eager_over_graph,
        "graph_replays": replayed,
    }


def interval(summary: dict) -> str:
    if summary["low"] is None:
        return f"{summary['geometric_mean']:.3f}x ({summary['pairs']} pairs)"
    return (
        f"{summary['geometric_mean']:.3f}x (95 % {summary['low']:.3f}-{summary['high']:.3f}, {summary['pairs']} pairs)"
    )


def report(result: dict) -> str:
    lines = [f"{result['setup']['what']} ({result['setup']['device']})",
             "side   q     tokens  TTFT ms  T_vit ms  T_lm(kept) ms  T_vit+T_lm  TTFT/that "
             " E+P ideal  TTFT/that"]  # fmt: skip
    for r in result["rows"]:
        lines.append(f"{r['side']:<6} {r['rate']:<5} {r['tokens']:>6.0f} {r['ttft_ms']:>8.1f} {r['vit_ms']:>9.1f} "
                     f"{r['lm_ms']:>14.1f} {r['ideal_vit_ms']:>11.1f} {r['ttft_over_ideal_vit']:>10.3f} "
                     f"{r['ideal_e_ms']:>10.1f} {r['ttft_over_ideal_e']:>10.3f}")  # fmt: skip
    for side, by_rate in result["ttft_vs_q0"].items():
        for rate, summary in by_rate.items():
            lines.append(f"{side}: TTFT q={rate} / q=0 {interval(summary)}")
    for rate, summary in result["eager_over_graph_ttft"].items():
        lines.append(f"eager/graph TTFT at q={rate}: {interval(summary)}")
    if result.get("interrupted"):
        lines.append(f"stopped early (time limit): {result['setup']['clips']} clips measured in full")
    replays = result["graph_replays"]
    lines.append(f"graph server: {replays['replayed_a_prefill_graph']} of {replays['timed']} timed requests "
                 "replayed a prefill graph")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="default: the 8B-shaped config (--smoke: the tiny model)")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, one server for both sides")
    parser.add_argument("--clips", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=8.0)  # about 3.2k video tokens at 448 x 448
    parser.add_argument("--size", default="448x448", help="HxW of the clips")
    parser.add_argument("--fps", type=int, default=2)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.5, 0.75])
    parser.add_argument("--method", default="evs")
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/gpu_ttft"))
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    rates = sorted(set(args.rates) | {0.0})

    device = "CPU (smoke)"
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            sys.exit("bench_gpu_ttft needs a CUDA GPU (or --smoke for the CPU dry run)")
        device = torch.cuda.get_device_name()
    from sglang_evs.bench.make_video_dataset import make_video_dataset, parse_size, request_line
    from sglang_evs.bench.measure import timed_video_request
    from sglang_evs.testing import qwen3_vl_8b_shape, tiny_model
    from sglang_evs.testing.server import running_servers

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        model = args.model_path or str(tiny_model.build_tiny_qwen3_vl(work / "tiny-qwen3-vl"))
    else:
        model = args.model_path or str(qwen3_vl_8b_shape.build(work / "qwen3-vl-8b-shape"))
    seconds, size, fps = (2.0, (64, 64), 4) if args.smoke else (args.seconds, parse_size(args.size), args.fps)
    dataset = make_video_dataset(work / "clips", args.clips, 0.5, seconds=seconds, size=size, fps=fps, max_tokens=1)
    lines = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
    warm_line = request_line(dataset.parent / "warmup.mp4", 1)
    traces = {side: work / f"trace-{side}.jsonl" for side in ("graph", "eager")}
    for path in traces.values():
        path.unlink(missing_ok=True)

    sides = ("graph",) if args.smoke else ("graph", "eager")  # --smoke: one server stands for both
    started = time.monotonic()
    with running_servers(*(launch(model, work, side, traces[side], args.smoke) for side in sides), timeout=900) as up:
        urls = {side: server.base_url for side, server in zip(sides, up, strict=True)}
        if args.smoke:
            urls["eager"], traces["eager"] = urls["graph"], traces["graph"]
        for url in set(urls.values()):  # the first request of each rate and shape is not measured
            for rate in rates:
                timed_video_request(url, warm_line, rate, args.method)
        samples, interrupted = [], False
        try:
            for i, (clip, rate, order) in enumerate(schedule(len(lines), rates)):
                for side in order:
                    sample = measure(
                        urls[side], lines[clip], rate, args.method, traces[side], seed=2 * i + (side == "eager")
                    )
                    samples.append({"clip": clip, "side": side, **sample})
        except KeyboardInterrupt:  # a time limit (SIGINT): report the clips measured in full, stop the servers
            interrupted = True
    samples = complete_clips(samples, rates)
    if not samples:
        sys.exit("bench_gpu_ttft: no clip was measured at every rate on both servers")
    result = summarize(samples, rates)
    result["interrupted"] = interrupted
    what = "smoke: tiny Qwen3-VL, one CPU server on both sides" if args.smoke else "Qwen3-VL-8B-shaped, bfloat16"
    if args.smoke:
        what += " (T_vit 0: the other side's request left the features in the server's vision cache)"
    result["setup"] = {"what": what, "device": device, "model": model, "method": args.method, "rates": rates,
                       "clips": len({s["clip"] for s in samples}), "seconds": seconds, "size": list(size), "fps": fps,
                       "server_args": {"graph": SMOKE_ARGS if args.smoke else gpu_server_args(True),
                                       "eager": SMOKE_ARGS if args.smoke else gpu_server_args(False)},
                       "wall_s": time.monotonic() - started, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    result["samples"] = samples
    print(report(result))
    if args.output:
        args.output.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
