"""The router benchmark's bookkeeping: how a request ended, error summaries, the router's added latency."""

import pytest
import requests

from sglang_evs.testing.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_router")


def test_outcomes_tell_completed_errors_and_hangs_apart(bench):
    results = [
        {"text": "ok"},
        RuntimeError("/generate answered 503: no available workers"),
        requests.ConnectionError("refused"),
        requests.Timeout("no answer"),
    ]
    assert bench.count_outcomes(results, hang_after_s=180) == {"completed": 1, "error": 2, "hung": 1}


def test_error_kinds_count_first_lines(bench):
    results = [RuntimeError("/generate answered 503: a\nbody"), RuntimeError("/generate answered 503: a"), "fine"]
    assert bench.error_kinds(results) == {"/generate answered 503: a": 2}


def test_router_added_latency_is_the_median_pair_difference_with_an_interval(bench):
    direct = [0.010, 0.020, 0.030]
    routed = [0.011, 0.025, 0.032]
    few = bench.added_latency_ms(direct, routed)
    assert few["median"] == pytest.approx(2.0)
    assert few["low"] is None  # no interval from 3 pairs
    # 20 pairs: differences 0..19 ms in scrambled order; the sign-test interval spans ranks 5..15
    direct = [1.0] * 20
    routed = [1.0 + ((7 * i) % 20) / 1000 for i in range(20)]
    many = bench.added_latency_ms(direct, routed)
    assert many["median"] == pytest.approx(9.5)
    assert (many["low"], many["high"]) == (pytest.approx(4.0), pytest.approx(14.0))
    assert many["pairs"] == 20


def test_throughput_ratio_is_per_alternated_round(bench):
    ratio = bench.round_ratio([10.0, 20.0, 10.0], [5.0, 10.0, 20.0])  # ratios.round_ratio, as the benchmark uses it
    assert ratio["per_round"] == [0.5, 0.5, 2.0]
    assert ratio["geometric_mean"] == pytest.approx(0.5 ** (1 / 3))  # (0.5 * 0.5 * 2) ** (1/3)
    assert ratio["low"] < ratio["geometric_mean"] < ratio["high"]


def test_worker_loads_sum_running_and_queued_requests_over_label_sets(bench, monkeypatch):
    pages = {
        "http://a/metrics": 'sglang:num_running_reqs{dp="0"} 3.0\nsglang:num_running_reqs{dp="1"} 2.0\n'
        'sglang:num_queue_reqs{dp="0"} 4.0\nsglang:num_running_reqs_total{x="y"} 99.0\n',
        "http://b/metrics": "# nothing yet\n",
    }

    class Reply:
        def __init__(self, url):
            self.text = pages[url]

    monkeypatch.setattr(bench.requests, "get", lambda url, timeout: Reply(url))
    assert bench.worker_loads(["http://a", "http://b"]) == [9.0, 0.0]
