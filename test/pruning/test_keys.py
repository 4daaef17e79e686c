"""A pruned video's cache key: set in the tokenizer where the pixels are readable there, folded where the scheduler
hashes the item where the tokenizer holds only a device handle (SGLang's CUDA IPC feature transport)."""

from array import array

import pytest
import torch
from sglang.srt.managers.mm_utils import pad_mm_tokens
from sglang.srt.managers.schedule_batch import (
    Modality,
    MultimodalDataItem,
    MultimodalInputs,
    MultimodalProcessorOutput,
)
from sglang.srt.multimodal.transport.memory_pool import StreamOrderedPoolConsumerMixin

from sglang_evs.methods import EVS
from sglang_evs.pruning import keys, regions
from sglang_evs.pruning.fields import DEFERRED_KEY, pruning_aware_hash
from sglang_evs.pruning.settings import Pruning

FOLD = {"method": "evs", "rate": 0.5, "token_budget": 64, "min_tokens_per_group": 2}


class DeviceHandle(StreamOrderedPoolConsumerMixin):
    """Stands for SGLang's CUDA IPC proxy in the process that exported it: reading it there fails."""

    def __getattr__(self, name):
        raise AssertionError(f"the tokenizer read {name!r} of a device handle")


def video(feature) -> MultimodalDataItem:
    item = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(2, 9)])
    item.feature = feature
    return item


def scheduler_reads(item: MultimodalDataItem, pixels: torch.Tensor) -> None:
    """What SGLang's scheduler does with a handle: reads the pixels (`reconstruct`), then hashes the item,
    through the plugin's hook on `set_pad_value`."""
    item.feature = pixels
    keys.fold_deferred_key(MultimodalDataItem.set_pad_value, item)


def test_readable_pixels_are_keyed_in_the_tokenizer_by_content_and_pruning():
    pixels = torch.arange(24.0).reshape(8, 3)
    item = video(pixels)
    keys.key_by_pruning(item, **FOLD)
    content = video(pixels.clone())
    content.set_pad_value()
    assert item.hash == pruning_aware_hash(content.hash, "evs", 0.5, 64, 2) != content.hash
    assert item.pad_value is not None and DEFERRED_KEY not in item.model_specific_data


def test_a_device_handle_is_left_unread_and_keyed_where_the_scheduler_hashes_it_alike():
    pixels = torch.arange(24.0).reshape(8, 3)
    in_tokenizer = video(pixels)
    keys.key_by_pruning(in_tokenizer, **FOLD)
    handed = video(DeviceHandle())
    keys.key_by_pruning(handed, **FOLD)
    assert handed.hash is None and handed.pad_value is None
    assert handed.model_specific_data[DEFERRED_KEY]["fold"]["pruning_rate"] == 0.5
    keys.fold_deferred_key(MultimodalDataItem.set_pad_value, handed)  # the exporting process never reads it
    assert handed.hash is None and handed.pad_value is None
    scheduler_reads(handed, pixels.clone())
    assert handed.hash == in_tokenizer.hash and handed.pad_values == in_tokenizer.pad_values
    assert DEFERRED_KEY not in handed.model_specific_data
    handed.pad_value = None  # a second hashing (a retracted request's) keys it as SGLang does: folded once
    keys.fold_deferred_key(MultimodalDataItem.set_pad_value, handed)
    assert handed.hash == in_tokenizer.hash


def test_any_other_item_is_keyed_by_sglang_alone():
    pixels = torch.randn(8, 3)
    hooked, upstream = video(pixels), video(pixels.clone())
    keys.fold_deferred_key(MultimodalDataItem.set_pad_value, hooked)
    upstream.set_pad_value()
    assert hooked.hash == upstream.hash and hooked.pad_values == upstream.pad_values


def pruned_prompt(feature) -> MultimodalProcessorOutput:
    """Qwen3-VL text | video (2 groups of 2x2 pads, m = 1) | text, through the tokenizer-side rewrite at q = .5."""
    vs, ve = 7, 8
    ids = [1, 2, 11, vs, PAD, PAD, PAD, PAD, ve, 12, vs, PAD, PAD, PAD, PAD, ve, 3]
    item = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(4, 7), (11, 14)])
    item.feature = feature
    item.model_specific_data = {"video_grid_thw": torch.tensor([[2, 2, 2]])}
    output = MultimodalProcessorOutput(mm_items=[item], input_ids=ids, video_token_id=PAD)
    output.mrope_positions = torch.arange(3 * len(ids)).reshape(3, len(ids))
    output.mrope_position_delta = torch.tensor([[0]])
    (counts,) = regions.prune_video_regions(output, Pruning(EVS, 0.5), spatial_merge_size=1, video_token_id=PAD)
    assert (counts.before, counts.after) == (8, 4) and len(output.input_ids) == len(ids) - 4
    return output


PAD = 9


def test_a_handed_video_is_padded_and_keyed_by_the_scheduler_as_the_tokenizer_keys_a_readable_one(monkeypatch):
    """The same pruned prompt two ways: pixels readable in the tokenizer (keyed and padded there), and pixels
    handed over as a device handle (left to the scheduler: SGLang's `from_processor_output` with the plugin's
    hook, then SGLang's padding). Same key, same padded prompt: the radix cache sees one prompt."""
    pixels = torch.randn(8, 3)
    readable, handed = pruned_prompt(pixels), pruned_prompt(DeviceHandle())
    assert handed.padded_input_ids is None and handed.mm_items[0].pad_value is None
    assert readable.padded_input_ids is not None
    upstream = MultimodalDataItem.set_pad_value
    monkeypatch.setattr(MultimodalDataItem, "set_pad_value", lambda item: keys.fold_deferred_key(upstream, item))
    handed.mm_items[0].feature = pixels.clone()  # what SGLang's scheduler reads through the handle
    scheduled = MultimodalInputs.from_processor_output(handed)
    assert scheduled.mm_items[0].hash == readable.mm_items[0].hash
    assert list(pad_mm_tokens(array("q", handed.input_ids), scheduled)) == readable.padded_input_ids


def test_a_bundle_of_handed_videos_is_refused_by_name():
    """Qwen2-VL/Qwen2.5-VL bundle a request's videos in one item: a handle cannot be split per video."""
    bundle = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(3, 10), (15, 26)])
    bundle.feature = DeviceHandle()
    bundle.model_specific_data = {"video_grid_thw": torch.tensor([[2, 4, 4], [4, 2, 6]])}
    with pytest.raises(ValueError, match="--mm-feature-transport cpu"):
        regions.split_bundled_videos([bundle])
