"""Server-level SGLang flags with the plugin (docs/compatibility.md): paged KV, several tokenizer workers, a LoRA
adapter on the language model, and the hierarchical (host-memory) KV cache.

One upstream server (`SGLANG_PLUGINS=none`) and one plugin server run with every flag on at once (they are
independent: none changes what the others compute), a plain plugin server with the adapter only is the
reference under pruning:
- `--page-size 16`: the radix cache matches whole pages, over pruned layouts whose kept counts 16 does not
  divide; 64-token chunks cut the videos.
- `--tokenizer-worker-num 2`: each HTTP worker process tokenizes (and prunes) the requests it takes; every reply
  carries its own counts, and the Prometheus totals add up over both workers.
- `--enable-lora --lora-paths tiny=ADAPTER`: a random rank-4 adapter of every attention and MLP projection of
  the language model (`sglang_evs.testing.lora_adapter`), asked for per request (`lora_path`).
- `--enable-hierarchical-cache` over a 1,024-token device pool: written through to host memory, a prompt
  evicted from the device pool comes back from the host tier (`cached_tokens_details.host`).

- q = 0: each request is bit-identical to upstream with the same flags (tokens, logprobs, top-5 logprobs, prompt
  length, cached tokens by tier).
- q = .75: tokens and prompt lengths equal the plain server's, logprobs within `TOLERANCE` (paged radix hits and
  host-tier loads cut the forwards elsewhere).
"""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.lora_adapter import build_lora_adapter
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
    per_request_rate,
    pruning_metrics,
)
from sglang_evs.testing.server import Launch, running_servers

pytestmark = pytest.mark.slow

PAGE_SIZE = 16
DEVICE_TOKENS = 1024  # the hierarchical cache's device pool: a few long prompts evict a video from it
ARGS = ["--dtype", "float32", "--chunked-prefill-size", "64"]
RATES = (0.0, 0.75)
TOLERANCE = 1e-4
ADAPTER = "tiny"


def lora_args(adapter_dir) -> list[str]:
    return ["--enable-lora", "--lora-paths", f"{ADAPTER}={adapter_dir}", "--lora-backend", "torch_native"]


# uvicorn restarts a tokenizer worker that has not answered its first health check within 10 s, forever. The CPU route
# forks the workers (about 1 s), but each still loads the plugin and builds its TokenizerWorker, which on the busy
# 2-core machine has taken longer (spawned, as uvicorn does by default, the four workers took 52 s).
TOKENIZER_WORKERS_ENV = {"SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT": "120"}


def flag_args(adapter_dir) -> list[str]:
    return [
        "--page-size", str(PAGE_SIZE), "--tokenizer-worker-num", "2", "--enable-metrics",
        "--enable-hierarchical-cache", "--max-total-tokens", str(DEVICE_TOKENS), *lora_args(adapter_dir),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    out = tmp_path_factory.mktemp("flag_media")
    return {
        "image": media.write_image(out / "image.png", seed=3),
        "moving": media.write_clip(out / "moving.mp4", "moving", num_frames=8, fps=4),
        "noise": media.write_clip(out / "noise.mp4", "noise", num_frames=8, fps=4),
    }


def cases(clips) -> dict[str, tuple[str, dict]]:
    return {
        "text": (chat_prompt(text="Count to five."), {}),
        "image": (chat_prompt(IMAGE), media_kwargs(images=[clips["image"]])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]])),
        "image+video": (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[clips["image"]], videos=[clips["noise"]])),
    }


# Long distinct prompts: together more than the device pool, so the video's pages leave it (kept in host memory)
FILLERS = [chat_prompt(text=" ".join(f"{word}{i}" for i in range(60))) for word in ("apple", "river", "stone")]


def serve(base_url: str, clips, rate: float, evict: bool = True) -> dict:
    """Each case alone with the adapter from an empty cache; the video without it; the video again (a device
    radix hit); then, after prompts that evict it from the device pool (`evict`), once more (a host-tier hit)."""
    flush_cache(base_url)
    setting = {**per_request_rate(rate), "lora_path": ADAPTER}
    out = {name: generate(base_url, prompt, **kwargs, **setting)[0] for name, (prompt, kwargs) in cases(clips).items()}
    prompt, kwargs = cases(clips)["video"]
    out["video without the adapter"] = generate(base_url, prompt, **kwargs, **per_request_rate(rate))[0]
    out["radix repeat"] = generate(base_url, prompt, **kwargs, **setting)[0]
    for filler in FILLERS if evict else ():
        generate(base_url, filler, max_new_tokens=1, lora_path=ADAPTER)
    out["host repeat"] = generate(base_url, prompt, **kwargs, **setting)[0]
    return out


BURST = 8


def burst(base_url: str, clips, rate: float) -> list:
    """`BURST` pruned video requests at once, each on its own connection: the two tokenizer workers share them."""
    prompt, kwargs = cases(clips)["video"]
    replies: list = [None] * BURST

    def send(index: int) -> None:
        replies[index] = generate(base_url, prompt, **kwargs, **per_request_rate(rate))[0]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return replies


def processing_pids_since(trace_path, offset: int) -> set[int]:
    """The processes that ran the pruning processor (the tokenizer workers) after `offset` bytes of the trace."""
    with open(trace_path) as lines:
        lines.seek(offset)
        return {event["pid"] for event in map(json.loads, lines) if event["event"] == "processed"}


def stream_turn_in_a_session(base_url: str, clip) -> requests.Response:
    session = open_session(base_url, streaming=False)
    body = {"text": chat_prompt(VIDEO), "video_data": [str(clip)], "session_params": {"id": session},
            "mm_processor_kwargs": {"video_stream": True}, "sampling_params": {"max_new_tokens": 1}}  # fmt: skip
    try:
        return requests.post(f"{base_url}/generate", json=body, timeout=120)
    finally:
        close_session(base_url, session)


@pytest.fixture(scope="module")
def served(tiny_model_dir, clips, tmp_path_factory):
    folder = tmp_path_factory.mktemp("server_flags")
    adapter = build_lora_adapter(folder / "adapter", tiny_model_dir)
    plans = {
        "upstream": (flag_args(adapter), {"SGLANG_PLUGINS": "none", **TOKENIZER_WORKERS_ENV}, (0.0,)),
        "plugin": (flag_args(adapter), {trace.ENV: str(folder / "trace.jsonl"), **TOKENIZER_WORKERS_ENV}, RATES),
        "plain": (lora_args(adapter), {}, (0.75,)),
    }
    out: dict = {"trace": folder / "trace.jsonl"}
    launches = [Launch(tiny_model_dir, folder / f"{name}.log", [*ARGS, *args], env)
                for name, (args, env, _) in plans.items()]  # fmt: skip

    def serve_all(server, name: str, rates: tuple[float, ...]) -> None:
        for rate in rates:
            out[name, rate] = serve(server.base_url, clips, rate, evict=name != "plain")
        if name == "plugin":  # bursts until both workers took some (which one accepts a connection is the OS's)
            before, offset = pruning_metrics(server.base_url), out["trace"].stat().st_size
            out["burst"] = []
            while len(out["burst"]) < 3 * BURST and len(processing_pids_since(out["trace"], offset)) < 2:
                out["burst"] += burst(server.base_url, clips, 0.75)
            out["counted"] = counter_increase(before, pruning_metrics(server.base_url))
            out["burst workers"] = processing_pids_since(out["trace"], offset)
            out["stream in a session"] = stream_turn_in_a_session(server.base_url, clips["moving"])

    with running_servers(*launches) as servers, ThreadPoolExecutor(len(servers)) as pool:
        # each server serves its requests in order, the three at once
        done = [pool.submit(serve_all, server, name, rates)
                for server, (name, (_, _, rates)) in zip(servers, plans.items(), strict=True)]  # fmt: skip
        for future in done:
            future.result()
    return out


def test_q0_with_the_flags_is_bit_identical_to_upstream_with_them(served):
    ours, upstream = served["plugin", 0.0], served["upstream", 0.0]
    assert ours.keys() == upstream.keys()
    for name in upstream:
        assert ours[name] == upstream[name], name
        assert ours[name].meta.get("cached_tokens_details") == upstream[name].meta.get("cached_tokens_details"), name


def test_pruning_with_the_flags_equals_the_plain_server_with_the_adapter(served):
    ours, plain = served["plugin", 0.75], served["plain", 0.75]
    for name in plain:
        assert (ours[name].output_ids, ours[name].prompt_tokens) == (plain[name].output_ids, plain[name].prompt_tokens)
        assert logprob_gap(ours[name], plain[name]) <= TOLERANCE, name
    assert ours["video"].prompt_tokens < served["plugin", 0.0]["video"].prompt_tokens  # pruning ran


@pytest.mark.parametrize("rate", RATES)
def test_the_adapter_changes_what_is_served(served, rate):
    """The adapter is applied (else every comparison above would hold for a server that ignored it)."""
    ours = served["plugin", rate]
    assert ours["video"].output_ids != ours["video without the adapter"].output_ids


@pytest.mark.parametrize("rate", RATES)
def test_radix_hits_match_whole_pages_of_the_pruned_layout(served, rate):
    ours = served["plugin", rate]
    video = ours["video"]
    assert video.meta["video_tokens"] % PAGE_SIZE and video.prompt_tokens % PAGE_SIZE  # kept counts 16 does not divide
    repeat = ours["radix repeat"]
    assert repeat.cached_tokens == video.prompt_tokens // PAGE_SIZE * PAGE_SIZE  # every whole page of the prompt
    assert (repeat.output_ids, repeat.prompt_tokens) == (video.output_ids, video.prompt_tokens)
    assert logprob_gap(repeat, video) <= TOLERANCE


@pytest.mark.parametrize("rate", RATES)
def test_a_prompt_evicted_to_host_memory_comes_back_from_the_host_tier(served, rate):
    ours = served["plugin", rate]
    again, first = ours["host repeat"], ours["video"]
    tiers = again.meta["cached_tokens_details"]
    assert tiers["host"] > 0, tiers
    assert (again.output_ids, again.prompt_tokens) == (first.output_ids, first.prompt_tokens)
    assert logprob_gap(again, first) <= TOLERANCE


def test_every_tokenizer_worker_counts_what_it_pruned(served):
    """Each reply of concurrent bursts carries its video's counts, whichever worker tokenized it, both workers
    pruned some (their pids in the trace), and the Prometheus counters (summed over the worker processes by
    SGLang's multiprocess collector) grew by exactly the bursts' counts."""
    alone = served["plain", 0.75]["video"].meta
    counts = ("video_tokens_before_pruning", "video_tokens_after_pruning")
    replies = served["burst"]
    for reply in replies:
        assert {key: reply.meta[key] for key in counts} == {key: alone[key] for key in counts}
    assert len(served["burst workers"]) == 2, served["burst workers"]
    assert served["counted"] == {
        "video_tokens_before_pruning": len(replies) * alone["video_tokens_before_pruning"],
        "video_tokens_after_pruning": len(replies) * alone["video_tokens_after_pruning"],
        "pruned_videos": len(replies),
    }


def test_a_stream_in_a_session_across_tokenizer_workers_gets_400_naming_the_flag(served):
    """Each tokenizer worker keeps its own sessions' streams, and a session's turns may reach either."""
    response = served["stream in a session"]
    assert response.status_code == 400 and "serve with --tokenizer-worker-num 1" in response.text, response.text
