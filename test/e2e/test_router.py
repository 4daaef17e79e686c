"""`sglang-router` (cache-aware) in front of two workers started with the plugin, EVS on.

The workers' default rate is q = .5; the router runs as the README's recipe starts it (cache-aware, with
the balance thresholds that spread a burst of media requests). sglang-router 0.3.2 rebuilds each
request from its own typed fields: it drops `mm_processor_kwargs` (the last test pins that) and
forwards a chat request's `chat_template_kwargs`, where the plugin also reads a per-request rate
(README, docs/scaling.md).
"""

import dataclasses
from contextlib import ExitStack

import pytest
import requests

from sglang_evs.testing import media, workload
from sglang_evs.testing.media import TOKENS_PER_GROUP
from sglang_evs.testing.requests import (
    VIDEO,
    chat_prompt,
    close_session,
    counter_increase,
    generate,
    media_kwargs,
    open_session,
    pruning_metrics,
    served_requests,
)
from sglang_evs.testing.router import MEDIA_BALANCE_ARGS, healthy_workers, running_router, worker_args
from sglang_evs.testing.server import Launch, running_servers

pytestmark = pytest.mark.slow

REQUESTS = 64
SERVER_RATE = 0.5
REQUEST_RATES = (0.25, 0.75)
IMAGE_RATE = 0.75
WORKER_ARGS = [*worker_args(SERVER_RATE), "--enable-streaming-session"]  # sessions: the last test


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return workload.write_media(tmp_path_factory.mktemp("router_media"))


@pytest.fixture(scope="module")
def request_set(files):
    # text, an image pruned at 0.75, a video at two rates
    return workload.mixed_requests(files, REQUESTS, video_rates=REQUEST_RATES, image_rate=IMAGE_RATE)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("router")
    launches = [Launch(tiny_model_dir, folder / f"worker{i}.log", WORKER_ARGS) for i in range(2)]
    with running_servers(*launches) as workers, ExitStack() as stack:
        urls = [w.base_url for w in workers]
        router = stack.enter_context(running_router(urls, folder / "router.log", extra=MEDIA_BALANCE_ARGS))
        yield router, workers


@pytest.fixture(scope="module")
def reference(cluster, request_set):
    """The request set, as chat requests, from one worker on its own (sent to it directly, not through the
    router), and its counters' increase."""
    _, workers = cluster
    before = pruning_metrics(workers[0].base_url)
    answers = workload.send_concurrently(workers[0].base_url, request_set, sender=workload.send_chat)
    return answers, counter_increase(before, pruning_metrics(workers[0].base_url))


def test_64_mixed_chat_requests_at_two_rates_through_the_router_match_one_worker(cluster, reference, request_set):
    router, workers = cluster
    urls = [worker.base_url for worker in workers]
    assert sorted(healthy_workers(router.base_url)) == sorted(urls)
    answers, counted = reference
    before, served_before = pruning_metrics(*urls), [served_requests(url) for url in urls]
    routed = workload.send_concurrently(router.base_url, request_set, sender=workload.send_chat)
    assert not [r.name for r, out in zip(request_set, routed, strict=True) if isinstance(out, Exception)]
    assert counter_increase(before, pruning_metrics(*urls)) == counted
    # the 48 media requests share one text, so without the balance thresholds they all go to one worker
    # and the 16 text requests to the other (docs/benchmarks.md); with them the burst spreads
    served = [served_requests(url) - b for url, b in zip(urls, served_before, strict=True)]
    assert sum(served) == REQUESTS
    assert min(served) > REQUESTS // 4, served
    assert counted["pruned_videos"] == REQUESTS // 2
    for request, one, through in zip(request_set, answers, routed, strict=True):
        assert through == one, request.name  # the answer and the prompt length
    # each request's own rate applied, not the workers' q = .5: q = .75 leaves the shorter prompt
    prompt_tokens = {
        (r.videos, r.rate): out.prompt_tokens for r, out in zip(request_set, routed, strict=True) if r.videos
    }
    for clip in {videos for videos, _ in prompt_tokens}:
        assert prompt_tokens[clip, 0.75] < prompt_tokens[clip, 0.25]
    # and the images' rate too (the workers prune no image by default): 16 of a 64-token image kept
    image, through = next((r, out) for r, out in zip(request_set, routed, strict=True) if r.images)
    unpruned = workload.send_chat(workers[0].base_url, dataclasses.replace(image, rate=None), 8)
    assert unpruned.prompt_tokens - through.prompt_tokens == 64 - 16


def test_the_same_video_twice_is_served_from_one_workers_radix_cache(cluster, tmp_path):
    router, _ = cluster
    clip = media.write_clip(tmp_path / "fresh.mp4", "noise", num_frames=16, fps=4, seed=99)
    prompt, kwargs = chat_prompt(VIDEO, text="What changes?"), media_kwargs(videos=[clip])
    first = generate(router.base_url, prompt, **kwargs)[0]
    again = generate(router.base_url, prompt, **kwargs)[0]
    assert first.meta["video_pruning_rate"] == SERVER_RATE
    assert first.cached_tokens < 20  # only the chat template's text was seen before
    assert again.cached_tokens >= first.prompt_tokens - 1  # every token but the last, on the same worker
    assert again.output_ids == first.output_ids


def test_router_drops_a_per_request_rate_and_the_workers_default_applies(cluster, files):
    """sglang-router 0.3.2 behaviour; when a release forwards `mm_processor_kwargs`, this fails and the
    docs can drop the `chat_template_kwargs` detour."""
    router, workers = cluster
    request = workload.mixed_requests(files, 4, video_rates=(None, 0.75))[3]
    assert request.extra["mm_processor_kwargs"] == {"video_pruning_method": "evs", "video_pruning_rate": 0.75}
    direct = workload.send(workers[0].base_url, request)
    routed = workload.send(router.base_url, request)
    assert direct.meta["video_pruning_rate"] == 0.75
    assert routed.meta["video_pruning_rate"] == SERVER_RATE
    assert routed.prompt_tokens > direct.prompt_tokens


def test_a_stream_marked_in_a_chat_request_through_the_router_is_pruned_as_one_video(cluster, tmp_path):
    """`video_stream` in `chat_template_kwargs`, the field the router forwards: two static segments through the
    router keep one frame group, as the same stream sent to a worker directly; unmarked, one group per segment."""
    router, workers = cluster
    frames = media.clip_frames("static", num_frames=32, seed=21)
    segments = [media.write_mp4(tmp_path / f"static-{i}.mp4", frames[16 * i : 16 * (i + 1)]) for i in (0, 1)]

    def chat(base_url: str, **settings) -> dict:
        content = [*({"type": "video_url", "video_url": {"url": f"file://{s}"}} for s in segments),
                   {"type": "text", "text": "What changes?"}]  # fmt: skip
        body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 2,
                "temperature": 0, "chat_template_kwargs": {"video_pruning_threshold": 0.05, **settings}}  # fmt: skip
        response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
        response.raise_for_status()
        return response.json()["usage"]

    streamed, apart = chat(router.base_url, video_stream=True), chat(router.base_url)
    direct = chat(workers[0].base_url, video_stream=True)
    assert streamed["prompt_tokens"] == direct["prompt_tokens"]
    assert streamed["prompt_tokens_details"]["video_tokens"] == TOKENS_PER_GROUP
    assert apart["prompt_tokens_details"]["video_tokens"] == 2 * TOKENS_PER_GROUP


def chat_turn(base_url: str, session: str, index: int, segment, session_params: dict) -> dict:
    """One segment of a stream as a chat turn of `session`, the routing key its id (a manual-policy router keeps it
    on one worker)."""
    content = [
        {"type": "video_url", "video_url": {"url": f"file://{segment}"}},
        {"type": "text", "text": f"Part {index}."},
    ]
    body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0,
            "session_params": {"id": session, **session_params},
            "chat_template_kwargs": {"video_pruning_rate": 0.5, "video_stream": bool(index)}}  # fmt: skip
    reply = requests.post(f"{base_url}/v1/chat/completions", json=body, headers={"X-SMG-Routing-Key": session},
                          timeout=300)  # fmt: skip
    return {"status": reply.status_code, **(reply.json() if reply.status_code == 200 else {"text": reply.text})}


def test_a_stream_turn_by_turn_behind_the_router_opens_and_closes_its_own_session(cluster, tmp_path):
    """sglang-router routes no `/open_session` (404): behind a manual-policy router, the first turn opens its
    streaming session on the worker its routing key reaches (`session_params.open`), the last closes it
    (`session_params.close`). Every turn equals the same turn of a session opened and closed by hand on one worker;
    after the close, a turn naming the session is refused."""
    _, workers = cluster
    frames = media.clip_frames("noise", num_frames=24, seed=61)
    segments = [media.write_mp4(tmp_path / f"part{i}.mp4", frames[8 * i : 8 * (i + 1)]) for i in range(3)]
    by_hand = open_session(workers[0].base_url)
    reference = [chat_turn(workers[0].base_url, by_hand, i, s, {}) for i, s in enumerate(segments)]
    close_session(workers[0].base_url, by_hand)
    ends = [{"open": {"streaming": True}}, {}, {"close": True}]
    with running_router([w.base_url for w in workers], tmp_path / "manual.log", policy="manual") as router:
        assert requests.post(f"{router.base_url}/open_session", json={}, timeout=30).status_code == 404
        routed = [chat_turn(router.base_url, "routed-stream", i, s, ends[i]) for i, s in enumerate(segments)]
        after_close = chat_turn(router.base_url, "routed-stream", 0, segments[2], {})
    for index, (got, want) in enumerate(zip(routed, reference, strict=True)):
        assert got["status"] == 200 == want["status"], (index, got, want)
        assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"], index
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"], index
    assert routed[-1]["usage"]["prompt_tokens"] > routed[0]["usage"]["prompt_tokens"]  # one history
    assert after_close["status"] == 400 and "does not exist" in after_close["text"], after_close
