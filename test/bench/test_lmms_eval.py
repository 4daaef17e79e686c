"""The lmms-eval recipe (`sglang_evs.bench.lmms_eval`, docs/accuracy.md) against one tiny-model server that prunes
by default: videos reach the server as `video_url` parts and pruning runs, per server and per request (kept counts
in the usage, the meta info and the Prometheus counters); lmms-eval's frame-copying backend is refused.

lmms-eval is no dependency of this project: the evaluate-loop test runs the recipe's command in a subprocess with
`$SGLANG_EVS_LMMS_EVAL_PATH` (default `.venv/lmms_eval_pkgs`, a `pip install --target`) on its PYTHONPATH, and is
skipped, saying why, where lmms-eval does not import there. The random model's accuracy means nothing.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from sglang_evs.bench import lmms_eval as recipe
from sglang_evs.bench import videomme_fixture
from sglang_evs.testing.requests import counter_increase, pruning_metrics

REPO = Path(__file__).resolve().parents[2]
SERVER_RATE, REQUEST_RATE = 0.25, 0.75  # a fixture video's 2 groups of 100 tokens: 150 and 100 kept
QUESTIONS = ("001-1", "002-1")  # one question on each of two fixture videos (static, moving)
slow = pytest.mark.slow  # the tests that use the server


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """A server of this module only, pruning at SERVER_RATE unless a request says otherwise."""
    from sglang_evs.testing.server import running_server

    log = tmp_path_factory.mktemp("lmms-eval-server") / "server.log"
    args = ["--dtype", "float32", "--enable-metrics",
            "--json-model-override-args", json.dumps({"video_pruning_rate": SERVER_RATE})]  # fmt: skip
    with running_server(tiny_model_dir, log, args) as running:
        yield running


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    """The Video-MME fixture where lmms-eval's videomme task looks for videos: `$HF_HOME/videomme/data/`."""
    home = tmp_path_factory.mktemp("lmms-eval-hf")
    videomme_fixture.write_fixture(home / "videomme")
    return home


def rows(hf_home: Path) -> list[dict]:
    """The fixture's questions this module asks, each with its video's path."""
    root = hf_home / "videomme"
    lines = (root / "videomme.jsonl").read_text().splitlines()
    picked = [row for row in map(json.loads, lines) if row["question_id"] in QUESTIONS]
    return [{**row, "video_path": root / "data" / f"{row['videoID']}.mp4"} for row in picked]


def messages(row: dict) -> list[dict]:
    """A question as lmms-eval's chat tasks give it (`ConfigurableMessagesTask._auto_doc_to_messages`)."""
    text = "\n".join([row["question"], *row["options"], "The best answer is:"])
    content = [{"type": "video", "url": str(row["video_path"])}, {"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def assert_pruned(record: recipe.PruningRecord, rate: float) -> None:
    assert record.pruned and record.video_pruning_rate == rate
    assert 0 < record.video_tokens_after_pruning < record.video_tokens_before_pruning
    assert record.video_tokens == record.video_tokens_after_pruning  # the usage reports the kept count


def assert_counters_grew_by(grew: dict, records: list[recipe.PruningRecord]) -> None:
    assert grew["pruned_videos"] == len(records)
    assert grew["video_tokens_before_pruning"] == sum(r.video_tokens_before_pruning for r in records)
    assert grew["video_tokens_after_pruning"] == sum(r.video_tokens_after_pruning for r in records)


def test_messages_become_video_url_parts_with_the_rate_in_chat_template_kwargs(hf_home):
    client = recipe.VideoChatClient("http://127.0.0.1:1/v1", pruning={"video_pruning_rate": REQUEST_RATE})
    row = rows(hf_home)[0]
    body, videos, images = client.request_body(messages(row), {"max_new_tokens": 16, "temperature": 0, "until": []})
    assert client.root == "http://127.0.0.1:1" and (videos, images) == (1, 0)
    assert body["messages"][0]["content"][0] == {"type": "video_url", "video_url": {"url": row["video_path"].as_uri()}}
    assert body["chat_template_kwargs"] == {"video_pruning_rate": REQUEST_RATE} and body["return_meta_info"]
    assert (body["max_tokens"], body["temperature"]) == (16, 0.0) and "stop" not in body
    data = recipe.VideoChatClient(video_transport="data").request_body(messages(row))[0]
    assert data["messages"][0]["content"][0]["video_url"]["url"].startswith("data:video/mp4;base64,")
    assert "chat_template_kwargs" not in data  # no setting named: the server's applies
    with pytest.raises(ValueError, match="video_pruning_rate"):
        recipe.VideoChatClient(pruning={"video_pruning_rate": 1.5})
    clipped = [{"role": "user", "content": [{"type": "video", "url": str(row["video_path"]), "start_time": 1.0}]}]
    with pytest.raises(NotImplementedError, match="start_time"):
        client.request_body(clipped)
    from sglang_evs.pruning.settings import SETTINGS

    assert set(recipe.PRUNING_ARGS) <= set(SETTINGS)  # the backend's names are the plugin's


@slow
def test_request_path_prunes_per_server_and_per_request(server, hf_home):
    before = pruning_metrics(server.base_url)
    by_server = recipe.VideoChatClient(f"{server.base_url}/v1")
    by_request = recipe.VideoChatClient(server.base_url, pruning={"video_pruning_rate": REQUEST_RATE})
    as_data = recipe.VideoChatClient(server.base_url, video_transport="data")
    questions = rows(hf_home)
    for row in questions:
        for client in (by_server, by_request):
            reply = client.ask(messages(row), {"max_new_tokens": 2}, "videomme", row["question_id"])
            assert isinstance(reply.text, str) and reply.record.prompt_tokens > reply.record.video_tokens > 0
    as_data.ask(messages(questions[0]), {"max_new_tokens": 2})
    for record in by_server.records + as_data.records:
        assert_pruned(record, SERVER_RATE)
    for record in by_request.records:
        assert_pruned(record, REQUEST_RATE)
    for server_default, own in zip(by_server.records, by_request.records, strict=True):
        assert own.video_tokens_before_pruning == server_default.video_tokens_before_pruning
        assert own.video_tokens_after_pruning < server_default.video_tokens_after_pruning
    assert as_data.records[0].video_tokens_after_pruning == by_server.records[0].video_tokens_after_pruning
    summary = by_request.summary()
    assert (summary["video_requests"], summary["pruned_requests"]) == (2, 2)
    grew = counter_increase(before, pruning_metrics(server.base_url))
    assert_counters_grew_by(grew, by_server.records + by_request.records + as_data.records)


@slow
def test_the_frame_copying_backend_is_refused_naming_why(server, hf_home):
    """`check_backend` takes the model args as lmms-eval parses them (the entry point parses them with lmms-eval's
    own `simple_parse_args_string`, then refuses before lmms-eval runs)."""
    base = {"model_version": "default", "base_url": f"{server.base_url}/v1"}
    with pytest.raises(recipe.FramesAsImagesError, match="never reach the video pruning") as refused:
        recipe.check_backend("openai_compatible", base)
    assert f"video_pruning_rate={SERVER_RATE}" in str(refused.value) and "--model sglang_evs" in str(refused.value)
    with pytest.raises(recipe.FramesAsImagesError, match="--force_simple"):
        recipe.check_backend("openai", {**base, "pass_video_url": True}, force_simple=True)
    with pytest.raises(recipe.FramesAsImagesError, match="ignores them"):  # refused before asking any server
        recipe.check_backend("async_openai", {"base_url": "http://127.0.0.1:1/v1", "video_pruning_rate": 0.5})
    with pytest.warns(UserWarning, match="pass_video_url=true sends videos as video_url"):
        recipe.check_backend("openai", {**base, "pass_video_url": True})
    with pytest.warns(UserWarning, match="could not be asked"):
        recipe.check_backend("openai_compatible", {"base_url": "http://127.0.0.1:1/v1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recipe.check_backend("sglang_evs", {"base_url": f"{server.base_url}/v1"})
    model_args = f"model_version=default,base_url={server.base_url}/v1"
    entry = subprocess.run([sys.executable, "-m", "sglang_evs.bench.lmms_eval", "--model", "openai_compatible",
                            "--model_args", model_args, "--tasks", "videomme"], env=lmms_eval_environment(hf_home),
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert entry.returncode != 0 and "refused: lmms-eval's openai_compatible backend" in entry.stderr, entry.stderr


def lmms_eval_environment(hf_home: Path) -> dict:
    """The recipe's subprocess environment: lmms-eval's install on the path, the fixture as lmms-eval's data,
    nothing fetched."""
    path = os.environ.get("SGLANG_EVS_LMMS_EVAL_PATH", str(REPO / ".venv" / "lmms_eval_pkgs"))
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)
    # found, not imported: importing it costs 15 s here (torch, transformers, datasets); a broken install fails the run
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; exit(u.find_spec('lmms_eval') is None)"],
                           env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"lmms-eval is not installed here nor in {path} (pip install lmms-eval, or set "
                    "SGLANG_EVS_LMMS_EVAL_PATH to a `pip install --target` of it; docs/accuracy.md)")  # fmt: skip
    return env


def write_task(out: Path, hf_home: Path) -> Path:
    """The fixture's questions as an lmms-eval task: lmms-eval's own Video-MME functions (visuals from
    `$HF_HOME/videomme/data`, prompt, answer parsing, scoring) on the local rows, in its category names."""
    questions = [{**row, "domain": "Knowledge", "sub_category": "Technology"} for row in rows(hf_home)]
    for row in questions:
        row.pop("video_path")
    (out / "questions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in questions))
    utils = "lmms_eval.tasks.videomme.utils"
    (out / "videomme_evs_fixture.yaml").write_text(f"""task: videomme_evs_fixture
dataset_path: json
dataset_kwargs:
  data_files:
    test: {out / "questions.jsonl"}
test_split: test
output_type: generate_until
doc_to_visual: !function {utils}.videomme_doc_to_visual
doc_to_text: !function {utils}.videomme_doc_to_text
doc_to_target: answer
generation_kwargs:
  max_new_tokens: 4
  temperature: 0
process_results: !function {utils}.videomme_process_results
metric_list:
  - metric: videomme_perception_score
    aggregation: !function {utils}.videomme_aggregate_results
    higher_is_better: true
lmms_eval_specific_kwargs:
  default:
    pre_prompt: ""
    post_prompt: "The best answer is:"
""")
    return out


@slow
def test_lmms_eval_runs_videomme_through_the_recipe_with_the_rate_per_request(server, hf_home, tmp_path):
    """lmms-eval's own command line finds `--model sglang_evs` through the package's `lmms_eval.models` entry point."""
    env = lmms_eval_environment(hf_home)
    tasks = write_task(tmp_path, hf_home)
    log, out = tmp_path / "pruning.jsonl", tmp_path / "results"
    before = pruning_metrics(server.base_url)
    model_args = f"base_url={server.base_url}/v1,video_pruning_rate={REQUEST_RATE},pruning_log={log}"
    done = subprocess.run(
        [sys.executable, "-m", "lmms_eval", "--model", recipe.MODEL_NAME, "--model_args", model_args,  # its own CLI
         "--tasks", "videomme_evs_fixture", "--include_path", str(tasks), "--batch_size", "1",
         "--output_path", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "sglang_evs: 2 of 2 video requests pruned" in done.stderr
    records = [recipe.PruningRecord(**json.loads(line)) for line in log.read_text().splitlines()]
    assert sorted(r.doc_id for r in records) == [0, 1] and {r.task for r in records} == {"videomme_evs_fixture"}
    for record in records:
        assert_pruned(record, REQUEST_RATE)
    assert_counters_grew_by(counter_increase(before, pruning_metrics(server.base_url)), records)
    (results,) = out.rglob("*_results.json")
    score = json.loads(results.read_text())["results"]["videomme_evs_fixture"]["videomme_perception_score,none"]
    assert 0 <= score <= 100
