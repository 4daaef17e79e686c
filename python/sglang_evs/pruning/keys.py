"""A pruned video's cache key: the content hash of its pixels folded with how it is pruned
(`fields.pruning_aware_hash`), so one video pruned two ways never shares radix-cache entries or cached embeddings.

The tokenizer process sets it where it can read the pixels. Under a device feature transport (SGLang's
`--mm-feature-transport cuda_ipc`, its default for Qwen3-VL on large Hopper GPUs) the tokenizer holds only a
handle to pixels the scheduler is to read: opening it in the process that exported it fails ("invalid device
context", seen on an H200) and would use up the scheduler's one read. There the fold travels on the item
(`fields.DEFERRED_KEY`) and is applied where the scheduler hashes the item (`fold_deferred_key`); the prompt's
padded ids are then SGLang's to build in the scheduler, from the same spans.
"""

import os

from sglang_evs import sglang_compat as sglang
from sglang_evs.pruning.fields import DEFERRED_KEY, pruning_aware_hash


def is_device_handle(feature) -> bool:
    """Whether `feature` is a handle to pixels another process is to read (a device transport's proxy)."""
    return isinstance(feature, sglang.resolve("DeviceFeatureHandle"))


def key_by_pruning(
    item,
    method: str,
    rate: float,
    token_budget: int = 0,
    min_tokens_per_group: int = 0,
    threshold: float | None = None,
) -> None:
    """Set a pruned video item's key in place: its content hash, then folded with the method, rate, limits and
    threshold. Deferred to the scheduler (`DEFERRED_KEY`) when the content hash is not known yet and the pixels
    are a device handle."""
    fold = {
        "method": method, "pruning_rate": rate, "token_budget": token_budget,
        "min_tokens_per_group": min_tokens_per_group, "threshold": threshold,
    }  # fmt: skip
    if item.hash is None and item.pad_value is None and is_device_handle(item.feature):
        item.set(DEFERRED_KEY, {"fold": fold, "exporter_pid": os.getpid()})
        return
    item.set_pad_value()
    item.set_hash(pruning_aware_hash(item.hash, **fold))


def fold_deferred_key(original, item, *args, **kwargs):
    """AROUND hook on `MultimodalDataItem.set_pad_value`: SGLang hashes the item's content as it always does;
    an item whose fold was deferred (`key_by_pruning`) then gets its pruning-aware key, once. The process that
    exported its handle leaves it unkeyed (SGLang's tokenizer hashes items itself where asked to,
    `SGLANG_MM_PRECOMPUTE_HASH`). Every other item, of any model, is SGLang's alone."""
    deferred = item.model_specific_data.get(DEFERRED_KEY)
    if deferred is None:
        return original(item, *args, **kwargs)
    if deferred["exporter_pid"] == os.getpid() and is_device_handle(item.feature):
        return None
    result = original(item, *args, **kwargs)
    if item.hash is not None:
        del item.model_specific_data[DEFERRED_KEY]
        item.set_hash(pruning_aware_hash(item.hash, **deferred["fold"]))
    return result
