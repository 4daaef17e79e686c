"""A stream (`video_stream`, pruning/streams.py) in 29-token chunks on a graph-mode server: what HF transformers gives
the stream's prompt with the stream's mask, for Qwen3-VL (its timestamps continue), Qwen2.5-VL and Qwen2-VL (no
timestamps: the context pruning alone, at the positions HF gives the request's videos; SGLang bundles its videos in one
item); a
static stream at a threshold; a session's turns equal to the stream sent at once."""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.chunked import assert_every_forward_replayed, chunk_graph_args, traced_request
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.evs_oracle import kept_count
from sglang_evs.testing.hf_reference import (
    HF_LOGPROB_TOLERANCE,
    assert_matches_hf,
    assert_stream_masks_agree_up_to_ties,
    hf_stream_greedy,
    hf_stream_inputs,
    hf_untimestamped_stream_inputs,
    served_stream_masks,
)
from sglang_evs.testing.requests import VIDEO, chat_prompt, close_session, generate, open_session
from sglang_evs.testing.server import PRUNING_DEFAULT_ARGS, running_server

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)

CHUNK = 29  # cuts every segment (400 tokens on the tiny Qwen3-VL, 576 on the tiny Qwen2.5-VL) unevenly
GROUPS = 4  # a 16-frame 4 fps segment -> SGLang samples 8 frames -> 4 temporal groups


@dataclass(frozen=True)
class Family:
    model_fixture: str  # the tiny checkpoint's fixture (test/conftest.py)
    hf_layout: Callable  # the HF reference's layout of a stream's prompt (testing/hf_reference.py)
    tolerance: float  # served vs HF logprobs


FAMILIES = {
    "qwen3_vl": Family("tiny_model_dir", hf_stream_inputs, HF_LOGPROB_TOLERANCE),
    # SGLang's Qwen2.5-VL vision tower and transformers' round apart (test_qwen2_vl_evs.py's HF_TOLERANCE)
    "qwen2_5_vl": Family("tiny_qwen2_5_vl_dir", hf_untimestamped_stream_inputs, 5e-2),
    "qwen2_vl": Family("tiny_qwen2_vl_dir", hf_untimestamped_stream_inputs, 1e-3),  # as test_qwen2_vl_evs.py's
}
SETTINGS = [{"video_pruning_rate": 0.5}, {"video_pruning_threshold": 0.9}]


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory):
    """(family, model_dir, server, trace_path): one graph-mode server per family, prompts cut into 29-token chunks,
    a default rate that prunes (the plugin's prefill graphs are on only where it does; each request names its own)."""
    family = FAMILIES[request.param]
    model_dir = request.getfixturevalue(family.model_fixture)
    out = tmp_path_factory.mktemp(request.param)
    args = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK), *chunk_graph_args(CHUNK),
            "--enable-streaming-session", *PRUNING_DEFAULT_ARGS]  # fmt: skip
    env = {"SGLANG_EVS_TRACE": str(out / "trace.jsonl")}
    with running_server(model_dir, out / "server.log", args, env, graph_mode=True) as server:
        yield family, model_dir, server, out / "trace.jsonl"


@pytest.fixture(scope="module")
def segments(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Two 4-s segments (4 groups each) of one stream per kind: a static camera and fresh noise every frame (few
    near-ties in EVS's scores: the server's masks are the HF oracle's up to the rounding of Qwen2.5-VL's encoders)."""
    out = tmp_path_factory.mktemp("segments")
    made = {}
    for kind in ("static", "noise"):
        frames = media.clip_frames(kind, num_frames=32, seed=21)
        made[kind] = tuple(media.write_mp4(out / f"{kind}-{i}.mp4", frames[16 * i : 16 * (i + 1)]) for i in (0, 1))
    return made


def stream_request(server, clips, stream: bool = True, **settings):
    kwargs = {"video_stream": True, **settings} if stream else settings
    return generate(server.base_url, chat_prompt(*[VIDEO] * len(clips)), video_data=[str(c) for c in clips],
                    mm_processor_kwargs=kwargs)[0]  # fmt: skip


@pytest.mark.parametrize("setting", SETTINGS, ids=["q.5", "t.9"])
def test_a_stream_in_29_token_chunks_is_what_hf_gives_its_prompt_with_the_streams_mask(served, segments, setting):
    """The served greedy tokens and logprobs are HF's for the stream's prompt as served, with the rows the server kept,
    which are the stream rule's on HF's features of the segments (the second segment scored against the first's last
    group) up to ties of the two encoders' rounding (Qwen2.5-VL's differ by ~1e-3, and noise scores crowd a threshold
    of 0.9); every forward a graph replay, every segment cut across chunks. At a rate the second segment keeps
    int(T * tpf * (1 - q)) tokens, none of its groups whole."""
    family, model_dir, server, trace_path = served
    decided_before = len(trace.read(trace_path, "keep_mask"))
    ask = functools.partial(stream_request, server, segments["noise"], **setting)
    reply, events = traced_request(trace_path, ask)
    q, threshold = setting.get("video_pruning_rate"), setting.get("video_pruning_threshold")
    inputs = family.hf_layout(model_dir, segments["noise"])
    masks = served_stream_masks(trace.read(trace_path, "keep_mask")[decided_before:], inputs)
    assert_stream_masks_agree_up_to_ties(masks, inputs, q, threshold)
    reference = hf_stream_greedy(model_dir, segments["noise"], q, threshold, layout=family.hf_layout, masks=masks)
    assert_matches_hf(reply, reference, family.tolerance)
    assert_every_forward_replayed(reply, events, prefills=(reply.prompt_tokens - reply.cached_tokens) // CHUNK)
    tokens_per_group = reply.meta["video_tokens_before_pruning"] // (2 * GROUPS)
    assert 2 * GROUPS * tokens_per_group == reply.meta["video_tokens_before_pruning"]
    assert CHUNK < GROUPS * tokens_per_group  # the chunks cut each segment
    if q is not None:
        continued = int(GROUPS * tokens_per_group * (1 - q))
        assert reply.meta["video_tokens_after_pruning"] == kept_count(tokens_per_group, GROUPS, q) + continued


def test_two_static_segments_as_one_stream_keep_what_one_segment_keeps_at_a_threshold(served, segments):
    """The stream: its first group alone (the second segment changed nothing). Sent as two videos: a group each."""
    _, _, server, _ = served
    threshold = {"video_pruning_threshold": 0.05}
    one = stream_request(server, segments["static"][:1], stream=False, **threshold)
    stream = stream_request(server, segments["static"], **threshold)
    apart = stream_request(server, segments["static"], stream=False, **threshold)
    tokens_per_group = one.meta["video_tokens_before_pruning"] // GROUPS
    assert one.meta["video_tokens_after_pruning"] == stream.meta["video_tokens_after_pruning"] == tokens_per_group
    assert apart.meta["video_tokens_after_pruning"] == 2 * tokens_per_group


def turn_prompt(index: int) -> str:
    return chat_prompt(VIDEO, text=f"Segment {index}.")


@pytest.mark.parametrize("setting", SETTINGS, ids=["q.5", "t.9"])
def test_a_session_of_two_appended_segments_is_the_two_sent_at_once(served, segments, setting):
    """A streaming session, one segment per turn, the second marked `video_stream` (the first prefilled only, so that
    no reply enters the history): the second turn's prompt, kept tokens and greedy tokens are the one request's."""
    _, _, server, _ = served
    session = open_session(server.base_url)
    turns = []
    for index, (segment, max_new_tokens) in enumerate(zip(segments["noise"], (0, 8), strict=True)):
        marked = {**setting, "video_stream": True} if index else setting
        turns.append(generate(server.base_url, turn_prompt(index), max_new_tokens, video_data=[str(segment)],
                              mm_processor_kwargs=marked, session_params={"id": session})[0])  # fmt: skip
    close_session(server.base_url, session)
    at_once = generate(server.base_url, turn_prompt(0) + turn_prompt(1), 8,
                       video_data=[str(c) for c in segments["noise"]],
                       mm_processor_kwargs={**setting, "video_stream": True})[0]  # fmt: skip
    assert_same_greedy(turns[-1], at_once, setting)
    assert turns[-1].prompt_tokens == at_once.prompt_tokens
    kept = sum(turn.meta["video_tokens_after_pruning"] for turn in turns)
    assert kept == at_once.meta["video_tokens_after_pruning"] < at_once.meta["video_tokens_before_pruning"]
