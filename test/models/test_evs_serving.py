"""EVS served end to end on the tiny Qwen3-VL (float32): token counts, an HF oracle, chunking, mixes.

The server's default rate is 0.5; requests override it with
`mm_processor_kwargs={"video_pruning_rate": q}`.
"""

import functools
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
import requests
import torch

from sglang_evs import trace
from sglang_evs.pruning import holds
from sglang_evs.testing import media
from sglang_evs.testing.chunked import assert_chunks_equal, assert_media_prefills_and_decodes_replayed, served_in_chunks
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.evs_oracle import limited_keep_mask, limited_kept_count, threshold_keep_mask
from sglang_evs.testing.held import assert_nothing_held
from sglang_evs.testing.hf_reference import (
    HF_LOGPROB_TOLERANCE,
    assert_limited_masks_agree_up_to_ties,
    assert_masks_agree_up_to_ties,
    assert_matches_hf,
    assert_threshold_masks_agree_up_to_ties,
    checked_mask,
    hf_pruned_greedy,
    served_mask,
    unseen_clip,
)
from sglang_evs.testing.media import GROUPS, TOKENS_PER_GROUP
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    chat_prompt,
    close_session,
    counter_increase,
    flush_cache,
    generate,
    logprob_gap,
    media_kwargs,
    open_session,
    per_request_pruning,
    per_request_rate,
    pruning_metrics,
)
from sglang_evs.testing.server import running_server
from sglang_evs.testing.workload import FORWARD_HOLD_S, send_alone, send_together, slow_down

T = TypeVar("T")
SERVER_RATE = 0.5
CHUNK = 96  # the evs_server's prefill chunk: a 400-token video takes five


def evs_count(q: float) -> int:
    """The EVS kept count written out: max(tpf, int(T * tpf * (1 - q)))."""
    return max(TOKENS_PER_GROUP, int(GROUPS * TOKENS_PER_GROUP * (1 - q)))


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("evs_clips")
    return {
        kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=3)
        for kind in ("moving", "noise", "static")
    }


@pytest.fixture(scope="module")
def evs_trace(tmp_path_factory) -> Path:
    """The evs_server's trace file (SGLANG_EVS_TRACE): its keep-mask events feed the HF oracle."""
    return tmp_path_factory.mktemp("evs_server") / "trace.jsonl"


@pytest.fixture(scope="module")
def evs_server(tiny_model_dir, evs_trace):
    """In graph mode, as a GPU serves by default: SGLang's decode graphs, and the breakable prefill graphs
    the plugin turns on for Qwen3-VL, replay every forward whose size they were captured for (96-token
    chunks are a prefill bucket). 96-token chunks also cut the 200-token (and longer) videos: the quick
    tier runs the partial-window path. Without SGLang's embedding cache (`SGLANG_VLM_CACHE_SIZE_MB=0`, its
    profiled default for Qwen3-VL on large Hopper GPUs), every chunk after a video's first reads the rows the
    plugin held (`pruning/holds.py`)."""
    args = [
        "--dtype",
        "float32",
        "--enable-metrics",
        "--chunked-prefill-size",
        str(CHUNK),
        "--enable-streaming-session",
    ]
    args += ["--json-model-override-args", f'{{"video_pruning_rate": {SERVER_RATE}}}']
    env = {"SGLANG_EVS_TRACE": str(evs_trace), "SGLANG_VLM_CACHE_SIZE_MB": "0"}
    with running_server(tiny_model_dir, evs_trace.parent / "server.log", args, env, graph_mode=True) as server:
        yield server


def video_request(server, clip, q=None, **extra):
    kwargs = per_request_rate(q) if q is not None else {}
    return generate(server.base_url, chat_prompt(VIDEO), **media_kwargs(videos=[clip]), **kwargs, **extra)[0]


def limited_request(server, clip, q: float, budget: int = 0, floor: int = 0):
    """The video at rate `q` under a token budget and a per-group floor (0: not sent)."""
    settings = {"video_pruning_rate": q, "video_token_budget": budget, "video_pruning_min_tokens_per_group": floor}
    return video_request(server, clip, mm_processor_kwargs={key: value for key, value in settings.items() if value})


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 0.9])
def test_prompt_tokens_drop_by_exactly_the_pruned_count(evs_server, clips, q):
    unpruned = video_request(evs_server, clips["moving"], q=0.0)
    served = video_request(evs_server, clips["moving"], q=q)
    pruned = GROUPS * TOKENS_PER_GROUP - evs_count(q)
    assert served.prompt_tokens == unpruned.prompt_tokens - pruned
    assert served.meta["video_tokens"] == evs_count(q)


def test_every_forward_of_a_pruned_video_replays_a_graph(evs_server, evs_trace):
    """Each prefill chunk replays a prefill graph reading the model's position buffer, each decode step a
    decode graph reading SGLang's static M-RoPE positions (graph mode, `sglang_evs.graph_trace`)."""
    before = {event: len(trace.read(evs_trace, event)) for event in ("graph_replay", "extend_forward")}
    reply = video_request(evs_server, unseen_clip(evs_trace, "moving", "graphs"), q=0.75)
    replays = trace.read(evs_trace, "graph_replay")[before["graph_replay"] :]
    extends = trace.read(evs_trace, "extend_forward")[before["extend_forward"] :]
    prefill = [r for r in replays if r["phase"] == "prefill"]
    decode = [r for r in replays if r["phase"] == "decode"]
    assert len(prefill) == len(extends) >= 2 and all(r["media"] for r in prefill)  # chunked: two or more
    assert {r["positions_from"] for r in prefill} == {"graph_inputs"}
    assert len(decode) == len(reply.output_ids) - 1 and {r["positions_from"] for r in decode} == {"mrope_positions"}


def encodes_per_video(trace_path: Path, ask: Callable[[], T]) -> tuple[T, Counter]:
    """`ask()`'s reply and how many times the server's vision tower encoded each video (by key) meanwhile."""
    before = len(trace.read(trace_path, "video_encoded"))
    reply = ask()
    return reply, Counter(key for event in trace.read(trace_path, "video_encoded")[before:] for key in event["items"])


@pytest.mark.parametrize("setting", [0.0, 0.5, {"video_pruning_threshold": 0.1}], ids=["q0", "q.5", "threshold"])
def test_each_video_is_encoded_once_per_request_in_chunks_without_an_embedding_cache(evs_server, evs_trace, setting):
    """A 400-token video in 96-token chunks with no embedding cache: one encode (at q = 0 too, where SGLang alone
    encodes it again at each chunk; a threshold's at admission), its rows held meanwhile, nothing held after."""
    clip = unseen_clip(evs_trace, "moving", f"once-{setting}")
    ask = functools.partial(generate, evs_server.base_url, chat_prompt(VIDEO), **media_kwargs(videos=[clip]),
                            **per_request_pruning(setting))  # fmt: skip
    (reply,), encodes = encodes_per_video(evs_trace, ask)
    assert reply.prompt_tokens > CHUNK and list(encodes.values()) == [1], encodes  # two chunks or more
    assert_nothing_held(evs_trace, items=set(encodes))


def test_two_requests_of_a_batch_each_encode_their_videos_once(evs_server, evs_trace):
    """One batch request of two prompts, one with two videos, in 96-token chunks with no embedding cache."""
    clips = [unseen_clip(evs_trace, kind, "batch") for kind in ("moving", "noise", "static")]
    ask = functools.partial(generate, evs_server.base_url, [chat_prompt(VIDEO, VIDEO), chat_prompt(VIDEO)],
                            video_data=[[str(clips[0]), str(clips[1])], [str(clips[2])]])  # fmt: skip
    replies, encodes = encodes_per_video(evs_trace, ask)
    assert [r.meta["video_tokens_before_pruning"] for r in replies] == [2 * GROUPS * TOKENS_PER_GROUP] + [
        GROUPS * TOKENS_PER_GROUP
    ]
    assert len(encodes) == 3 and set(encodes.values()) == {1}, encodes


def test_an_abort_mid_prefill_leaves_nothing_held(evs_server, evs_trace):
    """A request aborted between two chunks of its video (each forward held back 0.5 s meanwhile): SGLang
    releases its media, and the rows held for its later chunks go with them."""
    clip = unseen_clip(evs_trace, "noise", "abort")
    held_before = len(trace.read(evs_trace, "video_held"))
    slow_down(evs_server.base_url, FORWARD_HOLD_S)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            sent = pool.submit(requests.post, f"{evs_server.base_url}/generate", timeout=300, json={
                "text": chat_prompt(VIDEO), "video_data": [str(clip)], "rid": "aborted-mid-prefill",
                "sampling_params": {"max_new_tokens": 4}})  # fmt: skip
            deadline = time.monotonic() + 60
            while len(trace.read(evs_trace, "video_held")) == held_before and time.monotonic() < deadline:
                time.sleep(0.05)
            requests.post(f"{evs_server.base_url}/abort_request", json={"rid": "aborted-mid-prefill"}, timeout=30)
            slow_down(evs_server.base_url, None)
            reply = sent.result().json()
    finally:
        slow_down(evs_server.base_url, None)
    held = trace.read(evs_trace, "video_held")[held_before:]
    assert held, "the video was never held"
    key = held[0]["item"]
    assert reply["meta_info"]["finish_reason"]["type"] == "abort", reply["meta_info"]  # before its last chunk
    released = [e for e in trace.read(evs_trace, "video_released") if e["item"] == key]
    assert released and released[-1]["held_bytes"] == 0
    generate(evs_server.base_url, chat_prompt(text="Still serving?"))  # the server serves on


def test_what_evs_saved_is_reported_per_request_and_per_server(evs_server, clips):
    before = pruning_metrics(evs_server.base_url)
    served = video_request(evs_server, clips["noise"], q=0.75)
    kept = evs_count(0.75)
    assert served.meta["video_tokens_before_pruning"] == GROUPS * TOKENS_PER_GROUP
    assert served.meta["video_tokens_after_pruning"] == served.meta["video_tokens"] == kept
    assert served.meta["video_pruning_rate"] == 0.75
    assert served.meta["video_pruning_method"] == "evs"
    after = pruning_metrics(evs_server.base_url)
    delta = counter_increase(before, after)
    assert delta["video_tokens_before_pruning"] == GROUPS * TOKENS_PER_GROUP
    assert delta["video_tokens_after_pruning"] == kept
    assert delta["pruned_videos"] == 1


def test_openai_client_sets_the_rate_per_request(evs_server, clips):
    from openai import OpenAI

    client = OpenAI(base_url=f"{evs_server.base_url}/v1", api_key="none")
    content = [{"type": "video_url", "video_url": {"url": f"file://{clips['moving']}"}}, {"type": "text", "text": "hi"}]
    usage = {
        q: client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": content}], max_tokens=2,
            extra_body={"mm_processor_kwargs": {"video_pruning_rate": q}},
        ).usage
        for q in (0.0, 0.75)
    }  # fmt: skip
    assert usage[0.0].prompt_tokens - usage[0.75].prompt_tokens == GROUPS * TOKENS_PER_GROUP - TOKENS_PER_GROUP
    assert usage[0.75].prompt_tokens_details.video_tokens == TOKENS_PER_GROUP


def test_server_rate_is_the_default(evs_server, clips):
    default = video_request(evs_server, clips["static"])
    # the server's override names only the rate: EVS is the default method, as in vLLM
    assert (default.meta["video_pruning_method"], default.meta["video_pruning_rate"]) == ("evs", SERVER_RATE)
    explicit = video_request(evs_server, clips["static"], q=SERVER_RATE)
    assert explicit.prompt_tokens == default.prompt_tokens and explicit.output_ids == default.output_ids
    assert explicit.cached_tokens >= default.prompt_tokens - 1  # same cache key: same rate


def test_same_video_at_two_rates_shares_no_cached_video(evs_server, tmp_path):
    clip = media.write_clip(tmp_path / "unseen.mp4", "noise", num_frames=16, fps=4, seed=11)  # not cached yet
    first = video_request(evs_server, clip, q=0.25)
    again = video_request(evs_server, clip, q=0.25)
    other = video_request(evs_server, clip, q=0.75)
    assert again.cached_tokens >= first.prompt_tokens - 1  # everything but the last token
    assert other.cached_tokens < 20  # only the text before the video


@pytest.mark.parametrize("q", [0.5, 0.75])
@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_greedy_tokens_equal_hf_oracle(evs_server, evs_trace, tiny_model_dir, q, clip):
    """HF given the server's mask (which must be the oracle's on HF's features, up to ties) at the
    reference positions."""
    clip = unseen_clip(evs_trace, clip, f"evs{q}")
    reply = video_request(evs_server, clip, q=q)
    seen = {}
    checked = checked_mask(served_mask(evs_trace), seen)
    assert_matches_hf(reply, hf_pruned_greedy(tiny_model_dir, clip, q, keep_mask=checked))
    assert_masks_agree_up_to_ties(seen["served"], *seen["args"])


def test_the_tolerance_tells_a_one_position_error(evs_server, evs_trace, tiny_model_dir):
    """The control: HF with every token from the video on one position later is farther from what was
    served than the tolerance, so the tolerance separates exact from off by one."""
    clip = unseen_clip(evs_trace, "moving", "one-off")
    reply = video_request(evs_server, clip, q=0.75)
    one_off = hf_pruned_greedy(tiny_model_dir, clip, 0.75, keep_mask=served_mask(evs_trace), shift_from_video=1)
    assert logprob_gap(reply, one_off) > HF_LOGPROB_TOLERANCE


# --- chunked prefill and the radix cache see the same positions


@pytest.mark.slow
def test_chunked_prefill_and_radix_hits_equal_single_chunk(tiny_model_dir, clips, tmp_path):
    """7-token chunks cut inside groups, on framing tokens and at both edges of every video; 33-token ones
    cut groups unevenly with fewer windows, on a server in graph mode (its chunks and radix hits replay
    prefill graphs). (16 and 50 were dropped: they cut nothing these two miss.) Both without SGLang's embedding
    cache: the 33-token server reads each video's held rows (`pruning/holds.py`); the 7-token one may hold
    nothing (`SGLANG_EVS_HELD_VIDEO_MB=0`), so each chunk encodes its videos again and prunes them by the masks
    their first encode decided: both equal one chunk with SGLang's default cache."""
    image = media.write_image(tmp_path / "image.png", seed=2)
    cases = [
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]])),
        (chat_prompt(IMAGE, VIDEO, VIDEO), media_kwargs(images=[image], videos=[clips["noise"], clips["moving"]])),
    ]
    args = ["--dtype", "float32", "--json-model-override-args", '{"video_pruning_rate": 0.5}']
    no_cache = {"SGLANG_VLM_CACHE_SIZE_MB": "0"}
    env_by_chunk = {7: {**no_cache, holds.BOUND_ENV: "0"}, 33: no_cache}
    results = served_in_chunks(tiny_model_dir, cases, (None, 7, 33), args, tmp_path, 33, env_by_chunk)
    assert_chunks_equal(results, results[None][0], "EVS")
    encoded = Counter(key for event in trace.read(tmp_path / "graph-trace.jsonl", "video_encoded")
                      for key in event["items"])  # fmt: skip
    # the graph-mode (33-token) server: each of the cases' three videos encoded once; the repeats, radix hits
    # to their last token, encode nothing
    assert sorted(encoded.values()) == [1, 2], encoded  # the moving clip is in both cases


# --- several media per request and per batch


def test_mixed_media_requests_equal_each_request_alone(evs_server, evs_trace, clips, media_dir):
    """Each request alone, then all eight at once from an empty cache, so they prefill together: the trace
    shows a forward that held media of two requests or more."""
    image, image2 = media_dir / "image.png", media_dir / "image2.png"
    cases = [
        (chat_prompt(VIDEO, IMAGE), media_kwargs(images=[image], videos=[clips["moving"]])),
        (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[image2], videos=[clips["noise"]])),
        (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[clips["noise"], clips["moving"]])),
        (chat_prompt(IMAGE), media_kwargs(images=[image])),
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["static"]])),
        (chat_prompt(text="Count the objects."), {}),
        (chat_prompt(VIDEO, IMAGE, VIDEO), media_kwargs(images=[image2], videos=[clips["static"], clips["noise"]])),
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]])),
    ]
    cases = [(prompt, kwargs, 0.75) for prompt, kwargs in cases]
    cases[2] = (*cases[2][:2], {"video_pruning_threshold": 0.3})  # laid out when the scheduler admits it
    cases[6] = (*cases[6][:2], {"video_pruning_threshold": 0.05, "video_pruning_min_tokens_per_group": 10})
    alone = send_alone(evs_server.base_url, cases)
    together, (shared_forwards, cached, prompt) = send_together(evs_server.base_url, cases, evs_trace)
    assert shared_forwards > 0, "no prefill forward held the media of two requests"
    assert cached < prompt // 4  # prefilled, not served from the cache (two of them share their first video)
    # the graph-mode server replayed it: one prefill replay carried the media of two requests or more
    media_prefills = assert_media_prefills_and_decodes_replayed(evs_trace)
    assert any(replay["requests"] > 1 for replay in media_prefills)
    for one, many in zip(alone, together, strict=True):
        assert many.prompt_tokens == one.prompt_tokens
        assert_same_greedy(many, one, "batched vs alone")  # batched CPU GEMMs round differently


def test_the_video_rate_leaves_images_alone(evs_server, media_dir):
    """Bit-identical at video_pruning_rate 0.9 and 0 (cache flushed before each, so both prefill from scratch):
    images have settings of their own (test_image_pruning.py)."""
    prompt, kwargs = chat_prompt(IMAGE, IMAGE), media_kwargs(images=[media_dir / "image.png", media_dir / "image2.png"])
    runs = []
    for q in (0.9, 0.0):
        flush_cache(evs_server.base_url)
        runs.append(generate(evs_server.base_url, prompt, **kwargs, **per_request_rate(q))[0])
    assert runs[0] == runs[1]


# --- a token budget and a per-group floor: the count known when the prompt is laid out, the mask after the encoder


def test_budget_and_floor_are_part_of_the_cache_key(evs_server, tmp_path):
    clip = media.write_clip(tmp_path / "unseen.mp4", "noise", num_frames=16, fps=4, seed=12)  # not cached yet
    first = limited_request(evs_server, clip, 0.5, budget=150)
    for budget, floor in ((149, 0), (150, 1)):
        other = limited_request(evs_server, clip, 0.5, budget, floor)
        assert other.cached_tokens < 20, (budget, floor)  # only the text before the video
    assert limited_request(evs_server, clip, 0.5, budget=150).cached_tokens >= first.prompt_tokens - 1


BAD_LIMITS = [
    ({"video_token_budget": -1}, "video_token_budget must be a whole number >= 0 (0: off), got -1"),
    ({"video_pruning_min_tokens_per_group": 2.5}, "video_pruning_min_tokens_per_group must be a whole number"),
    ({"video_pruning_threshold": 3}, "video_pruning_threshold must be a number in [0, 2], got 3"),
    (
        {"video_pruning_threshold": 0.3, "video_pruning_rate": 0.5},
        "video_pruning_rate=0.5 and video_pruning_threshold=0.3: name one",
    ),
    (
        {"video_pruning_threshold": 0.3, "video_pruning_method": "vidcom2"},
        "video_pruning_threshold=0.3 is EVS's dissimilarity",
    ),
    ({"video_token_budjet": 100}, "unknown video pruning setting 'video_token_budjet': the settings are"),
    ({"video_pruning_rates": 0.5}, "unknown video pruning setting 'video_pruning_rates'"),
]


def test_bad_limits_and_unknown_keys_get_400_and_serving_goes_on(evs_server, clips):
    """Each in `mm_processor_kwargs` of /generate and in `chat_template_kwargs` of a chat request (the field
    sglang-router forwards); a good request after each is served as before."""
    url = evs_server.base_url
    good = limited_request(evs_server, clips["static"], 0.5, budget=150)
    content = [{"type": "video_url", "video_url": {"url": f"file://{clips['static']}"}}, {"type": "text", "text": "hi"}]
    chat = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    for settings, message in BAD_LIMITS:
        body = {"text": chat_prompt(VIDEO), "video_data": [str(clips["static"])], "mm_processor_kwargs": settings,
                "sampling_params": {"max_new_tokens": 2}}  # fmt: skip
        for response in (requests.post(f"{url}/generate", json=body, timeout=120),
                         requests.post(f"{url}/v1/chat/completions", json={**chat, "chat_template_kwargs": settings},
                                       timeout=120)):  # fmt: skip
            assert response.status_code == 400, (settings, response.text)
            assert message in response.text, response.text
    again = limited_request(evs_server, clips["static"], 0.5, budget=150)
    assert again.output_ids == good.output_ids and evs_server.alive()


# --- a threshold: the count decided by the content, when the scheduler admits the request (pruning/admission.py)


def threshold_request(server, clip, threshold: float, **extra):
    return video_request(server, clip, mm_processor_kwargs={"video_pruning_threshold": threshold}, **extra)


def test_a_static_clip_keeps_its_first_group_where_a_noisy_clip_keeps_nearly_all(evs_server, clips):
    """At one threshold, per request, on a server whose default is a rate: counted in the meta info and in
    Prometheus as the scheduler decided them."""
    before = pruning_metrics(evs_server.base_url)
    static = threshold_request(evs_server, clips["static"], 0.05)
    noise = threshold_request(evs_server, clips["noise"], 0.05)
    unpruned = video_request(evs_server, clips["static"], q=0.0)
    assert static.meta["video_tokens_after_pruning"] == static.meta["video_tokens"] == TOKENS_PER_GROUP
    assert static.prompt_tokens == unpruned.prompt_tokens - (GROUPS - 1) * TOKENS_PER_GROUP
    assert noise.meta["video_tokens_after_pruning"] >= 0.9 * GROUPS * TOKENS_PER_GROUP
    assert static.meta["video_pruning_threshold"] == 0.05 and "video_pruning_rate" not in static.meta
    delta = counter_increase(before, pruning_metrics(evs_server.base_url))
    assert delta["video_tokens_before_pruning"] == 2 * GROUPS * TOKENS_PER_GROUP
    assert delta["video_tokens_after_pruning"] == TOKENS_PER_GROUP + noise.meta["video_tokens_after_pruning"]
    assert delta["pruned_videos"] == 2


LIMITED = {  # name -> the request's settings; 4 groups of 100 tokens
    # the budget caps the rate's 200; the floor then moves tokens to the groups short of 20
    "budget": {"video_pruning_rate": 0.5, "video_token_budget": 150, "video_pruning_min_tokens_per_group": 20},
    # the rate's 100 are group 0's; the floor raises the count to 30 from every group
    "floor": {"video_pruning_rate": 0.75, "video_pruning_min_tokens_per_group": 30},
    # the content decides: group 0 and ~20 tokens of the moving object; then a budget caps it, or a floor moves
    # tokens to the groups it left below 10
    "threshold": {"video_pruning_threshold": 0.3},
    "threshold+budget": {"video_pruning_threshold": 0.3, "video_token_budget": 110},
    "threshold+floor": {"video_pruning_threshold": 0.3, "video_pruning_min_tokens_per_group": 10},
}


# the rate limits' cases in the quick tier, the thresholds' in the full suite (each an HF run of its own)
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if "threshold" in name else name
                                  for name in LIMITED])  # fmt: skip
def test_limits_and_thresholds_equal_hf_oracle_in_chunks_and_after_a_radix_hit(evs_server, evs_trace, tiny_model_dir,
                                                                                name):  # fmt: skip
    """HF given the server's mask at the reference positions, for the prompt prefilled in 96-token chunks that cut
    the video and again from the radix cache; the mask is the rule's on HF's features up to ties, and each limit
    binds (without it the oracle keeps other tokens)."""
    setting = LIMITED[name]
    q, threshold = setting.get("video_pruning_rate", 0.0), setting.get("video_pruning_threshold")
    budget, floor = setting.get("video_token_budget", 0), setting.get("video_pruning_min_tokens_per_group", 0)
    clip = unseen_clip(evs_trace, "moving", f"limits-{name}")
    first = video_request(evs_server, clip, mm_processor_kwargs=setting)
    seen = {}
    reference = hf_pruned_greedy(tiny_model_dir, clip, q, keep_mask=checked_mask(served_mask(evs_trace), seen))
    rows, grid, merge, _ = seen["args"]
    kept = int(seen["served"].sum())
    assert first.meta["video_tokens_after_pruning"] == first.meta["video_tokens"] == kept
    assert (first.meta.get("video_token_budget", 0), first.meta.get("video_pruning_min_tokens_per_group", 0)) == (
        budget, floor)  # fmt: skip
    assert first.prompt_tokens > 96  # cut into chunks
    assert_matches_hf(first, reference)
    if threshold is None:
        assert kept == limited_kept_count(TOKENS_PER_GROUP, GROUPS, q, budget, floor)
        assert_limited_masks_agree_up_to_ties(seen["served"], rows, grid, merge, q, budget=budget, floor=floor)
        without_floor = limited_keep_mask(rows, grid, merge, q, budget)
        assert min(without_floor.view(GROUPS, -1).sum(dim=1).tolist()) < floor  # the floor binds
    else:
        assert first.meta["video_pruning_threshold"] == threshold and "video_pruning_rate" not in first.meta
        assert TOKENS_PER_GROUP < kept < GROUPS * TOKENS_PER_GROUP  # the content decided, not all or group 0
        assert_threshold_masks_agree_up_to_ties(seen["served"], rows, grid, merge, threshold, budget, floor)
        alone = threshold_keep_mask(rows, grid, merge, threshold)
        limited = threshold_keep_mask(rows, grid, merge, threshold, budget, floor)
        assert bool(budget or floor) == (not torch.equal(alone, limited))  # a limit changes what is kept
    again = video_request(evs_server, clip, mm_processor_kwargs=setting)
    assert again.cached_tokens >= first.prompt_tokens - 1
    assert_matches_hf(again, reference)


@pytest.mark.slow
def test_the_threshold_is_part_of_the_cache_key(evs_server, tmp_path):
    clip = media.write_clip(tmp_path / "unseen-t.mp4", "noise", num_frames=16, fps=4, seed=13)  # not cached yet
    first = threshold_request(evs_server, clip, 1.0)
    other = threshold_request(evs_server, clip, 1.01)
    assert other.cached_tokens < 20  # only the text before the video
    assert threshold_request(evs_server, clip, 1.0).cached_tokens >= first.prompt_tokens - 1


@pytest.mark.slow
def test_input_logprobs_with_a_threshold_get_400(evs_server, clips):
    body = {"text": chat_prompt(VIDEO), "video_data": [str(clips["moving"])], "return_logprob": True,
            "logprob_start_len": 0, "mm_processor_kwargs": {"video_pruning_threshold": 0.3},
            "sampling_params": {"max_new_tokens": 2}}  # fmt: skip
    response = requests.post(f"{evs_server.base_url}/generate", json=body, timeout=120)
    assert response.status_code == 400 and "input logprobs (logprob_start_len=0) with video_pruning_threshold" in (
        response.text
    )
    output_only = threshold_request(evs_server, clips["moving"], 0.3, return_logprob=True)
    assert output_only.output_ids and evs_server.alive()


# --- a stream sent segment by segment, in one request (`video_stream`, pruning/streams.py)


@pytest.fixture(scope="module")
def segments(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Two 4-s segments (4 groups each) of one stream per kind: a static camera (the same still frame throughout)
    and fresh noise every frame (no near-ties in EVS's scores: the HF oracle's mask is the server's)."""
    out = tmp_path_factory.mktemp("segments")
    made = {}
    for kind in ("static", "noise"):
        frames = media.clip_frames(kind, num_frames=32, seed=21)
        made[kind] = tuple(media.write_mp4(out / f"{kind}-{i}.mp4", frames[16 * i : 16 * (i + 1)]) for i in (0, 1))
    # a 2.5-s first segment (10 frames at 4 fps, not a whole number of 2-frame groups: SGLang's sampler takes 4 of
    # them, rounding to the temporal patch, so no group is left part-filled), then a 4-s one
    frames = media.clip_frames("noise", num_frames=26, seed=22)
    made["uneven"] = (
        media.write_mp4(out / "uneven-0.mp4", frames[:10]),
        media.write_mp4(out / "uneven-1.mp4", frames[10:]),
    )
    return made


def stream_request(server, clips, stream: bool = True, **settings):
    kwargs = {"video_stream": True, **settings} if stream else settings
    return generate(server.base_url, chat_prompt(*[VIDEO] * len(clips)), video_data=[str(c) for c in clips],
                    mm_processor_kwargs=kwargs)[0]  # fmt: skip


def test_two_static_segments_as_one_stream_keep_what_one_segment_keeps_at_a_threshold(evs_server, segments):
    """The stream: its first group alone (the second segment changed nothing). Sent as two videos: a group each."""
    one = video_request(evs_server, segments["static"][0], mm_processor_kwargs={"video_pruning_threshold": 0.05})
    stream = stream_request(evs_server, segments["static"], video_pruning_threshold=0.05)
    apart = stream_request(evs_server, segments["static"], stream=False, video_pruning_threshold=0.05)
    assert one.meta["video_tokens_after_pruning"] == TOKENS_PER_GROUP
    assert stream.meta["video_tokens_after_pruning"] == TOKENS_PER_GROUP
    assert apart.meta["video_tokens_after_pruning"] == 2 * TOKENS_PER_GROUP


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["noise", "uneven"])
@pytest.mark.parametrize("setting", [{"video_pruning_rate": 0.5}, {"video_pruning_threshold": 0.9}], ids=["q.5", "t.9"])
def test_a_stream_in_96_token_chunks_is_what_hf_gives_its_prompt_with_the_streams_mask(
    evs_server, tiny_model_dir, segments, setting, kind
):
    """HF transformers given the stream's prompt as served (the second segment's timestamps counting on from the
    first's) with the rows the stream rule keeps, computed on the segments' rows concatenated; the server cuts each
    segment across 96-token chunks. The second segment's count at a rate is its own, int(T * tpf * (1 - q)). A first
    segment whose frames are not a whole number of temporal groups is served exactly too: sampled as SGLang samples
    it, the next segment's timestamps counting on from its real frames."""
    from sglang_evs.testing.hf_reference import hf_stream_greedy

    served = stream_request(evs_server, segments[kind], **setting)
    q, threshold = setting.get("video_pruning_rate"), setting.get("video_pruning_threshold")
    reference = hf_stream_greedy(tiny_model_dir, segments[kind], q, threshold)
    assert_matches_hf(served, reference)
    if q is not None and kind == "noise":
        assert served.meta["video_tokens_after_pruning"] == evs_count(q) + int(GROUPS * TOKENS_PER_GROUP * (1 - q))
    if kind == "uneven":  # 2 groups, then 4
        assert served.meta["video_tokens_before_pruning"] == (2 + GROUPS) * TOKENS_PER_GROUP


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"video_stream": "yes"}, "video_stream must be true or false"),
        ({"video_stream": True, "video_pruning_method": "vidcom2", "video_pruning_rate": 0.5}, "video_pruning_method"),
    ],
)
def test_a_bad_stream_request_gets_400_and_serving_goes_on(evs_server, segments, settings, message):
    body = {"text": chat_prompt(VIDEO, VIDEO), "video_data": [str(c) for c in segments["static"]],
            "mm_processor_kwargs": settings, "sampling_params": {"max_new_tokens": 2}}  # fmt: skip
    response = requests.post(f"{evs_server.base_url}/generate", json=body, timeout=120)
    assert response.status_code == 400 and message in response.text, response.text
    no_video = {**body, "text": chat_prompt(text="No video here."), "video_data": None,
                "mm_processor_kwargs": {"video_stream": True}}  # fmt: skip
    response = requests.post(f"{evs_server.base_url}/generate", json=no_video, timeout=120)
    assert response.status_code == 400 and "the request has no video" in response.text, response.text
    assert evs_server.alive() and stream_request(evs_server, segments["static"], video_pruning_rate=0.5).output_ids


# --- a stream sent turn by turn through a session (pruning/stream_sessions.py)


@pytest.fixture(scope="module")
def stream_of_four(tmp_path_factory) -> list[Path]:
    """Four 2-s segments (2 groups each) of one stream of fresh noise every frame (no near-ties in EVS's scores)."""
    out = tmp_path_factory.mktemp("stream_of_four")
    frames = media.clip_frames("noise", num_frames=32, seed=23)
    return [media.write_mp4(out / f"segment-{i}.mp4", frames[8 * i : 8 * (i + 1)]) for i in range(4)]


def turn_prompt(index: int) -> str:
    return chat_prompt(VIDEO, text=f"Segment {index}.")


def stream_turn(server, session: str, index: int, segment: Path, settings: dict, max_new_tokens: int, **extra):
    """One segment appended to `session`, marked `video_stream` after the first (which starts the stream)."""
    marked = {**settings, "video_stream": True} if index else settings
    return generate(server.base_url, turn_prompt(index), max_new_tokens, video_data=[str(segment)],
                    mm_processor_kwargs=marked, session_params={"id": session}, **extra)[0]  # fmt: skip


def held_stream_state(trace_path: Path, session: str) -> list[int]:
    """The tokenizer's bytes held for `session`'s stream at each of its changes (`stream_state` trace events; those of
    its turns not finished yet left out)."""
    events = trace.read(trace_path, "stream_state")
    return [event["bytes"] for event in events if event["session"] == session and "turn" not in event]


@pytest.mark.parametrize(
    "settings", [{"video_pruning_rate": 0.5}, {"video_pruning_threshold": 0.9}], ids=["q.5", "t.9"]
)
def test_a_session_of_four_appended_segments_is_the_four_sent_at_once(evs_server, evs_trace, stream_of_four, settings):
    """A streaming session, one segment per turn (each turn before the last prefilled only, so that no reply enters
    the history): the last turn's prompt, kept tokens and greedy tokens are the one request's, its logprobs within
    float32 noise; each turn reuses the turns before it from the radix cache; the stream's state in the tokenizer is
    one group of patches whatever the turns, and closing the session lets it go."""
    session = open_session(evs_server.base_url)
    turns = [stream_turn(evs_server, session, i, segment, settings, 0) for i, segment in enumerate(stream_of_four[:3])]
    last = stream_turn(evs_server, session, 3, stream_of_four[3], settings, 8)
    held = held_stream_state(evs_trace, session)
    close_session(evs_server.base_url, session)
    at_once = generate(evs_server.base_url, "".join(turn_prompt(i) for i in range(4)), 8,
                       video_data=[str(c) for c in stream_of_four],
                       mm_processor_kwargs={**settings, "video_stream": True})[0]  # fmt: skip
    assert_same_greedy(last, at_once, settings)
    assert last.prompt_tokens == at_once.prompt_tokens
    kept = [turn.meta["video_tokens_after_pruning"] for turn in (*turns, last)]
    assert sum(kept) == at_once.meta["video_tokens_after_pruning"] < at_once.meta["video_tokens_before_pruning"]
    following = zip(turns, [*turns[1:], last], strict=True)
    assert all(turn.cached_tokens >= before.prompt_tokens for before, turn in following)  # the radix cache's
    assert len(held) == 4 and len(set(held)) == 1 and held[0] > 0  # one group, whatever the turns
    assert held_stream_state(evs_trace, session)[-1] == 0


def test_a_session_turn_with_nothing_to_continue_gets_400_and_serving_goes_on(evs_server, stream_of_four):
    """The mark on a session's first video (nothing before it to continue), and on a turn of a session opened without
    streaming that does not name the turn it follows (SGLang appends it to nothing)."""
    for streaming, message in ((True, "has no earlier video to continue"), (False, "give session_params.rid=")):
        session = open_session(evs_server.base_url, streaming=streaming)
        if not streaming:
            stream_turn(evs_server, session, 0, stream_of_four[0], {"video_pruning_rate": 0.5}, 1)
        body = {"text": turn_prompt(1), "video_data": [str(stream_of_four[1])], "session_params": {"id": session},
                "mm_processor_kwargs": {"video_stream": True}, "sampling_params": {"max_new_tokens": 1}}  # fmt: skip
        response = requests.post(f"{evs_server.base_url}/generate", json=body, timeout=120)
        assert response.status_code == 400 and message in response.text, response.text
        close_session(evs_server.base_url, session)
    assert evs_server.alive() and video_request(evs_server, stream_of_four[0], q=0.5).output_ids


def test_a_pipelined_stream_turn_is_served_after_the_one_before_it(evs_server, stream_of_four):
    """A live source does not wait for answers: the next segment of a streaming session sent while the turn before it
    still decodes waits for it in the tokenizer (`stream_sessions.queue_pipelined_turn`), then is served exactly as
    the same segment sent once that turn finished: its prompt, kept and greedy tokens. (SGLang refuses such a turn,
    and 0.5.23 then stops its scheduler: `sessions.refused_turn` still guards that path.)"""
    settings = {"video_pruning_rate": 0.5}

    def second_turn(pipelined: bool):
        session = open_session(evs_server.base_url)
        first = functools.partial(stream_turn, evs_server, session, 0, stream_of_four[0], settings, 8)
        second = functools.partial(stream_turn, evs_server, session, 1, stream_of_four[1], settings, 8)
        try:
            if not pipelined:
                first()
                return second()
            slow_down(evs_server.base_url, FORWARD_HOLD_S)  # the first turn decodes for 4 s
            with ThreadPoolExecutor(max_workers=2) as pool:
                running = pool.submit(first)
                time.sleep(4 * FORWARD_HOLD_S)
                queued = pool.submit(second)
                time.sleep(FORWARD_HOLD_S)
                slow_down(evs_server.base_url, None)
                running.result()
                return queued.result()
        finally:
            slow_down(evs_server.base_url, None)
            close_session(evs_server.base_url, session)

    after, pipelined = second_turn(pipelined=False), second_turn(pipelined=True)
    assert_same_greedy(pipelined, after, "pipelined")
    assert pipelined.prompt_tokens == after.prompt_tokens
    assert pipelined.meta["video_tokens_after_pruning"] == after.meta["video_tokens_after_pruning"]
    session = open_session(evs_server.base_url)  # a turn SGLang refuses as it creates it: answered, not appended
    stream_turn(evs_server, session, 0, stream_of_four[0], settings, 1)
    refused = requests.post(f"{evs_server.base_url}/generate", timeout=120, json={
        "text": turn_prompt(1), "video_data": [str(stream_of_four[1])], "sampling_params": {"max_new_tokens": 1},
        "session_params": {"id": session, "replace": True}})  # fmt: skip
    close_session(evs_server.base_url, session)
    assert refused.status_code == 400 and "do not support replace" in refused.text, refused.text
    session = open_session(evs_server.base_url)
    assert evs_server.alive() and stream_turn(evs_server, session, 0, stream_of_four[2], settings, 1).output_ids
    close_session(evs_server.base_url, session)


def chat_messages(index: int, segment: Path) -> list[dict]:
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": f"file://{segment}"}},
                                         {"type": "text", "text": f"Segment {index}."}]}]  # fmt: skip


def chat_turn(client, session: str, index: int, segment: Path, settings: dict, max_tokens: int):
    """One segment appended to `session` through the `openai` client's chat completions (`extra_body`)."""
    return client.chat.completions.create(
        model="default", messages=chat_messages(index, segment), max_tokens=max_tokens, temperature=0,
        extra_body={"session_params": {"id": session}, "ignore_eos": True,
                    "chat_template_kwargs": {**settings, **({"video_stream": True} if index else {})}},
    )  # fmt: skip


@pytest.mark.parametrize("settings", [{"video_pruning_rate": 0.5}, {"video_pruning_threshold": 0.9}], ids=["q", "t"])
def test_a_stream_sent_turn_by_turn_through_the_openai_client_is_the_generate_sessions(
    evs_server, stream_of_four, tiny_model_dir, settings
):
    """Three segments of a streaming session through `/v1/chat/completions` with the `openai` package, each turn only
    its own segment: every turn's prompt tokens, kept video tokens and greedy reply are those of the same turns on
    `/generate` (each templated by the checkpoint's chat template, as the chat endpoint templates it)."""
    from openai import OpenAI
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    client = OpenAI(base_url=f"{evs_server.base_url}/v1", api_key="none")
    session, generated = open_session(evs_server.base_url), []
    for index, segment in enumerate(stream_of_four[:3]):
        text = processor.apply_chat_template(chat_messages(index, segment), tokenize=False, add_generation_prompt=True)
        marked = {**settings, "video_stream": True} if index else settings
        generated.append(generate(evs_server.base_url, text, 8, video_data=[str(segment)], mm_processor_kwargs=marked,
                                  session_params={"id": session})[0])  # fmt: skip
    close_session(evs_server.base_url, session)
    session = open_session(evs_server.base_url)
    chats = [chat_turn(client, session, i, segment, settings, 8) for i, segment in enumerate(stream_of_four[:3])]
    close_session(evs_server.base_url, session)
    kept_so_far = 0  # SGLang's usage counts the session's whole prompt: every turn's kept video tokens so far
    for index, (chat, turn) in enumerate(zip(chats, generated, strict=True)):
        kept_so_far += turn.meta["video_tokens_after_pruning"]
        assert chat.usage.prompt_tokens == turn.prompt_tokens, index
        assert chat.usage.prompt_tokens_details.video_tokens == kept_so_far, index
        assert chat.choices[0].message.content == processor.tokenizer.decode(turn.output_ids, skip_special_tokens=True)
    assert chats[-1].usage.prompt_tokens > chats[0].usage.prompt_tokens + 100  # the turns appended to one history


def test_the_readmes_openai_stream_snippet_runs(evs_server, stream_of_four, capsys):
    """The README's live-stream snippet, run as written against this server and these segments."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    blocks = [block.split("```", 1)[0] for block in readme.split("```python\n")[1:]]
    (snippet,) = [block for block in blocks if "chat.completions.create" in block and "session_params" in block]
    snippet = snippet.replace('"http://localhost:30000"', repr(evs_server.base_url))
    segments = [str(segment) for segment in stream_of_four[:3]]
    snippet = snippet.replace('["seg-000.mp4", "seg-001.mp4", "seg-002.mp4"]', repr(segments))
    exec(compile(snippet, "README.md", "exec"), {})
    assert capsys.readouterr().out.count("video tokens kept so far)") == 3


def test_the_stream_console_script_sends_a_file_as_it_records_and_closes_its_session(evs_server, evs_trace, tmp_path,
                                                                                    tiny_model_dir):  # fmt: skip
    """`sglang-evs-stream FILE`: a 4-s clip cut into two 2-s segments, each a session turn (the second continuing
    the first), each answer printed with its TTFT and its kept and pruned video tokens; the session closed at the
    end, so the tokenizer keeps nothing of the stream."""
    clip = media.write_clip(tmp_path / "live.mp4", "noise", num_frames=16, fps=4, seed=77)
    run = subprocess.run([sys.executable, "-m", "sglang_evs.live_stream", str(clip), "--url", evs_server.base_url,
                          "--segment-s", "2", "--question", "What happens?", "--video-pruning-rate", "0.5",
                          "--as-fast-as-possible", "--max-new-tokens", "4"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    turns = re.findall(r"\[segment (\d)\] TTFT (\d+) ms, video tokens kept (\d+), pruned (\d+)", run.stdout)
    assert [index for index, *_ in turns] == ["0", "1"], run.stdout
    assert all(int(kept) == int(pruned) == 100 for _, _, kept, pruned in turns), turns  # q = .5 of 2 groups
    state = [event for event in trace.read(evs_trace, "stream_state") if "turn" not in event]
    assert state[-1]["held"] == 0 and state[-1]["bytes"] == 0, state[-1]  # closed: its end let go
