"""The GPU prefill-graph benchmark, checked on CPU: its statistics, and a clear exit without a GPU."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_evs.bench.samples import SampleLog, read_records
from sglang_evs.testing.benchmarks import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmark" / "bench_prefill_graph.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_prefill_graph")


def test_interval_is_around_the_geometric_mean_and_narrows_with_pairs(bench):
    ratios = [1.2, 1.5, 1.3, 1.4, 1.35, 1.25]
    summary = bench.geometric_interval(ratios)
    assert math.isclose(summary["geometric_mean"], math.exp(sum(map(math.log, ratios)) / 6))
    assert summary["low"] < summary["geometric_mean"] < summary["high"]
    wider = bench.geometric_interval(ratios[:3])
    assert wider["high"] - wider["low"] > summary["high"] - summary["low"]
    assert bench.geometric_interval([2.0, 2.0, 2.0])["low"] == pytest.approx(2.0)


def test_requests_name_existing_media_and_one_output_token(bench, media_dir):
    bodies = bench.request_bodies(media_dir)
    for body in bodies.values():
        assert body["sampling_params"]["max_new_tokens"] == 1
        assert all(Path(p).exists() for key in ("image_data", "video_data") for p in body.get(key, []))
    assert bodies["image_video_q75"]["mm_processor_kwargs"] == {"video_pruning_rate": 0.75}


def test_without_a_gpu_it_says_so_and_starts_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode != 0 and "needs a CUDA GPU" in done.stderr
    assert not (tmp_path / "graph.log").exists()


def test_a_timed_request_that_replayed_no_graph_stops_the_run(bench, tmp_path, monkeypatch):
    trace_path = tmp_path / "trace.jsonl"
    trace_path.write_text('{"event": "graph_replay", "phase": "prefill", "pid": 1}\n')  # warm-up's replay
    monkeypatch.setattr(bench, "streamed_ttft_ms", lambda url, body: 5.0)
    with pytest.raises(RuntimeError, match="replayed no prefill graph"):
        bench.timed_on_graph("http://graph", {}, trace_path)

    def replaying(url, body):
        with open(trace_path, "a") as out:
            out.write('{"event": "graph_replay", "phase": "prefill", "pid": 1}\n')
        return 7.0

    monkeypatch.setattr(bench, "streamed_ttft_ms", replaying)
    assert bench.timed_on_graph("http://graph", {}, trace_path) == 7.0


def test_both_servers_prefill_every_timed_prompt_in_full(bench):
    for backend in ("breakable", "disabled"):
        assert "--disable-radix-cache" in bench.server_args(backend)


def test_both_servers_serve_bfloat16_on_the_gpu_route(bench):
    for backend in ("breakable", "disabled"):
        args = bench.server_args(backend)
        assert args[args.index("--attention-backend") + 1] == "triton" and args[args.index("--dtype") + 1] == "bfloat16"


def test_each_pair_is_a_sample_of_the_jsonl_and_the_result_is_the_samples_alone(bench, tmp_path, monkeypatch, capsys):
    times = iter(range(10, 100))
    sent = []

    def timed(side):
        def send(url, body, *trace):
            sent.append(side)
            return float(next(times)) * (1 if side == "graph" else 1.5)

        return send

    monkeypatch.setattr(bench, "timed_on_graph", timed("graph"))
    monkeypatch.setattr(bench, "streamed_ttft_ms", timed("eager"))
    path, out = tmp_path / "r.jsonl", tmp_path / "r.json"
    with SampleLog(path, 2 * 3) as log:
        log.write({"backend": "breakable", "model": "m"})
        bench.measure_pairs({"graph": "g", "eager": "e"}, {"image": {}, "image_video": {}}, 3, path, log)
    setup, *pairs = read_records([path])
    assert [(p["case"], p["pair"]) for p in pairs] == [(c, i) for c in ("image", "image_video") for i in range(3)]
    assert sent[:2] == ["eager", "eager"] and sent[2:4] == ["graph", "eager"] and sent[4:6] == ["eager", "graph"]
    result = bench.main(["--report", str(path), "--output", str(out)])  # no GPU asked: only the samples
    assert json.loads(out.read_text()) == result and list(result["cases"]) == ["image", "image_video"]
    case = result["cases"]["image"]
    assert case["pairs"][0] == {"graph": 12.0, "eager": 19.5} and len(case["pairs"]) == 3
    assert case["eager_over_graph_ttft"]["geometric_mean"] == pytest.approx(
        math.exp(sum(math.log(p["eager"] / p["graph"]) for p in case["pairs"]) / 3)
    )
    bench.finish(bench.result_of([setup, pairs[0]]), None)  # a run cut short after one pair: no interval
    assert "image: eager/graph TTFT geometric mean 1.625 (1 pair, no interval)" in capsys.readouterr().out
