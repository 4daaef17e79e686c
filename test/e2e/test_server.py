"""`python -m sglang.launch_server` on the tiny model serves images and videos over the OpenAI API."""

import base64

import requests

from sglang_evs import __version__


def chat(server, part: dict, max_tokens: int = 8) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": [part, {"type": "text", "text": "Describe this."}]}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    response = requests.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_image_request(tiny_server, media_dir):
    out = chat(tiny_server, {"type": "image_url", "image_url": {"url": f"file://{media_dir / 'image.png'}"}})
    assert out["usage"]["completion_tokens"] == 8
    assert out["usage"]["prompt_tokens"] > 64  # 64 image tokens plus the text


def test_video_request_file_url(tiny_server, media_dir):
    out = chat(tiny_server, {"type": "video_url", "video_url": {"url": f"file://{media_dir / 'moving.mp4'}"}})
    assert out["usage"]["completion_tokens"] == 8
    assert out["usage"]["prompt_tokens"] > 200  # 2 temporal groups of 100 tokens


def test_video_request_data_url_matches_file_url(tiny_server, media_dir):
    path = media_dir / "moving.mp4"
    data_url = "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()
    by_data = chat(tiny_server, {"type": "video_url", "video_url": {"url": data_url}})
    by_file = chat(tiny_server, {"type": "video_url", "video_url": {"url": f"file://{path}"}})
    assert by_data["usage"]["prompt_tokens"] == by_file["usage"]["prompt_tokens"]
    assert by_data["choices"][0]["message"]["content"] == by_file["choices"][0]["message"]["content"]


def test_plugin_loaded_in_every_server_process(tiny_server):
    announced = [
        line
        for line in tiny_server.log().splitlines()
        if f"sglang-evs {__version__} plugin loaded (sglang 0.5.23" in line
    ]
    loaded_in = {line.rsplit(" in ", 1)[1].rstrip(")") for line in announced}
    assert {"run_scheduler_process", "run_detokenizer_process"} <= loaded_in, announced
    assert len(announced) == len({line.split("pid ")[1] for line in announced}), "announced twice in a process"


def test_the_held_videos_bound_is_reserved_out_of_the_kv_budget(tiny_server):
    """The scheduler's log names the GB the plugin reserved beside SGLang's own multimodal reservation."""
    reserved = [line for line in tiny_server.log().splitlines() if "sglang-evs: reserving" in line]
    assert reserved and "GB of the KV budget for encoded videos held between chunks" in reserved[0], reserved
