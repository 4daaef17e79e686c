"""The test clients' reading of a server's Prometheus text (`testing.requests`), through prometheus_client's parser."""

from sglang_evs.testing.requests import metric_total, pruning_metrics

EXPOSITION = """# HELP sglang:num_requests_total Number of requests.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="tiny",priority="0"} 3.0
sglang:num_requests_total{model_name="tiny",priority="1"} 2.0
# HELP sglang_evs_video_tokens_before_pruning_total Video tokens before pruning.
# TYPE sglang_evs_video_tokens_before_pruning_total counter
sglang_evs_video_tokens_before_pruning_total{method="evs",model_name="a, b"} 400.0
sglang_evs_video_tokens_before_pruning_total{method="vidcom2",model_name="a, b"} 200.0
sglang_evs_video_tokens_before_pruning_created{method="evs",model_name="a, b"} 1.7e+09
"""


def test_a_metric_is_summed_over_its_label_sets():
    assert metric_total(EXPOSITION, "sglang:num_requests_total") == 5.0
    assert metric_total(EXPOSITION, "sglang:absent_total") == 0.0


def test_the_plugins_counters_are_read_by_name_and_method_whatever_the_labels_hold(monkeypatch):
    """A label value with a comma and a space (a model name) and a `_created` sample beside the counter: split
    strings would have misread both."""

    class Reply:
        text = EXPOSITION

    monkeypatch.setattr("sglang_evs.testing.requests.requests.get", lambda url, timeout: Reply())
    assert pruning_metrics("http://a", "http://b") == {
        ("video_tokens_before_pruning", "evs"): 800.0,
        ("video_tokens_before_pruning", "vidcom2"): 400.0,
    }
