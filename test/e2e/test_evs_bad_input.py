"""Bad input gets a clear error and loses nothing: startup refuses a bad setting; bad requests get HTTP 400."""

import subprocess
import sys

import pytest
import requests

from sglang_evs.testing import media
from sglang_evs.testing.server import run_to_exit, running_server

RATE_MESSAGE = "video_pruning_rate must be a number in [0, 1)"
RETIRED_MESSAGE = "video_retention_ratio is no longer read: write video_pruning_method='vidcom2' and video_pruning_rate"


# Every bad value is refused by the one check the unit tests cover (test/pruning/test_settings.py);
# these two launches show that check runs at a real server's startup, before anything is served.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ('{"video_pruning_rate": 1.5}', RATE_MESSAGE),
        ('{"video_retention_ratio": 0.25}', RETIRED_MESSAGE),
    ],
)
def test_startup_refuses_an_invalid_setting_naming_it(tiny_model_dir, overrides, message):
    done = run_to_exit(tiny_model_dir, ["--json-model-override-args", overrides])
    assert done.returncode != 0
    assert message in done.stdout + done.stderr


def test_friendly_launch_flag_refuses_an_invalid_rate():
    done = subprocess.run(
        [sys.executable, "-m", "sglang_evs.launch_server", "--video-pruning-rate", "1.0", "--model-path", "x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "video_pruning_rate must be" in done.stderr


@pytest.fixture(scope="module")
def bad_media(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bad_media")
    good = media.write_clip(out / "good.mp4", "moving", num_frames=8, fps=4)
    long = media.write_clip(out / "long.mp4", "moving", num_frames=16, fps=4)  # 4 groups: 400 video tokens
    (out / "truncated.mp4").write_bytes(good.read_bytes()[:3000])
    (out / "corrupt.mp4").write_bytes(b"this is not a video")
    (out / "empty.mp4").write_bytes(b"")
    media.write_clip(out / "one_frame.mp4", "moving", num_frames=1)
    return {p.stem: p for p in out.iterdir()} | {"good": good, "long": long}


def chat(server, video, q=None, field="mm_processor_kwargs") -> requests.Response:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": f"file://{video}"}}, {"type": "text", "text": "hi"},
        ]}],
        "max_tokens": 4,
        "temperature": 0,
    }  # fmt: skip
    if q is not None:
        body[field] = {"video_pruning_rate": q}
    return requests.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)


def test_bad_requests_get_400_and_good_ones_keep_succeeding(tiny_model_dir, bad_media, tmp_path):
    args = [
        "--dtype",
        "float32",
        "--context-length",
        "300",
        "--json-model-override-args",
        '{"video_pruning_rate": 0.5}',
    ]
    bad = [
        (bad_media["good"], 1.5, "video_pruning_rate must be a number in [0, 1), got 1.5"),
        (bad_media["good"], -0.5, "video_pruning_rate must be a number in [0, 1)"),
        (bad_media["good"], "fast", "video_pruning_rate must be a number in [0, 1), got 'fast'"),
        (bad_media["truncated"], None, "Could not decode"),
        (bad_media["corrupt"], None, "Could not decode"),
        (bad_media["empty"], None, "Could not decode"),
        (bad_media["one_frame"], None, "video 0 has 1 frame(s); Qwen-VL models need at least 2"),
        (bad_media["long"], 0.0, "The input (451 tokens) is longer than the model's context length (300 tokens)"),
    ]
    with running_server(tiny_model_dir, tmp_path / "server.log", args) as server:
        reference = chat(server, bad_media["good"]).json()["choices"][0]["message"]["content"]
        assert chat(server, bad_media["long"]).status_code == 200  # fits once pruned at q = 0.5
        for i in range(2 * len(bad)):  # each bad request twice, a good one after every one
            video, q, message = bad[i % len(bad)]
            response = chat(server, video, q)
            assert response.status_code == 400, (video, q, response.text)
            assert message in response.json()["message"]
            good = chat(server, bad_media["good"])
            assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == reference
        # the same setting in chat_template_kwargs (the field sglang-router forwards) is checked the same way
        for video, q, message in (bad[0], bad[-1]):
            response = chat(server, video, q, field="chat_template_kwargs")
            assert response.status_code == 400 and message in response.json()["message"], response.text
        assert server.alive()
