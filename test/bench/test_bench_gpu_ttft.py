"""The GPU benchmark, checked on CPU: its smoke run end to end (both parts, three servers), its arithmetic, its
time budget and its GPU servers' flags."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_evs.testing.benchmarks import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmark" / "bench_gpu_ttft.py"
VARIANTS = ("upstream", "q=0", "q=0.75", "q=0.5")


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_gpu_ttft")


@pytest.mark.slow  # three graph-mode CPU servers and bench_serving: about 60 s on 2 cores
def test_smoke_runs_every_step_on_cpu(bench, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "samples.jsonl"
    result = bench.main(["--smoke", "--model-path", str(tiny_model_dir), "--workdir", str(tmp_path), "--output",
                         str(out)])  # fmt: skip
    records = bench.read_records([out])
    steps = [r["step"] for r in records]
    assert steps[0] == "setup" and steps[-1] == "end" and records[-1]["reason"] == "done"
    requests = {(r["seconds"], r["variant"]): r for r in records if r["step"] == "requests"}
    assert set(requests) == {(s, v) for s in (1.0, 2.0) for v in VARIANTS}
    load = {(r["concurrency"], r["variant"]): r for r in records if r["step"] == "load"}
    assert set(load) == {(c, v) for c in (1, 2) for v in VARIANTS[:3]}
    for (_, variant), r in requests.items():
        if variant == "upstream":  # no plugin, no trace: SGLang's time stats, encodes unknown
            assert r["processing_from"] == "sglang" and r["processing_ms"] > 0 and r["encodes"] is None
        else:
            assert r["processing_from"] == "trace" and r["encodes"] >= 1 and r["vit_ms"] > 0
    assert requests[2.0, "q=0.75"]["tokens"] < requests[2.0, "q=0"]["tokens"] == requests[2.0, "upstream"]["tokens"]
    assert requests[2.0, "q=0.75"]["prefill_replays"] >= 1  # the pruning server's prefill graphs, replayed on CPU
    assert load[2, "upstream"]["encodes"] is None and load[2, "q=0.75"]["encodes"] >= load[2, "q=0.75"]["prompts"]
    assert len(load[2, "q=0"]["ttfts_ms"]) == load[2, "q=0"]["prompts"] == 4
    printed = capsys.readouterr().out
    assert "TTFT q=0.75/upstream" in printed and "req/s q=0.75/upstream" in printed
    assert bench.main(["--report", str(out)]) == result  # the report is the samples' alone


def request(run, seconds, clip, variant, ttft, lm=20.0, vit=10.0, processing=5.0):
    traced = variant != "upstream"
    return {"run": run, "step": "requests", "seconds": seconds, "clip": clip, "variant": variant, "ttft_ms": ttft,
            "tokens": 100, "lm_ms": lm, "processing_ms": processing, "vit_ms": vit if traced else None,
            "encodes": 2 if traced else None, "processing_from": "trace" if traced else "sglang"}  # fmt: skip


def load_sample(run, concurrency, variant, req_per_s, p99):
    traced = variant != "upstream"
    return {"run": run, "step": "load", "concurrency": concurrency, "variant": variant, "prompts": 16,
            "request_throughput": req_per_s, "median_ttft_ms": p99 / 2, "p99_ttft_ms": p99, "mean_prompt_tokens": 100,
            "encodes": 16 if traced else None, "videos_encoded": 8 if traced else None}  # fmt: skip


SETUP = {"run": "a", "step": "setup", "variants": list(VARIANTS[:3]), "load_variants": list(VARIANTS[:3]),
         "what": "w", "device": "d", "part": "all", "steps": ["requests", "load"], "load_seconds": 8.0,
         "date": "today"}  # fmt: skip


def test_summary_pairs_ratios_by_clip_and_adds_up_each_requests_parts(bench):
    records = [SETUP]
    for clip in range(2):
        records += [request("a", 8.0, clip, "upstream", 100.0), request("a", 8.0, clip, "q=0", 110.0, lm=60.0),
                    request("a", 8.0, clip, "q=0.75", 50.0 * (1 + clip))]  # fmt: skip
    records += [load_sample("a", 1, v, r, p) for v, r, p in (("upstream", 2.0, 100.0), ("q=0", 2.0, 100.0),
                                                              ("q=0.75", 3.0, 50.0))]  # fmt: skip
    summary = bench.summarize(records)
    rows = {r["variant"]: r for r in summary["requests"]}
    assert rows["upstream"]["parts_ms"] is None and rows["upstream"]["encodes"] is None  # no trace upstream
    assert rows["q=0"]["parts_ms"] == 75.0 and rows["q=0"]["ttft_over_parts"] == pytest.approx(110 / 75)
    ratios = summary["ttft_ratios"]["8"]
    assert ratios["q=0/upstream"]["geometric_mean"] == pytest.approx(1.1)
    assert ratios["q=0.75/upstream"]["geometric_mean"] == pytest.approx((0.5 * 1.0) ** 0.5)  # per clip, paired
    assert ratios["q=0.75/q=0"]["pairs"] == 2
    load = summary["load_ratios"]["1"]
    assert load["req/s q=0.75/upstream"]["geometric_mean"] == pytest.approx(1.5)
    assert load["TTFT p99 q=0.75/upstream"]["geometric_mean"] == pytest.approx(0.5)
    assert {r["variant"]: r["encodes_per_video"] for r in summary["load"]} == {"upstream": None, "q=0": 2.0,
                                                                               "q=0.75": 2.0}  # fmt: skip
    assert "TTFT q=0.75/upstream" in bench.report(summary)


def test_only_clips_and_concurrencies_measured_on_every_variant_are_reported(bench):
    records = [SETUP, *(request("a", 8.0, 0, v, 10.0) for v in VARIANTS[:3]), request("a", 8.0, 1, "upstream", 9.0)]
    records += [load_sample("a", 1, "upstream", 1.0, 10.0)]  # the run stopped before its variants' turn
    summary = bench.summarize(records)
    assert {r["clips"] for r in summary["requests"]} == {1} and summary["load"] == []


def test_a_run_stopped_by_its_budget_keeps_the_samples_written_so_far(bench, tmp_path):
    now = [0.0]

    def measure():
        now[0] += 4.0  # each request takes 4 s of the 10 s budget
        return {"ttft_ms": 1.0}

    out = tmp_path / "samples.jsonl"
    run = bench.Run(out, budget_s=10.0, clock=lambda: now[0])
    run.write(SETUP)
    with pytest.raises(bench.OutOfBudget):
        for clip in range(5):
            run.sample("requests-8s", measure, step="requests", clip=clip)
    assert [r.get("clip") for r in bench.read_records([out])] == [None, 0, 1]  # the third would end at 12 s
    with out.open("a") as partial:
        partial.write('{"run": "a", "step": "req')  # a line the stop cut off
    assert len(bench.read_records([out])) == 3


def test_encodes_are_those_naming_the_requests_videos_and_are_counted_per_video(tmp_path):
    from sglang_evs.bench.measure import encodes_per_video, request_encodes, stage_times, trace_window

    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"event": "video_encoded", "items": [9], "ms": 99.0}\n')  # before the window
    since = trace.stat().st_size
    events = [{"event": "processed", "items": [1], "ms": 3.0}, {"event": "video_encoded", "items": [1], "ms": 5.0},
              {"event": "video_encoded", "items": [2, 1], "ms": 7.0},
              {"event": "video_encoded", "items": [2], "ms": 1.0}]  # fmt: skip
    with trace.open("a") as out:
        out.writelines(json.dumps(e) + "\n" for e in events)
    window = trace_window(trace, since)
    assert request_encodes(window) == (2, 12.0) and encodes_per_video(window) == {1: 2, 2: 2}
    unhashed = [{**window[0], "items": [None]}, *window[1:]]  # pixels as a CUDA IPC handle: hashed in the scheduler
    assert request_encodes(unhashed) == (3, 13.0)  # every encode of the window: one request at a time
    assert stage_times(trace, since)["encoder_ms"] == 13.0 and stage_times(trace, since)["processing_ms"] == 3.0


def test_three_servers_upstream_without_the_plugin_all_at_sglangs_profiled_defaults(bench, tmp_path):
    from sglang.srt.server_args import ServerArgs

    for server in bench.SERVERS:
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        args = parser.parse_args(["--model-path", "m", *bench.server_args(server, False, 32, 0.75, "evs")])
        assert args.device == "cuda" and args.dtype == "bfloat16" and args.load_format == "dummy"
        assert args.enable_metrics and args.max_total_tokens == bench.KV_TOKENS and args.cuda_graph_max_bs_decode == 32
        # the profiled defaults: SGLang's chunk, prefill graph backend and feature transport
        assert args.chunked_prefill_size is None and args.cuda_graph_backend_prefill is None
        assert args.mm_feature_transport is None
        pruning = json.loads(args.json_model_override_args).get("video_pruning_rate")
        assert pruning == (0.75 if server == "pruning" else None)
        env = bench.launch(server, "m", tmp_path, [], smoke=False).env
        assert "SGLANG_VLM_CACHE_SIZE_MB" not in env and env["SGLANG_EVS_GPU_ROUTE"] == "1"
        assert (env.get("SGLANG_PLUGINS") == "none") == (server == "upstream")
        assert ("SGLANG_EVS_TRACE" in env) == (server != "upstream")


def test_variants_ask_per_request_only_beside_the_servers_defaults(bench):
    plan = bench.variants(0.75, [0.5, 0.75], "evs")
    assert [(v.name, v.server) for v in plan] == [("upstream", "upstream"), ("q=0", "plugin"),
                                                  ("q=0.75", "pruning"), ("q=0.5", "pruning")]  # fmt: skip
    assert [bool(v.fields) for v in plan] == [False, False, False, True]
    assert plan[3].fields["mm_processor_kwargs"]["video_pruning_rate"] == 0.5
    assert bench.rotated(plan, 5)[0].name == "q=0"


def test_without_a_gpu_or_smoke_it_says_so_and_starts_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode != 0 and "needs a CUDA GPU" in done.stderr
    assert not list(tmp_path.iterdir())
