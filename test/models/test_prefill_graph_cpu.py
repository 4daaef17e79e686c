"""Prefill graphs carry deepstack and pruned positions: proved on CPU through SGLang's own graph runner.

`prefill_graph_worker.py` (its docstring says how) has SGLang's `PrefillCudaGraphRunner` capture
our Qwen3-VL with the breakable backend, `CpuGraphSegment` standing in for the CUDA graph, and
sends live batches through `ModelRunner.forward`. Replays are compared with upstream SGLang's own
model and routine, eager, on the same batch and parameters; two broken copies of the plugin
(`post_process` without its buffer writes, deepstack rows left from an earlier forward) must fail
that comparison, so the comparison is shown able to catch what the buffers are for. GLM-4.1V (no deepstack,
its own processor) goes through the same runner: the plugin adds it to SGLang's breakable-graph list.
"""

import json
import os
from pathlib import Path

import pytest

from sglang_evs.testing import warm_start

WORKER = Path(__file__).with_name("prefill_graph_worker.py")
BROKEN = 1e-2  # a broken copy's logits must differ by far more than rounding (they differ by units)


def run_worker(model_dir) -> dict:
    proc = warm_start.run(str(WORKER), [str(model_dir)], dict(os.environ), timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("REPORT "))


@pytest.fixture(scope="module")
def report(tiny_model_dir) -> dict:
    return run_worker(tiny_model_dir)


def test_sglang_captures_the_model_with_its_breakable_backend(report):
    assert (report["runner"], report["backend"]) == ("PrefillCudaGraphRunner", "BreakableCudaGraphBackend")
    assert report["segments"] > len(report["buckets"])  # each graph breaks at attention
    assert report["graph_reads_deepstack_buffer"] and report["graph_reads_positions_buffer"]
    # A bucket above the prefill budget (512) is captured: the buffers cover it.
    assert report["capacity"] >= max(report["buckets"]) > 512


def test_mixed_media_batch_replays_bit_identical_to_upstream(report):
    mixed = report["mixed"]
    assert mixed["replayed"] and mixed["requests"] == 3
    assert mixed["tokens"] not in report["buckets"]  # padded to a bucket: padding rows replayed too
    assert mixed["deepstack_rows"] > 0
    assert mixed["replay_vs_upstream"] == 0.0


def test_text_replay_after_media_adds_no_stale_deepstack(report):
    after = report["text_after_media"]
    assert after["stale_rows_before"] > 0  # the media rows were in the buffer
    assert after["replayed"] and after["replay_vs_upstream"] == 0.0


def test_pruned_video_chunks_replay_as_they_run_eagerly(report):
    pruned = report["pruned"]
    assert pruned["cut_inside_region"] and pruned["tokens"] < pruned["unpruned_tokens"]
    for chunk in pruned["chunks"]:
        assert chunk["replayed"] and chunk["replay_vs_eager"] == 0.0


def test_broken_copies_of_the_plugin_fail_the_comparison(report):
    for broken in report["broken"].values():
        assert broken["replayed"] and broken["replay_vs_upstream"] > BROKEN


def test_a_read_back_inside_sglangs_capture_fails_it_naming_the_op(report):
    assert "_local_scalar_dense" in report["planted_read_back"]
    assert "operation not permitted when stream is capturing" in report["planted_read_back"]


def test_deepstack_buffer_never_moves(report):
    assert report["deepstack_ptr"]["constructed"] == report["deepstack_ptr"]["final"]


@pytest.fixture(scope="module")
def glm_report(tiny_glm4v_dir) -> dict:
    return run_worker(tiny_glm4v_dir)


@pytest.mark.slow
def test_glm4v_replays_as_upstream_and_pruned_chunks_as_eager(glm_report):
    """GLM-4.1V, which the plugin adds to SGLang's breakable-graph list: no deepstack, M-RoPE positions from
    its buffer; the mixed batch and a text batch replay bit-identical to upstream, the pruned video's
    chunks (6 groups, the cut inside its region) as they run eagerly."""
    assert glm_report["model"] == "Glm4vForConditionalGeneration" and "graph_reads_deepstack_buffer" not in glm_report
    assert glm_report["backend"] == "BreakableCudaGraphBackend" and glm_report["graph_reads_positions_buffer"]
    for batch in (glm_report["mixed"], glm_report["text_after_media"]):
        assert batch["replayed"] and batch["replay_vs_upstream"] == 0.0
    pruned = glm_report["pruned"]
    assert pruned["cut_inside_region"] and pruned["tokens"] < pruned["unpruned_tokens"]
    assert all(chunk["replayed"] and chunk["replay_vs_eager"] == 0.0 for chunk in pruned["chunks"])
    broken = glm_report["broken"]["without_buffer_writes"]
    assert broken["replayed"] and broken["replay_vs_upstream"] > BROKEN
