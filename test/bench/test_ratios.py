"""Interval arithmetic of the paired benchmarks (`sglang_evs.bench.ratios`)."""

import math
import random
import statistics

import pytest

from sglang_evs.bench import ratios
from sglang_evs.bench.ratios import geometric_interval, median_interval


def test_median_interval_brackets_the_median_with_order_statistics():
    ratios = [1.0 + 0.001 * i for i in range(100)]
    random.Random(0).shuffle(ratios)
    summary = median_interval(ratios)
    assert summary["median"] == pytest.approx(1.0495) and summary["pairs"] == 100
    # ranks 40 and 60 of 100 (50 -+ 9.8, outward)
    assert summary["low"] == pytest.approx(1.039) and summary["high"] == pytest.approx(1.059)


def test_median_interval_ignores_how_far_off_an_outlier_is():
    ratios = [0.99, 1.0, 1.01] * 10
    base = median_interval(ratios)
    disturbed = median_interval([*ratios[:-2], 0.3, 3.0])
    assert disturbed == base


def test_median_interval_needs_eight_pairs():
    assert median_interval([1.0] * 7)["low"] is None
    assert median_interval([1.0] * 8)["low"] == 1.0


@pytest.mark.parametrize("pairs", [2, 8, 32, 100])
def test_the_geometric_interval_is_students_t_interval_of_the_log_ratios(pairs):
    """At every count of pairs, scipy's t quantile: 32 rounds (df 31) took the normal 1.96 before, about 4 % too
    narrow a half-width."""
    from scipy import stats

    rng = random.Random(pairs)
    ratios = [math.exp(rng.gauss(0.1, 0.2)) for _ in range(pairs)]
    logs = [math.log(r) for r in ratios]
    half = stats.t.ppf(0.975, pairs - 1) * statistics.stdev(logs) / math.sqrt(pairs)
    assert half > 0
    got = geometric_interval(ratios)
    assert got["pairs"] == pairs and got["geometric_mean"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert got["low"] == pytest.approx(math.exp(statistics.fmean(logs) - half), rel=1e-12)
    assert got["high"] == pytest.approx(math.exp(statistics.fmean(logs) + half), rel=1e-12)
    if pairs == 32:
        normal_half = 1.96 * statistics.stdev(logs) / math.sqrt(pairs)
        assert half / normal_half == pytest.approx(1.04, abs=0.005)


def test_equal_ratios_have_a_point_interval_and_one_pair_none():
    assert geometric_interval([1.25] * 4)["low"] == pytest.approx(1.25) == geometric_interval([1.25] * 4)["high"]
    assert geometric_interval([1.25])["low"] is None


@pytest.mark.parametrize("ttfts", [[100.0, 120.0], [80.0, 95.0, 130.0, 101.0, 99.0, 140.0, 88.0, 91.0] * 4])
def test_a_runs_ttft_interval_is_students_t_interval_of_its_mean(ttfts):
    """From what bench_serving reports (the mean, numpy's standard deviation, the count): scipy's t interval of the
    mean of the per-request TTFTs; the plots draw it as error bars."""
    import numpy as np
    from scipy import stats

    record = {"completed": len(ttfts), "mean_ttft_ms": float(np.mean(ttfts)), "std_ttft_ms": float(np.std(ttfts)),
              "median_ttft_ms": 0.0, "request_throughput": 1.0, "mean_tpot_ms": 1.0}  # fmt: skip
    low, high = stats.t.interval(0.95, len(ttfts) - 1, loc=np.mean(ttfts), scale=stats.sem(ttfts))
    assert ratios.summarize_bench(record)["ttft_half_width_ms"] == pytest.approx((high - low) / 2, rel=1e-9)
    assert math.isnan(ratios.mean_half_width(5.0, 1))
