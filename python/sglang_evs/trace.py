"""Opt-in event trace: with SGLANG_EVS_TRACE=PATH every process appends JSON lines to PATH.

Used by the tests to observe what happens inside SGLang's scheduler process
(buffer addresses, what the language model was handed). Off by default; then
`record` is a single dictionary lookup.
"""

import json
import os

ENV = "SGLANG_EVS_TRACE"
POSITIONS_ENV = "SGLANG_EVS_TRACE_POSITIONS"  # =1: also every forward's rotary positions (large)


def enabled() -> bool:
    return ENV in os.environ


def positions_enabled() -> bool:
    return enabled() and os.environ.get(POSITIONS_ENV) == "1"


def record(event: str, **fields) -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def read(path: str | os.PathLike, event: str) -> list[dict]:
    with open(path) as lines:
        return [entry for entry in map(json.loads, lines) if entry["event"] == event]
