"""Sweep arithmetic on synthetic numbers, report/plot, and one short end-to-end sweep on the tiny model."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_evs.bench import measure, ratios, report
from sglang_evs.bench.launch import on_cpu, rate_args

REPO = Path(__file__).resolve().parents[2]


def video(ttft: float, tokens: float) -> dict:
    return {"mean_ttft_ms": ttft, "mean_prompt_tokens": tokens, "request_throughput": 1.0}


def synthetic_rows() -> list[dict]:
    return [
        {"rate": 0.0, "video": video(1000.0, 500.0), "prefill_ms": 600.0},
        {"rate": 0.5, "video": video(800.0, 280.0), "prefill_ms": 300.0},
    ]


def test_summarize_bench_uses_server_tokens_of_successful_requests():
    record = {"completed": 2, "mean_ttft_ms": 5.0, "median_ttft_ms": 4.0, "request_throughput": 3.0,
              "mean_tpot_ms": 7.0, "total_input_tokens": 10, "input_lens": [400, 410, 999],
              "errors": ["", "", "boom"]}  # fmt: skip
    summary = ratios.summarize_bench(record)
    assert summary["mean_prompt_tokens"] == 405 and summary["completed"] == 2 and summary["mean_ttft_ms"] == 5.0
    assert summary["mean_tpot_ms"] == 7.0


def test_ideal_and_ratios():
    rows = synthetic_rows()
    encoder = ratios.add_ratios(rows)
    assert encoder == 400.0  # E = TTFT(0) - P(n_0)
    q0, q5 = rows
    assert q0["ideal_ttft_ms"] == 1000.0 and q0["measured_over_ideal"] == 1.0
    assert q5["ideal_ttft_ms"] == 700.0  # E + P(n_0.5)
    assert q5["measured_over_ideal"] == pytest.approx(800 / 700)
    assert q5["ttft_vs_q0"] == pytest.approx(0.8) and q5["tokens_vs_q0"] == pytest.approx(0.56)


def test_reference_tokens_drop_only_the_video_part():
    assert ratios.reference_tokens(500, 20, 0.0) == 500
    assert ratios.reference_tokens(500, 20, 0.75) == pytest.approx(20 + 0.25 * 480)


def test_paired_ratio():
    ratio = ratios.paired_ratio([(110.0, 100.0), (90.0, 100.0), (130.0, 100.0)])
    assert ratio["per_pair"] == pytest.approx([1.1, 0.9, 1.3])
    assert ratio["mean"] == pytest.approx(1.1) and ratio["ratio_of_medians"] == pytest.approx(1.1)
    assert ratio["geometric_mean"] == pytest.approx((1.1 * 0.9 * 1.3) ** (1 / 3))
    # equal speeds, but whichever runs second is 10 % slower; the order alternates
    alternating = ratios.paired_ratio([(1.0, 1.1), (1.1, 1.0)])
    assert alternating["geometric_mean"] == pytest.approx(1.0) and alternating["mean"] > 1.004


def test_paired_ideal_takes_e_from_q0_pairs_and_medians():
    samples = {
        0.0: [{"media_ms": v, "prefill_ms": p, "tokens": 900} for v, p in ((7000, 5500), (6000, 5000), (9000, 5200))],
        0.75: [{"media_ms": v, "prefill_ms": p, "tokens": 300} for v, p in ((3000, 1900), (3300, 2000), (2900, 2100))],
    }
    result = ratios.paired_ideal(samples, 0.75)
    assert result["encoder_ms"] == 1500  # median of 1500, 1000, 3800: an outlier pair does not move it
    assert result["ideal_ms"] == 1500 + 2000
    assert result["measured_over_ideal"] == pytest.approx(3000 / 3500)
    assert result["ttft_vs_q0"] == pytest.approx(3000 / 7000)
    assert "measured/ideal 0.857" in report.report({"mode": "paired", **result})


def test_report_says_when_evs_is_not_active():
    rows = synthetic_rows()
    rows[1]["video"]["mean_prompt_tokens"] = 500.0
    result = {"mode": "sweep", "encoder_ms": ratios.add_ratios(rows), "rows": rows, "evs_active": False,
              "image_qmax_vs_q0": {"tokens": 1.0, "ttft": 1.0}}  # fmt: skip
    assert "EVS pruning is not active" in report.report(result)
    result["evs_active"] = True
    assert "not active" not in report.report(result)
    assert "0.800" in report.report(result)  # TTFT/q0 of q=0.5


def test_plot_writes_png(tmp_path):
    rows = synthetic_rows()
    ratios.add_ratios(rows)
    for row in rows:
        row["reference_tokens"] = 1.0
    rows[0]["image"] = video(10.0, 80.0)
    for row in rows:
        row["method"] = "evs" if row["rate"] else "none"
    vidcom2 = [{**row, "method": "vidcom2"} for row in rows[1:]]
    path = report.plot_sweep({"rows": rows + vidcom2, "methods": ["evs", "vidcom2"]}, tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_launch_helpers():
    assert on_cpu([]) and on_cpu(["--dtype", "float32", "--device", "cpu"])
    assert not on_cpu(["--device", "cuda"]) and not on_cpu(["--device=cuda"])
    assert rate_args(None) == []
    assert json.loads(rate_args(0.75)[1]) == {"video_pruning_method": "evs", "video_pruning_rate": 0.75}
    assert json.loads(rate_args(0.75, "vidcom2")[1]) == {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.75}


def test_method_comparison_report():
    result = {"mode": "methods", "rate": 0.75, "methods": ["evs", "vidcom2"],
              "tokens": {"evs": [200, 210], "vidcom2": [200, 210]},
              "latency_ratio": {"geometric_mean": 1.01, "low": 0.97, "high": 1.05, "pairs": 2}}  # fmt: skip
    text = report.report(result)
    assert "prompt tokens evs 205, vidcom2 205" in text and "1.010 (95 % interval 0.970-1.050, 2 pairs)" in text


@pytest.mark.slow
def test_end_to_end_sweep_two_rates(tiny_model_dir, tmp_path):
    start = time.monotonic()
    cmd = [sys.executable, str(REPO / "benchmark/evs_sweep.py"), "--model", str(tiny_model_dir), "--out",
           str(tmp_path), "--rates", "0", "0.5", "--num-prompts", "2", "--image-prompts", "1", "--prefill-reps", "1",
           "--seconds", "2", "--methods", "evs", "vidcom2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "results.json").read_text())
    q0, q5, vidcom2 = result["rows"]
    assert [(r["method"], r["rate"]) for r in result["rows"]] == [("none", 0.0), ("evs", 0.5), ("vidcom2", 0.5)]
    assert vidcom2["video"]["completed"] == 2 and "image" not in vidcom2
    assert vidcom2["video"]["mean_prompt_tokens"] < q0["video"]["mean_prompt_tokens"]
    for row in (q0, q5):
        assert row["video"]["completed"] == 2 and row["video"]["mean_prompt_tokens"] > 100
        assert row["image"]["completed"] == 1 and row["prefill_ms"] > 0
    assert q5["image"]["mean_prompt_tokens"] == q0["image"]["mean_prompt_tokens"]  # images are never pruned
    assert q5["video"]["mean_prompt_tokens"] < q0["video"]["mean_prompt_tokens"]  # EVS pruned
    assert result["evs_active"] is True
    assert q0["measured_over_ideal"] == pytest.approx(1.0)
    assert Path(result["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert "measured/ideal" in proc.stdout
    print(f"end-to-end sweep took {time.monotonic() - start:.0f} s")


def test_plugin_loaded_reads_the_announcement_line():
    log = "x\n[t] sglang-evs 0.1.0 plugin loaded (sglang 0.5.23, pid 1, in run_scheduler_process)\n"
    assert measure.plugin_loaded(log)
    assert not measure.plugin_loaded("Skipping plugin sglang_evs (not in SGLANG_PLUGINS)\nsglang-evs\nplugin loaded (")


def test_bench_serving_in_process_reports_a_usage_error_as_the_command_would():
    """An argument the command line refuses: its exit status and argparse's message come back, nothing is
    raised, and this process's argv is as it was."""
    argv = list(sys.argv)
    status, printed = measure.bench_serving(["--backend", "sglang-oai-chat", "--num-prompts", "many"])
    assert status == 2 and "--num-prompts: invalid int value: 'many'" in printed
    assert sys.argv == argv
