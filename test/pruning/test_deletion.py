"""`delete_tokens`: the one deletion both sides apply, on a made-up processor output."""

from types import SimpleNamespace

import torch

from sglang_evs.pruning.deletion import delete_tokens


def test_kept_tokens_keep_their_positions_spans_follow_them_and_the_offset_grows():
    ids = [1, 8, 8, 1, 9, 9, 9, 1, 9, 9, 9, 1]
    positions = torch.arange(3 * len(ids)).reshape(3, -1)
    image, video, emptied = (SimpleNamespace(offsets=offsets) for offsets in ([(1, 2)], [(4, 10)], [(8, 10)]))
    output = SimpleNamespace(input_ids=ids, mrope_positions=positions, mrope_position_delta=torch.tensor([[2]]),
                             mm_items=[image, video, emptied])  # fmt: skip
    keep = torch.tensor([True] * 6 + [False, True, False, False, False, True])
    delete_tokens(output, keep)
    assert output.input_ids == [1, 8, 8, 1, 9, 9, 1, 1]
    assert torch.equal(output.mrope_positions, positions[:, keep])
    assert int(output.mrope_position_delta) == 2 + 4
    assert output.mm_items == [image, video]  # a span with nothing kept is dropped, its item with it
    assert image.offsets == [(1, 2)] and video.offsets == [(4, 6)]  # first to last kept token of the span
