"""The threshold benchmark's fixed rate and summary, on made-up counts and samples (its requests run against a
live server in `benchmark/bench_threshold.py`; the threshold itself is proven in test/models)."""

import pytest

from sglang_evs.testing.benchmarks import load_benchmark


def test_the_fixed_rate_keeps_the_thresholds_total():
    bench = load_benchmark("bench_threshold")
    tokens, per_group = {"static": 800, "moving": 800, "noise": 800}, {"static": 100, "moving": 100, "noise": 100}
    kept = {"static": 100, "moving": 260, "noise": 760}  # 1120 of 2400
    rate = bench.fixed_rate(kept, tokens, per_group)
    assert 3 * int(800 * (1 - rate)) == pytest.approx(1120, abs=3)
    group_0 = bench.fixed_rate({"static": 100, "moving": 100, "noise": 100}, tokens, per_group)
    assert int(800 * (1 - group_0)) == 100  # the smallest rate that keeps each clip's first group alone


def test_threshold_is_compared_with_the_same_count_per_clip_and_with_the_fixed_rate_over_the_clips():
    bench = load_benchmark("bench_threshold")

    def runs(*ttfts: float, prompt: int = 300) -> list[dict]:
        return [{"ttft_ms": ttft, "prompt_tokens": prompt} for ttft in ttfts]

    samples = {
        "threshold": {"static": runs(110, 120), "noise": runs(220, 240)},
        "same count": {"static": runs(100, 100), "noise": runs(200, 200)},
        "fixed rate": {"static": runs(150, 150), "noise": runs(150, 150)},
    }
    summary = bench.summarize(samples)
    assert summary["threshold_vs_same_count"]["static"]["per_round"] == pytest.approx([1.1, 1.2])
    assert summary["threshold_vs_fixed_rate"]["per_round"] == pytest.approx([330 / 300, 360 / 300])
    assert summary["median_ttft_ms"]["threshold"]["noise"] == 230
    assert summary["prompt_tokens"]["same count"]["static"] == 300
