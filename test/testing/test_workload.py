"""`workload.sent_while_held`: the scheduler's hold is released once the round met, and always in the end."""

import threading
import time

import pytest

from sglang_evs.testing import workload


@pytest.fixture
def holds(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(workload, "slow_down", lambda base_url, seconds: calls.append(seconds))
    return calls


def test_the_hold_ends_when_the_round_met_before_the_replies(holds):
    met = threading.Event()

    def send(case):  # a reply comes only once the hold is lifted, as a held server's would
        met.set()
        deadline = time.monotonic() + 5
        while holds[-1] is not None:
            if time.monotonic() > deadline:
                raise TimeoutError("the hold was never lifted")
            time.sleep(0.01)
        return case

    assert workload.sent_while_held("url", send, [1, 2], met.is_set) == [1, 2]
    assert holds == [workload.FORWARD_HOLD_S, None, None]


def test_the_hold_ends_when_a_request_fails(holds):
    def send(case):
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        workload.sent_while_held("url", send, [1], lambda: False)
    assert holds[-1] is None
