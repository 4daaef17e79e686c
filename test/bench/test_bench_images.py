"""The image benchmark's requests and report, on made-up figures (its runs go against a live server in
`benchmark/bench_images.py`; image pruning itself is proven in test/models/test_image_pruning.py)."""

from pathlib import Path

from sglang_evs.testing.benchmarks import load_benchmark


def test_each_request_names_its_rate_and_method_where_sglang_router_and_the_chat_hook_read_them():
    bench = load_benchmark("bench_images")
    body = bench.image_body(Path("/data/a.png"), 0.75, "dart")
    assert body["chat_template_kwargs"] == {"image_pruning_rate": 0.75, "image_pruning_method": "dart"}
    assert body["messages"][0]["content"][0] == {"type": "image_url", "image_url": {"url": "file:///data/a.png"}}
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 1


def test_the_report_gives_each_rates_tokens_and_ttft_ratio_and_the_paired_ideal():
    bench = load_benchmark("bench_images")
    result = {
        "bench_serving": {
            "0.0": {"mean_prompt_tokens": 1040, "mean_ttft_ms": 4000, "ttft_vs_first": 1.0},
            "0.75": {"mean_prompt_tokens": 272, "mean_ttft_ms": 2100, "ttft_vs_first": 0.525},
        },
        "paired": {
            "rate": 0.75,
            "ttft_ratio": {"geometric_mean": 0.52, "low": 0.5, "high": 0.54, "pairs": 8},
            "encoder_ms": 1500,
            "ideal_ms": 2050,
            "measured_over_ideal": 1.024,
        },  # fmt: skip
    }
    lines = bench.report(result).splitlines()
    assert lines[2].split() == ["0.75", "272", "2100", "0.525"]
    assert "TTFT / q0 0.520 (0.500-0.540, 8 pairs)" in lines[3] and "measured / ideal 1.024" in lines[3]
