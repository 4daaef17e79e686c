"""Video-MME fixture, prompt, letter parsing and scoring; the per-rate driver with a fake launcher."""

from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from sglang_evs.bench import launch, videomme, videomme_fixture


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("videomme")
    videomme_fixture.write_fixture(out)
    return out


def test_fixture_rows_follow_the_schema(fixture_dir):
    rows = videomme.load_rows(fixture_dir)
    assert len(rows) == len(videomme_fixture.VIDEOS) * len(videomme_fixture.QUESTIONS)
    for row in rows:
        assert row["video_path"].is_file() and row["video_path"].suffix == ".mp4"
        assert [o[:3] for o in row["options"]] == ["A. ", "B. ", "C. ", "D. "]
        assert row["answer"] in "ABCD" and row["question_id"].startswith(row["video_id"] + "-")


def test_missing_video_is_an_error(fixture_dir, tmp_path):
    (tmp_path / "videomme.jsonl").write_text((fixture_dir / "videomme.jsonl").read_text())
    with pytest.raises(FileNotFoundError):
        videomme.load_rows(tmp_path)


def test_prompt_is_the_official_template():
    row = {"question": "Q?", "options": ["A. x", "B. y", "C. z", "D. w"]}
    prompt = videomme.build_prompt(row)
    assert prompt.startswith("Select the best answer to the following multiple-choice question based on the video.")
    assert prompt.endswith("Q?\nA. x\nB. y\nC. z\nD. w\nThe best answer is:")


@pytest.mark.parametrize(
    ("reply", "letter"),
    [("B", "B"), ("The best answer is C.", "C"), ("(D) w", "D"), ("  A. x", "A"), ("", ""),
     ("this reply is long and has no option letter in it at all, none", "")],
)  # fmt: skip
def test_extract_letter(reply, letter):
    assert videomme.extract_letter(reply) == letter


def test_score_per_group():
    rows = [{"answer": a, "duration": d, "task_type": t} for a, d, t in
            [("A", "short", "x"), ("B", "short", "y"), ("C", "long", "x")]]  # fmt: skip
    result = videomme.score(rows, ["A", "The answer is C", "C"])
    assert result["accuracy"] == pytest.approx(2 / 3) and result["num"] == 3
    assert result["per_duration"] == {"long": {"num": 1, "acc": 1.0}, "short": {"num": 2, "acc": 0.5}}
    assert result["per_task_type"]["x"] == {"num": 2, "acc": 1.0}


def test_evaluate_rates_launches_one_server_per_rate(monkeypatch, tmp_path):
    launched = []

    @contextmanager
    def fake_serving(model, log, server_args, env=None, timeout=600):
        launched.append((model, list(server_args)))
        yield SimpleNamespace(base_url=f"http://fake/{len(launched)}")

    monkeypatch.setattr(launch, "serving", fake_serving)
    monkeypatch.setattr(videomme, "evaluate", lambda url, rows, **kw: {"url": url, "n": len(rows), **kw})
    out = videomme.evaluate_rates("m", [{}], [0.0, 0.5], tmp_path, ["--dtype", "float32"], max_tokens=4)
    assert out == {"0.0": {"url": "http://fake/1", "n": 1, "max_tokens": 4},
                   "0.5": {"url": "http://fake/2", "n": 1, "max_tokens": 4}}  # fmt: skip
    settings = '{"video_pruning_method": "evs", "video_pruning_rate": 0.5}'
    assert launched[1] == ("m", ["--dtype", "float32", "--json-model-override-args", settings])


def test_evaluate_rates_prunes_with_the_chosen_method(monkeypatch, tmp_path):
    launched = []

    @contextmanager
    def fake_serving(model, log, server_args, env=None, timeout=600):
        launched.append(list(server_args))
        yield SimpleNamespace(base_url="http://fake")

    monkeypatch.setattr(launch, "serving", fake_serving)
    monkeypatch.setattr(videomme, "evaluate", lambda url, rows, **kw: {})
    videomme.evaluate_rates("m", [{}], [0.75], tmp_path, [], method="vidcom2")
    settings = '{"video_pruning_method": "vidcom2", "video_pruning_rate": 0.75}'
    assert launched == [["--json-model-override-args", settings]]
