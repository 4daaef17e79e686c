"""A pruned video's cache key: its content hash folded with how it is pruned, into the hash SGLang computes anyway,
where SGLang computes it (the scheduler, or the tokenizer where SGLang hashed the item already): the tokenizer
never hashes pixels for it, whether readable or a device handle (SGLang's CUDA IPC feature transport)."""

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


def content_hash(pixels: torch.Tensor) -> int:
    """What SGLang keys an unpruned video with."""
    item = video(pixels.clone())
    item.set_pad_value()
    return item.hash


@pytest.mark.parametrize("feature", ["pixels", "device handle"])
def test_the_tokenizer_never_hashes_a_pruned_video_and_the_scheduler_keys_it_by_content_and_pruning(feature):
    pixels = torch.arange(24.0).reshape(8, 3)
    item = video(pixels if feature == "pixels" else DeviceHandle())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MultimodalDataItem, "set_pad_value", lambda item: pytest.fail("hashed in the tokenizer"))
        keys.key_by_pruning(item, **FOLD)
    assert item.hash is None and item.pad_value is None
    assert item.model_specific_data[DEFERRED_KEY]["fold"]["pruning_rate"] == 0.5
    if feature == "device handle":
        keys.fold_deferred_key(MultimodalDataItem.set_pad_value, item)  # the exporting process never reads it
        assert item.hash is None and item.pad_value is None
    scheduler_reads(item, pixels.clone())
    assert item.hash == pruning_aware_hash(content_hash(pixels), "evs", 0.5, 64, 2) != content_hash(pixels)
    assert item.pad_value is not None and DEFERRED_KEY not in item.model_specific_data
    item.pad_value = None  # a second hashing (a retracted request's) keys it as SGLang does: folded once
    keys.fold_deferred_key(MultimodalDataItem.set_pad_value, item)
    assert item.hash == pruning_aware_hash(content_hash(pixels), "evs", 0.5, 64, 2)


def test_a_hash_sglang_computed_already_is_folded_at_once():
    """SGLang's processor hashes pixels it made on the GPU before moving them off (and a request may name its
    media's content hashes): the fold is applied in the tokenizer, from that hash, to the same key."""
    pixels = torch.arange(24.0).reshape(8, 3)
    item = video(pixels)
    item.hash = content_hash(pixels)
    keys.key_by_pruning(item, **FOLD)
    assert item.hash == pruning_aware_hash(content_hash(pixels), "evs", 0.5, 64, 2)
    assert item.pad_value is not None and DEFERRED_KEY not in item.model_specific_data


def test_any_other_item_is_keyed_by_sglang_alone():
    pixels = torch.randn(8, 3)
    hooked, upstream = video(pixels), video(pixels.clone())
    keys.fold_deferred_key(MultimodalDataItem.set_pad_value, hooked)
    upstream.set_pad_value()
    assert hooked.hash == upstream.hash and hooked.pad_values == upstream.pad_values


def pruned_prompt(feature, known_hash: int | None = None) -> MultimodalProcessorOutput:
    """Qwen3-VL text | video (2 groups of 2x2 pads, m = 1) | text, through the tokenizer-side rewrite at q = .5
    (`known_hash`: the content hash SGLang's processor computed already)."""
    vs, ve = 7, 8
    ids = [1, 2, 11, vs, PAD, PAD, PAD, PAD, ve, 12, vs, PAD, PAD, PAD, PAD, ve, 3]
    item = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(4, 7), (11, 14)], hash=known_hash)
    item.feature = feature
    item.model_specific_data = {"video_grid_thw": torch.tensor([[2, 2, 2]])}
    output = MultimodalProcessorOutput(mm_items=[item], input_ids=ids, video_token_id=PAD)
    output.mrope_positions = torch.arange(3 * len(ids)).reshape(3, len(ids))
    output.mrope_position_delta = torch.tensor([[0]])
    (counts,) = regions.prune_video_regions(output, Pruning(EVS, 0.5), spatial_merge_size=1, video_token_id=PAD)
    assert (counts.before, counts.after) == (8, 4) and len(output.input_ids) == len(ids) - 4
    return output


PAD = 9


def test_one_pruned_video_gets_one_key_and_one_padded_prompt_whoever_hashes_it(monkeypatch):
    """The same pruned prompt three ways: readable pixels and a device handle, both laid out in the tokenizer with no
    hashing there, then keyed and padded by SGLang's scheduler (`from_processor_output` with the plugin's hook,
    then SGLang's padding); and pixels SGLang's processor had hashed already, keyed and padded in the tokenizer.
    Same key, same padded prompt: the radix cache sees one prompt."""
    pixels = torch.randn(8, 3)
    hashed = pruned_prompt(pixels, known_hash=content_hash(pixels))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MultimodalDataItem, "set_pad_value", lambda item: pytest.fail("hashed in the tokenizer"))
        readable, handed = pruned_prompt(pixels.clone()), pruned_prompt(DeviceHandle())
    assert hashed.padded_input_ids is not None
    upstream = MultimodalDataItem.set_pad_value
    monkeypatch.setattr(MultimodalDataItem, "set_pad_value", lambda item: keys.fold_deferred_key(upstream, item))
    handed.mm_items[0].feature = pixels.clone()  # what SGLang's scheduler reads through the handle
    for output in (readable, handed):
        assert output.padded_input_ids is None and output.mm_items[0].pad_value is None
        scheduled = MultimodalInputs.from_processor_output(output)
        assert scheduled.mm_items[0].hash == hashed.mm_items[0].hash
        assert list(pad_mm_tokens(array("q", output.input_ids), scheduled)) == hashed.padded_input_ids


def test_a_bundle_of_handed_videos_is_refused_by_name():
    """Qwen2-VL/Qwen2.5-VL bundle a request's videos in one item: a handle cannot be split per video."""
    bundle = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(3, 10), (15, 26)])
    bundle.feature = DeviceHandle()
    bundle.model_specific_data = {"video_grid_thw": torch.tensor([[2, 4, 4], [4, 2, 6]])}
    with pytest.raises(ValueError, match="--mm-feature-transport cpu"):
        regions.split_bundled_videos([bundle])


def test_a_pruned_video_handed_as_a_cuda_ipc_handle_is_read_as_lazily_as_an_unpruned_one():
    """SGLang's scheduler defers reading a Qwen3-VL video's CUDA IPC handle (to the tower's first use) only for an item
    keyed in the tokenizer: pruned, such an item stays deferrable, its key folded at once from SGLang's hash."""
    from sglang.srt.multimodal.transport.cuda_ipc import (
        DEFER_CUDA_IPC_FEATURE_RECONSTRUCTION_KEY,
        CudaIpcTensorTransportProxy,
    )

    class Handle(CudaIpcTensorTransportProxy):
        def __init__(self):  # no device here: stands for the proxy, unread
            pass

    unpruned = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(4, 7)], hash=1234)
    unpruned.feature = Handle()
    unpruned.set_pad_value()
    pruned = pruned_prompt(Handle(), known_hash=1234).mm_items[0]
    for item in (unpruned, pruned):
        item.model_specific_data[DEFER_CUDA_IPC_FEATURE_RECONSTRUCTION_KEY] = True  # SGLang's Qwen3-VL processor's mark
    assert unpruned.can_defer_cuda_ipc_feature_reconstruction()
    assert pruned.can_defer_cuda_ipc_feature_reconstruction() and pruned.hash != unpruned.hash
