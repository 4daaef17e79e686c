"""A session opened and closed by its own turns (`pruning/session_turns.py`), on a stand-in tokenizer manager;
behind a router end to end in test/e2e/test_router.py."""

import asyncio
from types import SimpleNamespace

import pytest

from sglang_evs.pruning import session_turns


class Manager:
    def __init__(self) -> None:
        self.opened, self.closed = [], []

    async def open_session(self, request):
        self.opened.append(request)
        return request.session_id

    async def close_session(self, request):
        self.closed.append(request.session_id)


def turn(rid: str, **params) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, session_params={"id": "s", **params})


def test_a_turn_opens_its_session_first_and_its_end_closes_it():
    manager, first, last = Manager(), turn("r1", open={"streaming": True, "timeout": 60}), turn("r2", close=True)

    async def scenario():
        await session_turns.open_if_asked(manager, first)
        await session_turns.open_if_asked(manager, last)
        session_turns.close_if_asked(manager, "r1")  # its turn asked for no close
        session_turns.close_if_asked(manager, "r2")
        await asyncio.sleep(0)

    asyncio.run(scenario())
    (opened,) = manager.opened
    assert (opened.session_id, opened.streaming, opened.timeout) == ("s", True, 60)
    assert opened.capacity_of_str_len == session_turns.DEFAULT_CAPACITY and manager.closed == ["s"]
    assert first.session_params == last.session_params == {"id": "s"}  # SGLang reads only its own keys


@pytest.mark.parametrize("params, message", [({"id": None, "open": True}, "need the session's id"),
                                             ({"id": "s", "open": {"stream": True}}, "unknown stream")])  # fmt: skip
def test_what_cannot_open_a_session_is_refused_by_name(params, message):
    with pytest.raises(ValueError, match=message):
        asyncio.run(session_turns.open_if_asked(Manager(), SimpleNamespace(rid="r", session_params=params)))


def test_a_turn_that_asks_nothing_or_has_no_session_is_left_as_it_came():
    manager = Manager()
    for obj in (SimpleNamespace(rid="a", session_params=None), turn("b"), SimpleNamespace(rid="c")):
        before = dict(obj.session_params) if getattr(obj, "session_params", None) else None
        asyncio.run(session_turns.open_if_asked(manager, obj))
        assert (dict(obj.session_params) if getattr(obj, "session_params", None) else None) == before
    assert manager.opened == []
