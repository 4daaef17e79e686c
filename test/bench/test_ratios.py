"""Interval arithmetic of the paired benchmarks (`sglang_evs.bench.ratios`)."""

import random

import pytest

from sglang_evs.bench.ratios import median_interval


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
