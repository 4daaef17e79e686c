"""A pruned video's cache key: the content hash of its pixels folded with how it is pruned
(`fields.pruning_aware_hash`), so one video pruned two ways never shares radix-cache entries or cached embeddings.

The fold goes into the hash SGLang computes anyway, wherever SGLang computes it, on every feature transport: the
tokenizer process never hashes pixels for it. Where SGLang has hashed the item before the plugin sees it (its
processor hashes pixels it made on the GPU before moving them off; a request may name its media's content hashes),
the fold is applied at once. Otherwise it travels on the item (`fields.DEFERRED_KEY`) and is applied as SGLang
hashes the item (`fold_deferred_key`): in the scheduler, as it receives the request (as for an unpruned video), or in
the tokenizer under `SGLANG_MM_PRECOMPUTE_HASH`. The prompt's padded ids are then SGLang's to build in the
scheduler, from the same spans. (Hashing every pruned video's pixels on the tokenizer's CPU took 200-500 ms of a
48-s clip's processing on an H200 host, which an unpruned video never paid.)

A device feature transport (SGLang's `--mm-feature-transport cuda_ipc`, its default for Qwen3-VL on large Hopper
GPUs) leaves the tokenizer only a handle to pixels the scheduler is to read: the process that exported it never
hashes it (opening it there fails, "invalid device context", seen on an H200, and would use up the scheduler's one
read).
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
    stream_context: str | None = None,
) -> None:
    """Key a pruned video item by its content hash folded with the method, rate, limits, threshold and the stream
    group it continues: at once where SGLang hashed it already, else where SGLang will (`DEFERRED_KEY`)."""
    fold = {
        "method": method, "pruning_rate": rate, "token_budget": token_budget,
        "min_tokens_per_group": min_tokens_per_group, "threshold": threshold, "stream_context": stream_context,
    }  # fmt: skip
    if item.hash is None:
        item.set(DEFERRED_KEY, {"fold": fold, "exporter_pid": os.getpid()})
        return
    item.set_pad_value()  # from the hash SGLang computed: no hashing here
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
