"""The speculation-and-pruning benchmark's summary, on made-up samples (its measurement runs against live
servers in test/models/test_speculative_decoding.py)."""

import pytest

from sglang_evs.bench.samples import SampleLog, read_records
from sglang_evs.testing.benchmarks import load_benchmark


def sample(ttft: float, tpot: float, prompt: int, accept: float | None) -> dict:
    return {"ttft_ms": ttft, "tpot_ms": tpot, "tokens": 8, "prompt_tokens": prompt, "accept_length": accept}


def test_each_configuration_is_compared_with_neither_round_by_round():
    bench = load_benchmark("bench_speculative")
    samples = {
        "neither": [sample(100, 5, 896, None), sample(120, 6, 896, None), sample(110, 5, 896, None)],
        "pruning": [sample(80, 5, 296, None), sample(96, 6, 296, None), sample(88, 5, 296, None)],
        "MTP": [sample(100, 10, 896, 1.5), sample(120, 12, 896, 1.7), sample(110, 10, 896, 1.6)],
        "MTP + pruning": [sample(80, 10, 296, 1.4), sample(96, 12, 296, 1.5), sample(88, 10, 296, 1.3)],
    }
    summary = bench.summarize(samples)
    assert summary["pruning"]["ttft_vs_neither"]["geometric_mean"] == pytest.approx(0.8)
    assert summary["MTP"]["tpot_vs_neither"]["per_round"] == pytest.approx([2.0, 2.0, 2.0])
    assert summary["MTP + pruning"]["mean_accept_length"] == pytest.approx(1.4)
    assert summary["neither"]["mean_accept_length"] is None
    assert summary["pruning"]["median_ttft_ms"] == 88 and summary["pruning"]["prompt_tokens"] == 296


def test_each_request_is_a_sample_of_the_jsonl_and_the_result_is_the_samples_alone(tmp_path, monkeypatch):
    bench = load_benchmark("bench_speculative")
    sent = []

    def timed(url, body):
        sent.append(url)
        return sample(100.0 + len(sent), 5.0, 296 if body["rate"] else 896, 1.5 if url == "spec" else None)

    monkeypatch.setattr(bench, "timed", timed)
    monkeypatch.setattr(bench, "body", lambda clip, rate, tokens: {"rate": rate})
    path = tmp_path / "r.jsonl"
    with SampleLog(path, 4 * 2) as log:
        log.write({"model": "m", "rate": 0.75, "tokens": 8})
        samples = bench.measure({True: "spec", False: "plain"}, tmp_path / "clip.mp4", 0.75, 2, 8, log)
    setup, *records = read_records([path])
    assert len(sent) == 4 * 3 and len(records) == 4 * 2  # the warm-up round is not a sample
    assert [(r["round"], r["config"]) for r in records[:4]] == [(0, "neither"), (0, "pruning"), (0, "MTP"),
                                                                  (0, "MTP + pruning")]  # fmt: skip
    assert records[4]["config"] == "pruning"  # the order rotates
    assert bench.by_config(records) == samples
    assert bench.main(["--report", str(path)]) == bench.result_of([setup, *records])
    cut_short = bench.result_of([setup, *records[:6]])  # round 1 stopped after two of the four
    assert cut_short["rounds"] == 1 and cut_short["configs"]["MTP"]["prompt_tokens"] == 896
