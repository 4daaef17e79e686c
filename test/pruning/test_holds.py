"""A request's encoded videos held from its first chunk to its last (`pruning/holds.py`), on SGLang's own items."""

import pickle

import pytest
import torch
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

from sglang_evs.pruning import holds


@pytest.fixture(autouse=True)
def nothing_held_before_or_after():
    assert holds.held_bytes() == 0
    yield
    assert holds.held_bytes() == 0


KEYS = iter(range(1000, 10**6))


def video(*spans: tuple[int, int]) -> MultimodalDataItem:
    """A video item with a key of its own (as SGLang's scheduler keys it)."""
    return MultimodalDataItem(modality=Modality.VIDEO, offsets=list(spans), hash=next(KEYS))


def test_held_rows_are_counted_once_per_storage_and_let_go_on_release():
    first, second = video((2, 9)), video((12, 20))
    encoded = torch.zeros(17, 8)
    assert holds.hold(first, encoded[:8]) and holds.hold(second, encoded[8:])  # views of one tower call
    assert holds.held_bytes() == encoded.nbytes
    assert holds.held_rows(first).data_ptr() == encoded.data_ptr()
    holds.release(first)
    assert holds.held_rows(first) is None and holds.held_bytes() == encoded.nbytes  # the second keeps it
    holds.release(second)
    assert holds.held_bytes() == 0


def test_a_copy_of_the_item_finds_its_rows_as_another_rank_would():
    """Under tensor parallelism a rank may prefill SGLang's copy of the items another rank admitted: the hold is the
    key's, so every rank finds it alike (a rank that encodes alone would hang the tower's collectives)."""
    item = video((2, 9))
    holds.hold(item, torch.ones(8, 4))
    copy = pickle.loads(pickle.dumps(item))
    assert copy is not item and holds.held_rows(copy) is holds.held_rows(item)
    holds.release(copy)
    assert holds.held_rows(item) is None


def arrived(*items: MultimodalDataItem) -> tuple[MultimodalDataItem, ...]:
    """Each item's request reaches the scheduler, in this order."""
    for item in items:
        holds.note_arrival([item])
    return items


@pytest.fixture
def bound_of_1000_bytes(monkeypatch):
    monkeypatch.setenv(holds.BOUND_ENV, str(1000 / 2**20))


def test_rows_larger_than_the_bound_are_never_held(bound_of_1000_bytes):
    (large,) = arrived(video((15, 100)))
    assert not holds.hold(large, torch.zeros(96, 8))  # 3072 bytes
    assert holds.held_rows(large) is None and holds.held_bytes() == 0


def test_a_newer_request_never_takes_the_room_an_older_one_reads_next(bound_of_1000_bytes):
    """Held rows are let go only for an older request's video, the newest request's first; a video of the newest
    request finds the room taken and is not held, nothing let go."""
    oldest, older, newer, newest = arrived(*(video((5 * i, 5 * i + 3)) for i in range(4)))
    assert holds.hold(newer, torch.zeros(4, 24)) and holds.hold(newest, torch.zeros(4, 24))  # 384 bytes each
    assert holds.hold(oldest, torch.zeros(6, 24))  # 576 bytes: the newest request's go
    assert holds.held_rows(newest) is None and holds.held_rows(newer) is not None
    assert holds.hold(older, torch.zeros(4, 24))  # then the newer one's
    assert holds.held_rows(newer) is None and holds.held_bytes() == 960
    (late,) = arrived(video((40, 43)))
    assert not holds.hold(late, torch.zeros(4, 24))
    assert holds.held_rows(oldest) is not None and holds.held_rows(older) is not None
    for item in (oldest, older):
        holds.release(item)


def test_older_rows_are_let_go_only_where_that_frees_enough(bound_of_1000_bytes):
    first, second, third = arrived(*(video((5 * i, 5 * i + 3)) for i in range(3)))
    assert holds.hold(first, torch.zeros(4, 24)) and holds.hold(third, torch.zeros(4, 24))  # 768 bytes
    assert not holds.hold(second, torch.zeros(9, 24))  # 864 bytes: the third's 384 would not make room
    assert holds.held_rows(third) is not None and holds.held_bytes() == 768
    for item in (first, third):
        holds.release(item)


def test_a_forwards_encodes_are_held_after_its_reads(bound_of_1000_bytes):
    """The forward that covers a request's last video lets that request's held rows go before it holds what it
    encoded, and holds nothing of a request it covered to the end; a newer request then finds the room."""
    (old, old_second), (new,) = arrived(video((0, 3)), video((5, 8))), arrived(video((20, 23)))
    finishing, starting = MultimodalInputs(mm_items=[old, old_second]), MultimodalInputs(mm_items=[new])
    assert holds.hold(old, torch.zeros(4, 24))
    encoded = [(old_second, torch.zeros(4, 24)), (new, torch.zeros(8, 24))]  # 768 bytes: fits once `old` is gone
    holds.release_consumed([(finishing, 4, 5), (starting, 0, 10), (None, 0, 3)], encoded)
    assert holds.held_rows(old) is None and holds.held_rows(old_second) is None
    assert holds.held_rows(new) is not None and holds.held_bytes() == 768
    holds.release_consumed([(starting, 10, 10)])  # tokens 10..19: its span (20..23) not yet
    assert holds.held_rows(new) is not None
    holds.release_consumed([(starting, 20, 5)])
    assert holds.held_rows(new) is None


def test_a_requests_videos_are_let_go_by_the_forward_that_covers_the_last_of_them():
    """Two videos in one request, prefilled in three chunks: held through the chunk that ends inside the second,
    let go together by the one that reaches its last token; another request's are left alone."""
    first, second, other = video((2, 9)), video((12, 15), (17, 20)), video((0, 5))
    request, other_request = MultimodalInputs(mm_items=[first, second]), MultimodalInputs(mm_items=[other])
    for item, rows in ((first, 8), (second, 8), (other, 6)):
        holds.hold(item, torch.zeros(rows, 4))
    holds.release_consumed([(request, 0, 10), (other_request, 0, 3), (None, 0, 7)])
    holds.release_consumed([(request, 10, 10)])  # tokens 10..19: the second video's last token (20) not yet
    assert holds.held_rows(first) is not None and holds.held_rows(second) is not None
    holds.release_consumed([(request, 20, 5)])
    assert holds.held_rows(first) is None and holds.held_rows(second) is None
    assert holds.held_rows(other) is not None
    holds.release(other)


def test_sglang_releasing_a_requests_media_lets_its_held_videos_go():
    """The AFTER hook on `MultimodalInputs.release_features` (finished, aborted): SGLang's own method runs, then
    the holds go."""
    item = video((2, 9))
    mm_inputs = MultimodalInputs(mm_items=[item])
    holds.hold(item, torch.zeros(8, 4))
    result = mm_inputs.release_features()
    assert holds.release_media(result, mm_inputs) is result
    assert holds.held_rows(item) is None and item.feature is None
