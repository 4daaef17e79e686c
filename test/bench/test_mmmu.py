"""MMMU fixture and local loader, checked through SGLang's own MMMUVLMEval sample preparation (no server)."""

import numpy as np
import pytest

from sglang_evs.bench import mmmu, mmmu_fixture


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mmmu")
    assert mmmu_fixture.write_fixture(out) == mmmu_fixture.FIXTURE
    return out


def test_read_subject_gives_hub_columns_and_images(fixture_dir):
    rows = mmmu.read_subject(fixture_dir, "Math")
    assert len(rows) == mmmu_fixture.FIXTURE["Math"]
    assert set(rows[0]) == set(mmmu.COLUMNS)
    assert rows[0]["image_1"].size == (64, 64) and rows[0]["image_2"] is None
    assert eval(rows[0]["options"]) == mmmu_fixture.COLORS  # a Python-literal list, as on the hub
    with pytest.raises(FileNotFoundError):
        mmmu.read_subject(fixture_dir, "Physics")


def test_sglang_mmmu_eval_prepares_every_fixture_question(fixture_dir):
    eval_module = mmmu.use_local_data(fixture_dir)
    samples = eval_module.MMMUVLMEval(num_examples=None, num_threads=1).samples
    counts = {s: sum(x["category"] == s for x in samples) for s in mmmu_fixture.FIXTURE}
    assert counts == mmmu_fixture.FIXTURE
    open_ones = [x for x in samples if x["question_type"] == "open"]
    assert len(open_ones) == 1 and open_ones[0]["all_choices"] is None
    mc = next(x for x in samples if x["question_type"] == "multiple-choice")
    assert mc["all_choices"] == ["A", "B", "C", "D"] and "A. red" in mc["final_input_prompt"]
    assert mc["image_data"].startswith("data:image/png;base64,")
    limited = eval_module.MMMUVLMEval(num_examples=3, num_threads=1).samples
    assert [x["id"] for x in limited] == sorted(x["id"] for x in samples)[:3]


def test_parquet_layout_reads_like_jsonl(fixture_dir, tmp_path):
    mmmu_fixture.write_fixture(tmp_path, fmt="parquet")
    assert (tmp_path / "README.md").read_text().count("config_name") == len(mmmu_fixture.FIXTURE)
    for subject in mmmu_fixture.FIXTURE:
        a, b = mmmu.read_subject(fixture_dir, subject), mmmu.read_subject(tmp_path, subject)
        assert [r["id"] for r in a] == [r["id"] for r in b] and [r["answer"] for r in a] == [r["answer"] for r in b]
        assert np.array_equal(np.asarray(a[0]["image_1"]), np.asarray(b[0]["image_1"]))


def test_the_runner_runs_sglangs_own_run_and_patches_no_sglang_class(fixture_dir, monkeypatch):
    """`run_mmmu` hands SGLang's `run_eval_once` an `MMMUVLMEval` and reads each question's reply from the eval's own
    conversations; SGLang's class is the same before and after (its former runner replaced `__call__`)."""
    from types import SimpleNamespace

    from sglang.test import run_eval, simple_eval_mmmu_vlm

    before = dict(vars(simple_eval_mmmu_vlm.MMMUVLMEval))
    ran = []

    def run_eval_once(args, base_url, evaluation):  # what SGLang's does, less the server: a reply per sample
        ran.append((args.eval_name, base_url, type(evaluation).__name__))
        convos = [[{"role": "assistant", "content": f"answer to {s['id']}"}] for s in evaluation.samples]
        result = SimpleNamespace(convos=convos, metrics={"Math": {"num": len(convos), "acc": 0.5}}, score=0.5)
        return result, 1.5, SimpleNamespace(_completion_tokens=[2, 4])

    monkeypatch.setattr(run_eval, "run_eval_once", run_eval_once)
    result = mmmu.run_mmmu(fixture_dir, "http://server", limit=3)
    assert ran == [("mmmu", "http://server/v1", "MMMUVLMEval")]  # the OpenAI API's root, as run_eval gives it
    assert len(result["replies"]) == 3 and all(reply == f"answer to {key}" for key, reply in result["replies"].items())
    assert result["accuracy"] == 0.5 and result["metrics"]["latency"] == 1.5
    assert result["metrics"]["output_throughput"] == 4.0  # 6 completion tokens in 1.5 s, as run_eval reports it
    assert dict(vars(simple_eval_mmmu_vlm.MMMUVLMEval)) == before
