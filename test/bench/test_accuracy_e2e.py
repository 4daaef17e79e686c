"""MMMU and Video-MME command lines end to end on their fixtures, and the paired-ideal requests, against
one tiny-model server.

The random model's accuracy means nothing: only its range and the per-subject counts are checked.
"""

import json
import subprocess
import sys

import pytest

from sglang_evs.bench import mmmu_fixture

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """A server of this module only, stopped before the next module (one server at a time)."""
    from sglang_evs.testing.server import running_server

    log = tmp_path_factory.mktemp("accuracy-server") / "server.log"
    with running_server(tiny_model_dir, log, ["--dtype", "float32"]) as running:
        yield running


def run(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_mmmu_cli_on_fixture(server, tmp_path):
    mmmu_fixture.write_fixture(tmp_path / "data")
    out = tmp_path / "mmmu.json"
    run("sglang_evs.bench.mmmu", "--data-dir", str(tmp_path / "data"), "--base-url", server.base_url,
        "--max-tokens", "4", "--num-threads", "4", "--output", str(out))  # fmt: skip
    result = json.loads(out.read_text())
    assert 0.0 <= result["accuracy"] <= 1.0
    assert {s: r["num"] for s, r in result["per_subject"].items()} == mmmu_fixture.FIXTURE
    assert result["metrics"]["Overall"]["num"] == sum(mmmu_fixture.FIXTURE.values())
    assert len(result["replies"]) == sum(mmmu_fixture.FIXTURE.values()) and any(result["replies"].values())


def test_paired_mode_requests_set_the_rate_per_request(server, tmp_path):
    from sglang_evs.bench import measure
    from sglang_evs.bench.make_video_dataset import make_video_dataset

    line = json.loads(make_video_dataset(tmp_path, num=1, static_share=0.0, seconds=2).read_text())
    full, pruned = (measure.timed_video_request(server.base_url, line, q) for q in (0.0, 0.5))
    assert 0 < full.ttft_ms <= full.latency_ms and 0 < pruned.ttft_ms <= pruned.latency_ms
    # the server ran without a rate: the request's own rate pruned
    assert full.prompt_tokens > pruned.prompt_tokens > 0
    assert measure.prefill_ms(server.base_url, pruned.prompt_tokens, reps=1) > 0
