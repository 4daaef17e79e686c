"""What a prefill server's Mooncake transfers moved to its decode servers (registered only while tracing
transfers: `SGLANG_EVS_TRACE` and `SGLANG_EVS_TRACE_TRANSFERS=1`).

Under prefill/decode disaggregation the prefill server writes a request's KV, its metadata row and (for a
hybrid model such as Qwen3.5) its linear-attention state into the decode server's memory through
Mooncake's `batch_transfer_sync`, each batch of (source, destination, length) blocks through
`MooncakeKVManager._transfer_data`. This AROUND hook on it records every batch as a `pd_transfer` event, so
that a benchmark can count the bytes a pruned prompt saves on the wire (`benchmark/bench_pd.py`):

    kind        kv (the prompt's KV pages) | state (Mamba / linear-attention state) | metadata (the
                first token's row: `MetadataBuffers`) | other; from the SGLang function up the stack that
                sent it (other: none found, as for a send from a thread pool, which SGLang uses with a
                custom memory pool only)
    bytes       the blocks' lengths, summed: what Mooncake was asked to move
    blocks      how many (source, destination, length) blocks
    page_bytes  (kv only) the bytes of one KV page over every layer (`kv_item_lens`), so bytes / page_bytes
                is the pages sent
    status      Mooncake's return code (0: moved)

Not seen here: a TP-resharding send (`send_kvcache_slice`, prefill and decode at other attention TP sizes),
which calls Mooncake directly, and the metadata row over ZMQ (`SGLANG_MOONCAKE_SEND_AUX_TCP`). A server tracing
transfers answers /metrics empty: registering the hook imports Mooncake's `conn` module at plugin load, before
the server sets its Prometheus multiprocess directory (so the startup check leaves this target out,
`sglang_compat.RESOLVED_WHEN_REGISTERED`).
"""

import sys

from sglang_evs import trace

# SGLang's sending functions (mooncake/conn.py) -> the kind of what they send
SENDERS = {
    "send_kvcache": "kv",
    "send_kvcache_dcp": "kv",
    "_do_staging_transfer": "kv",
    "maybe_send_extra": "state",
    "send_aux": "metadata",
}


def sending_kind(depth: int = 16) -> str:
    """The kind of what the caller's caller is sending: the first of SGLang's sending functions up the stack
    (the KV path reaches `_transfer_data` through closures and thread pools of `_send_kvcache_generic`)."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            break
        kind = SENDERS.get(frame.f_code.co_name)
        if kind is not None:
            return kind
        frame = frame.f_back
    return "other"


def record_transfer(original, manager, session_id, transfer_blocks, *args, **kwargs):
    """AROUND hook on `MooncakeKVManager._transfer_data` (traced only): one `pd_transfer` event per batch."""
    status = original(manager, session_id, transfer_blocks, *args, **kwargs)
    if transfer_blocks:
        kind = sending_kind()
        page_bytes = sum(manager.kv_args.kv_item_lens) if kind == "kv" else None
        trace.record(
            "pd_transfer", kind=kind, bytes=int(sum(block[2] for block in transfer_blocks)),
            blocks=len(transfer_blocks), page_bytes=page_bytes, session=str(session_id), status=int(status),
        )  # fmt: skip
    return status
