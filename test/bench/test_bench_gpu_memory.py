"""The GPU memory step (benchmark/bench_gpu_memory.py), checked on CPU: its smoke run end to end (one server, three
clips at once, held between chunks at the plugin's default bound), what it reads from a server's log and trace,
and its GPU server's flags (SGLang's memory defaults)."""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_evs.pruning.holds import BOUND_ENV
from sglang_evs.testing.benchmarks import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmark" / "bench_gpu_memory.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_gpu_memory")


@pytest.mark.slow  # one CPU server, three short clips at once: about 15 s on 2 cores
def test_smoke_answers_every_clip_at_the_default_bound(bench, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(BOUND_ENV, "0")  # a bound of 0 holds nothing: the server must not see it
    out = tmp_path / "memory.json"
    result = bench.main(["--smoke", "--model-path", str(tiny_model_dir), "--workdir", str(tmp_path / "work"),
                         "--output", str(out)])  # fmt: skip
    assert os.environ[BOUND_ENV] == "0"  # restored here
    assert result["ok"] and result["reason"] == "done", bench.report(result)
    assert [r["status"] for r in result["requests"]] == [200] * 3 and not result["out_of_memory_lines"]
    assert result["videos_held"] >= 1 and result["peak_held_bytes"] > 0  # held between its 16-token chunks
    assert result["encodes"] >= 3 and result["held_reserved_gb"] > 0  # the default bound, reserved
    assert result["kv_tokens"] == 16384 and 0 < result["mem_fraction_static"] < 1  # the CPU harness's pool
    assert result["env"]["SGLANG_VLM_CACHE_SIZE_MB"] == "0" and BOUND_ENV not in result["env"]
    assert json.loads(out.read_text()) == result
    printed = capsys.readouterr().out
    assert "3/3 clips of 2 s answered" in printed and "held at peak" in printed and "KV pool 16384 tokens" in printed


GPU_LOG = """\
[2026-11-30 01:00:00] server_args={'model_path': 'm', 'mem_fraction_static': 0.8512, 'max_total_tokens': None}
[2026-11-30 01:00:20] sglang-evs: reserving 4.00 GB of the KV budget for encoded videos held between chunks (X)
[2026-11-30 01:00:21] KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 900000, K size: 61.80 GB, \
V size: 61.80 GB
[2026-11-30 01:00:30] Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 731234, KV size: \
100.42 GB, avail mem=9.10 GB
[2026-11-30 01:00:31] max_total_num_tokens=731234, chunked_prefill_size=8192, max_prefill_tokens=16384
[2026-11-30 01:02:00] RuntimeError: Prefill out of memory. Try to lower your batch size.
"""


def test_reads_the_kv_pool_the_reservation_and_out_of_memory_lines_from_the_log(bench):
    figures = bench.server_figures(GPU_LOG)
    assert figures["kv_tokens"] == 731234 and figures["kv_gb"] == 100.42  # the resized pool, not the VA bound
    assert figures["mem_fraction_static"] == 0.8512 and figures["held_reserved_gb"] == 4.0
    assert figures["out_of_memory_lines"] == [GPU_LOG.splitlines()[-1]]
    allocated = "KV Cache is allocated. dtype: torch.float32, #tokens: 16384, K size: 0.25 GB, V size: 0.25 GB"
    assert bench.server_figures(allocated) | {"out_of_memory_lines": []} == {
        "kv_tokens": 16384, "kv_gb": 0.5, "mem_fraction_static": None, "held_reserved_gb": None,
        "out_of_memory_lines": [],
    }  # fmt: skip


def test_peak_held_bytes_are_the_largest_any_hold_event_reports(bench):
    events = [{"event": "video_encoded"}, {"event": "video_held", "held_bytes": 100},
              {"event": "video_held", "held_bytes": 300},
              {"event": "video_released", "why": "evicted", "held_bytes": 50},
              {"event": "video_not_held", "why": "larger_than_bound", "held_bytes": 50},
              {"event": "video_released", "why": "consumed", "held_bytes": 0}, {"event": "video_encoded"}]  # fmt: skip
    assert bench.holds_summary(events) == {"peak_held_bytes": 300, "videos_held": 2, "evicted": 1, "encodes": 2,
                                           "not_held": {"larger_than_bound": 1}}  # fmt: skip
    assert bench.holds_summary([])["peak_held_bytes"] == 0


def test_passes_only_with_every_request_answered_and_no_out_of_memory_line(bench):
    answered = {"status": 200, "prompt_tokens": 10, "seconds": 1.0}
    result = {"clips": 2, "requests": [answered, answered], "out_of_memory_lines": []}
    assert bench.verdict(result)
    assert not bench.verdict({**result, "requests": [answered, {"status": 500, "error": "x", "seconds": 1.0}]})
    assert not bench.verdict({**result, "requests": [answered]})  # one never sent (cut off)
    assert not bench.verdict({**result, "out_of_memory_lines": ["CUDA out of memory"]})


@pytest.mark.parametrize("rate", [0.75, 0.0])
def test_gpu_server_keeps_sglangs_memory_defaults(bench, rate):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", *bench.gpu_server_args(rate, "evs", 32)])
    assert args.mem_fraction_static is None and args.max_total_tokens is None and args.chunked_prefill_size is None
    assert args.device == "cuda" and args.dtype == "bfloat16" and args.load_format == "dummy"
    assert args.cuda_graph_max_bs_decode == 32
    override = json.loads(args.json_model_override_args or "{}").get("video_pruning_rate")
    assert override == (rate or None)


def test_the_hold_bound_is_unset_only_while_servers_start(bench, monkeypatch):
    monkeypatch.setenv(BOUND_ENV, "12")
    with bench.default_hold_bound():
        assert BOUND_ENV not in os.environ
    assert os.environ[BOUND_ENV] == "12"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine would run the benchmark")
def test_without_a_gpu_or_smoke_it_says_so_and_starts_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode != 0 and "needs a CUDA GPU" in done.stderr
    assert not list(tmp_path.iterdir())
