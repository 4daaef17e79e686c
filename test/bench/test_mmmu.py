"""MMMU fixture and runner, checked through SGLang's own MMMUVLMEval sample preparation (no server): SGLang's
`load_dataset("MMMU/MMMU", ...)` reads the fixture through `datasets`' local-directory resolution, nothing of
SGLang replaced."""

import pytest

from sglang_evs.bench import mmmu, mmmu_fixture


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mmmu")
    assert mmmu_fixture.write_fixture(out) == mmmu_fixture.FIXTURE
    assert (out / "README.md").read_text().count("config_name") == len(mmmu_fixture.FIXTURE)
    return out


def test_sglang_mmmu_eval_prepares_every_fixture_question(fixture_dir):
    from sglang.test.simple_eval_mmmu_vlm import MMMUVLMEval

    with mmmu.local_mmmu(fixture_dir):
        samples = MMMUVLMEval(num_examples=None, num_threads=1).samples
        limited = MMMUVLMEval(num_examples=3, num_threads=1).samples
    counts = {s: sum(x["category"] == s for x in samples) for s in mmmu_fixture.FIXTURE}
    assert counts == mmmu_fixture.FIXTURE
    open_ones = [x for x in samples if x["question_type"] == "open"]
    assert len(open_ones) == 1 and open_ones[0]["all_choices"] is None
    mc = next(x for x in samples if x["question_type"] == "multiple-choice")
    assert mc["all_choices"] == ["A", "B", "C", "D"] and "A. red" in mc["final_input_prompt"]
    assert mc["image_data"].startswith("data:image/png;base64,")
    assert [x["id"] for x in limited] == sorted(x["id"] for x in samples)[:3]


def test_the_local_directory_is_only_there_within_and_must_be_the_hub_layout(fixture_dir, tmp_path):
    import os

    before = os.getcwd()
    with mmmu.local_mmmu(fixture_dir):
        assert (os.path.realpath("MMMU/MMMU")) == str(fixture_dir.resolve())
    assert os.getcwd() == before and not os.path.exists(os.path.join(before, "MMMU", "MMMU"))
    with pytest.raises(FileNotFoundError, match="hub layout"):
        with mmmu.local_mmmu(tmp_path):
            pass


def test_the_runner_runs_sglangs_own_run_and_patches_nothing_of_sglang(fixture_dir, monkeypatch):
    """`run_mmmu` hands SGLang's `run_eval_once` an `MMMUVLMEval` and reads each question's reply from the eval's own
    conversations; SGLang's eval module and class are the same before and after."""
    from types import SimpleNamespace

    from sglang.test import run_eval, simple_eval_mmmu_vlm

    module_before, class_before = dict(vars(simple_eval_mmmu_vlm)), dict(vars(simple_eval_mmmu_vlm.MMMUVLMEval))
    ran = []

    def run_eval_once(args, base_url, evaluation):  # what SGLang's does, less the server: a reply per sample
        ran.append((args.eval_name, base_url, type(evaluation).__name__))
        convos = [[{"role": "assistant", "content": f"answer to {s['id']}"}] for s in evaluation.samples]
        result = SimpleNamespace(convos=convos, metrics={"Math": {"num": len(convos), "acc": 0.5}}, score=0.5)
        return result, 1.5, None

    monkeypatch.setattr(run_eval, "run_eval_once", run_eval_once)
    result = mmmu.run_mmmu(fixture_dir, "http://server", limit=3)
    assert ran == [("mmmu", "http://server/v1", "MMMUVLMEval")]  # the OpenAI API's root, as run_eval gives it
    assert len(result["replies"]) == 3 and all(reply == f"answer to {key}" for key, reply in result["replies"].items())
    assert result["accuracy"] == 0.5 and result["metrics"]["latency"] == 1.5
    assert dict(vars(simple_eval_mmmu_vlm.MMMUVLMEval)) == class_before
    assert {name: value for name, value in vars(simple_eval_mmmu_vlm).items() if name in module_before} == module_before
