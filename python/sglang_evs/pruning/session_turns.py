"""A session opened and closed by its own turns, for sessions behind sglang-router.

sglang-router (0.3.2) routes no `/open_session` or `/close_session` (404), so a session cannot be opened through it;
with `--policy manual` it sends every request that carries one `X-SMG-Routing-Key` to one worker, so a session's
turns can all reach the worker that holds it. What is missing is opening and closing the session there, which a turn
now asks for in its `session_params` (the router forwards them whole):

  - `"open": {"streaming": true, "timeout": 600, "capacity_of_str_len": 65536}` (any of them, or `true`): the
    worker opens the session under the turn's `id` before the turn is processed, where it has none (SGLang then
    refuses the second open of an id in its log, and the turn goes on in the open session);
  - `"close": true`: the session is closed once this turn has finished, or was aborted.

Both keys are taken off `session_params` before SGLang reads them. For the models the plugin serves.
"""

import asyncio
import logging
from collections import OrderedDict

from sglang_evs import sglang_compat as sglang

logger = logging.getLogger(__name__)

OPEN, CLOSE = "open", "close"
DEFAULT_CAPACITY = 1 << 16  # `capacity_of_str_len` of a session opened by its turn, where the turn names none
MAX_CLOSING = 4096  # turns whose session closes when they end, not ended yet

_closing: OrderedDict[str, str] = OrderedDict()  # rid -> the session its end closes


async def open_if_asked(manager, obj) -> None:
    """Before a turn is processed: its session opened where it asks (`OPEN`), its close noted (`CLOSE`), both keys
    taken off its `session_params`."""
    params = getattr(obj, "session_params", None)
    if not isinstance(params, dict) or not ({OPEN, CLOSE} & params.keys()):
        return
    opening, closes = params.pop(OPEN, None), bool(params.pop(CLOSE, False))
    session_id = params.get("id")
    if session_id is None:
        raise ValueError("session_params: open and close need the session's id")
    if opening:
        options = opening if isinstance(opening, dict) else {}
        unknown = options.keys() - {"streaming", "timeout", "capacity_of_str_len"}
        if unknown:
            raise ValueError(f"session_params.open: unknown {', '.join(sorted(unknown))}")
        request = sglang.OpenSessionReqInput(
            capacity_of_str_len=int(options.get("capacity_of_str_len", DEFAULT_CAPACITY)), session_id=session_id,
            streaming=options.get("streaming"), timeout=options.get("timeout"),
        )  # fmt: skip
        await manager.open_session(request)
    if closes:
        _closing[obj.rid] = session_id
        while len(_closing) > MAX_CLOSING:
            _closing.popitem(last=False)


def close_if_asked(manager, rid: str) -> None:
    """A turn ended (finished or aborted): its session closed where the turn asked, once the tokenizer has handled
    the end (a task on the tokenizer's loop)."""
    session_id = _closing.pop(rid, None)
    if session_id is not None:
        request = sglang.CloseSessionReqInput(session_id=session_id)
        asyncio.get_running_loop().create_task(manager.close_session(request))
