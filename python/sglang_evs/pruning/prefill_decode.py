"""Video and image pruning under prefill/decode disaggregation: both servers agree on the prompt's layout, or it fails.

Under PD, sglang-router sends each request to both servers and each lays the prompt out itself: the decode
server runs the (pruning) processor too, allocates KV for its own prompt length and decodes at positions
from its own `mrope_position_delta`, while the prefill server writes the KV. With the same setting both lay
out the same pruned prompt (the kept count depends only on the grid, the method and the rate; the decode
offset is the unpruned delta plus the pruned count). SGLang itself never compares the two: where they
differ it cuts the KV to fit or leaves stale slots, and the answer is wrong without an error
(docs/scaling.md). So the layouts are compared on the way, and a request whose two layouts differ fails by
name instead of being decoded at wrong positions:

1. prefill server (`send_layout`, after SGLang fills the metadata row the decode server receives with the
   first token): a marker, the prompt length, the M-RoPE delta and the videos' and images' pruning methods and
   rates, in free slots of the row's `cached_tokens` buffer (SGLang writes slots 0-6 of its 16);
2. decode server (`check_prefill_layout`, before SGLang commits the received row to its request): that
   layout against its own; on a difference, or without the marker on a request that prunes (a prefill
   server without this plugin), the request is aborted as SGLang aborts a corrupted row;
3. prefill server again, for a decode server without this plugin, which checks nothing
   (`check_decode_allocation`, once the decode server's KV slots are known): the pages it allocated against
   the pages this prompt fills; on a difference the transfer fails with the reason, which reaches the
   client in the decode server's error.

One more hook mends an SGLang 0.5.23 race that a pair serving pruned requests met in this project's tests
(`cleared_room_reads_failed`): without it, one unlucky request stops every later transfer of a prefill server.

Each hook acts for the architectures the plugin serves only (`refusals.serves_this_model`, from the server's
checkpoint: the hooked buffers and queues hold no model config): for any other model a pair's metadata rows,
commits and transfers are SGLang's own, two layouts that differ included.
"""

import struct
from http import HTTPStatus
from typing import NamedTuple

from sglang_evs import sglang_compat as sglang
from sglang_evs.methods import METHODS, PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING
from sglang_evs.methods.images import IMAGE_METHODS, IMAGE_PRUNING_METHOD_SETTING, IMAGE_PRUNING_RATE_SETTING
from sglang_evs.pruning.fields import is_pruned, pruned_with
from sglang_evs.pruning.refusals import serves_this_model

# Slots of a request's `cached_tokens` metadata row (int32, 16 wide; SGLang writes 0-6, MetadataBuffers.set_buf).
MARKER_SLOT, LENGTH_SLOT, DELTA_SLOT, METHOD_SLOT, RATE_SLOT, IMAGE_METHOD_SLOT, IMAGE_RATE_SLOT = range(7, 14)
LAYOUT_MARKER = 0x45565331  # "EVS1": the prefill server ran this plugin and wrote its layout
METHOD_CODES = {name: code for code, name in enumerate(METHODS, start=1)}  # 0: no pruned video
IMAGE_METHOD_CODES = {name: code for code, name in enumerate(IMAGE_METHODS, start=1)}  # 0: no pruned image
SAME_SETTING = (
    f"both servers must run sglang-evs with the same video pruning setting ({PRUNING_METHOD_SETTING}, "
    f"{PRUNING_RATE_SETTING}) and image pruning setting ({IMAGE_PRUNING_METHOD_SETTING}, {IMAGE_PRUNING_RATE_SETTING})"
)


class Layout(NamedTuple):
    """What a server's prompt of one request is, for the other server to compare: its length, its M-RoPE
    decode offset, and how its videos and its images were pruned (None, 0.0: none was)."""

    length: int
    delta: int
    method: str | None
    rate: float
    image_method: str | None = None
    image_rate: float = 0.0

    @property
    def prunes(self) -> bool:
        return self.method is not None or self.image_method is not None

    def __str__(self) -> str:
        pruned = f"videos pruned by {self.method} at {self.rate:g}" if self.method else "no video pruned"
        images = f", images pruned by {self.image_method} at {self.image_rate:g}" if self.image_method else ""
        return f"{self.length} tokens, M-RoPE delta {self.delta}, {pruned}{images}"


def layout_of(req) -> Layout:
    """A scheduler's request as this server laid it out. The delta is SGLang's `mrope_position_delta`
    ([1, 1]; 0 without media, as its decode positions take it); the setting is a pruned video item's (one
    request has one), its rate as a slot carries it (float32). A video is pruned either here (the pruning
    processor) or, on a `--language-only` prefill server, by its encoder servers (`fields.pruned_with`): the
    decode server of such a prefill server prunes in its own processor, so the two compare alike."""
    inputs = getattr(req, "multimodal_inputs", None)
    delta = getattr(inputs, "mrope_position_delta", None)
    items = getattr(inputs, "mm_items", None) or ()
    pruned = next((setting for item in items if item.is_video() and (setting := pruned_with(item))), None)
    image = next((pruned_with(item) for item in items if item.is_image() and is_pruned(item)), None)
    return Layout(
        len(req.origin_input_ids),
        0 if delta is None else int(delta.flatten()[0]),
        None if pruned is None else pruned[0],
        0.0 if pruned is None else _as_sent(pruned[1]),
        None if image is None else image[0],
        0.0 if image is None else _as_sent(image[1]),
    )


def _rate_bits(rate: float) -> int:
    """The rate as an int32 slot holds it: its float32 bits (both servers round the same float alike)."""
    return struct.unpack("<i", struct.pack("<f", rate))[0]


def _rate_from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<i", bits))[0]


def _as_sent(rate: float) -> float:
    """The rate as the other server reads it back from a slot (float32), so that equal settings compare equal."""
    return _rate_from_bits(_rate_bits(rate))


def write_layout(row, layout: Layout) -> None:
    """Into a `cached_tokens` row (int32, indexable by slot)."""
    row[MARKER_SLOT] = LAYOUT_MARKER
    row[LENGTH_SLOT] = layout.length
    row[DELTA_SLOT] = layout.delta
    row[METHOD_SLOT] = METHOD_CODES[layout.method] if layout.method else 0
    row[RATE_SLOT] = _rate_bits(layout.rate)
    row[IMAGE_METHOD_SLOT] = IMAGE_METHOD_CODES[layout.image_method] if layout.image_method else 0
    row[IMAGE_RATE_SLOT] = _rate_bits(layout.image_rate)


def read_layout(row) -> Layout | None:
    """What `write_layout` wrote into a received row; None where no marker is (a prefill without this plugin)."""
    if int(row[MARKER_SLOT]) != LAYOUT_MARKER:
        return None
    names = {code: name for name, code in METHOD_CODES.items()}
    method = names.get(int(row[METHOD_SLOT]))
    rate = _rate_from_bits(int(row[RATE_SLOT])) if method else 0.0
    image_names = {code: name for name, code in IMAGE_METHOD_CODES.items()}
    image_method = image_names.get(int(row[IMAGE_METHOD_SLOT]))
    image_rate = _rate_from_bits(int(row[IMAGE_RATE_SLOT])) if image_method else 0.0
    return Layout(int(row[LENGTH_SLOT]), int(row[DELTA_SLOT]), method, rate, image_method, image_rate)


def send_layout(result, buffers, req, *args, **kwargs):
    """AFTER hook on the prefill server's `MetadataBuffers.set_buf`: this request's layout into the free slots
    of the row the decode server receives with its first token."""
    if serves_this_model():
        write_layout(buffers.cached_tokens[req.metadata_buffer_index], layout_of(req))
    return result


def layout_mismatch(sent: Layout | None, req) -> str | None:
    """Why a decode server's request cannot take the prefill's KV and first token, given the layout the prefill
    server `sent` (None: none, a prefill server without this plugin). None: they agree, or such a prefill
    server sent a request that prunes nothing here (which it lays out as SGLang does)."""
    own = layout_of(req)
    if sent is None and not own.prunes:
        return None
    if sent is None:
        return (
            f"sglang-evs: request {req.rid} prunes its media on this decode server ({own}), but its prefill "
            "server sent no prompt layout: a prefill server without sglang-evs, which does not prune; "
            f"{SAME_SETTING}, or send {PRUNING_RATE_SETTING}=0 and {IMAGE_PRUNING_RATE_SETTING}=0 with this request"
        )
    if sent == own:
        return None
    return (
        f"sglang-evs: request {req.rid} was laid out differently by the two servers: the prefill server's prompt "
        f"has {sent}, this decode server's {own}; {SAME_SETTING}"
    )


def check_prefill_layout(original, queue, decode_req, *args, **kwargs):
    """AROUND hook on the decode server's `DecodeTransferQueue._commit_transfer_to_req`: a request whose
    prefill server laid out another prompt is aborted as SGLang aborts a corrupted row (its receiver cleared;
    the caller streams the error and frees the request) instead of decoding over KV of another layout.
    HTTP 400: sglang-router retries a 5xx, which would fail the same way. Left to SGLang: a fake transfer
    (warm-up, no prefill server), a row of another room (SGLang's own corruption check), and a rebootstrap
    (recomputed from token ids alone, which SGLang does not support for media)."""
    req, index = decode_req.req, decode_req.metadata_buffer_index
    buffers = queue.metadata_buffers
    own_room = buffers.bootstrap_room[index, 0].item() == (req.bootstrap_room or 0)
    if sglang.is_fake_transfer(req) or decode_req.is_rebootstrap or not own_room or not serves_this_model():
        return original(queue, decode_req, *args, **kwargs)
    mismatch = layout_mismatch(read_layout(buffers.cached_tokens[index]), req)
    if mismatch is None:
        return original(queue, decode_req, *args, **kwargs)
    sglang.prepare_abort(req, mismatch, status_code=HTTPStatus.BAD_REQUEST)
    decode_req.kv_receiver.clear()
    decode_req.kv_receiver = None
    return None


def allocation_mismatch(req, sent_pages: int, allocated: dict[str, int]) -> str | None:
    """Why the prefill server cannot send this request's KV: a decode server (by Mooncake session) allocated
    another number of pages than the `sent_pages` this prompt fills past the decode's cached prefix. None:
    every decode server agrees."""
    differing = {session: pages for session, pages in allocated.items() if pages != sent_pages}
    if not differing:
        return None
    (session, pages), *_ = differing.items()
    return (
        f"sglang-evs: request {req.rid} has {layout_of(req)} on this prefill server, {sent_pages} KV pages to "
        f"send, but decode server {session} allocated {pages}: it laid the prompt out differently (another "
        f"pruning setting, or no sglang-evs, which does not prune); {SAME_SETTING}"
    )


def check_decode_allocation(original, queue, req, *args, **kwargs):
    """AROUND hook on the prefill server's `PrefillBootstrapQueue.finalize_bootstrap`, which runs once the
    decode server's KV slots have arrived (Mooncake's `TransferInfo.dst_kv_indices`, after its cached prefix)
    and sizes what this server sends. A decode server without this plugin lays a pruned request out unpruned
    and checks nothing; its allocation then differs from the pages sent, and the room fails with the reason
    before any KV moves (recorded for this server's error, sent to the decode server with its failure
    status); SGLang's bootstrap-failure path then drops the request before its prefill. Where a page holds
    several tokens, a difference within the last page is not seen here (a decode server with this plugin
    sees it)."""
    finalized = original(queue, req, *args, **kwargs)
    if not serves_this_model():
        return finalized
    sender = getattr(req, "disagg_kv_sender", None)
    manager = getattr(sender, "kv_mgr", None)
    infos = getattr(manager, "transfer_infos", {}).get(req.bootstrap_room) if manager is not None else None
    if not finalized or not infos:
        return finalized
    allocated = {
        str(session): len(info.dst_kv_indices)
        for session, info in infos.items()
        if not info.is_dummy and getattr(info, "dst_kv_indices", None) is not None
    }
    mismatch = allocation_mismatch(req, int(sender.num_kv_indices), allocated)
    if mismatch is not None:
        conclude_with_reason(manager, req.bootstrap_room, mismatch)
    return finalized


def conclude_with_reason(manager, room: int, reason: str) -> None:
    """Fail a room as SGLang's sender fails one (`conclude_failure`: the reason recorded for this server's
    error, the room marked Failed, its decode servers told), with the reason in the status message too:
    Mooncake's manager leaves it out (`kv_status_msg_carries_reason`), so the decode server, whose error is
    the one sglang-router returns, would name only SGLang's generic prefill failure; a decode server of
    SGLang 0.5.23 reads a reason wherever one is sent."""
    manager.kv_status_msg_carries_reason = True  # this manager only, for this message
    try:
        manager.conclude_failure(bootstrap_room=room, failure_reason=reason)
    finally:
        del manager.kv_status_msg_carries_reason


def cleared_room_reads_failed(original, manager, bootstrap_room, *args, **kwargs):
    """AROUND hook on `CommonKVManager.check_status`: a room already cleared reads as `KVPoll.Failed` instead
    of raising KeyError. Every caller treats a room missing from `request_status` as failed, but tests that
    first and reads its status after; the scheduler thread clears a finished room in between at times, and
    the KeyError then ends Mooncake's transfer thread (`Transfer thread failed because of <room>`): every
    later request of that prefill server waits for its KV until the client gives up (seen in a full run of
    this project's suite: a text request unanswered for 300 s). Upstream's own sender poll reads a missing
    room as failed alike; a room that is there reads as SGLang reads it."""
    try:
        return original(manager, bootstrap_room, *args, **kwargs)
    except KeyError:
        if not serves_this_model():
            raise
        return sglang.KVPoll.Failed
