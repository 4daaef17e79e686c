"""The in-process q = 0 overhead harness: its arithmetic, its weight sharing, and a short run on the tiny model.

The run (`benchmark/bench_overhead_inprocess.py`, a process of its own) must show that each variant
went through its own routine, that the two variants' logits were bit-identical on every pair, and a
report with every field; no time is asserted.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_evs.bench.inprocess import GOAL, check_routing, half_width, pair_ratios, share_tensors, summarize

SCRIPT = Path(__file__).resolve().parents[2] / "benchmark" / "bench_overhead_inprocess.py"
SCENARIOS = ["text", "image", "video", "video_chunk1", "video_chunk2", "decode"]


class FakeScenario:
    def __init__(self, name: str, mode: str, tokens: int) -> None:
        self.name, self.mode, self.tokens = name, mode, tokens


def test_ratios_are_ours_over_upstream_per_pair():
    assert pair_ratios({"ours": [2.0, 3.0], "upstream": [1.0, 4.0]}) == [2.0, 0.75]
    with pytest.raises(ValueError):
        pair_ratios({"ours": [1.0], "upstream": [1.0, 2.0]})


def test_summary_pools_every_pair_and_weighs_rounds_by_time():
    times = {
        "video": {"ours": [1.01, 1.03, 1.02], "upstream": [1.0, 1.0, 1.0]},
        "decode": {"ours": [0.010, 0.012, 0.011], "upstream": [0.010, 0.010, 0.010]},
    }
    report = summarize([FakeScenario("video", "extend", 500), FakeScenario("decode", "decode", 3)], times)
    assert report["pooled"]["pairs"] == 6 and report["rounds"] == 3
    expected = math.exp(sum(math.log(r) for t in times.values() for r in pair_ratios(t)) / 6)
    assert report["pooled"]["geometric_mean"] == pytest.approx(expected)
    assert report["scenarios"]["decode"]["ratio"]["geometric_mean"] == pytest.approx(1.1, rel=0.01)
    # the per-round totals are dominated by the long video forwards
    assert report["round_totals"]["geometric_mean"] == pytest.approx(1.02, rel=0.002)
    assert report["scenarios"]["video"]["median_ms"] == {"ours": pytest.approx(1020.0), "upstream": 1000.0}
    assert report["within_goal"] is (report["pooled"]["high"] <= GOAL)
    assert report["pooled_median"]["pairs"] == 6 and report["pooled_median"]["low"] is None  # too few pairs


def test_half_width_is_relative_to_the_geometric_mean():
    assert half_width({"geometric_mean": 2.0, "low": 1.98, "high": 2.02}) == pytest.approx(0.01)
    assert half_width({"geometric_mean": 1.0, "low": None, "high": None}) is None


def test_routing_must_show_each_routine_once_per_call_of_its_variant():
    check_routing({"upstream_routine": 6, "ours_routine": 6, "ours_post_process": 6}, 6)
    with pytest.raises(RuntimeError, match="routing"):  # ours called upstream's routine
        check_routing({"upstream_routine": 12, "ours_routine": 0, "ours_post_process": 0}, 6)
    with pytest.raises(RuntimeError, match="routing"):  # our routine ran without post_process
        check_routing({"upstream_routine": 6, "ours_routine": 6, "ours_post_process": 0}, 6)
    check_routing({"upstream_routine": 12, "ours_routine": 0, "ours_post_process": 0}, 6, control=True)


def layers(extra: bool = False) -> torch.nn.Module:
    model = torch.nn.Module()
    model.linear, model.norm = torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)
    if extra:
        model.extra = torch.nn.Linear(2, 2)
    return model.eval()


def test_shared_tensors_are_the_same_objects_and_extra_modules_keep_their_own():
    torch.manual_seed(0)
    src, dst = layers(), layers(extra=True)
    own = dst.extra.weight
    share_tensors(dst, src)
    assert dst.linear.weight is src.linear.weight and dst.norm.running_mean is src.norm.running_mean
    assert dst.extra.weight is own
    x = torch.randn(3, 4)
    assert torch.equal(dst.norm(dst.linear(x)), src.norm(src.linear(x)))


def test_sharing_refuses_a_model_missing_an_upstream_module():
    with pytest.raises(RuntimeError, match="lacks"):
        share_tensors(
            torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        )


@pytest.mark.slow  # loads a model runner in a process of its own (~10 s)
def test_short_run_on_the_tiny_model(tiny_model_dir, tmp_path):
    out = tmp_path / "report.json"
    cmd = [sys.executable, str(SCRIPT), "--model", str(tiny_model_dir), "--rounds", "2", "--warmup", "1",
           "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())

    assert report["variants"] == {
        "ours": "sglang_evs.models.qwen3_vl.Qwen3VLForConditionalGeneration",
        "upstream": "sglang.srt.models.qwen3_vl.Qwen3VLForConditionalGeneration",
    }
    assert report["processor"].startswith("sglang.srt.multimodal.processors.")
    # one warm-up pass: each routine once per scenario, our post_process with ours
    assert report["routing_in_warmup"] == dict.fromkeys(
        ("upstream_routine", "ours_routine", "ours_post_process"), len(SCENARIOS)
    )
    assert list(report["scenarios"]) == SCENARIOS
    for name, row in report["scenarios"].items():
        assert row["outputs_identical"] is True
        assert row["mode"] == ("decode" if name == "decode" else "extend")
        assert row["tokens"] > 0 and len(row["per_pair"]) == 2 and row["ratio"]["pairs"] == 2
        assert row["ratio"]["low"] <= row["ratio"]["geometric_mean"] <= row["ratio"]["high"]
    rows = report["scenarios"]
    assert rows["video_chunk1"]["tokens"] + rows["video_chunk2"]["tokens"] == rows["video"]["tokens"]
    assert rows["decode"]["tokens"] == 3  # a text, an image and a video request, one token each
    assert report["pooled"]["pairs"] == 2 * len(SCENARIOS) and report["rounds"] == 2
    assert report["pooled_half_width"] > 0 and isinstance(report["within_goal"], bool)
    assert "pooled (12 pairs)" in done.stdout
