"""Streams on a server short of KV memory: many at once, the scheduler retracting running requests (their KV freed,
their prompts prefilled again later) and evicting sessions' history from the radix cache, every reply what the same
stream gets alone; and afterwards nothing of them held, in the scheduler (`pruning/holds.py`) or the tokenizer
(`pruning/stream_sessions.py`), streams aborted mid-segment and sessions closed with a turn running included."""

import functools
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests

from sglang_evs import trace
from sglang_evs.pruning import holds
from sglang_evs.testing import media
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.held import assert_no_stream_state
from sglang_evs.testing.held import assert_nothing_held as assert_no_rows_held
from sglang_evs.testing.requests import (
    VIDEO,
    chat_prompt,
    close_session,
    flush_cache,
    generate,
    metric_total,
    open_session,
)
from sglang_evs.testing.server import running_server
from sglang_evs.testing.workload import (
    FORWARD_HOLD_S,
    all_arrived,
    arrivals,
    send_alone,
    send_case,
    send_together,
    sent_while_held,
    slow_down,
)

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)

KV_TOKENS = 1024  # a stream's prompt is ~250-400 tokens: six at once need twice the pool
REPLY = 48
SETTINGS = ({"video_pruning_rate": 0.5}, {"video_pruning_threshold": 0.9}, {"video_pruning_rate": 0.75})
RETRACTED = "sglang:num_retracted_requests_total"


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pressure") / "trace.jsonl"


@pytest.fixture(scope="module")
def tight_server(tiny_model_dir, trace_path):
    """A KV pool of 1024 tokens whose running requests are retracted every 10th forward, 64-token chunks, no
    embedding cache (a retracted request's videos are encoded again, through the plugin's holds), streaming sessions
    on."""
    args = ["--dtype", "float32", "--max-total-tokens", str(KV_TOKENS), "--chunked-prefill-size", "64",
            "--enable-streaming-session", "--enable-metrics", "--max-running-requests", "8"]  # fmt: skip
    # SGLang's own switch for testing retraction: the running batch retracted every 10th forward, as a full pool
    # retracts it (a CPU pool this small admits one request at a time, never running short by itself)
    retract = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "10"}
    env = {trace.ENV: str(trace_path), "SGLANG_VLM_CACHE_SIZE_MB": "0", **retract}
    with running_server(tiny_model_dir, trace_path.parent / "server.log", args, env) as server:
        yield server


@pytest.fixture(scope="module")
def streams(tmp_path_factory) -> list[tuple[Path, Path]]:
    """Six streams of two 2-s segments each, of fresh noise (no near-ties in EVS's scores)."""
    out = tmp_path_factory.mktemp("pressure_streams")
    made = []
    for index in range(6):
        frames = media.clip_frames("noise", num_frames=16, seed=100 + index)
        made.append(tuple(media.write_mp4(out / f"s{index}-{i}.mp4", frames[8 * i : 8 * (i + 1)]) for i in (0, 1)))
    return made


def stream_request(server, segments, settings: dict):
    return generate(server.base_url, chat_prompt(VIDEO, VIDEO, text="What happens?"), REPLY,
                    video_data=[str(s) for s in segments],
                    mm_processor_kwargs={**settings, "video_stream": True})[0]  # fmt: skip


def retracted(server) -> float:
    return metric_total(requests.get(f"{server.base_url}/metrics", timeout=30).text, RETRACTED)


def assert_nothing_held(trace_path: Path, sessions: bool = True) -> None:
    """Neither the scheduler's held rows nor the tokenizer's stream state (where sessions ran) keep anything."""
    assert_no_rows_held(trace_path)
    if sessions:
        assert_no_stream_state(trace_path)


def test_streams_retracted_under_memory_pressure_are_served_as_alone(tight_server, streams, trace_path):
    cases = [(segments, SETTINGS[index % len(SETTINGS)]) for index, segments in enumerate(streams)]
    alone = []
    for segments, settings in cases:
        flush_cache(tight_server.base_url)
        alone.append(stream_request(tight_server, segments, settings))
    flush_cache(tight_server.base_url)
    retracted_before = retracted(tight_server)
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        together = list(pool.map(lambda case: stream_request(tight_server, *case), cases))
    assert retracted(tight_server) > retracted_before, "no request was retracted: the pool is not short"
    for index, (got, want) in enumerate(zip(together, alone, strict=True)):
        assert_same_greedy(got, want, (index, cases[index][1]))
        assert got.meta["video_tokens_after_pruning"] == want.meta["video_tokens_after_pruning"]
    assert_nothing_held(trace_path, sessions=False)


def test_sessions_at_once_evicted_and_aborted_leave_nothing_held(tight_server, streams, trace_path):
    """Three sessions appended to at once, segment by segment, their histories more than the pool holds beside each
    other: evicted from the radix cache, a turn prefills its history again, continued segments encoded again with
    their context. Sessions opened without streaming, whose history the radix cache may evict (a streaming session
    locks its history's KV: three of them here would wait on each other for the pool, upstream as well). Each
    session's last turn is what its segments sent at once give; then a session closed with a turn running and a
    stream aborted mid-prefill: nothing held, and the server serves on."""

    def run_session(segments) -> tuple:
        session, parent, replies = open_session(tight_server.base_url, streaming=False), None, []
        for index, segment in enumerate(segments):
            settings = {"video_pruning_rate": 0.5, **({"video_stream": True} if index else {})}
            replies.append(
                generate(
                    tight_server.base_url,
                    chat_prompt(VIDEO, text=f"Segment {index}."),
                    0 if index < len(segments) - 1 else 8,
                    video_data=[str(segment)],
                    mm_processor_kwargs=settings,
                    session_params={"id": session, "rid": parent},
                )[0]
            )
            parent = replies[-1].meta["id"]  # fmt: skip
        close_session(tight_server.base_url, session)
        return replies[-1]

    long_streams = [(*streams[i], *streams[i + 3]) for i in range(3)]  # four segments each
    with ThreadPoolExecutor(max_workers=3) as pool:
        lasts = list(pool.map(run_session, long_streams))
    assert any(last.cached_tokens < last.prompt_tokens // 2 for last in lasts), "no session's history was evicted"
    for segments, last in zip(long_streams, lasts, strict=True):
        flush_cache(tight_server.base_url)
        at_once = generate(tight_server.base_url, "".join(chat_prompt(VIDEO, text=f"Segment {i}.") for i in range(4)),
                           8, video_data=[str(s) for s in segments],
                           mm_processor_kwargs={"video_pruning_rate": 0.5, "video_stream": True})[0]  # fmt: skip
        assert_same_greedy(last, at_once, segments[0].name)
        assert last.prompt_tokens == at_once.prompt_tokens
    abort_mid_flight(tight_server, streams[0])
    unseen = media.write_clip(trace_path.parent / "unseen.mp4", "noise", num_frames=16, fps=4, seed=200)
    abort_a_session_turn_mid_prefill(tight_server, trace_path, unseen)
    assert_nothing_held(trace_path)
    assert tight_server.alive() and stream_request(tight_server, streams[1], SETTINGS[0]).output_ids


def abort_mid_flight(server, segments) -> None:
    """A session whose second turn is running (forwards held back) when the session is closed, and a stream request
    aborted mid-prefill."""
    session = open_session(server.base_url)
    generate(server.base_url, chat_prompt(VIDEO), 1, video_data=[str(segments[0])], session_params={"id": session},
             mm_processor_kwargs={"video_pruning_rate": 0.5})  # fmt: skip
    slow_down(server.base_url, FORWARD_HOLD_S)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            turn = pool.submit(requests.post, f"{server.base_url}/generate", timeout=300, json={
                "text": chat_prompt(VIDEO), "video_data": [str(segments[1])], "session_params": {"id": session},
                "mm_processor_kwargs": {"video_pruning_rate": 0.5, "video_stream": True},
                "sampling_params": {"max_new_tokens": 4}})  # fmt: skip
            stream = pool.submit(requests.post, f"{server.base_url}/generate", timeout=300, json={
                "text": chat_prompt(VIDEO, VIDEO), "video_data": [str(s) for s in segments], "rid": "aborted-stream",
                "mm_processor_kwargs": {"video_pruning_rate": 0.5, "video_stream": True},
                "sampling_params": {"max_new_tokens": 4}})  # fmt: skip
            time.sleep(4 * FORWARD_HOLD_S)
            close_session(server.base_url, session)
            requests.post(f"{server.base_url}/abort_request", json={"rid": "aborted-stream"}, timeout=30)
            slow_down(server.base_url, None)
            turn.result(), stream.result()
    finally:
        slow_down(server.base_url, None)


def abort_a_session_turn_mid_prefill(server, trace_path: Path, segment: Path) -> None:
    """A session's turn aborted once its video is held (300 kept tokens: five 64-token chunks, forwards held back), its
    session left open: SGLang drops a session turn's media without `release_features`."""
    session, held_before = open_session(server.base_url, streaming=False), len(trace.read(trace_path, "video_held"))
    slow_down(server.base_url, FORWARD_HOLD_S)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            turn = pool.submit(requests.post, f"{server.base_url}/generate", timeout=300, json={
                "text": chat_prompt(VIDEO), "video_data": [str(segment)], "rid": "aborted-turn",
                "session_params": {"id": session}, "mm_processor_kwargs": {"video_pruning_rate": 0.25},
                "sampling_params": {"max_new_tokens": 4}})  # fmt: skip
            deadline = time.monotonic() + 60
            while len(trace.read(trace_path, "video_held")) == held_before and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(trace.read(trace_path, "video_held")) > held_before, "the turn's video was never held"
            requests.post(f"{server.base_url}/abort_request", json={"rid": "aborted-turn"}, timeout=30)
            slow_down(server.base_url, None)
            turn.result()
    finally:
        slow_down(server.base_url, None)


# Holds bounded to about one video's rows (a 400-token noise clip at q = .5 keeps 200 rows of the tiny model's
# 64-wide hidden state and its two deepstack levels: 150 KB)
ONE_VIDEO_MB = 0.25


@pytest.fixture(scope="module")
def one_video_bound(tiny_model_dir, tmp_path_factory):
    """(server, trace): a hold bound that fits one video's rows, no embedding cache, 48-token chunks."""
    out = tmp_path_factory.mktemp("one_video_bound")
    env = {trace.ENV: str(out / "trace.jsonl"), "SGLANG_VLM_CACHE_SIZE_MB": "0", holds.BOUND_ENV: str(ONE_VIDEO_MB)}
    args = ["--dtype", "float32", "--chunked-prefill-size", "48"]
    with running_server(tiny_model_dir, out / "server.log", args, env) as server:
        yield server, out / "trace.jsonl"


def test_concurrent_videos_past_the_hold_bound_are_served_as_alone(one_video_bound, tmp_path):
    """Three chunked videos prefilled together where the holds fit one: every request is served as it is alone, the
    holds never past their bound, nothing held afterwards. (The scheduler stopped here once: a video held at the
    start of a forward and let go by another's hold in that forward was handed to SGLang as None.)"""
    server, trace_path = one_video_bound
    clips = [
        media.write_clip(tmp_path / f"c{seed}.mp4", "noise", num_frames=16, fps=4, seed=seed) for seed in (7, 8, 9)
    ]
    cases = [(chat_prompt(VIDEO), {"video_data": [str(clip)]}, 0.5) for clip in clips]
    alone = send_alone(server.base_url, cases)
    held_before = len(trace.read(trace_path, "video_held"))
    together, batched = send_together(server.base_url, cases, trace_path)
    assert batched[0] > 0, "the videos were never prefilled in one forward"
    for index, (got, want) in enumerate(zip(together, alone, strict=True)):
        assert_same_greedy(got, want, index)
    held = [event["held_bytes"] for event in trace.read(trace_path, "video_held")[held_before:]]
    assert held and max(held) <= ONE_VIDEO_MB * 2**20, held
    assert_no_rows_held(trace_path)
    assert server.alive()


def test_past_the_hold_bound_each_video_is_encoded_at_most_twice_per_request(one_video_bound, tmp_path):
    """Four videos of about eight 48-token chunks each, two waiting for a threshold (encoded as the scheduler admits
    them), sent at once where the holds fit one video: alone, each is encoded once; together, a video whose room an
    older request holds is not held, and its request encodes it again at its own first chunk, never a third time;
    every answer as alone."""
    server, trace_path = one_video_bound
    settings = ({"video_pruning_rate": 0.5}, {"video_pruning_threshold": 0.9})
    cases = [
        (chat_prompt(VIDEO), {"video_data": [str(media.write_clip(tmp_path / f"long{seed}.mp4", "noise",
                                                                   num_frames=16, fps=4, seed=seed))]},
         settings[index % 2])
        for index, seed in enumerate(range(40, 44))
    ]  # fmt: skip
    before = len(trace.read(trace_path, "video_encoded"))
    alone = send_alone(server.base_url, cases)
    assert set(encodes(trace_path, before).values()) == {1}, "alone, a video was encoded more than once"
    flush_cache(server.base_url)
    before, arrived = len(trace.read(trace_path, "video_encoded")), arrivals(trace_path)
    not_held_before = len(trace.read(trace_path, "video_not_held"))
    together = sent_while_held(server.base_url, functools.partial(send_case, server.base_url), cases,
                               lambda: all_arrived(trace_path, arrived, len(cases)))  # fmt: skip
    counts = encodes(trace_path, before)
    assert len(counts) == len(cases) and max(counts.values()) <= 2, counts
    assert trace.read(trace_path, "video_not_held")[not_held_before:], "every video was held: the bound does not bind"
    for index, (got, want) in enumerate(zip(together, alone, strict=True)):
        assert_same_greedy(got, want, (index, cases[index][2]))
    assert_no_rows_held(trace_path)


def encodes(trace_path: Path, before: int) -> Counter:
    """How many times each video key went through the tower since the trace's first `before` encodes."""
    return Counter(key for event in trace.read(trace_path, "video_encoded")[before:] for key in event["items"])


SOAK_ROUNDS = 10
RSS_MARGIN_MB = 64  # the tokenizer's and the scheduler's resident memory after the soak, beside after its first round


def server_rss_mb(server) -> dict[str, float]:
    """Resident memory of the server's tokenizer (its main process) and scheduler, in MB: the processes the plugin's
    load announced in the log (`pid N, in run_scheduler_process`)."""
    roles = dict(re.findall(r"plugin loaded \(sglang [\d.]+, pid (\d+), in (\S+)\)", server.log()))
    schedulers = [int(pid) for pid, role in roles.items() if role == "run_scheduler_process"]
    assert len(schedulers) == 1, roles
    pids = {"tokenizer": server.process.pid, "scheduler": schedulers[0]}
    return {name: psutil.Process(pid).memory_info().rss / 2**20 for name, pid in pids.items()}


def test_a_soak_of_sessions_long_videos_aborts_refusals_and_retractions_keeps_nothing(
    tight_server, streams, trace_path, tmp_path
):
    """Rounds of everything at once on the short KV pool (running requests retracted every 10th forward, no embedding
    cache, 64-token chunks): two sessions sent segment by segment, one of them sending a turn the tokenizer refuses
    after processing its segment; a streaming session whose turns are sent without waiting for answers; long videos
    by rate and by threshold; a stream aborted as the scheduler gets it. Every answer equals the same request served
    alone and none is lost; afterwards nothing is held in any process, and the tokenizer's and the scheduler's
    resident memory are within `RSS_MARGIN_MB` of what they were after the first round. (The streaming session's
    answers are not compared: upstream SGLang 0.5.23 answers a retracted streaming-session turn otherwise than alone,
    with or without the plugin; docs/compatibility.md.)"""
    long_videos = [(chat_prompt(VIDEO), {"video_data": [str(media.write_clip(tmp_path / f"soak{i}.mp4", "noise",
                                                                               num_frames=16, fps=4, seed=300 + i))]},
                    setting) for i, setting in enumerate(SETTINGS)]  # fmt: skip
    sessions = [streams[4], streams[5]]

    def turn_body(index: int, segment) -> dict:
        settings = {"video_pruning_rate": 0.5, **({"video_stream": True} if index else {})}
        return {"text": chat_prompt(VIDEO, text=f"Segment {index}."), "video_data": [str(segment)],
                "mm_processor_kwargs": settings}  # fmt: skip

    def session_replies(segments, refuse_one: bool) -> list:
        """A session opened without streaming (each turn names the one before it), segment by segment."""
        session, parent, replies = open_session(tight_server.base_url, streaming=False), None, []
        try:
            for index, segment in enumerate(segments):
                body = {**turn_body(index, segment), "session_params": {"id": session, "rid": parent}}
                if refuse_one and index == 1:  # longer than the context: refused after its segment was processed
                    refused = requests.post(f"{tight_server.base_url}/generate", timeout=300,
                                            json={**body, "sampling_params": {"max_new_tokens": 10**6}})  # fmt: skip
                    assert refused.status_code == 400, refused.text
                replies.append(generate(tight_server.base_url, body.pop("text"), 8, **body)[0])
                parent = replies[-1].meta["id"]
        finally:
            close_session(tight_server.base_url, session)
        return replies

    def pipelined_stream() -> list[int]:
        """A streaming session's three turns sent 0.2 s apart, answers not awaited: each is queued behind the one
        before it and answered. Their HTTP statuses."""
        session = open_session(tight_server.base_url)
        try:
            with ThreadPoolExecutor(max_workers=3) as pool:
                sent = []
                for index, segment in enumerate((*streams[3], streams[3][1])):
                    body = {**turn_body(min(index, 1), segment), "session_params": {"id": session},
                            "sampling_params": {"max_new_tokens": 8}}  # fmt: skip
                    sent.append(pool.submit(requests.post, f"{tight_server.base_url}/generate", json=body, timeout=300))
                    time.sleep(0.2)
                return [reply.result().status_code for reply in sent]
        finally:
            close_session(tight_server.base_url, session)

    def aborted_stream(round_index: int) -> dict:
        """A stream aborted as soon as the scheduler has it (queued or prefilling)."""
        rid, arrived = f"soak-abort-{round_index}", arrivals(trace_path)
        with ThreadPoolExecutor(max_workers=1) as pool:
            sent = pool.submit(requests.post, f"{tight_server.base_url}/generate", timeout=300, json={
                "text": chat_prompt(VIDEO, VIDEO), "video_data": [str(s) for s in streams[0]], "rid": rid,
                "mm_processor_kwargs": {"video_pruning_rate": 0.5, "video_stream": True},
                "sampling_params": {"max_new_tokens": 64}})  # fmt: skip
            deadline = time.monotonic() + 60
            while not any(e["rid"] == rid for e in trace.read(trace_path, "request_arrived")[arrived:]):
                assert time.monotonic() < deadline, "the stream to abort never reached the scheduler"
                time.sleep(0.01)
            requests.post(f"{tight_server.base_url}/abort_request", json={"rid": rid}, timeout=30)
            return sent.result().json()

    alone_videos = send_alone(tight_server.base_url, long_videos)
    alone_sessions = [session_replies(segments, refuse_one=False) for segments in sessions]
    flush_cache(tight_server.base_url)
    retracted_before, rss_after_first = retracted(tight_server), None
    for round_index in range(SOAK_ROUNDS):
        with ThreadPoolExecutor(max_workers=len(long_videos) + len(sessions) + 2) as pool:
            videos = [pool.submit(send_case, tight_server.base_url, case) for case in long_videos]
            turns = [pool.submit(session_replies, segments, index == 0) for index, segments in enumerate(sessions)]
            pipelined, aborted = pool.submit(pipelined_stream), pool.submit(aborted_stream, round_index)
            for index, (got, want) in enumerate(zip(videos, alone_videos, strict=True)):
                assert_same_greedy(got.result(), want, (round_index, "video", index))
            for index, (got, want) in enumerate(zip(turns, alone_sessions, strict=True)):
                for turn, (reply, reference) in enumerate(zip(got.result(), want, strict=True)):
                    assert_same_greedy(reply, reference, (round_index, "session", index, turn))
            assert pipelined.result() == [200, 200, 200], round_index
            assert aborted.result()["meta_info"]["finish_reason"]["type"] == "abort"
        if rss_after_first is None:
            rss_after_first = server_rss_mb(tight_server)
    assert retracted(tight_server) > retracted_before, "no request was retracted"
    assert_nothing_held(trace_path)
    grown = {name: mb - rss_after_first[name] for name, mb in server_rss_mb(tight_server).items()}
    assert max(grown.values()) < RSS_MARGIN_MB, grown
    assert tight_server.alive()
