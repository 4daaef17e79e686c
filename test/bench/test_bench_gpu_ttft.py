"""The GPU TTFT benchmark, checked on CPU: its smoke run end to end, its arithmetic, its GPU servers' flags."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_evs.testing.benchmarks import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmark" / "bench_gpu_ttft.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_gpu_ttft")


@pytest.mark.slow  # a graph-mode CPU server: about 20 s
def test_smoke_runs_every_step_on_cpu(bench, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--smoke", "--clips", "1", "--model-path", str(tiny_model_dir), "--workdir", str(tmp_path), "--output",
            str(out)]  # fmt: skip
    result = bench.main(argv)
    rows = {(r["side"], r["rate"]): r for r in result["rows"]}
    assert set(rows) == {(side, q) for side in ("graph", "eager") for q in (0.0, 0.5, 0.75)}
    assert rows["graph", 0.75]["tokens"] < rows["graph", 0.0]["tokens"]  # pruned
    assert rows["graph", 0.0]["vit_ms"] > 0  # the tower's time came from the trace
    replays = result["graph_replays"]
    assert replays["timed"] == 3 and replays["replayed_a_prefill_graph"] == 3  # graph mode replays on CPU
    assert json.loads(out.read_text())["samples"] and "eager/graph TTFT" in capsys.readouterr().out


def sample(side, clip, rate, ttft, vit=10.0, lm=20.0, tokens=100):
    return {"side": side, "clip": clip, "rate": rate, "ttft_ms": ttft, "vit_ms": vit, "lm_ms": lm, "tokens": tokens,
            "prefill_replays": int(side == "graph")}  # fmt: skip


def test_summary_gives_both_ideals_and_side_by_side_ratios(bench):
    samples = []
    for side, scale in (("graph", 1.0), ("eager", 2.0)):  # eager twice as slow, text prefill alike
        samples += [sample(side, c, 0.0, 100.0 * scale, lm=60.0) for c in range(2)]
        samples += [sample(side, c, 0.75, 50.0 * scale, lm=20.0) for c in range(2)]
    result = bench.summarize(samples, [0.0, 0.75])
    graph = {r["rate"]: r for r in result["rows"] if r["side"] == "graph"}
    assert graph[0.75]["ideal_vit_ms"] == 30.0 and graph[0.75]["ttft_over_ideal_vit"] == pytest.approx(50 / 30)
    assert graph[0.75]["encoder_e_ms"] == 40.0 and graph[0.75]["ideal_e_ms"] == 60.0  # E = 100 - 60
    assert result["ttft_vs_q0"]["graph"]["0.75"]["geometric_mean"] == pytest.approx(0.5)
    assert result["eager_over_graph_ttft"]["all"]["geometric_mean"] == pytest.approx(2.0)
    assert result["graph_replays"] == {"timed": 4, "replayed_a_prefill_graph": 4}


def test_schedule_rotates_rates_and_alternates_the_servers(bench):
    plan = bench.schedule(3, [0.0, 0.5, 0.75])
    assert [rate for clip, rate, _ in plan if clip == 1] == [0.5, 0.75, 0.0]
    assert [order[0] for _, _, order in plan] == ["graph", "eager"] * 4 + ["graph"]
    assert sorted((c, q) for c, q, _ in plan) == [(c, q) for c in range(3) for q in (0.0, 0.5, 0.75)]


def test_gpu_servers_are_bfloat16_dummy_weights_graph_and_eager(bench):
    from sglang.srt.server_args import ServerArgs

    parsed = {}
    for graphs in (True, False):
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        parsed[graphs] = parser.parse_args(["--model-path", "m", *bench.gpu_server_args(graphs)])
    for args in parsed.values():
        assert args.device == "cuda" and args.dtype == "bfloat16" and args.load_format == "dummy"
        assert args.cuda_graph_bs_prefill == list(bench.BUCKETS) and args.chunked_prefill_size == bench.BUCKETS[-1]
    assert parsed[True].cuda_graph_backend_prefill == "breakable"  # named: the server's default prunes nothing
    assert parsed[False].cuda_graph_backend_prefill == "disabled"


def test_without_a_gpu_or_smoke_it_says_so_and_starts_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode != 0 and "needs a CUDA GPU" in done.stderr
    assert not list(tmp_path.iterdir())


def test_a_run_stopped_early_reports_only_clips_measured_in_full(bench):
    rates = [0.0, 0.75]
    samples = [sample(side, c, q, 10.0) for c in range(2) for q in rates for side in ("graph", "eager")]
    partial = samples[:-1]  # clip 1's last measurement never came
    assert {s["clip"] for s in bench.complete_clips(partial, rates)} == {0}
    assert bench.complete_clips(samples, rates) == samples
