"""What a traced server (`SGLANG_EVS_TRACE`) still holds, read off its trace: the videos' rows a scheduler holds
(`pruning/holds.py`) and the streams' state a tokenizer keeps (`pruning/stream_sessions.py`). The checks every
"nothing held afterwards" test makes, each failing where a hold or an unfinished turn's record leaks
(test/testing/test_held.py breaks the releases on purpose)."""

import json
from pathlib import Path

HOLD_EVENTS = ("video_held", "video_released", "video_not_held")


def hold_events(trace_path: str | Path) -> list[dict]:
    """The trace's hold events, in the order the server's processes wrote them."""
    path = Path(trace_path)
    lines = path.read_text().splitlines() if path.exists() else []
    return [event for event in map(json.loads, filter(str.strip, lines)) if event["event"] in HOLD_EVENTS]


def assert_nothing_held(trace_path: str | Path, items: set | None = None) -> None:
    """Every video held was let go, and each process's last hold event counts 0 bytes held. `items`: the keys whose
    holds the test expects (None: at least one, so that a check over a trace with no hold at all cannot pass)."""
    events = hold_events(trace_path)
    held = {event["item"] for event in events if event["event"] == "video_held"}
    released = {event["item"] for event in events if event["event"] == "video_released"}
    assert held and (items is None or items <= held), f"no hold to check in {trace_path}: {sorted(held)}"
    assert held <= released, f"held, never let go: {sorted(held - released)}"
    last_per_process = {event["pid"]: event for event in events}
    assert {event["held_bytes"] for event in last_per_process.values()} == {0}, last_per_process


def assert_no_stream_state(trace_path: str | Path) -> None:
    """The tokenizer keeps nothing of any stream: each process's last `stream_state` event counts 0 bytes held (every
    turn recorded, finished, refused or its session closed, records one), and there was one to check."""
    path = Path(trace_path)
    lines = path.read_text().splitlines() if path.exists() else []
    events = [event for event in map(json.loads, filter(str.strip, lines)) if event["event"] == "stream_state"]
    assert events, f"no stream state to check in {trace_path}"
    last_per_process = {event["pid"]: event for event in events}
    assert {event["held"] for event in last_per_process.values()} == {0}, last_per_process
