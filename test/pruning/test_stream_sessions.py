"""What the tokenizer process keeps per session (`pruning/stream_sessions.py`): a stream's end, recorded per turn,
committed when the turn finishes, kept once per session, let go past its bound, dropped on close; the turns'
lengths, which place a turn after its history. Served end to end in test/models/test_evs_serving.py."""

import asyncio
from types import SimpleNamespace

import pytest
import torch

from sglang_evs.pruning import stream_sessions
from sglang_evs.pruning.stream_sessions import SessionStreams, SessionTurn, session_turn
from sglang_evs.pruning.streams import StreamEnd

GROUP_BYTES = 8 * 6 * 4  # one group of 8 patches, 6 float32 values each


def end(frames: int, fill: float = 0.0) -> StreamEnd:
    return StreamEnd(frames=frames, fps=4.0, grid_hw=(2, 4), patches=torch.full((8, 6), fill))


def turn(session: str = "s", rid: str | None = None, **params) -> SessionTurn:
    return session_turn(SimpleNamespace(session_params={"id": session, "rid": rid, **params}))


def streaming_session(name: str = "s") -> SessionStreams:
    streams = SessionStreams()
    streams.streaming.add(name)
    return streams


def test_a_turn_continues_the_end_of_its_sessions_last_finished_turn_and_none_aborted():
    streams = streaming_session()
    for rid, frames in (("t1", 16), ("t2", 32)):
        streams.record_turn(rid, turn(), end(frames))
        streams.finished(rid, "s", aborted=False)
    streams.record_turn("t3", turn(), end(48))
    streams.finished("t3", "s", aborted=True)
    assert streams.continued_end(turn()).frames == 32 and not streams.pending
    assert streams.held_bytes() == GROUP_BYTES  # one group per session, whatever its turns


def test_a_turn_without_a_video_moves_the_session_on_and_keeps_its_end():
    streams = SessionStreams()  # opened without streaming: a turn names the one it follows
    streams.record_turn("t1", turn(), end(16))
    streams.finished("t1", "s", aborted=False)
    streams.finished("question", "s", aborted=False)
    assert streams.continued_end(turn(rid="question")).frames == 16
    with pytest.raises(ValueError, match="session_params.rid='question'"):
        streams.continued_end(turn(rid="t1"))
    with pytest.raises(ValueError, match="session_params.rid='question'"):
        streams.continued_end(turn())  # SGLang appends it to nothing


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "session s has no earlier video to continue; send the stream's first segment without it"),
        ({"replace": True}, "replaces or cuts its session's history"),
        ({"offset": 3}, "replaces or cuts its session's history"),
    ],
)
def test_what_a_turn_cannot_continue_is_refused_by_name(params, message):
    streams = streaming_session()
    if "replace" in params or "offset" in params:
        streams.record_turn("t1", turn(), end(16))
        streams.finished("t1", "s", aborted=False)
    with pytest.raises(ValueError, match=message):
        streams.continued_end(turn(**params))


def test_closing_a_session_drops_its_end_and_its_unfinished_turns():
    streams = streaming_session()
    streams.record_turn("t1", turn(), end(16))
    streams.finished("t1", "s", aborted=False)
    streams.record_turn("t2", turn(), end(32))
    streams.record_turn("other", turn("o"), end(8))
    streams.forget("s")
    assert list(streams.pending) == ["other"] and "s" not in streams.streaming
    assert streams.held_bytes() == GROUP_BYTES  # the other session's unfinished turn only
    streams.finished("t2", "s", aborted=False)  # the turn that ran while its session was closed
    assert "s" not in streams.sessions and streams.held_bytes() == GROUP_BYTES


def test_past_the_bound_the_least_recently_used_sessions_patches_are_let_go(monkeypatch):
    monkeypatch.setenv(stream_sessions.BOUND_ENV, str(2.5 * GROUP_BYTES / 2**20))
    streams = SessionStreams()
    for session in ("a", "b", "c"):
        streams.streaming.add(session)
        streams.record_turn(session, turn(session), end(16, fill=ord(session)))
        streams.finished(session, session, aborted=False)
    assert streams.held_bytes() == 2 * GROUP_BYTES
    let_go = streams.continued_end(turn("a"))
    assert let_go.patches is None and let_go.frames == 16  # its timestamps still go on
    assert torch.equal(streams.continued_end(turn("c")).patches, end(16, fill=ord("c")).patches)


@pytest.mark.parametrize(
    ("streaming", "params", "history"),
    [
        (True, {}, 100 + 7),
        (False, {"rid": "t1"}, 100 + 7),
        (False, {}, 0),  # SGLang appends it to nothing
        (False, {"rid": "t1", "drop_previous_output": True}, 100),
        (False, {"rid": "t1", "offset": 40}, 40),
        (False, {"rid": "unknown"}, None),
    ],
)
def test_a_turns_history_is_the_prompt_and_reply_of_the_turn_it_appends_to(streaming, params, history):
    streams = streaming_session() if streaming else SessionStreams()
    streams.finished("t0", "s", aborted=False, prompt=60, reply=3)
    streams.finished("t1", "s", aborted=False, prompt=100, reply=7)
    assert streams.history_tokens(turn(**params)) == history


def test_the_tokenizers_outputs_commit_finished_turns_of_a_served_model():
    streams = streaming_session()
    streams.record_turn("t1", turn(), end(16))
    streams.record_turn("t2", turn("o"), end(8))
    states = {rid: SimpleNamespace(obj=SimpleNamespace(session_params={"id": session}))
              for rid, session in (("t1", "s"), ("t2", "o"), ("q", "s"))}  # fmt: skip
    config = SimpleNamespace(architectures=["Qwen3VLForConditionalGeneration"])
    manager = SimpleNamespace(rid_to_state=states, model_config=SimpleNamespace(hf_config=config))

    def outputs(rids, reasons):
        return SimpleNamespace(rids=rids, finished_reasons=reasons, prompt_tokens=[50] * 2, completion_tokens=[4] * 2)

    async def upstream(manager, recv_obj):
        return "handled"

    stream_sessions.SESSION_STREAMS, saved = streams, stream_sessions.SESSION_STREAMS
    try:
        finished = outputs(["t1", "t2"], [{"type": "stop"}, None])
        assert asyncio.run(stream_sessions.commit_finished_turns(upstream, manager, finished)) == "handled"
        assert streams.sessions["s"].last_rid == "t1" and list(streams.pending) == ["t2"]
        asyncio.run(stream_sessions.commit_finished_turns(upstream, manager, outputs(["q"], [{"type": "length"}])))
        assert streams.sessions["s"].last_rid == "q" and streams.history_tokens(turn()) == 54
        assert streams.continued_end(turn()).frames == 16  # a turn without a video keeps the session's end
        config.architectures = ["LlavaForConditionalGeneration"]  # not served: SGLang's alone
        asyncio.run(stream_sessions.commit_finished_turns(upstream, manager, finished))
        assert list(streams.pending) == ["t2"] and streams.sessions["s"].last_rid == "q"
    finally:
        stream_sessions.SESSION_STREAMS = saved


def test_unfinished_turns_count_under_the_bound_and_a_refused_one_keeps_nothing(monkeypatch):
    """Turns recorded and never finished (refused where the tokenizer does not see it) hold at most the bound; one
    refused in validation drops its record, and the refusal still reaches the client."""
    streams = streaming_session()
    monkeypatch.setattr(stream_sessions, "SESSION_STREAMS", streams)
    monkeypatch.setenv(stream_sessions.BOUND_ENV, str(3 * GROUP_BYTES / 2**20))  # three groups
    for index in range(10):
        streams.record_turn(f"r{index}", turn(), end(16))
    assert streams.held_bytes() <= 3 * GROUP_BYTES and len(streams.pending) == 10
    assert streams.pending["r9"][1].patches is not None  # the newest kept, the oldest let go first

    def refuse(manager, obj):
        raise ValueError("longer than the model's context")

    with pytest.raises(ValueError, match="context"):
        stream_sessions.forget_refused_turn(refuse, None, SimpleNamespace(rid="r9"))
    assert "r9" not in streams.pending and streams.held_bytes() == 2 * GROUP_BYTES


def test_a_session_id_opened_again_after_its_close_keeps_its_turns(monkeypatch):
    streams = SessionStreams()
    monkeypatch.setattr(stream_sessions, "SESSION_STREAMS", streams)
    streams.forget("s")

    async def open_upstream(manager, obj):
        return "s"

    assert asyncio.run(stream_sessions.note_streaming_session(open_upstream, None, SimpleNamespace(streaming=True)))
    streams.finished("t1", "s", aborted=False)
    assert streams.sessions["s"].last_rid == "t1" and "s" in streams.streaming


def test_a_streaming_sessions_turns_in_flight_go_one_at_a_time_in_the_order_they_came(monkeypatch):
    """The hook around tokenization: a turn sent while the one before it is in flight waits until that one finished,
    then takes the session's end it committed; a turn that failed, or is no longer in flight however it went, lets
    the next go; a turn of another session, or outside one, never waits."""
    streams = streaming_session()
    monkeypatch.setattr(stream_sessions, "SESSION_STREAMS", streams)
    monkeypatch.setattr(stream_sessions, "TURN_POLL_S", 0.01)
    config = SimpleNamespace(architectures=["Qwen3VLForConditionalGeneration"])
    manager = SimpleNamespace(rid_to_state={}, model_config=SimpleNamespace(hf_config=config))
    order = []

    async def tokenize(manager, obj):
        if obj.rid == "fails":
            raise ValueError("bad media")
        order.append((obj.rid, streams.sessions["s"].last_rid if "s" in streams.sessions else None))
        return obj.rid

    def request(rid: str, session: str | None = "s"):
        params = {"id": session} if session else None
        manager.rid_to_state[rid] = object()
        return stream_sessions.queue_pipelined_turn(tokenize, manager, SimpleNamespace(rid=rid, session_params=params))

    async def scenario():
        await request("t1")
        queued = [asyncio.create_task(request(rid)) for rid in ("t2", "fails", "t3")]
        assert await request("other", session=None) == "other" and await request("o1", session="o") == "o1"
        await asyncio.sleep(0.05)
        assert [rid for rid, _ in order] == ["t1", "other", "o1"]  # t2, t3 wait for t1
        streams.finished("t1", "s", aborted=False)
        assert await asyncio.wait_for(queued[0], timeout=5) == "t2" and order[-1] == ("t2", "t1")
        del manager.rid_to_state["t2"]  # t2 went some way the tokenizer's outputs never showed
        with pytest.raises(ValueError, match="bad media"):
            await asyncio.wait_for(queued[1], timeout=5)
        assert await asyncio.wait_for(queued[2], timeout=5) == "t3"
        assert streams.running["s"][0] == "t3"

    asyncio.run(scenario())


def test_a_turn_the_scheduler_aborted_leaves_nothing_and_lets_the_next_go(monkeypatch):
    """An abort comes back to the tokenizer apart from the batch outputs (`_handle_abort_req`): the turn's record goes,
    the session keeps its end, and a turn queued behind it may go."""
    streams = streaming_session()
    monkeypatch.setattr(stream_sessions, "SESSION_STREAMS", streams)
    streams.record_turn("first", turn(), end(8))
    streams.finished("first", "s", aborted=False)
    streams.record_turn("aborted", turn(), end(16))
    streams.running["s"] = ("aborted", asyncio.Event())
    stream_sessions.forget_aborted_turn(None, SimpleNamespace(rid="aborted"))
    assert "aborted" not in streams.pending and "s" not in streams.running
    assert streams.held_bytes() == GROUP_BYTES and streams.continued_end(turn()).frames == 8
    stream_sessions.forget_aborted_turn(None, SimpleNamespace(rid="unknown"))  # any other request: nothing to do
