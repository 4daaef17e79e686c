"""Request-level SGLang features meeting video pruning (docs/compatibility.md): a pre-tokenized prompt with a
video (`input_ids`), `/v1/completions` with a video, input logprobs (`logprob_start_len`), and sessions
(`session_params`, streaming sessions, `--enable-session-radix-cache`).

An upstream server (`SGLANG_PLUGINS=none`) and a plugin server, float32, both with the session flags, serve
every case at q = 0, which must be bit-identical. Pruning (EVS at `RATE`, per request) runs on the plain
`tiny_server` where no flag is needed and on the plugin server where one is; it is compared with the same
prompt sent as text, with HF transformers given the kept rows at their positions (`hf_reference`), or with a
plain request. The videos have two temporal groups, and at `RATE` EVS keeps rows of both.
"""

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

# Imported when the module is collected, before any server starts: both set environment variables (cache
# directories), and a server started after such a change needs a warm interpreter of its own (warm_start.py).
from sglang.srt.entrypoints.openai.protocol import CompletionRequest
from transformers import AutoTokenizer

from sglang_evs.testing import media
from sglang_evs.testing.hf_reference import (
    HF_LOGPROB_TOLERANCE,
    assert_matches_hf,
    hf_prompt_logprobs,
    hf_session_greedy,
    hf_video_prompt,
)
from sglang_evs.testing.requests import VIDEO, chat_prompt, generate, logprob_gap, media_kwargs, per_request_rate
from sglang_evs.testing.server import Launch, running_servers

pytestmark = pytest.mark.slow

SESSION_FLAGS = ["--enable-streaming-session", "--enable-session-radix-cache"]
ARGS = ["--dtype", "float32", *SESSION_FLAGS]
RATE = 0.25  # 150 of 200 video rows kept: the first group whole, half of the second
TOLERANCE = 1e-4  # the same forwards scheduled otherwise (another server, a radix hit)
STEPS = 4
FOLLOW_UP = "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
LATER_VIDEO_TURN = f"<|im_end|>\n<|im_start|>user\n{VIDEO}Compare the two.<|im_end|>\n<|im_start|>assistant\n"
# A radix-native session's requests carry the whole conversation, a reply written by the client included.
CONVERSATION = chat_prompt(VIDEO) + "It moves." + FOLLOW_UP


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("request_features")
    return {
        "video": media.write_clip(out / "video.mp4", "noise", num_frames=8, fps=4, seed=21),
        "later": media.write_clip(out / "later.mp4", "noise", num_frames=8, fps=4, seed=22),
    }


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def post(base_url: str, path: str, body: dict) -> requests.Response:
    return requests.post(f"{base_url}{path}", json=body, timeout=300)


def completion(base_url: str, clip, rate: float) -> dict:
    """/v1/completions with a video named the way /generate names one: the choices and usage."""
    body = {"model": "tiny", "prompt": chat_prompt(VIDEO), "max_tokens": STEPS, "temperature": 0,
            "video_data": [str(clip)], **per_request_rate(rate)}  # fmt: skip
    reply = post(base_url, "/v1/completions", body)
    assert reply.status_code == 200, reply.text
    return {key: reply.json()[key] for key in ("choices", "usage")}


def input_logprobs(base_url: str, clip, rate: float, start: int) -> requests.Response:
    body = {"text": chat_prompt(VIDEO), "video_data": [str(clip)], "return_logprob": True, "logprob_start_len": start,
            "top_logprobs_num": 3, "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True},
            **per_request_rate(rate)}  # fmt: skip
    return post(base_url, "/generate", body)


def session_turns(base_url: str, clips, rate: float, streaming: bool, probe: bool = False) -> dict:
    """A video, a follow-up question, then a second video, as turns of one session (each turn carries only its
    own text and media; a non-streaming session names the turn it continues): their generations ("turns").
    `probe`: before the last turn, a turn asking for input logprobs from the session's first token, its reply."""
    session = f"{'streaming' if streaming else 'session'}-{rate}-{uuid.uuid4().hex[:8]}"
    opened = post(base_url, "/open_session", {"capacity_of_str_len": 100000, "session_id": session,
                                              "streaming": streaming})  # fmt: skip
    assert opened.status_code == 200, opened.text
    turns = [(chat_prompt(VIDEO), media_kwargs(videos=[clips["video"]])), (FOLLOW_UP, {}),
             (LATER_VIDEO_TURN, media_kwargs(videos=[clips["later"]]))]  # fmt: skip
    out: dict = {"turns": []}
    for index, (text, kwargs) in enumerate(turns):
        params = {"id": session} | ({} if streaming or index == 0 else {"rid": f"{session}-{index - 1}"})
        if probe and index == len(turns) - 1:
            body = {"text": FOLLOW_UP, "session_params": params, "return_logprob": True, "logprob_start_len": 0,
                    "sampling_params": {"max_new_tokens": 1}, **per_request_rate(rate)}  # fmt: skip
            out["probe"] = post(base_url, "/generate", body)
        reply = generate(base_url, text, STEPS, session_params=params, rid=f"{session}-{index}", **kwargs,
                         **per_request_rate(rate))  # fmt: skip
        out["turns"].append(reply[0])
    assert post(base_url, "/close_session", {"session_id": session}).status_code == 200
    return out


def radix_session(base_url: str, clips, rate: float) -> list:
    """A radix-native session (`--enable-session-radix-cache`, the top-level `session_id`): the video alone, then
    the whole conversation with it."""
    session = f"radix-{rate}-{uuid.uuid4().hex[:8]}"
    assert post(base_url, "/open_session", {"capacity_of_str_len": 100000, "session_id": session}).status_code == 200
    video = media_kwargs(videos=[clips["video"]])
    out = [generate(base_url, text, STEPS, session_id=session, **video, **per_request_rate(rate))[0]
           for text in (chat_prompt(VIDEO), CONVERSATION)]  # fmt: skip
    assert post(base_url, "/close_session", {"session_id": session}).status_code == 200
    return out


def pre_tokenized(base_url: str, clips, rate: float, tokenizer, logprob_start_len: int = -1) -> dict:
    """The video prompt sent as token ids: its output, prompt length and logprobs (input ones from
    `logprob_start_len`, where asked)."""
    ids = tokenizer.encode(chat_prompt(VIDEO))
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": logprob_start_len,
            "video_data": [str(clips["video"])], **per_request_rate(rate)}  # fmt: skip
    reply = post(base_url, "/generate", body)
    assert reply.status_code == 200, reply.text
    meta = reply.json()["meta_info"]
    logprobs = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs")
    return {"output_ids": reply.json()["output_ids"], "prompt_tokens": meta["prompt_tokens"]} | {
        key: meta[key] for key in logprobs if key in meta
    }


def unpruned_cases(base_url: str, clips, tokenizer) -> dict:
    """Every feature at q = 0, as both servers serve it (the pre-tokenized prompt with input logprobs from its
    first token)."""
    return {
        "input_ids and input logprobs": pre_tokenized(base_url, clips, 0.0, tokenizer, logprob_start_len=0),
        "completions": completion(base_url, clips["video"], 0.0),
        "session": session_turns(base_url, clips, 0.0, streaming=False)["turns"],
        "streaming session": session_turns(base_url, clips, 0.0, streaming=True)["turns"],
        "radix session": radix_session(base_url, clips, 0.0),
    }


def flagged_pruned_cases(base_url: str, clips) -> dict:
    """The pruned cases that need the session flags."""
    return {
        "streaming session": session_turns(base_url, clips, RATE, streaming=True)["turns"],
        "radix session": radix_session(base_url, clips, RATE),
    }


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, clips, tokenizer, tmp_path_factory) -> dict:
    """Every q = 0 case on both servers, and the pruned cases that need the session flags on the plugin's; the
    two servers serve at once (each one's results depend on nothing the other does)."""
    folder = tmp_path_factory.mktemp("request_feature_servers")
    launches = [Launch(tiny_model_dir, folder / "upstream.log", ARGS, {"SGLANG_PLUGINS": "none"}),
                Launch(tiny_model_dir, folder / "plugin.log", ARGS)]  # fmt: skip
    with running_servers(*launches) as (upstream, plugin), ThreadPoolExecutor(2) as pool:
        theirs = pool.submit(unpruned_cases, upstream.base_url, clips, tokenizer)
        ours = pool.submit(lambda: (unpruned_cases(plugin.base_url, clips, tokenizer),
                                    flagged_pruned_cases(plugin.base_url, clips)))  # fmt: skip
        (ours_unpruned, ours_pruned) = ours.result()
        return {("upstream", 0.0): theirs.result(), ("plugin", 0.0): ours_unpruned, ("plugin", RATE): ours_pruned}


def test_q0_each_feature_is_bit_identical_to_upstream(fleet):
    ours, upstream = fleet["plugin", 0.0], fleet["upstream", 0.0]
    assert ours.keys() == upstream.keys()
    for name in upstream:
        assert ours[name] == upstream[name], name


def test_input_ids_with_a_video_are_pruned_as_the_same_prompt_sent_as_text(tiny_server, fleet, clips, tokenizer):
    """SGLang decodes `input_ids` sent with media and lays the text out through the processor: with pruning, the
    pruning processor's layout, as the text prompt gets it."""
    text = generate(tiny_server.base_url, chat_prompt(VIDEO), STEPS, top_k=3, **media_kwargs(videos=[clips["video"]]),
                    **per_request_rate(RATE))[0]  # fmt: skip
    ids = pre_tokenized(tiny_server.base_url, clips, RATE, tokenizer)
    assert (ids["output_ids"], ids["prompt_tokens"]) == (text.output_ids, text.prompt_tokens)
    served = [entry[0] for entry in ids["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(served, text.logprobs, strict=True)) <= TOLERANCE
    assert ids["prompt_tokens"] < fleet["plugin", 0.0]["input_ids and input logprobs"]["prompt_tokens"]  # pruned


def test_completions_leave_a_video_out_as_upstream_does(tiny_server, fleet, clips, tokenizer):
    """SGLang 0.5.23's /v1/completions has no media field (its request model ignores unknown ones), so the video
    never reaches the processor: the prompt is served as text, the same at any rate, as upstream serves it."""
    assert not {"image_data", "video_data", "audio_data"} & set(CompletionRequest.model_fields)
    assert CompletionRequest.model_config.get("extra", "ignore") == "ignore"
    pruned = completion(tiny_server.base_url, clips["video"], RATE)
    assert pruned == fleet["upstream", 0.0]["completions"]
    assert pruned["usage"]["prompt_tokens"] == len(tokenizer.encode(chat_prompt(VIDEO)))  # no video rows


@pytest.fixture(scope="module")
def pruned_logprobs(tiny_server, clips, tiny_model_dir) -> dict:
    """Input logprobs asked from before the pruned video (refused) and from its end (served), the HF oracle's
    rows for the same kept prompt, and a request served after the refusals."""
    url, clip = tiny_server.base_url, clips["video"]
    prompt = hf_video_prompt(tiny_model_dir, clip, RATE)
    ids, rows = hf_prompt_logprobs(prompt)
    pads = prompt.is_pad.nonzero().flatten()
    after_video = len(prompt.ids) - int(pads.max()) - 1  # tokens after the last pad: never pruned
    end = len(ids) - after_video  # the pruned prompt's first token after the video
    refused = {start: input_logprobs(url, clip, RATE, start) for start in (0, end - 1)}  # before, inside
    served = input_logprobs(url, clip, RATE, end)
    assert served.status_code == 200, served.text
    return {"ids": ids, "rows": rows, "end": end, "refused": refused, "served": served.json()}


def test_input_logprobs_from_a_pruned_videos_end_are_the_hf_oracles(pruned_logprobs):
    """`logprob_start_len` indexes the served (pruned) prompt: one logprob per token from there, each the HF
    oracle's for that token given the kept prompt before it (the first is None, as SGLang returns it)."""
    ids, rows, end, meta = (pruned_logprobs[key] for key in ("ids", "rows", "end", "served"))
    meta = meta["meta_info"]
    tokens, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert meta["prompt_tokens"] == len(ids) and len(tokens) == len(tops) == len(ids) - end
    assert [token for _, token, _ in tokens] == ids[end:].tolist()
    assert tokens[0][0] is None and tops[0] is None
    for offset, ((logprob, token, _), top) in enumerate(zip(tokens[1:], tops[1:], strict=True), start=end):
        assert abs(logprob - float(rows[offset, token])) < HF_LOGPROB_TOLERANCE
        best = rows[offset].topk(3)
        assert [entry[1] for entry in top] == best.indices.tolist()
        assert max(abs(entry[0] - float(value)) for entry, value in zip(top, best.values, strict=True)) < 1e-3


def test_input_logprobs_over_a_pruned_video_are_refused_by_name_and_the_server_serves_on(pruned_logprobs):
    end = pruned_logprobs["end"]
    for start, reply in pruned_logprobs["refused"].items():
        assert reply.status_code == 400, (start, reply.text)
        message = reply.json()["error"]["message"]
        assert message.startswith(f"logprob_start_len={start}: input logprobs over a video pruned with ")
        assert f"video_pruning_rate={RATE} (evs)" in message and f"ask from logprob_start_len={end} on" in message
    assert "input_token_logprobs" in pruned_logprobs["served"]["meta_info"]  # served after the refusals


def test_a_session_turns_input_logprobs_over_its_pruned_video_are_refused_and_the_session_serves_on(pruned_session):
    """A turn's `logprob_start_len` indexes the whole session's prompt, a pruned video of an earlier turn in it:
    refused by the scheduler naming the setting; the next turn is served (and is the oracle's, below)."""
    reply = pruned_session["probe"]
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith("logprob_start_len=0: input logprobs over a video pruned with ")
    assert f"video_pruning_rate={RATE} (evs)" in message
    assert len(pruned_session["turns"]) == 3


@pytest.fixture(scope="module")
def pruned_session(tiny_server, clips) -> dict:
    return session_turns(tiny_server.base_url, clips, RATE, streaming=False, probe=True)


def test_a_session_continues_after_a_pruned_video_as_the_hf_oracle_does(
    pruned_session, clips, tiny_model_dir, tokenizer
):
    """Each turn of a session after a pruned video: the whole conversation so far (every earlier reply as
    served) in HF, the video rows kept at their positions; the second video in a later turn too (its rows moved
    past the history, `pruning/sessions.py`)."""
    first, follow_up, later = pruned_session["turns"]  # the first alone: test/models/test_evs_serving.py
    video, replied = (chat_prompt(VIDEO), clips["video"]), first.output_ids + tokenizer.encode(FOLLOW_UP)
    assert_matches_hf(follow_up, hf_session_greedy(tiny_model_dir, [video, replied], RATE, STEPS))
    later_video = (LATER_VIDEO_TURN, clips["later"])
    history = [video, replied + follow_up.output_ids, later_video]
    assert_matches_hf(later, hf_session_greedy(tiny_model_dir, history, RATE, STEPS))


def test_a_streaming_session_serves_what_a_session_serves(fleet, pruned_session):
    for streamed, turn in zip(fleet["plugin", RATE]["streaming session"], pruned_session["turns"], strict=True):
        assert (streamed.output_ids, streamed.prompt_tokens) == (turn.output_ids, turn.prompt_tokens)
        assert logprob_gap(streamed, turn) <= TOLERANCE


def test_a_radix_session_serves_what_each_request_serves_alone(fleet, tiny_server, clips):
    """A radix-native session's requests are whole prompts (the session only holds their KV in the radix
    cache): pruned as the same request without a session."""
    video = media_kwargs(videos=[clips["video"]])
    first, conversation = fleet["plugin", RATE]["radix session"]
    for served, text in ((first, chat_prompt(VIDEO)), (conversation, CONVERSATION)):
        alone = generate(tiny_server.base_url, text, STEPS, **video, **per_request_rate(RATE))[0]
        assert (served.output_ids, served.prompt_tokens) == (alone.output_ids, alone.prompt_tokens)
        assert logprob_gap(served, alone) <= TOLERANCE
