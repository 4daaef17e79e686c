"""sglang-router (cache-aware) in front of two EVS workers on the CPU route: throughput, the router's
own latency, and a worker killed with requests in flight.

    python benchmark/bench_router.py throughput [--cores own|shared] [--requests 64] [--rounds 8] [--pairs 100]
        [--output R.json]
    python benchmark/bench_router.py faults [--requests 32] [--output R.json]
    python benchmark/bench_router.py --report R.jsonl [--output R.json]    # the result again, from the samples

Workers are the bundled tiny Qwen3-VL (float32) with a default EVS rate of q = .5, started by the CPU
harness.

throughput compares like with like, as a GPU cluster does (one worker per GPU): with `--cores own` (the
default) each worker runs on a core group of its own (half the machine's cores, torch threads to
match), and the one-worker baseline is worker 0 on its own group, so 2.0 is the ideal ratio. With
`--cores shared` every worker may use every core: two workers then contend for the cores one worker
already keeps busy, and the ratio is bounded by them.

throughput: the request set of the router test (`sglang_evs.testing.workload`: text, image, and videos
at q = .25 and q = .75, as chat requests whose rate sits in `chat_template_kwargs`, the field
sglang-router 0.3.2 forwards), all at once, to one worker and to the router in front of two,
alternating which goes first, with the workers' radix caches flushed before each; req/s as SGLang's bench_serving
measures it (`python -m sglang.benchmark.serving`, the set as its `openai` dataset, all at once), and the per-round
ratio router / one worker with a 95 % interval over rounds. Then
`--pairs` sequential short text requests, each sent straight to a worker and through the router in
alternating order; the router's added latency is the median of the per-pair differences, with a
distribution-free 95 % interval.

faults: `--requests` requests with long outputs are sent through the router at once; when the workers
run or queue at least half of them (their own `/metrics` gauges), the busier worker's whole process
group gets SIGKILL. Every
accepted request must end, completed or with an HTTP error, within a per-request timeout (else it is
counted as hung). Then: the time until the router stops listing the killed worker, new requests through
the router, the killed worker restarted on its port, the time until the router lists it healthy again,
rounds of 8 prompts new to both caches until the restarted worker has served one (the router's circuit
breaker, opened by the killed worker's failed requests, keeps traffic from it until its timeout), and
then `--burst` prompts at once and how the two workers shared them.

The run's setup, then each sample as it is measured (throughput: a round, a latency pair; faults: each phase as it
ends, from the kill to the burst), go to a JSONL beside `--output` (`R.json` -> `R.jsonl`; without it
`WORKDIR/MODE/samples.jsonl`), so a run cut short keeps what it measured; the result is computed from that file
alone (`--report`): throughput's from the rounds measured on both targets.
"""

import argparse
import json
import os
import shlex
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import requests

from sglang_evs.bench.ratios import median_interval, round_ratio
from sglang_evs.bench.samples import SampleLog, read_records, samples_path
from sglang_evs.runtime.rank_binding import core_groups
from sglang_evs.testing.requests import metric_total, served_requests
from sglang_evs.testing.router import worker_args

REPO = Path(__file__).resolve().parents[1]
SERVER_RATE = 0.5
# The router checks health every 60 s and drops a worker after 3 failures by default; the fault run
# checks every 2 s so that dropping and rejoining happen within the run (retries are the defaults).
HEALTH_ARGS = [
    "--health-check-interval-secs",
    "2",
    "--health-failure-threshold",
    "2",
    "--health-success-threshold",
    "1",
]
WORKER_ARGS = worker_args(SERVER_RATE)
TARGETS = ("one_worker", "router_two_workers")
FAULT_PHASES = ("kill", "unlisted", "rejoined", "serves", "burst")  # the faults run's samples, one each


def outcome(result: object, hang_after_s: float) -> str:
    """'completed', 'error' (an HTTP error or a refused connection, reported to the client) or 'hung'."""
    if isinstance(result, requests.Timeout) or (isinstance(result, float) and result >= hang_after_s):
        return "hung"
    return "error" if isinstance(result, Exception) else "completed"


def count_outcomes(results: list, hang_after_s: float) -> dict[str, int]:
    counts = {"completed": 0, "error": 0, "hung": 0}
    for result in results:
        counts[outcome(result, hang_after_s)] += 1
    return counts


def error_kinds(results: list) -> dict[str, int]:
    """How many requests failed with each first line of error (HTTP status and the body's start)."""
    kinds: dict[str, int] = {}
    for result in results:
        if isinstance(result, Exception):
            key = str(result).splitlines()[0][:160]
            kinds[key] = kinds.get(key, 0) + 1
    return kinds


def added_latency_ms(direct: list[float], routed: list[float]) -> dict:
    """Per pair (routed - direct) in ms: their median, the router's added latency per request, with a
    distribution-free 95 % interval (none below 8 pairs)."""
    return median_interval([(r - d) * 1000 for d, r in zip(direct, routed, strict=True)])


def worker_cores(layout: str, workers: int) -> list[list[int] | None]:
    """Each worker's cores: its own group of this process's cores ("own"), or all of them ("shared")."""
    if layout == "shared":
        return [None] * workers
    return core_groups(workers, sorted(os.sched_getaffinity(0)))


def model_dir() -> Path:
    sys.path.insert(0, str(REPO / "test"))
    from conftest import build_cached_model

    return build_cached_model("tiny")


def worker_loads(worker_urls: list[str]) -> list[float]:
    """Requests each worker is running or queueing (its own `/metrics` gauges: any router policy)."""
    loads = []
    for url in worker_urls:
        text = requests.get(f"{url}/metrics", timeout=10).text
        loads.append(metric_total(text, "sglang:num_running_reqs") + metric_total(text, "sglang:num_queue_reqs"))
    return loads


def send_text(base_url: str, text: str, max_new_tokens: int = 4) -> object:
    """A raw-text request (no chat template): its prefix is new to every worker's cache."""
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    try:
        reply = requests.post(f"{base_url}/generate", json=body, timeout=120)
        reply.raise_for_status()
        return reply.json()
    except requests.RequestException as exc:
        return exc


def write_chat_dataset(request_set: list, max_new_tokens: int, path: Path) -> Path:
    """The request set as bench_serving's `openai` dataset: one chat request per line (its rate in
    `chat_template_kwargs`, which the dataset passes on with every other field of the line)."""
    lines = []
    for request in request_set:
        body = request.chat_body(max_new_tokens)
        body.pop("model")
        lines.append(json.dumps(body))
    path.write_text("\n".join(lines) + "\n")
    return path


def round_throughput(base_url: str, dataset: Path, num_prompts: int, out_file: Path) -> float:
    """Requests per second of the dataset's first `num_prompts` requests sent at once, as SGLang's bench_serving
    measures it (`python -m sglang.benchmark.serving`, no concurrency cap; it fails where any request failed)."""
    from sglang_evs.bench.measure import run_bench_serving

    record = run_bench_serving(base_url, out_file, ("--dataset-name", "openai", "--dataset-path", str(dataset)),
                               num_prompts, max_concurrency=None, extra_args=("--request-rate", "inf"))  # fmt: skip
    return float(record["request_throughput"])


def one_text_latency(base_url: str) -> float:
    from sglang_evs.testing.requests import chat_prompt

    body = {"text": chat_prompt(text="Hi."), "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    start = time.perf_counter()
    requests.post(f"{base_url}/generate", json=body, timeout=120).raise_for_status()
    return time.perf_counter() - start


def throughput(args, folder: Path, log: SampleLog) -> None:
    from sglang_evs.testing import workload
    from sglang_evs.testing.requests import flush_cache
    from sglang_evs.testing.router import running_router
    from sglang_evs.testing.server import running_server

    request_set = workload.mixed_requests(workload.write_media(folder / "media"), args.requests)
    cores = worker_cores(args.cores, 2)
    log.write({"mode": "throughput", "cores": args.cores, "worker_cores": cores, "requests": args.requests,
               "request_kinds": sorted({r.kind for r in request_set}), "max_new_tokens": args.max_new_tokens,
               "policy": args.policy, "router_args": args.router_args,
               "cpu_cores": len(os.sched_getaffinity(0))})  # fmt: skip
    with ExitStack() as stack:
        workers = [
            stack.enter_context(running_server(model_dir(), folder / f"worker{i}.log", WORKER_ARGS, cores=cores[i]))
            for i in range(2)
        ]
        urls = [w.base_url for w in workers]
        router = stack.enter_context(running_router(urls, folder / "router.log", args.policy, args.router_args))
        dataset = write_chat_dataset(request_set, args.max_new_tokens, folder / "requests.jsonl")
        round_throughput(router.base_url, dataset, 8, folder / "warm-router.jsonl")  # warm both paths once
        round_throughput(workers[0].base_url, dataset, 8, folder / "warm-worker.jsonl")
        target_url = {"one_worker": workers[0].base_url, "router_two_workers": router.base_url}
        for round_index in range(args.rounds):
            for target in TARGETS[:: 1 if round_index % 2 == 0 else -1]:
                for worker in workers:
                    flush_cache(worker.base_url)
                served_before = [served_requests(w.base_url) for w in workers]
                out_file = folder / f"round{round_index}-{target}.jsonl"
                req_per_s = round_throughput(target_url[target], dataset, len(request_set), out_file)
                split = [served_requests(w.base_url) - b for w, b in zip(workers, served_before, strict=True)]
                log.sample({"round": round_index, "target": target, "req_per_s": req_per_s,
                            "requests_per_worker": split if target == "router_two_workers" else None})  # fmt: skip
        latency_url = {"direct_s": workers[0].base_url, "routed_s": router.base_url}
        for pair in range(args.pairs):
            order = list(latency_url)[:: 1 if pair % 2 == 0 else -1]
            log.sample({"pair": pair, **{key: one_text_latency(latency_url[key]) for key in order}})


def throughput_result(setup: dict, samples: list[dict]) -> dict:
    """Throughput's setup and samples -> req/s per target and their ratio per round, over the rounds measured on
    both, and the router's added latency (None before its first pair)."""
    rounds = [s for s in samples if "round" in s]
    both = set.intersection(*({s["round"] for s in rounds if s["target"] == t} for t in TARGETS))
    rounds = [s for s in rounds if s["round"] in both]
    req_per_s = {t: [s["req_per_s"] for s in rounds if s["target"] == t] for t in TARGETS}
    direct, routed = ([s[key] for s in samples if "pair" in s] for key in ("direct_s", "routed_s"))
    latency = None
    if direct:
        latency = {
            **added_latency_ms(direct, routed),
            "direct_median_ms": statistics.median(direct) * 1000,
            "routed_median_ms": statistics.median(routed) * 1000,
        }
    return {
        **setup,
        "req_per_s": req_per_s,
        "median_req_per_s": {t: statistics.median(req_per_s[t]) for t in TARGETS},
        "router_two_over_one": round_ratio(req_per_s["one_worker"], req_per_s["router_two_workers"]),
        "router_round_requests_per_worker": [
            s["requests_per_worker"] for s in rounds if s["target"] == "router_two_workers"
        ],
        "router_added_latency_ms": latency,
    }


def faults(args, folder: Path, log: SampleLog) -> None:
    from sglang_evs.testing import workload
    from sglang_evs.testing.router import healthy_workers, running_router
    from sglang_evs.testing.server import running_server, start_server, stop, wait_healthy

    files = workload.write_media(folder / "media")
    request_set = workload.mixed_requests(files, args.requests, video_rates=(None,))
    model = model_dir()
    breaker = [] if args.cb_timeout_s is None else ["--cb-timeout-duration-secs", str(args.cb_timeout_s)]
    router_args = [*HEALTH_ARGS, *breaker, *args.router_args]
    log.write({"mode": "faults", "requests": len(request_set), "max_new_tokens": args.max_new_tokens,
               "policy": args.policy, "router_args": router_args, "hang_after_s": args.hang_after_s})  # fmt: skip
    with ExitStack() as stack:
        workers = [stack.enter_context(running_server(model, folder / f"worker{i}.log", WORKER_ARGS)) for i in range(2)]
        router = stack.enter_context(
            running_router([w.base_url for w in workers], folder / "router.log", args.policy, router_args)
        )

        def send(request):
            try:
                return workload.send(router.base_url, request, args.max_new_tokens)
            except Exception as exc:  # noqa: BLE001 - counted per request
                return exc

        with ThreadPoolExecutor(max_workers=len(request_set)) as pool:
            futures = [pool.submit(send, request) for request in request_set]
            deadline = time.monotonic() + 60
            urls = [w.base_url for w in workers]
            loads = [0, 0]
            while time.monotonic() < deadline and sum(loads) < len(request_set) // 2:
                loads = worker_loads(urls)
                time.sleep(0.05)
            victim = max(range(2), key=lambda i: loads[i])
            os.killpg(workers[victim].process.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            in_flight = [f for f in futures if not f.done()]
            results = []
            for future in futures:
                try:
                    results.append(future.result(timeout=max(0.0, killed_at + args.hang_after_s - time.monotonic())))
                except TimeoutError:
                    results.append(requests.Timeout("no answer"))
            log.sample({"phase": "kill", "running_or_queued_per_worker_at_kill": loads, "killed_worker": victim,
                        "unfinished_at_kill": len(in_flight), "last_answer_after_kill_s": time.monotonic() - killed_at,
                        "accepted": count_outcomes(results, args.hang_after_s),
                        "errors": error_kinds(results)})  # fmt: skip
        workers[victim].process.wait()
        while workers[victim].base_url in healthy_workers(router.base_url) and time.monotonic() - killed_at < 120:
            time.sleep(0.2)
        unlisted_after_kill_s = time.monotonic() - killed_at
        after_kill = workload.send_concurrently(router.base_url, workload.mixed_requests(files, 16, (None,)), 8)
        log.sample({"phase": "unlisted", "router_unlists_killed_worker_after_s": unlisted_after_kill_s,
                    "router_lists_healthy_after_kill": len(healthy_workers(router.base_url)),
                    "new_requests_after_kill": count_outcomes(after_kill, args.hang_after_s),
                    "new_request_errors": error_kinds(after_kill)})  # fmt: skip
        # restart on the same port; the router's health checker takes it back
        port = int(workers[victim].base_url.rsplit(":", 1)[1])
        restarted = start_server(model, folder / f"worker{victim}-restarted.log", WORKER_ARGS, port=port)
        stack.callback(stop, restarted)
        restart_at = time.monotonic()
        wait_healthy(workers[victim].base_url, restarted, folder / f"worker{victim}-restarted.log")
        healthy_at = time.monotonic()
        while len(healthy_workers(router.base_url)) < 2 and time.monotonic() - healthy_at < 120:
            time.sleep(0.2)
        rejoined_at = time.monotonic()
        log.sample({"phase": "rejoined", "restart_to_worker_healthy_s": healthy_at - restart_at,
                    "worker_healthy_to_router_lists_it_s": rejoined_at - healthy_at})  # fmt: skip
        # The router's circuit breaker for the killed worker opened on its failed requests; until it lets
        # traffic through again (--cb-timeout-duration-secs, 60 s by default) the relisted worker gets none.
        # Rounds of 8 prompts new to both caches, every 2 s, until the restarted worker has served one.
        probes, rounds, restarted_served = [], 0, False
        while not restarted_served and time.monotonic() - rejoined_at < args.rejoin_limit_s:
            served_before = served_requests(workers[victim].base_url)
            texts = [f"{rounds} {i} {'novel ' * (i + 20)}" for i in range(8)]
            probes += workload.send_concurrently(router.base_url, texts, 4, sender=send_text)
            rounds += 1
            restarted_served = served_requests(workers[victim].base_url) > served_before
            if not restarted_served:
                time.sleep(2)
        first_served_at = time.monotonic()
        log.sample({"phase": "serves", "probe_rounds_after_rejoin": rounds,
                    "probe_requests_after_rejoin": count_outcomes(probes, args.hang_after_s),
                    "restarted_worker_served": restarted_served,
                    "router_lists_it_to_restarted_worker_serves_s": first_served_at - rejoined_at,
                    "kill_to_restarted_worker_serves_s": first_served_at - killed_at})  # fmt: skip
        served_before_burst = [served_requests(w.base_url) for w in workers]
        burst = [f"{i} {'burst ' * (i % 7 + 20)}" for i in range(args.burst)]
        burst_results = workload.send_concurrently(router.base_url, burst, args.max_new_tokens, sender=send_text)
        served = [served_requests(w.base_url) - b for w, b in zip(workers, served_before_burst, strict=True)]
        log.sample({"phase": "burst", "burst_after_it_serves": count_outcomes(burst_results, args.hang_after_s),
                    "burst_served_per_worker": served})  # fmt: skip


def result_of(records: list[dict]) -> dict:
    """A run's JSONL (its setup, then its samples) -> its result: throughput's summary, or the fault run's phases
    merged (those it reached)."""
    setup, *samples = records
    if setup["mode"] == "throughput":
        return throughput_result(setup, samples)
    return {key: value for record in records for key, value in record.items() if key != "phase"}


def finish(result: dict, output: Path | None) -> dict:
    """Prints the result and writes it to `output` (JSON), where given."""
    text = json.dumps(result, indent=2)
    print(text)
    if output:
        output.write_text(text + "\n")
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=("throughput", "faults"))
    parser.add_argument("--requests", type=int, default=None, help="64 (throughput) or 32 (faults)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="16 (throughput) or 128 (faults)")
    parser.add_argument("--cores", choices=("own", "shared"), default="own", help="throughput: worker core layout")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--hang-after-s", type=float, default=180.0)
    parser.add_argument("--burst", type=int, default=32, help="faults: concurrent requests once it serves again")
    parser.add_argument("--rejoin-limit-s", type=float, default=180.0, help="faults: how long to wait for that")
    parser.add_argument("--policy", default="cache_aware", help="the router's --policy")
    parser.add_argument("--router-args", type=shlex.split, default=[], help="more router flags, in one string")
    parser.add_argument("--cb-timeout-s", type=int, help="faults: the router's --cb-timeout-duration-secs (60)")
    parser.add_argument("--workdir", type=Path, default=REPO / ".cache" / "bench_router")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--report", type=Path, default=None, help="only the result of this JSONL's samples")
    args = parser.parse_args(argv)
    if args.report:
        return finish(result_of(read_records([args.report])), args.output)
    if args.mode is None:
        parser.error("a mode (throughput or faults), or --report")
    args.requests = args.requests or (64 if args.mode == "throughput" else 32)
    args.max_new_tokens = args.max_new_tokens or (16 if args.mode == "throughput" else 128)
    folder = args.workdir / args.mode
    folder.mkdir(parents=True, exist_ok=True)
    path = samples_path(args.output, folder)
    if args.mode == "throughput":
        with SampleLog(path, 2 * args.rounds + args.pairs, "rounds and pairs") as log:
            throughput(args, folder, log)
    else:
        with SampleLog(path, len(FAULT_PHASES), "phases", "phase") as log:
            faults(args, folder, log)
    result = finish(result_of(read_records([path])), args.output)
    print(f"samples: {path}")
    return result


if __name__ == "__main__":
    main()
