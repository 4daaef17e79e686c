"""VidCom2 served beside EVS on the tiny Qwen3-VL (float32): its counts, an HF oracle with its mask,
chunking and radix hits, cache keys apart from EVS's, counts by method, bad settings.

The server's default is VidCom2 at `video_pruning_rate` 0.5 (vLLM's pair of settings); a request
names the method, the rate or both in `mm_processor_kwargs`, and what it leaves out is the server's.
"""

from pathlib import Path

import pytest
import requests

from sglang_evs.testing import media
from sglang_evs.testing.chunked import assert_chunks_equal, served_in_chunks
from sglang_evs.testing.hf_reference import assert_matches_hf, hf_pruned_greedy
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    chat_prompt,
    flush_cache,
    generate,
    media_kwargs,
    per_request_rate,
    pruning_metrics,
)
from sglang_evs.testing.server import Launch, running_servers
from sglang_evs.testing.vidcom2_oracle import keep_mask as vidcom2_keep_mask

SERVER_RATE = 0.5
GROUPS, TOKENS_PER_GROUP = 4, 100  # a 16-frame 4 fps clip -> 8 sampled frames -> 4 groups of 10x10
SERVER_SETTINGS = f'{{"video_pruning_method": "vidcom2", "video_pruning_rate": {SERVER_RATE}}}'
SERVER_ARGS = ["--dtype", "float32", "--json-model-override-args", SERVER_SETTINGS]
# The module's server sets the same default with the plugin's launcher flags (vLLM's CLI names).
LAUNCHER_ARGS = ["--dtype", "float32", "--video-pruning-method", "vidcom2", "--video-pruning-rate", str(SERVER_RATE)]


def vidcom2_count(q: float) -> int:
    """vLLM 0.33's rule written out: max(T, int(T * tpf * (1 - q)))."""
    return max(GROUPS, min(int(GROUPS * TOKENS_PER_GROUP * (1 - q)), GROUPS * TOKENS_PER_GROUP))


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("vidcom2_clips")
    return {
        kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=5)
        for kind in ("moving", "noise", "static")
    }


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vidcom2_server") / "server.log"
    # in graph mode, as a GPU serves by default (SGLang's decode graphs and the prefill graphs the plugin turns on)
    launch = Launch(tiny_model_dir, log, [*LAUNCHER_ARGS, "--enable-metrics"], launcher="sglang_evs.launch_server",
                    graph_mode=True)  # fmt: skip
    with running_servers(launch) as (running,):
        yield running


def video_request(server, clip, **extra):
    return generate(server.base_url, chat_prompt(VIDEO), **media_kwargs(videos=[clip]), **extra)[0]


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 0.9, 0.995])
def test_prompt_tokens_follow_the_vidcom2_count(server, clips, q):
    unpruned = video_request(server, clips["moving"], **per_request_rate(0.0))
    served = video_request(server, clips["moving"], **per_request_rate(q, "vidcom2"))
    assert served.prompt_tokens == unpruned.prompt_tokens - (GROUPS * TOKENS_PER_GROUP - vidcom2_count(q))
    assert served.meta["video_tokens"] == vidcom2_count(q)


def test_server_default_is_vidcom2_and_a_request_may_choose_evs(server, clips):
    default = video_request(server, clips["static"])
    assert default.meta["video_pruning_method"] == "vidcom2"
    assert default.meta["video_tokens"] == vidcom2_count(SERVER_RATE)
    evs = video_request(server, clips["static"], **per_request_rate(0.9))
    assert evs.meta["video_pruning_method"] == "evs"
    assert evs.meta["video_tokens"] == max(TOKENS_PER_GROUP, int(GROUPS * TOKENS_PER_GROUP * (1 - 0.9)))
    # what a request leaves out is the server's: the method here, the rate there
    rate_only = video_request(server, clips["static"], mm_processor_kwargs={"video_pruning_rate": 0.75})
    assert (rate_only.meta["video_pruning_method"], rate_only.meta["video_tokens"]) == ("vidcom2", vidcom2_count(0.75))
    method_only = video_request(server, clips["static"], mm_processor_kwargs={"video_pruning_method": "evs"})
    assert method_only.meta["video_pruning_method"] == "evs" and method_only.meta["video_pruning_rate"] == SERVER_RATE


def test_what_was_pruned_is_counted_by_method(server, clips):
    before = pruning_metrics(server.base_url)
    pruned = video_request(server, clips["noise"], **per_request_rate(0.75, "vidcom2"))
    evs = video_request(server, clips["noise"], **per_request_rate(0.5))
    after = pruning_metrics(server.base_url)
    assert {k: v for k, v in pruned.meta.items() if k.startswith("video_")} == {
        "video_pruning_method": "vidcom2",
        "video_pruning_rate": 0.75,
        "video_tokens_before_pruning": GROUPS * TOKENS_PER_GROUP,
        "video_tokens_after_pruning": vidcom2_count(0.75),
        "video_tokens": vidcom2_count(0.75),
    }
    assert (evs.meta["video_pruning_method"], evs.meta["video_pruning_rate"]) == ("evs", 0.5)
    for method, reply in (("vidcom2", pruned), ("evs", evs)):
        for name in ("video_tokens_before_pruning", "video_tokens_after_pruning"):
            assert after[name, method] - before.get((name, method), 0.0) == reply.meta[name], (method, name)
        assert after["pruned_videos", method] - before.get(("pruned_videos", method), 0.0) == 1


def test_evs_and_vidcom2_at_the_same_rate_share_no_cached_video(server, tmp_path):
    clip = media.write_clip(tmp_path / "unseen.mp4", "noise", num_frames=16, fps=4, seed=12)  # not cached yet
    first = video_request(server, clip, **per_request_rate(0.75, "vidcom2"))
    again = video_request(server, clip, **per_request_rate(0.75, "vidcom2"))
    evs = video_request(server, clip, **per_request_rate(0.75))  # the same q = 0.75 and the same kept count
    assert evs.prompt_tokens == first.prompt_tokens
    assert again.cached_tokens >= first.prompt_tokens - 1
    assert evs.cached_tokens < 20  # only the text before the video


@pytest.mark.parametrize("q", [0.5, 0.75])
@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_greedy_tokens_equal_hf_oracle_with_the_vidcom2_mask(server, tiny_model_dir, clips, q, clip):
    reference = hf_pruned_greedy(tiny_model_dir, clips[clip], q, keep_mask=vidcom2_keep_mask)
    assert_matches_hf(video_request(server, clips[clip], **per_request_rate(q, "vidcom2")), reference)


@pytest.mark.slow
def test_chunked_prefill_and_radix_hits_equal_single_chunk(server, tiny_model_dir, clips, media_dir, tmp_path):
    """Against the module's server (one chunk); chunks cut inside groups and on framing tokens, the 50-token
    ones on a server in graph mode."""
    cases = [
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]])),
        (chat_prompt(IMAGE, VIDEO, VIDEO),
         media_kwargs(images=[media_dir / "image.png"], videos=[clips["noise"], clips["moving"]])),
    ]  # fmt: skip
    flush_cache(server.base_url)
    reference = [generate(server.base_url, p, **kw)[0] for p, kw in cases]
    results = served_in_chunks(tiny_model_dir, cases, (7, 50), SERVER_ARGS, tmp_path, graph_chunk=50)
    assert_chunks_equal(results, reference, "VidCom2")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"video_pruning_method": "fastv"}, "video_pruning_method must be one of 'evs', 'vidcom2', got 'fastv'"),
        ({"video_pruning_rate": 1.5}, "video_pruning_rate must be a number in [0, 1), got 1.5"),
        ({"video_pruning_rate": "half"}, "video_pruning_rate must be a number in [0, 1), got 'half'"),
        ({"video_retention_ratio": 0.25}, "video_retention_ratio is no longer read: write video_pruning_method="),
    ],
)
def test_bad_settings_get_400_and_the_server_keeps_serving(server, clips, settings, message):
    good = video_request(server, clips["moving"])
    body = {
        "text": chat_prompt(VIDEO), "video_data": [str(clips["moving"])], "mm_processor_kwargs": settings,
        "sampling_params": {"max_new_tokens": 2},
    }  # fmt: skip
    reply = requests.post(f"{server.base_url}/generate", json=body, timeout=120)
    assert reply.status_code == 400 and message in reply.text, reply.text
    assert video_request(server, clips["moving"]).output_ids == good.output_ids
