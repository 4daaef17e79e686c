"""SGLang serving features that touch positions, batches or embeddings, with the plugin (docs/compatibility.md).

One upstream server (`SGLANG_PLUGINS=none`) and one plugin server run with the same features on:
`--disable-overlap-schedule`, `--enable-mixed-chunk`, `--enable-priority-scheduling`,
`--enable-return-hidden-states` (they are independent, so one pair of servers covers them), 64-token chunks
that cut every video, float32. A third, plain plugin server is the reference under pruning.

- q = 0: every request sent alone is bit-identical to upstream with the same features (tokens, logprobs,
  top-5 logprobs, prompt length, returned hidden states).
- q = .75: tokens and prompt lengths equal the plain server's, logprobs within `TOLERANCE` (another
  scheduling of the same forwards: a radix hit's decode steps measured 1e-7 apart with overlap off).
- Request features, at both rates: `n` = 2, streaming, priorities, a mixed prefill+decode batch (seen in
  the trace), and an abort in the middle of a chunked video prefill, after which the server serves on.
"""

import json
import threading
import time

import pytest
import requests

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    chat_prompt,
    flush_cache,
    generate,
    logprob_gap,
    media_kwargs,
    per_request_rate,
)
from sglang_evs.testing.server import Launch, running_servers

pytestmark = pytest.mark.slow

FEATURES = [
    "--disable-overlap-schedule",
    "--enable-mixed-chunk",
    "--enable-priority-scheduling",
    "--enable-return-hidden-states",
]
ARGS = ["--dtype", "float32", "--chunked-prefill-size", "64"]
RATES = (0.0, 0.75)
TOLERANCE = 1e-4


def cases(clips) -> dict[str, tuple[str, dict]]:
    return {
        "text": (chat_prompt(text="Count to five."), {}),
        "image": (chat_prompt(IMAGE), media_kwargs(images=[clips["image"]])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]])),
        "image+video": (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[clips["image"]], videos=[clips["noise"]])),
    }


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    out = tmp_path_factory.mktemp("feature_media")
    return {
        "image": media.write_image(out / "image.png", seed=3),
        "moving": media.write_clip(out / "moving.mp4", "moving", num_frames=8, fps=4),
        "noise": media.write_clip(out / "noise.mp4", "noise", num_frames=8, fps=4),
        "long": media.write_clip(out / "long.mp4", "moving", num_frames=48, fps=4, seed=9),  # 19 chunks of 64
    }


def post(base_url: str, body: dict) -> dict | list:
    response = requests.post(f"{base_url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text[:2000]
    return response.json()


def greedy_body(prompt, rate: float, max_new_tokens: int = 8, **extra) -> dict:
    return {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        **per_request_rate(rate),
        **extra,
    }


def sequential(base_url: str, clips, rate: float, hidden_states: bool = True) -> dict:
    """Each case alone from an empty cache, then a radix repeat; hidden states of the image+video case."""
    flush_cache(base_url)
    out = {name: generate(base_url, prompt, **kwargs, **per_request_rate(rate))[0]
           for name, (prompt, kwargs) in cases(clips).items()}  # fmt: skip
    prompt, kwargs = cases(clips)["image+video"]
    out["radix repeat"] = generate(base_url, prompt, **kwargs, **per_request_rate(rate))[0]
    if hidden_states:
        hidden = post(base_url, greedy_body(prompt, rate, max_new_tokens=2, return_hidden_states=True, **kwargs))
        out["hidden states"] = hidden["meta_info"]["hidden_states"]
    return out


def request_features(base_url: str, clips, rate: float, trace_path=None) -> dict:
    """n = 2, streaming, priorities with a mixed prefill+decode batch; with a trace, an abort mid-prefill."""
    prompt, kwargs = cases(clips)["video"]
    out = {}
    flush_cache(base_url)
    body = greedy_body(prompt, rate, **kwargs)
    body["sampling_params"]["n"] = 2
    both = post(base_url, body)
    out["n=2"] = [(o["output_ids"], o["meta_info"]["prompt_tokens"]) for o in both]

    flush_cache(base_url)
    chunks = []
    with requests.post(f"{base_url}/generate", json=greedy_body(prompt, rate, stream=True, **kwargs), stream=True,
                       timeout=300) as reply:  # fmt: skip
        for line in reply.iter_lines():
            if line.startswith(b"data:") and line != b"data: [DONE]":
                chunks.append(json.loads(line[5:]))
    out["stream"] = (chunks[-1]["output_ids"], chunks[-1]["meta_info"]["prompt_tokens"])

    # A long decode (low priority) is running while the video (high priority) prefills in chunks: with
    # --enable-mixed-chunk its chunks share forwards with the decode.
    flush_cache(base_url)
    results: dict = {}
    text_prompt = cases(clips)["text"][0]
    decoder = threading.Thread(target=lambda: results.update(
        text=post(base_url, greedy_body(text_prompt, rate, max_new_tokens=600, priority=0))))  # fmt: skip
    decoder.start()
    time.sleep(0.3)
    results["video"] = post(base_url, greedy_body(prompt, rate, priority=10, **kwargs))
    decoder.join()
    out["concurrent"] = {name: (r["output_ids"][:8], r["meta_info"]["prompt_tokens"]) for name, r in results.items()}
    if trace_path is not None:
        out["abort"] = abort_mid_prefill(base_url, clips, rate, trace_path)
    return out


LONG_TEXT = " ".join(str(i) for i in range(600))  # about 1,500 tokens after the video: many more chunks


def abort_mid_prefill(base_url: str, clips, rate: float, trace_path) -> dict:
    """A long chunked request (a 12 s video, 1,200 tokens at q = 0, then long text) served whole, then
    aborted as soon as the trace shows its first media chunk embedded, then sent again (part of it may be
    in the radix cache now): the aborted reply's (finish reason, output tokens), and both served replies."""
    prompt = chat_prompt(VIDEO, text=LONG_TEXT)
    kwargs = media_kwargs(videos=[clips["long"]])
    flush_cache(base_url)
    whole = generate(base_url, prompt, **kwargs, **per_request_rate(rate))[0]
    flush_cache(base_url)
    rid = f"abort-me-{rate}"
    answer: dict = {}
    offset = trace_path.stat().st_size
    body = greedy_body(prompt, rate, rid=rid, **kwargs)
    sender = threading.Thread(target=lambda: answer.update(reply=requests.post(f"{base_url}/generate", json=body,
                                                                                timeout=300)))  # fmt: skip
    sender.start()
    deadline = time.monotonic() + 60
    while not media_embedded_since(trace_path, offset) and time.monotonic() < deadline:
        time.sleep(0.005)
    requests.post(f"{base_url}/abort_request", json={"rid": rid}, timeout=30).raise_for_status()
    sender.join()
    reply = answer["reply"].json()
    again = generate(base_url, prompt, **kwargs, **per_request_rate(rate))[0]
    aborted = (reply["meta_info"]["finish_reason"]["type"], len(reply.get("output_ids", [])))
    return {"aborted": aborted, "whole": whole, "again": again}


def media_embedded_since(trace_path, offset: int) -> bool:
    with open(trace_path) as out:
        out.seek(offset)
        return any('"embed_routine"' in line and json.loads(line)["media_rows"] for line in out)


@pytest.fixture(scope="module")
def served(tiny_model_dir, clips, tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    plans = {
        "upstream": ([*ARGS, *FEATURES], {"SGLANG_PLUGINS": "none"}, (0.0,)),
        "plugin": ([*ARGS, *FEATURES], {trace.ENV: str(folder / "trace.jsonl")}, RATES),
        "plain": (ARGS, {}, (0.75,)),
    }
    out: dict = {"trace": folder / "trace.jsonl"}
    launches = [Launch(tiny_model_dir, folder / f"{name}.log", args, env) for name, (args, env, _) in plans.items()]
    with running_servers(*launches) as servers:
        for server, (name, (_, _, rates)) in zip(servers, plans.items(), strict=True):
            for rate in rates:
                out[name, rate] = sequential(server.base_url, clips, rate, hidden_states=name != "plain")
                if name != "plain":
                    trace_path = out["trace"] if name == "plugin" else None
                    out[name, rate, "requests"] = request_features(server.base_url, clips, rate, trace_path)
                    out[name, rate, "after abort"] = sequential(server.base_url, clips, rate)
    return out


def test_q0_with_the_features_is_bit_identical_to_upstream_with_them(served):
    ours, upstream = served["plugin", 0.0], served["upstream", 0.0]
    assert ours.keys() == upstream.keys()
    for name in upstream:
        assert ours[name] == upstream[name], name
    ours, upstream = served["plugin", 0.0, "requests"], served["upstream", 0.0, "requests"]
    assert {name: ours[name] for name in upstream} == upstream  # the abort runs on the traced server only


def test_pruning_with_the_features_equals_the_plain_server(served):
    ours, plain = served["plugin", 0.75], served["plain", 0.75]
    for name in plain.keys() - {"hidden states"}:
        assert (ours[name].output_ids, ours[name].prompt_tokens) == (plain[name].output_ids, plain[name].prompt_tokens)
        gap = logprob_gap(ours[name], plain[name])
        assert gap <= TOLERANCE, (name, gap)
    assert ours["video"].prompt_tokens < served["plugin", 0.0]["video"].prompt_tokens  # pruning ran


@pytest.mark.parametrize("rate", RATES)
def test_request_features_serve_what_a_lone_request_serves(served, rate):
    alone = served["plugin", rate]["video"]
    features = served["plugin", rate, "requests"]
    expected = (alone.output_ids, alone.prompt_tokens)
    assert features["n=2"] == [expected, expected]
    assert features["stream"] == expected
    assert features["concurrent"]["video"] == expected
    assert features["concurrent"]["text"] == (served["plugin", rate]["text"].output_ids,
                                              served["plugin", rate]["text"].prompt_tokens)  # fmt: skip


def test_a_video_chunk_and_a_decode_row_shared_a_forward(served):
    """SGLang runs a mixed chunk as an extend forward whose decoding requests extend by one token."""
    mixed = [e for e in trace.read(served["trace"], "embed_routine")
             if any(e["media_rows"]) and 1 in e["extend_lens"] and max(e["extend_lens"]) > 1]  # fmt: skip
    assert mixed, "no forward held a video chunk and a decode row"


@pytest.mark.parametrize("rate", RATES)
def test_an_abort_during_a_chunked_video_prefill_loses_nothing(served, rate):
    abort = served["plugin", rate, "requests"]["abort"]
    assert abort["aborted"] == ("abort", 0)
    again, whole = abort["again"], abort["whole"]
    assert (again.output_ids, again.prompt_tokens) == (whole.output_ids, whole.prompt_tokens)
    assert logprob_gap(again, whole) <= TOLERANCE
    after, before = served["plugin", rate, "after abort"], served["plugin", rate]
    assert after == before  # every other request, from an empty cache, as before
