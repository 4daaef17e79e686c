"""Prefill CUDA graphs carry deepstack and pruned positions: proved on CPU with SGLang's own capture path.

`prefill_graph_worker.py` (its docstring says how) captures our Qwen3-VL language model
the way SGLang's prefill graph runner does, on a capture batch with no media, records it
with `CpuGraph`, and replays it for live batches whose `post_process` wrote deepstack rows
and positions. On the code before the fixed buffers, the replay dropped deepstack (it
equalled the zero-deepstack output exactly) and ignored the live positions.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)

WORKER = Path(__file__).with_name("prefill_graph_worker.py")
ROUNDING = 1e-5  # replays re-run the same float32 kernels: equal up to (in fact without) rounding


@pytest.fixture(scope="module")
def report(tiny_model_dir) -> dict:
    proc = subprocess.run([sys.executable, str(WORKER), str(tiny_model_dir)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("REPORT "))


def test_capture_reads_the_model_buffers(report):
    assert report["body"] == "Qwen3LLMModel"
    assert report["graph_reads_deepstack_buffer"] and report["graph_reads_positions_buffer"]


def test_sglang_deepstack_warmup_finds_no_argument_path(report):
    assert report["deepstack_argument_warmup_ran"] is False


def test_replay_adds_the_live_deepstack(report):
    deepstack = report["deepstack"]
    assert deepstack["replay_vs_eager"] <= ROUNDING
    assert deepstack["eager_vs_zero_deepstack"] > 1000 * ROUNDING  # deepstack matters in this model
    assert deepstack["replay_vs_zero_deepstack"] > 1000 * ROUNDING


def test_text_prefill_after_media_adds_zeros(report):
    after = report["text_after_image"]
    assert after["deepstack_rows_before"] == 24  # the image's rows were in the buffer
    assert after["replay_vs_fresh_text_reference"] <= ROUNDING


def test_replay_reads_the_live_batch_positions(report):
    positions = report["live_positions"]
    assert positions["replay_vs_eager"] <= ROUNDING
    assert positions["eager_vs_capture_positions"] > 1000 * ROUNDING


def test_replay_reads_pruned_positions_of_a_chunk_that_cuts_a_video(report):
    pruned = report["pruned_positions"]
    assert pruned["region_rows_in_chunk"] > 0
    assert pruned["buffer_equals_reference"]
    assert pruned["replay_vs_eager_reference"] <= ROUNDING
    assert pruned["reference_vs_unrewritten"] > 1000 * ROUNDING


def test_deepstack_buffer_never_moves(report):
    ptr = report["deepstack_ptr_constructed"]
    assert ptr and ptr == report["deepstack_ptr_after_forwards"] == report["deepstack_ptr_final"]
    # The worker asks for a graph bucket (768) above its prefill budget (512): the buffers cover it.
    assert report["graph_buckets"] and max(report["graph_buckets"]) > 512
    assert report["capacity"] >= max(report["graph_buckets"])
