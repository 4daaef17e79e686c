"""A request's encoded videos held from its first prefill chunk to the one that covers their last token: the
vision tower runs once per video per request, whatever the chunk size and SGLang's embedding cache.

Why: SGLang fetches a video through `mm_schedule._get_chunked_embedding_full` (a video item has one span per
temporal group), which encodes every video of the request again at each chunk its embedding cache misses:
always where `SGLANG_VLM_CACHE_SIZE_MB` is 0 (SGLang's profiled default for Qwen3-VL on large Hopper GPUs), and
wherever the request's videos are larger than the cache. On an H200 a 48-s clip prefilled in three 4096-token
chunks was encoded three times, 3 x 205 ms of a 1.3-s TTFT.

What is held: the rows the model's video getter returned for an item (`PrunedVideos.features`: a pruned video's
filled region, so only its kept rows; an unpruned video's rows; a threshold video's kept rows from admission),
where the getter left them (the model's device), by the item's key (its hash: the content folded with how it is
pruned). By key, not by the item object: under tensor parallelism a rank's request may hold SGLang's copies of the
items another rank received, and every rank must make the same choice to encode or not (the tower's collectives
would otherwise wait on each other: a rank that encodes alone hangs the group). Every decision here follows only
what every rank sees alike (keys, forwards, finished and aborted requests), so the ranks agree.

Released, whichever comes first:
  - by the forward that covers the request's last held video's last token (`release_consumed`; all of a request's
    videos together, so that a later chunk never encodes an earlier video again in a batch of its own);
  - when SGLang releases the request's media: finished, aborted in the queue or mid-prefill
    (`release_media`, an AFTER hook on `MultimodalInputs.release_features`; a session's turn, whose abort drops its
    media without that call, `release_aborted_turn`);
  - the oldest first, when a new video needs the room (so a hold whose request went some other way cannot keep
    its bytes for good).
A retracted request is a decoding one: its prefill, and so its holds, ended before. Two requests in flight with one
video and one setting share its rows; the first to finish lets them go, and the other's later chunks encode it
again, as SGLang does.

Bound: `SGLANG_EVS_HELD_VIDEO_MB` (default `DEFAULT_BOUND_MB`) per process, counted over the storage the held rows
keep alive. A video whose rows are larger than it is not held: its later chunks encode it again, as SGLang does, and
it is pruned there by the keep-mask decided at its first (`PrunedVideos`), so the answer is the same.
"""

import os
from collections import OrderedDict
from dataclasses import dataclass

import torch

from sglang_evs import trace

BOUND_ENV = "SGLANG_EVS_HELD_VIDEO_MB"
# 4 GiB: 32 concurrent 48-s clips of a Qwen3-VL-8B at q = .75 (about 80 MB of kept rows each, with deepstack),
# or 12 unpruned ones; the tower's own activations for one such clip are larger than its rows.
DEFAULT_BOUND_MB = 4096


@dataclass(eq=False)
class Held:
    rows: torch.Tensor
    storage: int  # the key of the storage the rows keep alive (`_storages`)


_held: OrderedDict[int, Held] = OrderedDict()  # item key -> its rows, oldest first
# storage key -> [bytes, how many held rows keep it alive]: several items' rows may be views of one tower call
_storages: dict[int, list[int]] = {}


def bound_bytes() -> int:
    return int(float(os.environ.get(BOUND_ENV, DEFAULT_BOUND_MB)) * 2**20)


def held_bytes() -> int:
    """Bytes of storage the held rows keep alive in this process."""
    return sum(nbytes for nbytes, _ in _storages.values())


def held_rows(item) -> torch.Tensor | None:
    held = _held.get(item.hash)
    return None if held is None else held.rows


def hold(item, rows: torch.Tensor) -> bool:
    """Hold `rows` ([tokens, width], the item's encoded rows as the getter returned them) under the item's key; the
    oldest holds make room if needed. False where the rows alone are larger than the bound (the item is then encoded
    again by a later chunk that needs it)."""
    if item.hash in _held:
        return True
    storage = rows.untyped_storage()
    key = storage.data_ptr()
    extra = 0 if key in _storages else storage.nbytes()
    if extra > bound_bytes():
        _record("video_not_held", item.hash, extra)
        return False
    while extra and held_bytes() + extra > bound_bytes():
        _let_go(next(iter(_held)), "evicted")
    _storages.setdefault(key, [storage.nbytes(), 0])[1] += 1
    _held[item.hash] = Held(rows, key)
    _record("video_held", item.hash, extra)
    return True


def release(item, why: str = "consumed") -> None:
    _let_go(item.hash, why)


def _let_go(item_key: int, why: str) -> None:
    """`why`: consumed (its request's forwards covered it), media_released (SGLang dropped the request's media) or
    evicted (another video's rows needed the room)."""
    held = _held.pop(item_key, None)
    if held is None:
        return
    entry = _storages[held.storage]
    entry[1] -= 1
    if entry[1] == 0:
        del _storages[held.storage]
    _record("video_released", item_key, 0, why=why)


def release_consumed(requests) -> None:
    """After an extend forward's features were fetched: release each request's held videos once the forward covered
    the last token of the last of them. `requests`: (mm_inputs or None, prefix_len, extend_len) per request."""
    if not _held:
        return
    for mm_inputs, prefix, extend in requests:
        held = [item for item in (mm_inputs.mm_items if mm_inputs is not None else ()) if item.hash in _held]
        if held and prefix + extend > max(item.offsets[-1][1] for item in held):
            for item in held:
                release(item)


def release_media(result, mm_inputs, *args, **kwargs):
    """AFTER hook on `MultimodalInputs.release_features`: SGLang dropped a request's media (finished or aborted), so
    its held rows go too. Items of any other model hold nothing."""
    for item in getattr(mm_inputs, "mm_items", None) or ():
        release(item, "media_released")
    return result


def release_aborted_turn(req, *args, **kwargs) -> None:
    """BEFORE hook on `Req.release_mm_inputs_on_abort`: a session turn aborted mid-prefill drops its media without
    `release_features` (its session keeps the history), so its held rows go here."""
    release_media(None, req.multimodal_inputs)


def _record(event: str, item_key: int, nbytes: int, **fields) -> None:
    if trace.enabled():
        trace.record(event, item=item_key, bytes=nbytes, held_bytes=held_bytes(), **fields)
