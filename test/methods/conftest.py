"""EVS unit tests run single-threaded: their tensors are tiny, and on a busy
2-core machine intra-op thread hand-offs cost milliseconds per op.

`vllm_evs` / `vllm_vidcom2`: vLLM 0.33.0's released pruning modules, fetched
from PyPI at test time (see vllm_wheel.py); tests using them skip when the
registry cannot be reached, except under CI (`CI=true`), where PyPI is reachable by
definition and a cross-check that did not run is a failure."""

import os
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from .vllm_wheel import VERSION, VllmUnavailable, released_module


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _released(name: str) -> ModuleType:
    try:
        return released_module(name)
    except VllmUnavailable as err:
        message = f"vLLM {VERSION} wheel could not be fetched from PyPI, so no cross-check: {err}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def vllm_evs() -> ModuleType:
    return _released("evs")


@pytest.fixture(scope="session")
def vllm_vidcom2() -> ModuleType:
    return _released("vidcom2")
