"""The router benchmark's bookkeeping: how a request ended, error summaries, the router's added latency, and its
result rebuilt from its samples."""

import inspect
import re

import pytest
import requests

from sglang_evs.bench.samples import SampleLog
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


def test_throughput_is_reported_from_its_samples_over_the_rounds_measured_on_both_targets(bench, tmp_path):
    setup = {"mode": "throughput", "cores": "own", "requests": 64}
    rounds = [{"round": 0, "target": "one_worker", "req_per_s": 10.0, "requests_per_worker": None},
              {"round": 0, "target": "router_two_workers", "req_per_s": 15.0, "requests_per_worker": [40, 24]},
              {"round": 1, "target": "router_two_workers", "req_per_s": 20.0, "requests_per_worker": [32, 32]},
              {"round": 1, "target": "one_worker", "req_per_s": 10.0, "requests_per_worker": None},
              {"round": 2, "target": "one_worker", "req_per_s": 99.0, "requests_per_worker": None}]  # fmt: skip
    pairs = [{"pair": 0, "direct_s": 0.010, "routed_s": 0.011}, {"pair": 1, "routed_s": 0.025, "direct_s": 0.020}]
    result = bench.result_of([setup, *rounds, *pairs])  # round 2 stopped before the router's turn
    assert result["req_per_s"] == {"one_worker": [10.0, 10.0], "router_two_workers": [15.0, 20.0]}
    assert result["router_two_over_one"]["per_round"] == [1.5, 2.0] and result["cores"] == "own"
    assert result["router_round_requests_per_worker"] == [[40, 24], [32, 32]]
    assert result["router_added_latency_ms"]["median"] == pytest.approx(3.0)
    assert bench.result_of([setup, *rounds])["router_added_latency_ms"] is None  # stopped before the pairs
    path = tmp_path / "r.jsonl"
    with SampleLog(path) as log:
        for record in [setup, *rounds, *pairs]:
            log.write(record)
    assert bench.main(["--report", str(path)]) == result


def test_a_fault_run_is_its_phases_merged_as_far_as_it_got(bench):
    setup = {"mode": "faults", "requests": 32}
    kill = {"phase": "kill", "killed_worker": 1, "accepted": {"completed": 20, "error": 12, "hung": 0}}
    unlisted = {"phase": "unlisted", "router_unlists_killed_worker_after_s": 4.1}
    assert bench.result_of([setup, kill, unlisted]) == {"mode": "faults", "requests": 32, "killed_worker": 1,
                                                         "accepted": kill["accepted"],
                                                         "router_unlists_killed_worker_after_s": 4.1}  # fmt: skip
    written = re.findall(r'"phase": "(\w+)"', inspect.getsource(bench.faults))
    assert tuple(written) == bench.FAULT_PHASES  # the progress bar's steps: the phases the run writes, in order
