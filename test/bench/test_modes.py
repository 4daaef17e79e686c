"""Benchmark modes driven against fakes: what each one sends and how it derives its ratios."""

from contextlib import contextmanager
from types import SimpleNamespace

from sglang_evs.bench import modes, report


def fake_lengths_run(monkeypatch, tmp_path) -> tuple[dict, list]:
    """Per request: prompt tokens 100 + 100 * seconds * (1 - q); TTFT 50 ms per second of clip
    (the encoder) + 10 ms per prompt token; P(n) = 10 ms per token."""
    sent = []

    @contextmanager
    def fake_serving(model, log, server_args, env=None, timeout=600):
        yield SimpleNamespace(base_url="http://fake")

    def fake_video_bench(url, dataset, out_file, num, concurrency, body):
        seconds = float(dataset.parent.name.removeprefix("clips-").removesuffix("s"))
        rate = body["mm_processor_kwargs"]["video_pruning_rate"]
        sent.append((seconds, rate))
        tokens = 100 + 100 * seconds * (1 - rate)
        return {"mean_ttft_ms": 50 * seconds + 10 * tokens, "mean_prompt_tokens": tokens}

    monkeypatch.setattr(modes, "serving", fake_serving)
    monkeypatch.setattr(modes, "warm_up", lambda *a: None)
    monkeypatch.setattr(modes, "video_bench", fake_video_bench)
    monkeypatch.setattr(modes, "prefill_ms", lambda url, tokens, reps, seed: 10.0 * tokens)
    result = modes.lengths("m", tmp_path, seconds=[2, 4, 8], rates=[0.5, 0.75], num_prompts=1)
    return result, sent


def test_lengths_rotates_the_rates_and_derives_the_ideal(monkeypatch, tmp_path):
    result, sent = fake_lengths_run(monkeypatch, tmp_path)
    assert result["rates"] == [0.0, 0.5, 0.75]
    firsts = [rates for seconds, rates in sent[::3]]
    assert firsts == [0.0, 0.5, 0.75]  # q = 0 is not always the first request of a length
    assert sorted(sent) == [(s, q) for s in (2, 4, 8) for q in (0.0, 0.5, 0.75)]
    row = next(r for r in result["rows"] if r["seconds"] == 8 and r["rate"] == 0.75)
    assert row["video"]["mean_prompt_tokens"] == 300
    assert row["ideal_ttft_ms"] == 400 + 3000  # E(8 s) = 50 * 8, P(300) = 3000
    assert row["measured_over_ideal"] == 1.0
    assert row["ttft_vs_q0"] == 3400 / (400 + 9000)


def test_lengths_report_and_plot(monkeypatch, tmp_path):
    result, _ = fake_lengths_run(monkeypatch, tmp_path)
    result["beyond_context"] = {"0.0": {"status": 400, "error": "longer than the context"},
                                "0.75": {"status": 200, "prompt_tokens": 3300}}  # fmt: skip
    text = report.report(result)
    assert "beyond the context, q=0.0: HTTP 400 longer than the context" in text
    assert len([line for line in text.splitlines() if line.startswith(("2 ", "4 ", "8 "))]) == 9
    path = report.plot_lengths(result, tmp_path / "lengths.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_alternates_the_rates_over_fresh_servers(monkeypatch, tmp_path):
    """Fake throughput: 1.0 req/s at q = 0, 2.0 at q = .75, except round 1's q = .75 server at 2.2."""
    started = []

    @contextmanager
    def fake_serving(model, log, server_args, env=None, timeout=600):
        started.append(server_args[-1] if server_args else "none")
        yield SimpleNamespace(base_url="http://fake")

    def fake_video_bench(url, dataset, out_file, num, concurrency):
        fast = "q0.75" in out_file.name
        throughput = (2.2 if "round1" in out_file.name else 2.0) if fast else 1.0
        return {"request_throughput": throughput, "mean_ttft_ms": 1000 / throughput, "mean_prompt_tokens": 1}

    monkeypatch.setattr(modes, "serving", fake_serving)
    monkeypatch.setattr(modes, "warm_up", lambda *a: None)
    monkeypatch.setattr(modes, "video_bench", fake_video_bench)
    result = modes.load("m", tmp_path / "d.jsonl", tmp_path, [0.0, 0.75], 4, [], rounds=3)
    assert [run["rate"] for run in result["runs"]] == [0.0, 0.75, 0.75, 0.0, 0.0, 0.75]
    assert len(started) == 6  # a fresh server per rate and round
    assert result["throughput_ratio"]["per_round"] == [2.0, 2.2, 2.0]
    assert result["throughput_ratio"]["low"] < 2.0 < 2.2 < result["throughput_ratio"]["high"]
    assert result["rows"][1]["throughput_vs_first"] == (2.0 + 2.2 + 2.0) / 3
    assert "requests/s q=0.75 / q=0.0 per round: geometric mean" in report.report(result)


def test_overhead_alternates_plugin_and_upstream_and_reports_ttft_and_decode(monkeypatch, tmp_path):
    """Fake: the plugin's TTFT is 1 % above upstream's, its time per output token equal."""
    started = []

    @contextmanager
    def fake_serving(model, log, server_args, env=None, timeout=600):
        started.append("upstream" if env else "plugin")
        yield SimpleNamespace(base_url="http://fake", log=lambda: "")

    def fake_video_bench(url, dataset, out_file, num):
        plugin = "plugin" in out_file.name
        round_factor = 1.0 + 0.1 * int(out_file.stem[-1])  # each round's servers slower than the last
        return {"mean_ttft_ms": 100.0 * round_factor * (1.01 if plugin else 1.0), "mean_tpot_ms": 20.0 * round_factor}

    monkeypatch.setattr(modes, "serving", fake_serving)
    monkeypatch.setattr(modes, "warm_up", lambda *a: None)
    monkeypatch.setattr(modes, "video_bench", fake_video_bench)
    result = modes.overhead("m", tmp_path / "d.jsonl", tmp_path, rounds=3)
    assert started == ["plugin", "upstream", "upstream", "plugin", "plugin", "upstream"]
    ttft, tpot = result["plugin_over_upstream_ttft"], result["plugin_over_upstream_tpot"]
    assert [round(x, 6) for x in ttft["per_pair"]] == [1.01] * 3 and round(ttft["low"], 6) == 1.01
    assert [round(x, 6) for x in tpot["per_pair"]] == [1.0] * 3
    text = report.report(result)
    assert "TTFT plugin/upstream per round" in text and "time per output token plugin/upstream" in text
