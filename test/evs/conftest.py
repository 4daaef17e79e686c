"""EVS unit tests run single-threaded: their tensors are tiny, and on a busy
2-core machine intra-op thread hand-offs cost milliseconds per op."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
