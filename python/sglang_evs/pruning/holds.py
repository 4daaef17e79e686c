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
  - to make room for a video of an older request (`hold`), as below.
A retracted request is a decoding one: its prefill, and so its holds, ended before. Two requests in flight with one
video and one setting share its rows; the first to finish lets them go, and the other's later chunks encode it
again, as SGLang does.

Bound: `SGLANG_EVS_HELD_VIDEO_MB` per process (default: `default_bound_mb`, a share of the model device's memory,
reserved out of SGLang's KV budget by the plugin), counted over the storage the held rows keep alive. What is held
is what later forwards read: a pruned video's kept rows, never its unpruned count. A forward's encodes are held after
its reads (`release_consumed`): the videos it read for the last time are let go first, and a video whose request
reads it for the last time in the forward that encodes it is not held at all.

Past the bound, the work done is kept (`_room_for`): a new video may take the room of rows held for requests that
reached the scheduler after its own, the newest first; never the rows an older request, admitted or prefilling,
reads next. Where that frees too little, the video is not held and nothing is let go: its request encodes it again
at its next chunk. SGLang prefills one chunked request at a time, and the room its older requests held is free once
their last chunks ran, so a video is encoded at most twice per request (a threshold video queued behind a long
prefill: at admission, then at its own first chunk). A video whose rows alone are larger than the bound is never
held: each of its chunks encodes it, as SGLang does, pruned by the keep-mask decided at its first (`PrunedVideos`),
so the answer is the same.
"""

import functools
import itertools
import os
from collections import OrderedDict
from dataclasses import dataclass

import torch

from sglang_evs import trace

BOUND_ENV = "SGLANG_EVS_HELD_VIDEO_MB"
# The default bound: this share of the model device's memory, at most 4 GiB. A 24-GB card serving Qwen3-VL-8B in
# bf16 (16.3 GiB of weights) keeps about 2.1 GiB of KV beside 0.7 GiB of holds: seven 48-s clips at q = .75 (about
# 100 MB of kept rows each, with deepstack). An H200 reaches the cap: 40 such clips.
DEFAULT_DEVICE_SHARE = 0.03
DEFAULT_CAP_MB = 4096
ARRIVALS_KEPT = 65536  # item keys whose requests' arrival order is remembered (`note_arrival`)


@dataclass(eq=False)
class Held:
    rows: torch.Tensor
    storage: int  # the key of the storage the rows keep alive (`_storages`)
    arrival: int  # the arrival order of the oldest request that reads it (`note_arrival`)


_held: dict[int, Held] = {}  # item key -> its rows
# storage key -> [bytes, how many held rows keep it alive]: several items' rows may be views of one tower call
_storages: dict[int, list[int]] = {}
_arrivals: OrderedDict[int, int] = OrderedDict()  # item key -> the order its oldest request reached the scheduler
_arrival_count = itertools.count()


def default_bound_mb(device_bytes: int) -> float:
    return min(float(DEFAULT_CAP_MB), DEFAULT_DEVICE_SHARE * device_bytes / 2**20)


@functools.cache
def _device_bytes() -> int:
    """The memory of the device the model runs on: this process's GPU, or the host's on the CPU route."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def bound_bytes() -> int:
    configured = os.environ.get(BOUND_ENV)
    megabytes = float(configured) if configured is not None else default_bound_mb(_device_bytes())
    return int(megabytes * 2**20)


def held_bytes() -> int:
    """Bytes of storage the held rows keep alive in this process."""
    return sum(nbytes for nbytes, _ in _storages.values())


def held_rows(item) -> torch.Tensor | None:
    held = _held.get(item.hash)
    return None if held is None else held.rows


def note_arrival(items) -> None:
    """A request reached the scheduler with these media items: their keys take its arrival order (the first
    request's, where two carry one video). Every rank receives the same requests in the same order."""
    order = next(_arrival_count)
    for item in items:
        if item.hash is not None and item.hash not in _arrivals:
            _arrivals[item.hash] = order
    while len(_arrivals) > ARRIVALS_KEPT:
        _arrivals.popitem(last=False)


def hold(item, rows: torch.Tensor) -> bool:
    """Hold `rows` ([tokens, width], the item's encoded rows as the getter returned them) under the item's key, if
    there is room (`_room_for`). False where they are not held."""
    if item.hash in _held:
        return True
    storage = rows.untyped_storage()
    key = storage.data_ptr()
    extra = 0 if key in _storages else storage.nbytes()
    arrival = _arrivals.get(item.hash)
    if arrival is None:  # keyed after its request arrived (a device handle): as a request arriving now
        arrival = _arrivals[item.hash] = next(_arrival_count)
    if extra > bound_bytes():
        _record("video_not_held", item.hash, extra, why="larger_than_bound")
        return False
    room = _room_for(extra, arrival)
    if room is None:
        _record("video_not_held", item.hash, extra, why="older_requests_hold_the_bound")
        return False
    for victim in room:
        _let_go(victim, "evicted")
    _storages.setdefault(key, [storage.nbytes(), 0])[1] += 1
    _held[item.hash] = Held(rows, key, arrival)
    _record("video_held", item.hash, extra, arrival=arrival)
    return True


def _room_for(extra: int, arrival: int) -> list[int] | None:
    """The held keys to let go so that `extra` more bytes fit the bound, for a video whose request arrived `arrival`:
    rows of requests that arrived after it, the newest first. None where letting all of those go would not free
    enough (then none go)."""
    free = bound_bytes() - held_bytes()
    if extra <= free:
        return []
    newer = sorted((key for key, held in _held.items() if held.arrival > arrival),
                   key=lambda key: _held[key].arrival, reverse=True)  # fmt: skip
    users = {storage: count for storage, (_, count) in _storages.items()}
    chosen = []
    for key in newer:
        storage = _held[key].storage
        users[storage] -= 1
        if users[storage] == 0:
            free += _storages[storage][0]
        chosen.append(key)
        if extra <= free:
            return chosen
    return None


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


def release_consumed(requests, encoded=()) -> None:
    """After an extend forward's features were fetched: each request's held videos let go once the forward covered
    the last token of the last of them, then what the forward encoded held for the requests that read it later.
    Holding after the forward's reads, not as it encodes, lets the videos it read for the last time make room first.
    `requests`: (mm_inputs or None, prefix_len, extend_len) per request; `encoded`: (item, rows) per video encoded."""
    if not _held and not encoded:  # every extend forward passes here, most with nothing held
        return
    read_later = set()
    for mm_inputs, prefix, extend in requests:
        videos = [item for item in (mm_inputs.mm_items if mm_inputs is not None else ()) if item.is_video()]
        if not videos:
            continue
        if prefix + extend > max(item.offsets[-1][1] for item in videos):
            for item in videos:
                release(item)
        else:
            read_later.update(item.hash for item in videos)
    for item, rows in encoded:
        if item.hash in read_later:
            hold(item, rows)


def release_media(result, mm_inputs, *args, **kwargs):
    """AFTER hook on `MultimodalInputs.release_features`: SGLang dropped a request's media (finished or aborted), so
    its held rows go too. Items of any other model hold nothing."""
    for item in getattr(mm_inputs, "mm_items", None) or ():
        release(item, "media_released")
        _arrivals.pop(item.hash, None)
    return result


def release_aborted_turn(req, *args, **kwargs) -> None:
    """BEFORE hook on `Req.release_mm_inputs_on_abort`: a session turn aborted mid-prefill drops its media without
    `release_features` (its session keeps the history), so its held rows go here."""
    release_media(None, req.multimodal_inputs)


def _record(event: str, item_key: int, nbytes: int, **fields) -> None:
    if trace.enabled():
        trace.record(event, item=item_key, bytes=nbytes, held_bytes=held_bytes(), **fields)
