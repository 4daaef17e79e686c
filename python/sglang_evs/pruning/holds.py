"""A request's encoded videos held from its first prefill chunk to the one that covers their last token: the
vision tower runs once per video per request, whatever the chunk size and SGLang's embedding cache.

Why: SGLang fetches a video through `mm_schedule._get_chunked_embedding_full` (a video item has one span per
temporal group), which encodes every video of the request again at each chunk its embedding cache misses:
always where `SGLANG_VLM_CACHE_SIZE_MB` is 0 (SGLang's profiled default for Qwen3-VL on large Hopper GPUs), and
wherever the request's videos are larger than the cache. On an H200 a 48-s clip prefilled in three 4096-token
chunks was encoded three times, 3 x 205 ms of a 1.3-s TTFT.

What is held: the rows the model's video getter returned for an item (`PrunedVideos.features`: a pruned video's
filled region, so only its kept rows; an unpruned video's rows; a threshold video's kept rows from admission),
where the getter left them (the model's device), as an attribute of the item itself. It is not one of the item's
fields, so SGLang never serializes or sends it, and it lives no longer than the request's item does.

Released, whichever comes first:
  - by the forward that covers the request's last held video's last token (`release_consumed`; all of a request's
    videos together, so that a later chunk never encodes an earlier video again in a batch of its own);
  - when SGLang releases the request's media: finished, aborted in the queue or mid-prefill
    (`release_media`, an AFTER hook on `MultimodalInputs.release_features`);
  - with the item, if neither ran.
A retracted request is a decoding one: its prefill, and so its holds, ended before.

Bound: `SGLANG_EVS_HELD_VIDEO_MB` (default `DEFAULT_BOUND_MB`) per process, counted over the storage the held rows
keep alive. A video whose rows would pass it is not held: its later chunks encode it again, as SGLang does, and
it is pruned there by the keep-mask decided at its first (`PrunedVideos`), so the answer is the same.
"""

import os
import weakref
from dataclasses import dataclass

import torch

from sglang_evs import trace

BOUND_ENV = "SGLANG_EVS_HELD_VIDEO_MB"
# 4 GiB: 32 concurrent 48-s clips of a Qwen3-VL-8B at q = .75 (about 80 MB of kept rows each, with deepstack),
# or 12 unpruned ones; the tower's own activations for one such clip are larger than its rows.
DEFAULT_BOUND_MB = 4096
HELD_ATTR = "_sglang_evs_held"  # on the item's instance dictionary (SGLang's items accept extra attributes)


@dataclass(eq=False)
class Held:
    rows: torch.Tensor
    storage: int  # the key of the storage the rows keep alive (`_storages`)


# storage key -> (bytes, the ids of the `Held` alive that keep it): several items' rows may be views of one batch.
# A `Held` leaves it as it is garbage collected (`weakref.finalize`): popped by `release`, or gone with its item.
_storages: dict[int, tuple[int, set[int]]] = {}


def bound_bytes() -> int:
    return int(float(os.environ.get(BOUND_ENV, DEFAULT_BOUND_MB)) * 2**20)


def held_bytes() -> int:
    """Bytes of storage the held rows keep alive in this process."""
    return sum(nbytes for nbytes, _ in _storages.values())


def held_rows(item) -> torch.Tensor | None:
    held = item.__dict__.get(HELD_ATTR)
    return None if held is None else held.rows


def hold(item, rows: torch.Tensor) -> bool:
    """Hold `rows` ([tokens, width], the item's encoded rows as the getter returned them) on `item`; False where the
    bound leaves no room (the item is then encoded again by a later chunk that needs it)."""
    if held_rows(item) is not None:
        return True
    storage = rows.untyped_storage()
    key = storage.data_ptr()
    extra = 0 if key in _storages else storage.nbytes()
    if extra and held_bytes() + extra > bound_bytes():
        _record("video_not_held", item, extra)
        return False
    held = Held(rows, key)
    _storages.setdefault(key, (storage.nbytes(), set()))[1].add(id(held))
    weakref.finalize(held, _forget, key, id(held))
    item.__dict__[HELD_ATTR] = held
    _record("video_held", item, extra)
    return True


def release(item) -> None:
    if item.__dict__.pop(HELD_ATTR, None) is not None:  # the `Held` is collected here: `_forget`
        _record("video_released", item, 0)


def _forget(key: int, held_id: int) -> None:
    _, holders = _storages[key]
    holders.discard(held_id)
    if not holders:
        del _storages[key]


def release_consumed(requests) -> None:
    """After an extend forward's features were fetched: release each request's held videos once the forward covered
    the last token of the last of them. `requests`: (mm_inputs or None, prefix_len, extend_len) per request."""
    if not _storages:
        return
    for mm_inputs, prefix, extend in requests:
        held = [item for item in (mm_inputs.mm_items if mm_inputs is not None else ()) if held_rows(item) is not None]
        if held and prefix + extend > max(item.offsets[-1][1] for item in held):
            for item in held:
                release(item)


def release_media(result, mm_inputs, *args, **kwargs):
    """AFTER hook on `MultimodalInputs.release_features`: SGLang dropped a request's media (finished or aborted), so
    its held rows go too. Items of any other model hold nothing."""
    for item in getattr(mm_inputs, "mm_items", None) or ():
        release(item)
    return result


def _record(event: str, item, nbytes: int) -> None:
    if trace.enabled():
        trace.record(event, item=item.hash, bytes=nbytes, held_bytes=held_bytes())
