"""The "nothing held afterwards" checks (`testing/held.py`) fail where a release is broken on purpose: a hold the
scheduler never lets go, a turn's record the tokenizer never drops. Driven through the plugin's own modules, traced
as a server traces them."""

import pytest
import torch
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

from sglang_evs import trace
from sglang_evs.pruning import holds
from sglang_evs.pruning.stream_sessions import SessionStreams, session_turn
from sglang_evs.pruning.streams import StreamEnd
from sglang_evs.testing.held import assert_no_stream_state, assert_nothing_held


@pytest.fixture
def trace_path(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(trace.ENV, str(path))
    return path


def prefill_two_requests() -> None:
    """Two requests, a video each, held by their first chunk and let go: one by its last chunk, one as SGLang drops
    its media (aborted)."""
    videos = [MultimodalDataItem(modality=Modality.VIDEO, offsets=[(0, 9)], hash=key) for key in (51, 52)]
    requests = [MultimodalInputs(mm_items=[video]) for video in videos]
    holds.release_consumed([(request, 0, 5) for request in requests], [(v, torch.zeros(4, 8)) for v in videos])
    holds.release_consumed([(requests[0], 5, 5)])
    holds.release_media(None, requests[1])


def test_the_hold_check_passes_where_every_hold_is_let_go_and_fails_where_one_is_not(trace_path, monkeypatch):
    prefill_two_requests()
    assert_nothing_held(trace_path, items={51, 52})
    trace_path.unlink()
    release = holds.release
    monkeypatch.setattr(holds, "release", lambda item, why="consumed": item.hash != 52 and release(item, why))
    prefill_two_requests()  # 52 never let go
    with pytest.raises(AssertionError, match="never let go"):
        assert_nothing_held(trace_path)
    monkeypatch.setattr(holds, "release", release)
    holds.release(MultimodalDataItem(modality=Modality.VIDEO, offsets=[(0, 9)], hash=52))


def test_the_hold_check_fails_on_a_trace_that_held_nothing(trace_path):
    with pytest.raises(AssertionError, match="no hold to check"):
        assert_nothing_held(trace_path)


END = StreamEnd(frames=8, fps=4.0, grid_hw=(2, 2), patches=torch.ones(4, 6))
TURN = session_turn(type("Request", (), {"session_params": {"id": "s"}})())


def closed_session(streams: SessionStreams) -> None:
    """Three turns of a streaming session recorded, one finished, one refused, one aborted; then the session closed."""
    for rid in ("finished", "refused", "aborted"):
        streams.record_turn(rid, TURN, END)
    streams.finished("finished", "s", aborted=False)
    streams.refused("refused")
    streams.finished("aborted", "s", aborted=True)
    streams.forget("s")


def refused_first_turn(streams: SessionStreams) -> None:
    """A session whose first segment was refused after its media were processed: it keeps nothing, open or not."""
    streams.record_turn("refused", TURN, END)
    streams.refused("refused")


@pytest.mark.parametrize(
    "scenario, broken",
    [(closed_session, "forget"), (refused_first_turn, "refused")],
    ids=["closing keeps the end", "a refused turn's record kept"],
)
def test_the_stream_check_passes_where_every_record_is_dropped_and_fails_where_one_is_kept(
    trace_path, monkeypatch, scenario, broken
):
    scenario(SessionStreams())
    assert_no_stream_state(trace_path)
    trace_path.unlink()
    monkeypatch.setattr(SessionStreams, broken, lambda self, *args: None)
    scenario(SessionStreams())
    with pytest.raises(AssertionError):
        assert_no_stream_state(trace_path)


def test_the_stream_check_fails_on_a_trace_without_streams(trace_path):
    with pytest.raises(AssertionError, match="no stream state"):
        assert_no_stream_state(trace_path)
