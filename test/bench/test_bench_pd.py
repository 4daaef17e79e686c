"""The PD benchmark (`benchmark/bench_pd.py`): its smoke run end to end on the tiny model, its arithmetic, and
the trace hook it reads (`sglang_evs.transfer_trace`) on stand-ins for SGLang's Mooncake sender."""

import json
from types import SimpleNamespace

import pytest

from sglang_evs import trace
from sglang_evs.bench.samples import read_records
from sglang_evs.testing.benchmarks import load_benchmark
from sglang_evs.testing.server import mooncake_missing
from sglang_evs.transfer_trace import record_transfer

MOONCAKE_MISSING = mooncake_missing()


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_pd")


@pytest.mark.slow  # a PD pair and the router: about a minute on 2 cores
@pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))
def test_smoke_measures_both_rates_through_a_pair(bench, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--model-path", str(tiny_model_dir), "--rounds", "1", "--frames", "8", "--workdir", str(tmp_path),
            "--output", str(out)]  # fmt: skip
    result = bench.main(argv)
    q0, q = result["medians"]["0.0"], result["medians"]["0.75"]
    assert q["prompt_tokens"] < q0["prompt_tokens"] and q["kv_bytes"] < q0["kv_bytes"]
    assert result["kv_bytes_ratio_minus_kept_fraction"] < 1e-9  # one page a token, the whole prompt sent
    assert result["kv_pages_fill_the_prompt"] and result["page_bytes_match_config"]
    assert q0["metadata_bytes"] == q["metadata_bytes"] > 0 and q0["state_bytes"] == q0["other_bytes"] == 0
    assert result["failed_transfers"] == 0 and result["ttft_vs_q0"]["pairs"] == 1
    assert q0["encoder_ms"] > 0 and q0["language_model_ms"] > 0  # the prefill server's trace
    assert json.loads(out.read_text())["samples"] and "KV bytes q/0" in capsys.readouterr().out
    setup, *samples = read_records([out.with_suffix(".jsonl")])  # each request's sample, as it was measured
    assert setup["rate"] == 0.75 and [(s["round"], s["rate"]) for s in samples] == [(0, 0.0), (0, 0.75)]
    assert bench.main(["--report", str(out.with_suffix(".jsonl"))]) == result  # the result is the samples' alone


def sample(round_, rate, ttft, tokens, page_bytes=100):
    return {"round": round_, "rate": rate, "ttft_ms": ttft, "prompt_tokens": tokens, "kv_bytes": tokens * page_bytes,
            "processing_ms": 5.0, "encoder_ms": 20.0, "language_model_ms": tokens / 10,
            "kv_pages": tokens, "page_bytes": page_bytes, "state_bytes": 0, "metadata_bytes": 900, "other_bytes": 0,
            "failed_transfers": 0}  # fmt: skip


def test_summary_compares_each_round_at_both_rates(bench):
    samples = [sample(0, 0.0, 100.0, 1000), sample(0, 0.75, 50.0, 400), sample(1, 0.75, 80.0, 400),
               sample(1, 0.0, 200.0, 1000)]  # fmt: skip
    result = bench.summarize(samples, 0.75, token_bytes=100)
    assert result["kv_bytes_ratio_per_round"] == [0.4, 0.4] == result["kept_prompt_fraction_per_round"]
    assert result["kv_bytes_ratio_minus_kept_fraction"] == 0.0
    assert result["ttft_vs_q0"]["per_round"] == [0.5, 0.4]
    assert result["medians"]["0.75"]["kv_bytes"] == 40000 and result["medians"]["0.0"]["ttft_ms"] == 150.0
    assert result["kv_pages_fill_the_prompt"] and result["page_bytes_match_config"]
    assert not bench.summarize(samples, 0.75, token_bytes=50)["page_bytes_match_config"]
    assert not bench.summarize(samples, 0.75, page_size=16)["kv_pages_fill_the_prompt"]  # 1000 tokens: 63 pages
    with pytest.raises(ValueError, match="both rates"):
        bench.summarize(samples[:3], 0.75)


def test_a_run_cut_short_is_reported_from_the_rounds_measured_at_both_rates(bench):
    setup = {"model": "m", "frames": 8, "server_args": [], "rate": 0.75, "page_size": 1, "config_token_bytes": 100}
    records = [setup, sample(0, 0.0, 100.0, 1000), sample(0, 0.75, 50.0, 400), sample(1, 0.75, 80.0, 400)]
    result = bench.result_of(records)  # round 1 stopped before its q = 0 request
    assert result["rounds"] == 1 and result["samples"] == records[1:3] and result["page_bytes_match_config"]


def test_transferred_sums_bytes_by_kind_and_counts_pages(bench):
    events = [
        {"kind": "kv", "bytes": 3000, "page_bytes": 100, "status": 0},
        {"kind": "kv", "bytes": 1000, "page_bytes": 100, "status": 0},
        {"kind": "metadata", "bytes": 900, "page_bytes": None, "status": 0},
        {"kind": "state", "bytes": 64, "page_bytes": None, "status": -1},
    ]
    got = bench.transferred(events)
    assert (got["kv_bytes"], got["kv_pages"], got["page_bytes"]) == (4000, 40, 100)
    assert (got["metadata_bytes"], got["state_bytes"], got["other_bytes"], got["failed_transfers"]) == (900, 64, 0, 1)


def test_a_tokens_kv_bytes_come_from_the_full_attention_layers_of_the_config(bench, tmp_path):
    text = {"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 32, "hidden_size": 64,
            "num_attention_heads": 4}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({"text_config": text}))
    assert bench.config_page_bytes(tmp_path) == 2 * 4 * 2 * 32 * 4  # K and V, float32
    hybrid = {**text, "layer_types": ["linear_attention", "full_attention"] * 2, "head_dim": None}
    (tmp_path / "config.json").write_text(json.dumps(hybrid))  # no text_config: the top level
    assert bench.config_page_bytes(tmp_path, dtype_bytes=2) == 2 * 2 * 2 * 16 * 2


def send_kvcache(manager, blocks):  # named as SGLang's senders are: the hook finds the kind up the stack
    def process_layers():
        return record_transfer(lambda *args: 0, manager, "session", blocks)

    return process_layers()


def send_aux(manager, blocks):
    return record_transfer(lambda *args: 0, manager, "session", blocks)


def test_the_hook_records_each_batch_with_its_kind_and_bytes(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(trace.ENV, str(path))
    manager = SimpleNamespace(kv_args=SimpleNamespace(kv_item_lens=[64, 64, 64, 64]))
    assert send_kvcache(manager, [(0, 0, 256), (512, 1024, 768)]) == 0
    assert send_aux(manager, [(0, 0, 64), (0, 0, 512)]) == 0
    assert record_transfer(lambda *args: 0, manager, "session", []) == 0  # nothing moved, nothing recorded
    events = trace.read(path, "pd_transfer")
    assert [(e["kind"], e["bytes"], e["blocks"], e["page_bytes"]) for e in events] == [
        ("kv", 1024, 2, 256),
        ("metadata", 576, 2, None),
    ]
