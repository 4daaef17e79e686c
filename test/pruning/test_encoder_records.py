"""Encoder-side pruning and the language server's layout of what arrives, on made-up rows and prompts."""

from types import SimpleNamespace

import pytest
import torch

from sglang_evs.methods import EVS, VIDCOM2
from sglang_evs.pruning.encoder_records import kept_counts, lay_out_pruned, prune_encoded_videos, settings_for_encoder
from sglang_evs.pruning.fields import is_pruned, pruned_with
from sglang_evs.pruning.settings import NO_PRUNING, Pruning

VIDEO_PAD, IMAGE_PAD, TEXT = 9, 8, 1


def test_the_encoder_sends_each_videos_kept_rows_and_says_which():
    grids = [[4, 4, 4], [2, 4, 4], [4, 4, 4]]  # merged 2x2: 16, 8 and 16 rows
    settings = [settings_for_encoder(Pruning(EVS, 0.5)), settings_for_encoder(NO_PRUNING),
                settings_for_encoder(Pruning(VIDCOM2, 0.75))]  # fmt: skip
    rows = torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
    kept, counts, records = prune_encoded_videos(rows, grids, settings, 2)
    assert counts == kept_counts(grids, settings, 2)  # the sizes announced before the forward hold
    assert counts[1] == 8 and records[1]["kept"] is None
    starts = [0, 16, 24]
    expected = torch.cat([rows[start:][record["kept"]] if record["kept"] is not None else rows[16:24]
                          for start, record in zip(starts, records, strict=True)])  # fmt: skip
    assert torch.equal(kept, expected) and kept.shape[0] == sum(counts)
    with pytest.raises(ValueError, match="encoded rows"):  # rows left over: the grids do not describe them
        prune_encoded_videos(torch.cat([rows, rows[:1]]), grids, settings, 2)


class Item(SimpleNamespace):
    def __init__(self, **fields):
        super().__init__(model_specific_data={}, **fields)

    def is_video(self) -> bool:
        return self.modality == "video"


def test_the_language_server_deletes_the_pruned_pads_from_ids_positions_and_items():
    # text, an image (2 pads), text, a video of two groups (3 pads each) framed by a timestamp token
    ids = [TEXT, IMAGE_PAD, IMAGE_PAD, TEXT, TEXT, *[VIDEO_PAD] * 3, TEXT, TEXT, *[VIDEO_PAD] * 3, TEXT]
    positions = torch.arange(3 * len(ids)).reshape(3, -1)

    def output():  # upstream's processor output (the layout edits its items in place)
        items = [Item(modality="image", offsets=[(1, 2)]), Item(modality="video", offsets=[(5, 7)]),
                 Item(modality="video", offsets=[(10, 12)])]  # fmt: skip
        return SimpleNamespace(input_ids=ids, mrope_positions=positions, mrope_position_delta=torch.tensor([[3]]),
                               mm_items=items)  # fmt: skip

    record = {"method": "evs", "rate": 0.5, "kept": [0, 1, 2], "tokens": 6}  # group 1 pruned whole
    rows = torch.randn(3, 4)
    out = lay_out_pruned(output(), [record], rows, VIDEO_PAD)
    keep = torch.tensor([True] * 10 + [False] * 3 + [True])
    assert out.input_ids == torch.tensor(ids)[keep].tolist()
    assert torch.equal(out.mrope_positions, positions[:, keep])
    assert int(out.mrope_position_delta) == 3 + 3
    assert [item.offsets for item in out.mm_items] == [[(1, 2)], [(5, 7)]]  # the empty group is gone
    assert torch.equal(out.mm_items[1].precomputed_embeddings, rows)
    # the setting the encoder pruned with, for a PD pair's layout check; not one the model would prune again
    assert [pruned_with(item) for item in out.mm_items] == [None, ("evs", 0.5)]
    assert not is_pruned(out.mm_items[1])
    unpruned = lay_out_pruned(output(), [{**record, "rate": 0.0, "kept": None}], torch.randn(6, 4), VIDEO_PAD)
    assert [pruned_with(item) for item in unpruned.mm_items] == [None, None, None]
    with pytest.raises(ValueError, match="rows received"):
        lay_out_pruned(output(), [record], rows[:2], VIDEO_PAD)


def test_pads_are_found_only_inside_video_spans_and_an_item_may_have_several():
    """GLM's layout: video rows written with the image token, one span per temporal group, and an image
    beside the video with the same token. The image keeps every row; the video's second group loses two."""
    shared = IMAGE_PAD
    ids = [TEXT, shared, shared, TEXT, *[shared] * 3, TEXT, *[shared] * 3, TEXT]
    positions = torch.arange(3 * len(ids)).reshape(3, -1)
    items = [Item(modality="image", offsets=[(1, 2)]), Item(modality="video", offsets=[(4, 6), (8, 10)])]
    output = SimpleNamespace(input_ids=ids, mrope_positions=positions, mrope_position_delta=torch.tensor([[0]]),
                             mm_items=items)  # fmt: skip
    record = {"method": "evs", "rate": 0.3, "kept": [0, 1, 2, 4], "tokens": 6}
    rows = torch.randn(4, 4)
    out = lay_out_pruned(output, [record], rows, shared)
    keep = torch.tensor([True] * 8 + [False, True, False, True])  # group 1's rows 0 and 2 (tokens 8, 10) pruned
    assert out.input_ids == torch.tensor(ids)[keep].tolist()
    assert torch.equal(out.mrope_positions, positions[:, keep])
    assert int(out.mrope_position_delta) == 2
    assert [item.offsets for item in out.mm_items] == [[(1, 2)], [(4, 6), (8, 8)]]
    assert torch.equal(out.mm_items[1].precomputed_embeddings, rows)
    with pytest.raises(ValueError, match="video pads"):  # the image's two pads are not the video's
        lay_out_pruned(output, [{**record, "tokens": 8, "kept": None}], torch.randn(8, 4), shared)
