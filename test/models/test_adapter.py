"""The adapter's traced extend forward under a graph capture (`models/adapter.py`, `_trace_forward`)."""

import time
from types import SimpleNamespace

import pytest
import torch

from sglang_evs import trace
from sglang_evs.models.adapter import _trace_forward
from sglang_evs.runtime.cpu_graph import CaptureError, CpuGraphSegment


class ExtendMode:
    """A target-verify batch's mode: an extend forward, and one a graph captures whole."""

    def is_extend(self) -> bool:
        return True


@pytest.fixture
def traced(tmp_path, monkeypatch) -> object:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(trace.ENV, str(path))
    return path


def test_a_traced_extend_forward_waits_for_its_device_and_is_timed(cpu_graph_stand_ins, traced, monkeypatch):
    waits = []
    monkeypatch.setattr(torch.cpu, "synchronize", lambda device=None: waits.append(device))
    _trace_forward(SimpleNamespace(forward_mode=ExtendMode()), torch.zeros(5, dtype=torch.long), time.perf_counter())
    assert len(waits) == 1 and [event["tokens"] for event in trace.read(traced, "extend_forward")] == [5]


def test_a_traced_extend_forward_under_a_capture_neither_waits_nor_is_timed(cpu_graph_stand_ins, traced):
    """A target-verify graph captures the whole forward, tracing included: waiting for the device there
    fails a CUDA capture, and the stand-in's synchronize as CUDA's."""
    segment = CpuGraphSegment()
    segment.capture_begin()
    try:
        with pytest.raises(CaptureError, match="synchronize"):
            torch.cpu.synchronize()
        _trace_forward(SimpleNamespace(forward_mode=ExtendMode()), torch.zeros(5, dtype=torch.long), 0.0)
    finally:
        segment.capture_end()
    assert not traced.exists() or not trace.read(traced, "extend_forward")
