"""Qwen2-VL and Qwen2.5-VL, served by this project's classes through its routine, serve exactly as upstream.

Qwen2.5-VL also has an upstream `post_process` placeholder with other arguments: the routine must
leave it alone (it is not the contract's)."""

import pytest

from sglang_evs import trace
from sglang_evs.testing.requests import IMAGE, VIDEO, chat_prompt, generate, media_kwargs
from sglang_evs.testing.server import Launch, running_servers

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)


@pytest.mark.parametrize(
    ("fixture", "architecture"),
    [("tiny_qwen2_vl_dir", "Qwen2VLForConditionalGeneration"),
     ("tiny_qwen2_5_vl_dir", "Qwen2_5_VLForConditionalGeneration")],
)  # fmt: skip
def test_bit_identical_with_and_without_plugin(fixture, architecture, media_dir, tmp_path, request):
    model_dir = request.getfixturevalue(fixture)
    requests = [
        (chat_prompt(IMAGE), media_kwargs(images=[media_dir / "image.png"])),
        (chat_prompt(VIDEO), media_kwargs(videos=[media_dir / "moving.mp4"])),
        (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[media_dir / "image2.png"], videos=[media_dir / "noise.mp4"])),
        (chat_prompt(text="Count the objects."), {}),
    ]
    trace_path = tmp_path / "trace.jsonl"
    args = ["--dtype", "float32", "--chunked-prefill-size", "48"]
    launches = [Launch(model_dir, tmp_path / "on.log", args, {"SGLANG_EVS_TRACE": str(trace_path)}),
                Launch(model_dir, tmp_path / "off.log", args, {"SGLANG_PLUGINS": "none"})]  # fmt: skip
    results = {}
    with running_servers(*launches) as servers:
        for plugin, server in zip(("on", "off"), servers, strict=True):
            results[plugin] = [generate(server.base_url, prompt, **kwargs)[0] for prompt, kwargs in requests]
    assert results["on"] == results["off"]
    calls = trace.read(trace_path, "embed_routine")
    assert {c["model"] for c in calls} == {architecture}
    assert sum(sum(c["media_rows"]) for c in calls) > 0  # media went through the routine
