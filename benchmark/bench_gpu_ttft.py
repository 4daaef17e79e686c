"""GPU: what a user compares. Upstream SGLang (no plugin), the plugin at q = 0 and the plugin pruning (server default
q = .75, q = .5 per request) served side by side on a Qwen3-VL-8B-shaped model: each request's TTFT beside what it
cost, and throughput under load.

    SGLANG_EVS_GPU_ROUTE=1 python benchmark/bench_gpu_ttft.py --part 1 --budget-s 450 --output part1.jsonl
    SGLANG_EVS_GPU_ROUTE=1 python benchmark/bench_gpu_ttft.py --part 2 --budget-s 450 --output part2.jsonl
        [--seconds 8 48 120] [--clips 4] [--concurrency 1 8 32] [--min-prompts 16] [--load-seconds 8]
        [--server-rate 0.75] [--rates 0.5 0.75] [--method evs] [--size 448x448] [--fps 2] [--model-path M]
    SGLANG_EVS_GPU_ROUTE=1 python benchmark/bench_gpu_ttft.py --compact --budget-s 80 --output compact.jsonl
        (both parts, small: 2 clips each of 8 and 48 s; concurrency 1 and 8 on 4 and 16 clips of 8 s)
    python benchmark/bench_gpu_ttft.py --report part1.jsonl part2.jsonl    # the report again, from the samples
    python benchmark/bench_gpu_ttft.py --smoke [--model-path TINY]         # CPU, tiny model: every step, both parts

Three servers run at once on the GPU, each on the GPU route (`sglang_evs.runtime.gpu_route.SERVER_ARGS`) in bfloat16
with random weights (`--load-format dummy`) on the Qwen3-VL-8B-shaped config (`testing/qwen3_vl_8b_shape.py`):
`upstream` (`SGLANG_PLUGINS=none`: SGLang without the plugin), `plugin` (default q = 0) and `pruning` (default
`--server-rate`, set as a user sets it: `--json-model-override-args`, so the plugin turns its prefill graphs on).
All three run SGLang's profiled defaults for this model and card (chunk size, prefill graphs, no
`SGLANG_VLM_CACHE_SIZE_MB`, no `--mm-feature-transport`), in graph mode, and differ from them only where the
three must share the card or be measured: a KV pool of 65536 tokens each, decode graphs up to the largest
`--concurrency`, `--enable-metrics` (SGLang's per-request time stats). The two plugin servers are traced (each
encode timed to the end of its kernels: a device synchronize upstream does not pay).

Part 1 (`requests`): clips of each `--seconds` from `bench/make_video_dataset.py` (half static, half a moving
square); per clip, the clip lengths in turn and the variants in an order rotated per clip, each on a flushed cache:
  - a video chat request with one output token: TTFT (until its reply) and the prompt tokens;
  - the tokenizer's processing time: the plugin trace's `processed` event; upstream, which has no trace,
    SGLang's own time stats (received until handed to the scheduler, `bench.measure.sglang_processing_ms`);
  - the vision tower's encodes in that request, how many and their time `T_vit` (the trace's `video_encoded`
    events naming the request's videos); unknown (None) upstream: no plugin, no trace;
  - `T_lm(kept)`: a text-only request of the same prompt length (`bench/measure.prefill_ms`).
Part 2 (`load`): SGLang's bench_serving (`python -m sglang.benchmark.serving --dataset-name openai`, in this
process) on distinct `--load-seconds` clips at each `--concurrency`, for upstream, q = 0 and the pruning server's
default, in an order rotated per concurrency: req/s, TTFT p50 and p99, and how many times each video was encoded.

Every sample is appended to the JSONL `--output` as it is measured (and flushed), so a run cut short keeps what it
measured; the report is computed from that file alone (`--report`), from the clips and concurrencies measured on
every variant. `--budget-s`: no work starts that would end past this many seconds after the start (by the longest
of its kind so far); the servers' stop and the report take about a minute more. SIGINT stops it the same way.

`--compact`: both parts in one short run (scripts/gpu_run.sh's default `bench` step, one device call with the GPU
tests): `DEFAULTS["compact"]`, part 1 within half the budget left once the servers are up (what it leaves goes to
part 2), so that a tight budget still measures some of each. Its figures are few: a ratio over 2 clips has a wide
interval, and the 120 s clips are left to the full parts (and to `bench_gpu_memory.py`, 32 at once).

`--smoke`: the tiny Qwen3-VL in float32 on three CPU servers in graph mode (SGLang's graph runners replaying on CPU
stand-ins), 1 and 2 s clips of 64 x 64, concurrency 1 and 2, both parts: every step runs, the figures say nothing
(`test/bench/test_bench_gpu_ttft.py`).
"""

import argparse
import functools
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from sglang_evs.bench.samples import SampleLog, read_records

STEPS = {"1": ("requests",), "2": ("load",), "all": ("requests", "load")}
SERVERS = ("upstream", "plugin", "pruning")
UPSTREAM_ENV = {"SGLANG_PLUGINS": "none"}  # SGLang without the plugin, as the tests' upstream servers run
REPLAY_PHASE = "prefill"
KV_TOKENS = 65536  # each server's pool: a 120 s clip (~25k tokens), or 32 8 s clips at once (~54k)
LOAD_OUTPUT_TOKENS = 16  # a load request's reply: TTFT and req/s measure the prefill, not a long decode


class Defaults(NamedTuple):
    seconds: tuple[float, ...]
    size: str
    fps: int
    clips: int
    concurrency: tuple[int, ...]
    min_prompts: int
    load_seconds: float


DEFAULTS = {
    "gpu": Defaults((8, 48, 120), "448x448", 2, 4, (1, 8, 32), 16, 8),  # 8 s: ~1.7k video tokens at q = 0
    "compact": Defaults((8, 48), "448x448", 2, 2, (1, 8), 4, 8),  # one device call beside the GPU tests
    "smoke": Defaults((1, 2), "64x64", 4, 1, (1, 2), 2, 1),
}
REQUESTS_SHARE = 0.5  # of the budget left once the servers are up, for part 1 where part 2 runs after it


class Variant(NamedTuple):
    name: str  # as reported: "upstream", "q=0", "q=0.75", ...
    server: str  # the one of SERVERS that serves it
    rate: float
    fields: dict  # request fields: {} where the server's default applies


def variants(server_rate: float, rates: Iterable[float], method: str) -> list[Variant]:
    """Upstream, the plugin at q = 0, the pruning server at its default, then each other rate asked per request
    there."""
    from sglang_evs.testing.requests import per_request_rate

    out = [Variant("upstream", "upstream", 0.0, {}), Variant("q=0", "plugin", 0.0, {}),
           Variant(f"q={server_rate:g}", "pruning", server_rate, {})]  # fmt: skip
    others = sorted(set(rates) - {server_rate})
    return out + [Variant(f"q={q:g}", "pruning", q, per_request_rate(q, method)) for q in others]


def deployed(plan: list[Variant]) -> list[Variant]:
    """The variants at a server's default, as a user deploys them: the ones measured under load too."""
    return [v for v in plan if not v.fields]


def gpu_server_args(max_concurrency: int) -> list[str]:
    """A server on the GPU: the route, bfloat16, random weights, SGLang's time stats, a KV pool of its own size and
    decode graphs up to the load's concurrency; SGLang's defaults otherwise. The memory fraction is of what is free
    as the server starts: with the pool capped, three servers starting together each get theirs."""
    from sglang_evs.runtime.gpu_route import SERVER_ARGS

    return [*SERVER_ARGS, "--dtype", "bfloat16", "--load-format", "dummy", "--context-length", "32768",
            "--mem-fraction-static", "0.7", "--max-total-tokens", str(KV_TOKENS),
            "--cuda-graph-max-bs-decode", str(max_concurrency), "--enable-metrics"]  # fmt: skip


def smoke_server_args(max_concurrency: int) -> list[str]:
    """A CPU server of --smoke: float32, a chunk that holds a 2 s clip's prompt, one prefill graph bucket of it."""
    return ["--dtype", "float32", "--chunked-prefill-size", "256", "--cuda-graph-bs-prefill", "256",
            "--cuda-graph-max-bs-decode", str(max_concurrency), "--enable-metrics"]  # fmt: skip


def server_args(server: str, smoke: bool, max_concurrency: int, server_rate: float, method: str) -> list[str]:
    from sglang_evs.bench.launch import rate_args

    common = smoke_server_args(max_concurrency) if smoke else gpu_server_args(max_concurrency)
    return [*common, *(rate_args(server_rate, method) if server == "pruning" else [])]


def launch(server: str, model: str, work: Path, args: list[str], smoke: bool):
    """One of SERVERS (`testing.server.Launch`): the plugin's traced, upstream without the plugin."""
    from sglang_evs import trace
    from sglang_evs.testing.gpu import ROUTE_ON
    from sglang_evs.testing.server import Launch

    env = UPSTREAM_ENV if server == "upstream" else {trace.ENV: str(trace_path(work, server))}
    return Launch(model, work / f"{server}.log", args, {**env, **({} if smoke else ROUTE_ON)}, cpu=smoke,
                  graph_mode=smoke)  # fmt: skip


def trace_path(work: Path, server: str) -> Path:
    return work / f"trace-{server}.jsonl"


class Server(NamedTuple):
    url: str
    trace: Path | None  # None: upstream, no plugin to trace


class OutOfBudget(Exception):
    """The next piece of work would end past the time budget: it is not started."""


class Run:
    """The JSONL the samples go to, each appended and flushed as it is measured, and the time budget: a piece of
    work starts only where it would end within it, taking as long as the longest of its kind so far (or of any
    kind, for the first of a kind)."""

    def __init__(self, output: Path, budget_s: float | None, clock: Callable[[], float] = time.monotonic,
                 total: int | None = None):  # fmt: skip
        """`total`: the samples the run plans (a progress bar over them; None: no bar)."""
        self.log, self.clock, self.started = SampleLog(output, total, desc="bench_gpu_ttft"), clock, clock()
        self.deadline = None if budget_s is None else self.started + budget_s
        self.longest: dict[str, float] = {}
        self.id = f"{time.strftime('%Y%m%dT%H%M%S')}-{id(self) % 10000}"

    def write(self, record: dict) -> None:
        self.log.write({"run": self.id, **record})

    def sample(self, kind: str, measure: Callable[[], dict], **fields) -> dict:
        expected = self.longest.get(kind, max(self.longest.values(), default=0.0))
        if self.deadline is not None and self.clock() + expected > self.deadline:
            raise OutOfBudget(kind)
        start = self.clock()
        record = {**fields, **measure()}
        took = self.clock() - start
        self.longest[kind] = max(took, self.longest.get(kind, 0.0))
        at_s = round(self.clock() - self.started, 1)
        self.log.sample({"run": self.id, **record, "took_s": round(took, 3), "at_s": at_s})
        return record

    def within(self, share: float, work: Callable[[], None]) -> str | None:
        """Run `work` with `share` of the budget left as its own (its samples start only where they end within
        it), then restore the run's: None, or the kind of the sample it stopped before (`OutOfBudget`)."""
        saved = self.deadline
        if saved is not None:
            self.deadline = self.clock() + share * (saved - self.clock())
        try:
            work()
        except OutOfBudget as stopped:
            return str(stopped)
        finally:
            self.deadline = saved
        return None


def rotated(items: Sequence, by: int) -> list:
    return list(items[by % len(items) :]) + list(items[: by % len(items)])


def request_costs(events: list[dict] | None, meta: dict) -> dict:
    """Processing, encodes and prefill replays of one request: from the plugin's trace, or (`events` None: upstream,
    no plugin, no trace) processing from SGLang's own time stats and the rest unknown."""
    from sglang_evs.bench.measure import request_encodes, sglang_processing_ms

    sglang_ms = sglang_processing_ms(meta)
    if events is None:
        return {"processing_ms": sglang_ms, "processing_from": "sglang", "sglang_processing_ms": sglang_ms,
                "encodes": None, "vit_ms": None, "prefill_replays": None}  # fmt: skip
    encodes, vit_ms = request_encodes(events)
    replays = sum(e["event"] == "graph_replay" and e["phase"] == REPLAY_PHASE for e in events)
    processing = sum(e["ms"] for e in events if e["event"] == "processed")
    return {"processing_ms": processing, "processing_from": "trace", "sglang_processing_ms": sglang_ms,
            "encodes": encodes, "vit_ms": vit_ms, "prefill_replays": replays}  # fmt: skip


def measure_request(server: Server, line: dict, fields: dict, seed: int) -> dict:
    """One video request on a flushed cache and what it cost, then T_lm(kept) = P(n) at its prompt length."""
    from sglang_evs.bench.measure import meta_reply, prefill_ms, trace_size, trace_window
    from sglang_evs.testing.requests import flush_cache

    flush_cache(server.url)
    since = trace_size(server.trace) if server.trace else 0
    reply = meta_reply(server.url, line, fields)
    events = trace_window(server.trace, since) if server.trace else None
    lm_ms = prefill_ms(server.url, reply.prompt_tokens, reps=1, seed=seed)
    server_ttft = reply.meta.get("first_token_latency")
    return {"ttft_ms": reply.ttft_ms, "server_ttft_ms": None if server_ttft is None else server_ttft * 1000,
            "tokens": reply.prompt_tokens, "lm_ms": lm_ms, **request_costs(events, reply.meta)}  # fmt: skip


def warm_request(server: Server, line: dict, fields: dict) -> dict:
    from sglang_evs.bench.measure import meta_reply

    return {"ttft_ms": meta_reply(server.url, line, fields).ttft_ms}


def run_requests(run: Run, servers: dict[str, Server], datasets: dict[float, Path], plan: list[Variant]) -> None:
    """Part 1: a warm-up request per clip length and variant (the first of each shape and rate is not measured),
    then per clip every length and every variant, the variants' order rotated per clip and length."""
    from sglang_evs.bench.make_video_dataset import WARMUP_CLIP, request_line

    for seconds, dataset in datasets.items():
        warm = request_line(dataset.parent / WARMUP_CLIP, 1)
        for v in plan:
            job = functools.partial(warm_request, servers[v.server], warm, v.fields)
            run.sample("warmup", job, step="warmup", seconds=seconds, variant=v.name)
    lines = {s: [json.loads(line) for line in d.read_text().splitlines() if line.strip()] for s, d in datasets.items()}
    for clip in range(max(map(len, lines.values()), default=0)):
        for i, seconds in enumerate(lines):
            for j, v in enumerate(rotated(plan, clip + i)):
                if clip < len(lines[seconds]):
                    job = functools.partial(measure_request, servers[v.server], lines[seconds][clip], v.fields,
                                             seed=1000 * clip + 10 * i + j)  # fmt: skip
                    run.sample(f"requests-{seconds:g}s", job, step="requests", seconds=seconds, clip=clip,
                               variant=v.name, server=v.server, rate=v.rate)  # fmt: skip


def load_run(server: Server, dataset: Path, concurrency: int, prompts: int, out_file: Path) -> dict:
    """bench_serving on `prompts` distinct clips at `concurrency`: its figures, each request's TTFT, and (traced)
    how many times each video was encoded and the tower's time."""
    from sglang_evs.bench.measure import encodes_per_video, run_bench_serving, trace_size, trace_window
    from sglang_evs.bench.ratios import summarize_bench

    since = trace_size(server.trace) if server.trace else 0
    dataset_args = ("--dataset-name", "openai", "--dataset-path", str(dataset))
    record = run_bench_serving(server.url, out_file, dataset_args, prompts, concurrency)
    sample = {**summarize_bench(record), "ttfts_ms": [t * 1000 for t in record["ttfts"]],
              "videos_encoded": None, "encodes": None, "vit_ms": None}  # fmt: skip
    if server.trace:
        events = trace_window(server.trace, since)
        per_video = encodes_per_video(events)
        vit_ms = sum(e["ms"] for e in events if e["event"] == "video_encoded")
        sample.update(videos_encoded=len(per_video), encodes=sum(per_video.values()), vit_ms=vit_ms)
    return sample


def make_clips(args: argparse.Namespace, steps: Sequence[str], work: Path) -> tuple[dict, dict]:
    """Part 1's clips, a dataset per length (`bench/make_video_dataset.py`), and part 2's, a dataset per
    concurrency: `--min-prompts` or twice the concurrency, clips of no other run, so that none is found in a cache
    a run before it filled (SGLang's vision cache where it has one: 100 MB on CPU)."""
    from sglang_evs.bench.make_video_dataset import make_video_dataset, parse_size

    shape = {"size": parse_size(args.size), "fps": args.fps, "static_share": 0.5}
    datasets = {
        seconds: make_video_dataset(
            work / f"clips-{seconds:g}s", args.clips, seconds=seconds, max_tokens=1, seed=1000 * i, **shape
        )  # fmt: skip
        for i, seconds in enumerate(args.seconds if "requests" in steps else [])
    }
    load_datasets = {}
    if "load" in steps:
        counts = [max(args.min_prompts, 2 * c) for c in args.concurrency]
        folder = work / f"load-clips-{args.load_seconds:g}s"
        every = make_video_dataset(folder, sum(counts), seconds=args.load_seconds, max_tokens=LOAD_OUTPUT_TOKENS,
                                   seed=7000, **shape).read_text().splitlines()  # fmt: skip
        for c, start, count in zip(args.concurrency, itertools.accumulate([0, *counts]), counts, strict=False):
            load_datasets[c] = folder / f"dataset-c{c}.jsonl"
            load_datasets[c].write_text("\n".join(every[start : start + count]) + "\n")
    return datasets, load_datasets


def run_load(run: Run, servers: dict[str, Server], datasets: dict[int, Path], plan: list[Variant], work: Path) -> None:
    """Part 2: a warm-up per server (video and image, in no measured request), then per concurrency each deployed
    variant on that concurrency's clips, the order rotated per concurrency."""
    for v in deployed(plan):
        dataset = next(iter(datasets.values()))
        run.sample("warmup", functools.partial(warm_up_server, servers[v.server], work, dataset), step="warmup",
                   variant=v.name)  # fmt: skip
    for i, (c, dataset) in enumerate(datasets.items()):
        prompts = len(dataset.read_text().splitlines())
        for v in rotated(deployed(plan), i):
            job = functools.partial(
                load_run, servers[v.server], dataset, c, prompts, work / f"load-{v.server}-c{c}.jsonl"
            )
            run.sample(f"load-c{c}", job, step="load", concurrency=c, prompts=prompts, variant=v.name,
                       server=v.server, rate=v.rate)  # fmt: skip


def warm_up_server(server: Server, work: Path, dataset: Path) -> dict:
    from sglang_evs.bench.measure import warm_up

    warm_up(server.url, work, dataset)
    return {}


def complete_groups(samples: list[dict], key: Sequence[str], expected: dict[str, list[str]]) -> dict[tuple, dict]:
    """`{(run, *key values): {variant: sample}}` of the groups measured on every variant their run `expected`."""
    groups: dict[tuple, dict[str, dict]] = {}
    for s in samples:
        groups.setdefault((s["run"], *(s[k] for k in key)), {})[s["variant"]] = s
    return {k: g for k, g in groups.items() if set(g) == set(expected.get(k[0], ()))}


def median(values: list) -> float | None:
    """The median; None where a value is unknown (upstream's encodes) or there is none."""
    return None if not values or any(v is None for v in values) else statistics.median(values)


def ratio(groups: list[dict[str, dict]], field: str, num: str, den: str) -> dict:
    """`field` of `num` over `den`, paired within each group: geometric mean and 95 % interval."""
    from sglang_evs.bench.ratios import geometric_interval

    return geometric_interval([g[num][field] / g[den][field] for g in groups])


LOAD_RATIOS = {"req/s": "request_throughput", "TTFT p50": "median_ttft_ms", "TTFT p99": "p99_ttft_ms"}


def summarize(records: list[dict]) -> dict:
    """The samples of one or more runs -> per clip length and variant the medians and TTFT over its parts, the TTFT
    ratios paired by clip, and per concurrency and variant the load figures and their ratios."""
    setups = [r for r in records if r["step"] == "setup"]
    order = list(dict.fromkeys(v for s in setups for v in s["variants"]))
    samples = {step: [r for r in records if r["step"] == step] for step in ("requests", "load")}
    requests = complete_groups(samples["requests"], ("seconds", "clip"), {s["run"]: s["variants"] for s in setups})
    load = complete_groups(samples["load"], ("concurrency",), {s["run"]: s["load_variants"] for s in setups})
    rows, ratios = [], {}
    for seconds in sorted({k[1] for k in requests}):
        groups = [g for k, g in requests.items() if k[1] == seconds]
        for name in [v for v in order if v in groups[0]]:
            at = [g[name] for g in groups]
            med = {k: median([s[k] for s in at]) for k in ("tokens", "ttft_ms", "processing_ms", "encodes", "vit_ms",
                                                          "lm_ms")}  # fmt: skip
            parts = None if med["vit_ms"] is None else med["processing_ms"] + med["vit_ms"] + med["lm_ms"]
            rows.append({"seconds": seconds, "variant": name, "clips": len(at), **med, "parts_ms": parts,
                         "ttft_over_parts": None if parts is None else med["ttft_ms"] / parts,
                         "processing_from": at[0]["processing_from"]})  # fmt: skip
        others = [v for v in order if v != "upstream"]
        pairs = [(v, "upstream") for v in others] + [(v, "q=0") for v in others if v != "q=0"]
        ratios[f"{seconds:g}"] = {f"{a}/{b}": ratio(groups, "ttft_ms", a, b) for a, b in pairs if a in groups[0]}
    load_rows, load_ratios = [], {}
    for c in sorted({k[1] for k in load}):
        groups = [g for k, g in load.items() if k[1] == c]
        for name in [v for v in order if v in groups[0]]:
            at = [g[name] for g in groups]
            encodes = median([s["encodes"] / s["videos_encoded"] if s["videos_encoded"] else None for s in at])
            load_rows.append({"concurrency": c, "variant": name, "runs": len(at), "prompts": at[0]["prompts"],
                              "req_per_s": median([s["request_throughput"] for s in at]),
                              "ttft_p50_ms": median([s["median_ttft_ms"] for s in at]),
                              "ttft_p99_ms": median([s["p99_ttft_ms"] for s in at]),
                              "tokens": median([s["mean_prompt_tokens"] for s in at]),
                              "encodes_per_video": encodes})  # fmt: skip
        load_ratios[str(c)] = {
            f"{label} {v}/upstream": ratio(groups, field, v, "upstream")
            for label, field in LOAD_RATIOS.items()
            for v in order
            if v != "upstream" and v in groups[0]
        }
    ends = [r for r in records if r["step"] == "end"]
    return {"setups": setups, "ends": ends, "requests": rows, "ttft_ratios": ratios, "load": load_rows,
            "load_ratios": load_ratios}  # fmt: skip


def cell(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def report(summary: dict) -> str:
    from sglang_evs.bench.report import interval_text

    lines = []
    for setup in summary["setups"]:
        end = next((e for e in summary["ends"] if e["run"] == setup["run"]), {"reason": "no end record (cut off)"})
        lines.append(f"{setup['what']} on {setup['device']}, part {setup['part']}, {setup['date']}: "
                     f"{end['reason']}")  # fmt: skip
    if summary["requests"]:
        lines += ["per request, medians over the clips measured on every variant; processing: the plugin's trace, "
                  "upstream SGLang's time stats; upstream's encodes unknown (no plugin, no trace)",
                  "clip  variant   clips  tokens  TTFT ms  proc ms  encodes  T_vit ms  T_lm(kept) ms  "
                  "proc+T_vit+T_lm  TTFT/that"]  # fmt: skip
        for r in summary["requests"]:
            lines.append(f"{r['seconds']:>3g}s  {r['variant']:<9} {r['clips']:>5} {cell(r['tokens'], '.0f'):>7} "
                         f"{cell(r['ttft_ms']):>8} {cell(r['processing_ms']):>8} {cell(r['encodes'], 'g'):>8} "
                         f"{cell(r['vit_ms']):>9} {cell(r['lm_ms']):>14} {cell(r['parts_ms']):>16} "
                         f"{cell(r['ttft_over_parts'], '.3f'):>10}")  # fmt: skip
        for seconds, by_pair in summary["ttft_ratios"].items():
            for pair, interval in by_pair.items():
                lines.append(f"{seconds}s clips: TTFT {pair} {interval_text(interval)}")
    if summary["load"]:
        seconds = sorted({s["load_seconds"] for s in summary["setups"] if "load" in s["steps"]})
        lines.append(f"under load (bench_serving; {'/'.join(f'{x:g}' for x in seconds)} s clips, one per request)")
        lines.append("concurrency  variant   prompts  tokens  req/s    TTFT p50 ms  TTFT p99 ms  encodes/video")
        for r in summary["load"]:
            lines.append(f"{r['concurrency']:>11}  {r['variant']:<9} {r['prompts']:>7} {cell(r['tokens'], '.0f'):>7} "
                         f"{r['req_per_s']:>6.3f} {r['ttft_p50_ms']:>12.1f} {r['ttft_p99_ms']:>12.1f} "
                         f"{cell(r['encodes_per_video'], '.2f'):>14}")  # fmt: skip
        for c, by_pair in summary["load_ratios"].items():
            for pair, interval in by_pair.items():
                lines.append(f"concurrency {c}: {pair} {interval_text(interval)}")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", type=Path, nargs="+", help="only report these JSONL files' samples")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="CPU, tiny model, both parts")
    mode.add_argument("--compact", action="store_true", help="GPU, both parts, few clips: one call with the tests")
    parser.add_argument("--part", choices=sorted(STEPS), default=None,
                        help="1: requests, 2: load (--smoke, --compact: all)")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=None, help="start no work that would end later than this")
    parser.add_argument("--model-path", default=None, help="default: the 8B-shaped config (--smoke: the tiny model)")
    parser.add_argument("--seconds", type=float, nargs="+", help="clip lengths of part 1 (default 8 48 120)")
    parser.add_argument("--clips", type=int, help="clips of each length (default 4)")
    parser.add_argument("--size", help="HxW of the clips (default 448x448)")
    parser.add_argument("--fps", type=int, help="default 2")
    parser.add_argument("--concurrency", type=int, nargs="+", help="part 2 (default 1 8 32)")
    parser.add_argument("--min-prompts", type=int, help="requests of a load run: this, or twice its concurrency")
    parser.add_argument("--load-seconds", type=float, help="clip length of part 2 (default 8)")
    parser.add_argument("--server-rate", type=float, default=0.75, help="the pruning server's default q")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 0.75], help="q > 0 on the pruning server")
    parser.add_argument("--method", default="evs")
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/gpu_ttft"))
    parser.add_argument("--output", type=Path, default=None, help="the samples' JSONL (default WORKDIR/samples.jsonl)")
    args = parser.parse_args(argv)
    if not 0 < args.server_rate < 1 or not all(0 < q < 1 for q in args.rates):
        parser.error("--server-rate and --rates are in (0, 1): q = 0 is the plugin server's")
    defaults = DEFAULTS["smoke" if args.smoke else "compact" if args.compact else "gpu"]
    for field, value in defaults._asdict().items():
        if getattr(args, field) is None:
            setattr(args, field, value)
    args.part = args.part or ("all" if args.smoke or args.compact else "1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.report:
        summary = summarize(read_records(args.report))
        print(report(summary))
        return summary
    run_started = time.monotonic()
    device = "CPU (smoke)"
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            sys.exit("bench_gpu_ttft needs a CUDA GPU (or --smoke for the CPU dry run)")
        device = torch.cuda.get_device_name()
    from sglang_evs import sglang_compat as sglang
    from sglang_evs.testing import qwen3_vl_8b_shape, tiny_model
    from sglang_evs.testing.server import running_servers

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    output = args.output or work / "samples.jsonl"
    budget = None if args.budget_s is None else args.budget_s - (time.monotonic() - run_started)
    steps, plan = STEPS[args.part], variants(args.server_rate, args.rates, args.method)
    planned = len(args.seconds) * (1 + args.clips) * len(plan) if "requests" in steps else 0
    planned += (1 + len(args.concurrency)) * len(deployed(plan)) if "load" in steps else 0
    run = Run(output, budget, total=planned)
    if args.smoke:
        model = args.model_path or str(tiny_model.build_tiny_qwen3_vl(work / "tiny-qwen3-vl"))
    else:
        model = args.model_path or str(qwen3_vl_8b_shape.build(work / "qwen3-vl-8b-shape"))
    max_concurrency = max(args.concurrency)
    args_of = {s: server_args(s, args.smoke, max_concurrency, args.server_rate, args.method) for s in SERVERS}
    what = "smoke: tiny Qwen3-VL, float32, CPU graph mode" if args.smoke else "Qwen3-VL-8B-shaped, bfloat16, dummy"
    what += " (compact)" if args.compact else ""
    run.write({"step": "setup", "what": what, "device": device, "part": args.part, "steps": list(steps),
               "model": model, "variants": [v.name for v in plan],
               "load_variants": [v.name for v in deployed(plan)], "method": args.method, "seconds": args.seconds,
               "clips": args.clips, "size": args.size, "fps": args.fps, "concurrency": args.concurrency,
               "min_prompts": args.min_prompts, "load_seconds": args.load_seconds, "server_args": args_of,
               "budget_s": args.budget_s, "date": time.strftime("%Y-%m-%d %H:%M")})  # fmt: skip
    for server in SERVERS:
        trace_path(work, server).unlink(missing_ok=True)
    reason, failure = "done", None
    launches = [launch(s, model, work, args_of[s], args.smoke) for s in SERVERS]
    with ThreadPoolExecutor(1) as pool:  # while the servers start: the clips, and bench_serving's imports (~7 s)
        clips = pool.submit(make_clips, args, steps, work)
        if "load" in steps:
            pool.submit(sglang.resolve, "bench_serving_cli")
        try:
            with running_servers(*launches, timeout=900) as up:
                servers = {s: Server(r.base_url, None if s == "upstream" else trace_path(work, s))
                           for s, r in zip(SERVERS, up, strict=True)}  # fmt: skip
                datasets, load_datasets = clips.result()
                parts = {"requests": lambda: run_requests(run, servers, datasets, plan),
                         "load": lambda: run_load(run, servers, load_datasets, plan, work)}  # fmt: skip
                stops = [run.within(REQUESTS_SHARE if step != steps[-1] else 1.0, parts[step]) for step in steps]
                stopped = [f"stopped by the budget ({args.budget_s:g} s) before a '{kind}' sample" for kind in stops
                           if kind is not None]  # fmt: skip
                reason = "; ".join(stopped) or "done"
        except KeyboardInterrupt:  # a time limit (SIGINT): the servers are stopped, the samples are kept
            reason = "interrupted (SIGINT)"
        except Exception as error:  # a refused request, a server that died: reported with what was measured
            failure, reason = error, f"failed: {type(error).__name__}: {str(error)[:300]}"
    run.write({"step": "end", "reason": reason, "wall_s": round(time.monotonic() - run_started, 1)})
    run.log.close()
    summary = summarize(read_records([output]))
    print(report(summary))
    print(f"samples: {output}")
    if failure is not None:
        raise failure
    return summary


if __name__ == "__main__":
    main()
