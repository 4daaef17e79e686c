"""What the tokenizer process keeps per session (SGLang's `session_params`, streaming sessions alike): where its last
video ended, for a turn that continues its stream, and how long its turns were, for a threshold's kept count.

SGLang's scheduler assembles a session turn's prompt from the session's history; the tokenizer process lays the turn
out alone, so it keeps, per session, the way SGLang's session keeps its turns:

  - where the last video ended (`streams.StreamEnd`: the stream's frames and fps, its frame size, its last temporal
    group of patches): a turn with a video is recorded when it is processed (`record_turn`) and its end becomes the
    session's when it finishes (`commit_finished_turns`, on the tokenizer's outputs); an aborted or refused turn
    leaves the session as it was, as SGLang leaves its history. A turn marked `video_stream` continues that end
    (`continued_end`); with none, it is refused with 400 naming it;
  - each finished turn's prompt and reply tokens: a threshold turn's served length is its prompt's less the history
    SGLang put before it (`history_tokens`), which tells the tokenizer what the scheduler kept (`usage.py`);
  - closing the session drops it all (`forget_closed_session`).

One end per session: the held bytes of a stream are one group of patches, whatever the number of its turns. All
sessions' patches together, with those of turns not finished yet, stay under `SGLANG_EVS_STREAM_STATE_MB` (default
256); a turn refused in the tokenizer after its media were processed drops its own (`forget_refused_turn`). Past the
bound the least recently used session's patches are let go (then the oldest unfinished turn's), and its next
segment is scored as a stream's first (its first group kept whole); its timestamps still continue. A turn appends
to the session's last finished turn in a streaming session: one turn is in flight per streaming session, and a turn
sent while another runs (a live source does not wait for answers) waits for it before it is processed
(`queue_pipelined_turn`), so it continues that turn's end, as if sent after it. In a session opened without
streaming SGLang appends a turn to the one `session_params.rid` names and to nothing without it, so a stream turn
there names the session's last finished turn, or it is refused. Kept for the models the plugin serves only.
"""

import asyncio
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from sglang_evs import trace
from sglang_evs.methods import STREAM_SETTING
from sglang_evs.pruning import session_turns
from sglang_evs.pruning.streams import StreamEnd
from sglang_evs.served import serves

logger = logging.getLogger(__name__)

BOUND_ENV = "SGLANG_EVS_STREAM_STATE_MB"
DEFAULT_BOUND_MB = 256
MAX_SESSIONS = 65536  # sessions kept (their frame counts outlive their patches); the least recently used go first
MAX_TURNS = 64  # finished turns' lengths kept per session opened without streaming (a turn may name any of them)
MAX_PENDING = 4096  # turns processed and not finished yet (a turn aborted before SGLang saw it never finishes here)
TURN_POLL_S = 1.0  # how often a queued turn checks that the turn before it is still in flight


@dataclass(frozen=True)
class SessionTurn:
    """A session request as the tokenizer sees it (`session_params`)."""

    session_id: str
    parent_rid: str | None  # the turn it appends to (`session_params.rid`), if named
    offset: int  # `session_params.offset`: the history cut to this many tokens (0: not cut)
    replaces: bool  # `session_params.replace`
    drops_previous_output: bool  # `session_params.drop_previous_output`

    @property
    def rewrites_history(self) -> bool:
        return self.replaces or bool(self.offset)


def session_turn(request_obj) -> SessionTurn | None:
    params = getattr(request_obj, "session_params", None)
    if not params:
        return None
    get = params.get if isinstance(params, dict) else lambda name: getattr(params, name, None)
    if get("id") is None:
        return None
    return SessionTurn(get("id"), get("rid"), int(get("offset") or 0), bool(get("replace")),
                       bool(get("drop_previous_output")))  # fmt: skip


@dataclass
class SessionRecord:
    last_rid: str | None = None  # its last finished turn
    end: StreamEnd | None = None  # where its last video ended
    turns: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict)  # rid -> (prompt, reply) tokens


class SessionStreams:
    """The tokenizer process's records, per session."""

    def __init__(self) -> None:
        self.sessions: OrderedDict[str, SessionRecord] = OrderedDict()
        self.pending: OrderedDict[str, tuple[str, StreamEnd]] = OrderedDict()  # rid -> (session, end)
        self.streaming: set[str] = set()  # sessions opened with `streaming`
        self.closed: OrderedDict[str, None] = OrderedDict()  # the last MAX_SESSIONS closed: no turn re-creates them
        self.running: dict[str, tuple[str, asyncio.Event]] = {}  # streaming session -> its turn in flight, its end

    async def take_turn(self, session_id: str, rid: str, in_flight) -> None:
        """Wait until the streaming session's turn in flight, if any, has finished (or is no longer `in_flight(rid)`,
        however it went), then make `rid` the session's turn in flight. Turns waiting go in the order they came."""
        while session_id in self.running:
            running_rid, done = self.running[session_id]
            try:
                await asyncio.wait_for(done.wait(), timeout=TURN_POLL_S)
            except TimeoutError:
                if not in_flight(running_rid):
                    self.turn_over(running_rid)
        self.running[session_id] = (rid, asyncio.Event())

    def turn_over(self, rid: str) -> None:
        """The turn `rid` is no longer in flight (finished, aborted, refused): the next turn of its session may go."""
        for session_id, (running_rid, done) in list(self.running.items()):
            if running_rid == rid:
                del self.running[session_id]
                done.set()

    def continued_end(self, turn: SessionTurn) -> StreamEnd:
        """The end a `video_stream` turn continues. ValueError (HTTP 400) naming why there is none."""
        if turn.rewrites_history:
            raise ValueError(f"{STREAM_SETTING}: a turn that replaces or cuts its session's history cannot continue it")
        record = self.sessions.get(turn.session_id)
        if record is None or record.end is None:
            raise ValueError(
                f"{STREAM_SETTING}: session {turn.session_id} has no earlier video to continue; "
                "send the stream's first segment without it"
            )
        if turn.parent_rid is not None and turn.parent_rid in self.pending:
            raise ValueError(
                f"{STREAM_SETTING}: the turn {turn.parent_rid!r} it appends to has not finished; send this segment "
                "once it has (a streaming session queues it)"
            )
        if self._appends_to(turn) != record.last_rid:
            raise ValueError(
                f"{STREAM_SETTING}: the turn continues session {turn.session_id}'s last video, so it appends to its "
                f"last turn: give session_params.rid={record.last_rid!r}"
            )
        self.sessions.move_to_end(turn.session_id)
        return record.end

    def history_tokens(self, turn: SessionTurn) -> int | None:
        """The tokens SGLang puts before the turn's own (its history as the scheduler assembles it), or None where
        the turn it appends to is not known here."""
        parent = self._appends_to(turn)
        if parent is None:
            return 0
        record = self.sessions.get(turn.session_id)
        lengths = record.turns.get(parent) if record is not None else None
        if lengths is None:
            return None
        prompt, reply = lengths
        history = prompt if turn.drops_previous_output else prompt + reply
        return min(history, turn.offset) if turn.offset else history

    def record_turn(self, rid: str, turn: SessionTurn, end: StreamEnd) -> None:
        self.pending[rid] = (turn.session_id, end)
        while len(self.pending) > MAX_PENDING:
            self.pending.popitem(last=False)
        self._let_go_past_the_bound()
        trace.record("stream_state", session=turn.session_id, bytes=end.nbytes, held=self.held_bytes(), turn=rid)

    def refused(self, rid: str) -> None:
        """A turn SGLang refused after its media were processed (it never reaches the scheduler, never finishes)."""
        refused = self.pending.pop(rid, None)
        self.turn_over(rid)
        if refused is not None:
            trace.record("stream_state", session=refused[0], bytes=0, held=self.held_bytes(), turn=rid)

    def aborted(self, rid: str) -> None:
        """A turn the scheduler aborted, whose end comes back apart from the batch outputs: it leaves the session as it
        was, and the session's next turn may go."""
        if rid in self.pending:
            self.finished(rid, self.pending[rid][0], aborted=True)  # which also lets the next turn go
        else:
            self.turn_over(rid)

    def finished(self, rid: str, session_id: str, aborted: bool, prompt: int = 0, reply: int = 0) -> None:
        """A session turn finished (one that had a video recorded, or any other): unless aborted, it is the
        session's last turn, its end the session's where it had a video."""
        _, end = self.pending.pop(rid, (None, None))
        self.turn_over(rid)
        if aborted or session_id in self.closed:  # a turn that ran while its session was closed
            if end is not None:
                trace.record("stream_state", session=session_id, bytes=0, held=self.held_bytes(), turn=rid)
            return
        record = self.sessions.setdefault(session_id, SessionRecord())
        self.sessions.move_to_end(session_id)
        record.last_rid = rid
        if session_id in self.streaming:
            record.turns.clear()
        record.turns[rid] = (prompt, reply)
        while len(record.turns) > MAX_TURNS:
            record.turns.popitem(last=False)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        if end is not None:
            record.end = end
            self._let_go_past_the_bound()
            trace.record("stream_state", session=session_id, bytes=end.nbytes, held=self.held_bytes())

    def forget(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        self.closed[session_id] = None
        while len(self.closed) > MAX_SESSIONS:
            self.closed.popitem(last=False)
        self.streaming.discard(session_id)
        if session_id in self.running:
            self.turn_over(self.running[session_id][0])
        self.pending = OrderedDict((rid, entry) for rid, entry in self.pending.items() if entry[0] != session_id)
        trace.record("stream_state", session=session_id, bytes=0, held=self.held_bytes())

    def held_bytes(self) -> int:
        """The patches kept: the sessions' ends and the ends of turns not finished yet."""
        committed = sum(record.end.nbytes for record in self.sessions.values() if record.end is not None)
        return committed + sum(end.nbytes for _, end in self.pending.values())

    def _appends_to(self, turn: SessionTurn) -> str | None:
        """The turn SGLang appends this one to: the one it names, else the last in a streaming session."""
        if turn.parent_rid is not None or turn.session_id not in self.streaming:
            return turn.parent_rid
        record = self.sessions.get(turn.session_id)
        return record.last_rid if record is not None else None

    def _let_go_past_the_bound(self) -> None:
        """Past the bound, patches go, the least recently used first: sessions' ends, then turns not finished (the
        oldest first: a turn SGLang refused in a way the tokenizer never sees keeps none for good). A turn after
        one let go is scored as a stream's first; its timestamps still continue."""
        bound = int(float(os.environ.get(BOUND_ENV, DEFAULT_BOUND_MB)) * 2**20)
        held = self.held_bytes()
        for session_id, record in self.sessions.items():
            if held <= bound:
                return
            if record.end is not None and record.end.patches is not None:
                held -= record.end.nbytes
                record.end = replace(record.end, patches=None)
                logger.warning("sglang-evs: %s of session %s let go (%s)", STREAM_SETTING, session_id, BOUND_ENV)
        for rid, (session_id, end) in self.pending.items():
            if held <= bound:
                return
            if end.patches is not None:
                held -= end.nbytes
                self.pending[rid] = (session_id, replace(end, patches=None))
                logger.warning("sglang-evs: %s of session %s let go (%s)", STREAM_SETTING, session_id, BOUND_ENV)


SESSION_STREAMS = SessionStreams()


async def commit_finished_turns(upstream, manager, recv_obj, *args, **kwargs):
    """AROUND hook on `TokenizerManager._handle_batch_output` (through `plugin._on_batch_output`): each session turn
    that finished (on a model the plugin serves) is its session's last turn, and where it had a video, its session's
    end; one aborted leaves the session as it was."""
    if serves(manager.model_config.hf_config):
        for index, (rid, reason) in enumerate(zip(recv_obj.rids, recv_obj.finished_reasons, strict=False)):
            state = manager.rid_to_state.get(rid) if reason is not None else None
            turn = session_turn(state.obj) if state is not None else None
            if turn is not None:
                aborted = reason.get("type") == "abort"
                lengths = (recv_obj.prompt_tokens[index], recv_obj.completion_tokens[index]) if not aborted else (0, 0)
                SESSION_STREAMS.finished(rid, turn.session_id, aborted, *lengths)
            if reason is not None:
                session_turns.close_if_asked(manager, rid)
    return await upstream(manager, recv_obj, *args, **kwargs)


async def queue_pipelined_turn(upstream, manager, obj, *args, **kwargs):
    """AROUND hook on `TokenizerManager._tokenize_one_request`: a turn that opens its session has it opened first
    (`session_turns`); a streaming session's turn sent while the one before it is in flight (a live source does not
    wait for answers) waits for it, then is processed and served exactly as if sent after it (SGLang would refuse
    it: one turn in flight per streaming session). For the models the plugin serves; every other request goes on at
    once."""
    if not serves(manager.model_config.hf_config):
        return await upstream(manager, obj, *args, **kwargs)
    await session_turns.open_if_asked(manager, obj)
    turn = session_turn(obj)
    if turn is None or turn.session_id not in SESSION_STREAMS.streaming:
        return await upstream(manager, obj, *args, **kwargs)
    await SESSION_STREAMS.take_turn(turn.session_id, obj.rid, lambda rid: rid in manager.rid_to_state)
    try:
        return await upstream(manager, obj, *args, **kwargs)
    except BaseException:
        SESSION_STREAMS.turn_over(obj.rid)
        raise


def forget_aborted_turn(manager, recv_obj, *args, **kwargs) -> None:
    """BEFORE hook on `TokenizerManager._handle_abort_req`: a request the scheduler aborted (a client's abort, one
    aborted in the queue or mid-prefill) ends here, not among the batch outputs: a session turn's record goes."""
    rid = getattr(recv_obj, "rid", None)
    if rid:
        SESSION_STREAMS.aborted(rid)
        session_turns.close_if_asked(manager, rid)


def forget_refused_turn(upstream, manager, obj, *args, **kwargs):
    """AROUND hook on `TokenizerManager._validate_one_request`: a turn refused there, after its media were processed
    (a prompt longer than the context, ...), never reaches the scheduler: what was recorded for it goes."""
    try:
        return upstream(manager, obj, *args, **kwargs)
    except Exception:
        SESSION_STREAMS.refused(getattr(obj, "rid", None))
        raise


async def note_streaming_session(upstream, manager, obj, *args, **kwargs):
    """AROUND hook on `TokenizerManager.open_session`: which sessions append each turn to the last."""
    session_id = await upstream(manager, obj, *args, **kwargs)
    if session_id is not None:
        SESSION_STREAMS.closed.pop(session_id, None)  # an id a client opens again after closing it
        if getattr(obj, "streaming", False):
            SESSION_STREAMS.streaming.add(session_id)
    return session_id


async def forget_closed_session(upstream, manager, obj, *args, **kwargs):
    """AROUND hook on `TokenizerManager.close_session`: a closed session's records go with it."""
    result = await upstream(manager, obj, *args, **kwargs)
    SESSION_STREAMS.forget(obj.session_id)
    return result
