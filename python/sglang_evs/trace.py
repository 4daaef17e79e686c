"""Opt-in event trace: with SGLANG_EVS_TRACE=PATH every process appends JSON lines to PATH.

Used by the tests to observe what happens inside SGLang's scheduler process
(buffer addresses, what the language model was handed). Off by default; then
`record` is a single dictionary lookup.
"""

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "SGLANG_EVS_TRACE"
POSITIONS_ENV = "SGLANG_EVS_TRACE_POSITIONS"  # =1: also every forward's rotary positions (large)
# =1: also what a PD prefill server's Mooncake transfers move (transfer_trace.py). Its own switch: the hook
# imports Mooncake's conn module at plugin load, which leaves the server's /metrics empty.
TRANSFERS_ENV = "SGLANG_EVS_TRACE_TRANSFERS"


def enabled() -> bool:
    return ENV in os.environ


def positions_enabled() -> bool:
    return enabled() and os.environ.get(POSITIONS_ENV) == "1"


def transfers_enabled() -> bool:
    return enabled() and os.environ.get(TRANSFERS_ENV) == "1"


_in_graph_replay = [False]


@contextmanager
def graph_replay() -> Iterator[None]:
    """While a graph runner replays (`graph_trace.py`): the model's Python that still runs around the
    replayed kernels (an outer forward) is not what they read, so it records no positions."""
    _in_graph_replay[0] = True
    try:
        yield
    finally:
        _in_graph_replay[0] = False


def in_graph_replay() -> bool:
    return _in_graph_replay[0]


def record(event: str, **fields) -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def record_arrival(scheduler, recv_req, *args, **kwargs) -> None:
    """BEFORE hook on `Scheduler.handle_generate_request` (traced only): a request reached a scheduler, its prompt
    tokenized and its media processed (`testing.workload` holds a concurrent round's forwards until all have)."""
    record("request_arrived", rid=recv_req.rid)


def read(path: str | os.PathLike, event: str) -> list[dict]:
    """The `event` entries of the trace at `path`, oldest first; [] while there is none. A line still being
    written (no newline yet), which a reader polling a live server's trace may meet, is not one yet."""
    if not os.path.exists(path):
        return []
    with open(path) as lines:
        complete = [line for line in lines if line.endswith("\n")]
    return [entry for entry in map(json.loads, complete) if entry["event"] == event]


def settle(device) -> bool:
    """Wait for the kernels queued on `device` (a torch.device), so that a traced timing covers them rather
    than their launch; False, without waiting, inside a graph capture, where nothing has run yet and waiting
    would fail the capture (the device's own module: the CPU route's graph stand-in refuses it as CUDA does)."""
    import torch

    module = torch.get_device_module(device)
    if getattr(module, "is_current_stream_capturing", bool)():
        return False
    module.synchronize()
    return True
