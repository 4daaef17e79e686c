"""Video pruning under encoder disaggregation: the encoder server prunes, the language server lays out.

With `--encoder-only` servers encoding for a `--language-only` one (SGLang's `zmq_to_scheduler`
transport), a request's videos travel to an encoder server as URLs and come back as embedding rows;
the language server builds the prompt only when the rows arrive (its processor's `get_mm_data`).
So pruning happens where the rows are made:

1. language tokenizer: the request's method and rate (over the language server's default) ride with
   each video entry sent to the encoder (`settings_for_encoder`);
2. encoder server: after the tower, each video's keep-mask (`methods`) picks its kept rows; only those
   rows are sent, with a record per video (method, rate, kept indices) (`prune_encoded_videos`);
3. language scheduler: the prompt is laid out unpruned by upstream's processor (over stand-in rows),
   then the pruned pads are deleted from its ids, positions and items, and the received rows placed
   (`lay_out_pruned`): the same rule as one server (unpruned positions, pruned rows deleted, decode
   offset grown by the pruned count).

The request's setting also rides to the language scheduler (in its sampling parameters' `custom_params`,
SGLang's own private channel for per-request facts), so that rows coming back without a record (an encoder
that does not run this plugin) fail that request by name instead of serving it at another rate
(`refuse_rows_without_records`).
"""

import pickle
from array import array

import torch

from sglang_evs import trace
from sglang_evs.methods import DEFAULT_METHOD, METHODS, PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING, grid_tokens
from sglang_evs.pruning.settings import (
    Pruning,
    conflicting_setup,
    pruning_from,
    refuse_unsupported,
    server_pruning,
)

RECORDS = "evs_video_pruning"  # the per-video records' attribute on SGLang's EmbeddingData
ASKED = "__sglang_evs_video_pruning"  # the request's setting, in its sampling parameters' custom_params


def video_record(method: str, rate: float, kept: list[int] | None, tokens: int) -> dict:
    """What the encoder did to one video, in plain types (SGLang's restricted unpickler carries it):
    `kept` the indices of the kept pads in the video's [T*h*w] (None: not pruned), `tokens` its pads."""
    return {"method": method, "rate": rate, "kept": kept, "tokens": tokens}


def settings_for_encoder(pruning: Pruning) -> dict:
    """The fields one video entry carries to the encoder server."""
    return {PRUNING_METHOD_SETTING: pruning.method.name, PRUNING_RATE_SETTING: pruning.rate}


def video_pruning(setting: dict):
    """A video entry's settings (`settings_for_encoder`, {} for none) -> (its method, its rate)."""
    method = METHODS[setting.get(PRUNING_METHOD_SETTING, DEFAULT_METHOD.name)]
    return method, float(setting.get(PRUNING_RATE_SETTING) or 0.0)


def prune_encoded_videos(
    rows: torch.Tensor, grids: list, settings: list[dict], spatial_merge_size: int
) -> tuple[torch.Tensor, list[int], list[dict]]:
    """Rows [sum tokens, D] of several videos, in order (grids [T, H, W] each, settings as
    `settings_for_encoder` wrote them, {} for none) -> (the kept rows, each video's kept count, records)."""
    kept_rows, counts, records = [], [], []
    start = 0
    for grid, setting in zip(grids, settings, strict=True):
        t, h, w = grid_tokens(grid, spatial_merge_size)
        video = rows[start : start + t * h * w]
        start += t * h * w
        method, rate = video_pruning(setting)
        if rate <= 0:
            kept_rows.append(video)
            counts.append(t * h * w)
            records.append(video_record(method.name, 0.0, None, t * h * w))
            continue
        mask = method.retention_mask(video, grid, spatial_merge_size, rate)
        kept_rows.append(video[mask])
        counts.append(int(mask.sum()))
        records.append(video_record(method.name, rate, mask.nonzero().flatten().tolist(), t * h * w))
    if start != rows.shape[0]:
        raise ValueError(f"{rows.shape[0]} encoded rows for videos of {start} tokens")
    return torch.cat(kept_rows) if kept_rows else rows, counts, records


def lay_out_pruned(output, records: list[dict], video_rows: torch.Tensor, video_token_id: int):
    """Upstream's processor output for the unpruned prompt (its video items over stand-in rows) -> the
    pruned prompt: each video's pruned pads deleted from the ids, the M-RoPE positions and the items'
    spans, the decode offset grown by their count, and the received kept rows [sum kept, D] placed in
    the video items, in order. Records: `video_record`s, one per video in prompt order.

    A video's pads are the `video_token_id` tokens inside its items' spans, and an item may have several
    spans (GLM writes a video's rows with its image token, one span per temporal group): an image's pads
    are never taken for a video's, even where the two share a token id."""
    ids = torch.as_tensor(output.input_ids)
    in_video = torch.zeros_like(ids, dtype=torch.bool)
    for item in output.mm_items:
        for start, end in item.offsets if item.is_video() else ():
            in_video[start : end + 1] = True
    is_pad = in_video & (ids == video_token_id)
    pads = is_pad.nonzero().flatten()
    masks = []
    for record in records:
        mask = torch.ones(record["tokens"], dtype=torch.bool)
        if record["kept"] is not None:
            mask[:] = False
            mask[list(record["kept"])] = True
        masks.append(mask)
    pad_mask = torch.cat(masks) if masks else torch.ones(0, dtype=torch.bool)
    if pad_mask.numel() != pads.numel():
        raise ValueError(f"the prompt has {pads.numel()} video pads, the encoder's records {pad_mask.numel()}")
    if int(pad_mask.sum()) != video_rows.shape[0]:
        raise ValueError(f"{video_rows.shape[0]} video rows received for {int(pad_mask.sum())} kept pads")
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[pads] = pad_mask
    new_index = keep.cumsum(0) - 1
    kept_pad = keep & is_pad
    items, consumed = [], 0
    for item in output.mm_items:
        offsets, kept_pads = [], 0
        for start, end in item.offsets:
            kept_at = start + keep[start : end + 1].nonzero().flatten()
            if kept_at.numel():
                offsets.append((int(new_index[kept_at[0]]), int(new_index[kept_at[-1]])))
            kept_pads += int(kept_pad[start : end + 1].sum())
        if not offsets:  # every row of the item pruned
            continue
        if item.is_video():
            item.precomputed_embeddings = video_rows[consumed : consumed + kept_pads]
            consumed += kept_pads
        item.offsets = offsets
        items.append(item)
    pruned = int((~keep).sum())
    output.input_ids = ids[keep].tolist()
    output.mrope_positions = output.mrope_positions[:, keep]
    output.mrope_position_delta = output.mrope_position_delta + pruned
    output.mm_items = items
    return output


# --- hooks (registered by the plugin) ---------------------------------------------------------------------

ENCODER_SETTINGS = "evs_video_settings"  # each video's settings, on the encode context until the rows exist


def carry_pruning_to_encoders(tokenizer_manager, request, *args, **kwargs):
    """BEFORE hook on a `--language-only` server's dispatch of a request's media to its encoder servers:
    the request's method and rate over the server's (a bad one is SGLang's HTTP 400 here, before anything
    is sent), written back into its `mm_processor_kwargs` for `settings_to_video_entries`."""
    hf_config = getattr(getattr(tokenizer_manager, "model_config", None), "hf_config", None)
    default = server_pruning(hf_config)
    conflict = conflicting_setup(tokenizer_manager.server_args, hf_config)
    given = request.mm_processor_kwargs  # a batch request may give one dict per sub-request
    resolved, prunings = [], set()
    for settings in given if isinstance(given, list) else [given]:
        pruning = pruning_from(settings or {}, default)
        refuse_unsupported(pruning, conflict)
        prunings.add(pruning)
        resolved.append({**(settings or {}), **settings_for_encoder(pruning)})
    if len(prunings) > 1:  # SGLang sends a batch's media to the encoders as one request
        raise ValueError(
            f"a batch request under encoder disaggregation takes one {PRUNING_METHOD_SETTING} and "
            f"{PRUNING_RATE_SETTING} for all its prompts; send prompts that differ as separate requests"
        )
    request.mm_processor_kwargs = resolved if isinstance(given, list) else resolved[0]
    (pruning,) = prunings
    if pruning.prunes:
        request.sampling_params = with_asked_pruning(request.sampling_params, pruning)


def with_asked_pruning(sampling_params, pruning: Pruning):
    """A request's sampling parameters (a dict, one per prompt of a batch, or None) with the pruning it
    asked for under `ASKED` in each one's `custom_params`, where the language scheduler reads it."""
    if isinstance(sampling_params, list):
        return [with_asked_pruning(params, pruning) for params in sampling_params]
    params = dict(sampling_params or {})
    params["custom_params"] = {**(params.get("custom_params") or {}), ASKED: settings_for_encoder(pruning)}
    return params


def refuse_rows_without_records(waiting, *args, **kwargs) -> None:
    """BEFORE hook on the language scheduler's assembly of a request's rows from its encoders: a request
    that asked for pruning, whose videos came back without the encoders' records (an encoder server that
    does not run this plugin sends every row, unpruned and unrecorded), fails with an error naming the
    encoders and the setting; SGLang reports it to the client and serves on. Never served at another rate."""
    custom = waiting.recv_req.sampling_params.custom_params
    asked = custom.get(ASKED) if isinstance(custom, dict) else None
    if not asked:
        return
    received = waiting.recv_embedding_data
    grids = received.get_mm_extra_meta()["video_grid_thw"]
    videos = 0 if grids is None else len(grids)
    recorded = sum(len(part or ()) for part in getattr(received, RECORDS, None) or ())
    if recorded < videos:
        setting = " ".join(f"{key}={value}" for key, value in asked.items())
        raise ValueError(
            f"sglang-evs: this request asked for {setting}, but {videos - recorded} of its {videos} videos came "
            f"back from the encoder server(s) {', '.join(waiting.recv_req.encoder_urls or ['?'])} unpruned "
            "and without a pruning record: an encoder server without the sglang-evs plugin. Install "
            f"sglang-evs on every --encoder-only server, or send {PRUNING_RATE_SETTING}=0 with this request"
        )


def settings_to_video_entries(result: list, receiver, request_obj, *args, **kwargs) -> list:
    """AFTER hook on the language server's list of media entries for the encoders: each video entry
    carries the request's method and rate (`carry_pruning_to_encoders` resolved them)."""
    settings = request_obj.mm_processor_kwargs
    if isinstance(settings, list):  # a batch: one setting for all (carry_pruning_to_encoders)
        settings = settings[0] if settings else None
    if not settings or PRUNING_RATE_SETTING not in settings:
        return result
    for entry in result:
        if getattr(entry.get("modality"), "name", None) == "VIDEO":
            entry.update({key: settings[key] for key in (PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING)})
    return result


async def remember_video_settings(original, encoder, requests, modality, *args, **kwargs):
    """AROUND hook on the encoder's `_prepare_encode_context`: each video's settings, in the order of
    its grids, onto the context for `prune_on_encoder`."""
    context = await original(encoder, requests, modality, *args, **kwargs)
    if getattr(modality, "name", None) != "VIDEO":
        return context
    leaves = [leaf for request in requests for leaf in encoder.preprocessor._flatten_nested_items(request["mm_items"])]
    keys = (PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING)
    settings = [{key: leaf[key] for key in keys if key in leaf} if isinstance(leaf, dict) else {} for leaf in leaves]
    if not any(setting.get(PRUNING_RATE_SETTING) for setting in settings):
        return context
    if len(settings) != context.num_items or len(context.items_per_req) != 1:
        raise RuntimeError(
            f"sglang-evs: cannot prune {context.num_items} encoded videos of {len(context.items_per_req)} "
            f"requests from {len(settings)} video entries"
        )
    context.aux_data[ENCODER_SETTINGS] = settings
    return context


def kept_counts(grids: list, settings: list[dict], spatial_merge_size: int) -> list[int]:
    """Each video's row count once pruned: known from its grid, method and rate before it is encoded."""
    counts = []
    for grid, setting in zip(grids, settings, strict=True):
        t, h, w = grid_tokens(grid, spatial_merge_size)
        method, rate = video_pruning(setting)
        counts.append(method.retained_token_count(h * w, t, rate) if rate > 0 else t * h * w)
    return counts


def _spatial_merge_size(encoder) -> int:
    """The checkpoint's vision merge size (the encoder's model may hold only the text config, as Qwen3.5's)."""
    return int(encoder.model_config.hf_config.vision_config.spatial_merge_size)


def _grids(context) -> list[list[int]]:
    return [[int(v) for v in grid] for grid in context.preprocess_result.grid_thw]


async def publish_pruned_sizes(original, encoder, context, requests, *args, **kwargs):
    """AROUND hook on the encoder's `_publish_preprocess_metadata` (sizes announced before the forward, and
    checked against what is staged): the pruned row counts. The forward itself still sees the full ones."""
    settings = context.aux_data.get(ENCODER_SETTINGS)
    if settings is None:
        return await original(encoder, context, requests, *args, **kwargs)
    full = context.preprocess_result.token_counts
    merge = _spatial_merge_size(encoder)
    context.preprocess_result.token_counts = kept_counts(_grids(context), settings, merge)
    try:
        return await original(encoder, context, requests, *args, **kwargs)
    finally:
        context.preprocess_result.token_counts = full


async def prune_on_encoder(original, encoder, context, *args, **kwargs):
    """AROUND hook on the encoder's `_compute_embedding`: each video's kept rows only, its kept count in
    the context's token counts (SGLang slices and sends by them), its record beside the rows."""
    rows = await original(encoder, context, *args, **kwargs)
    settings = context.aux_data.pop(ENCODER_SETTINGS, None)
    if rows is None or settings is None:
        return rows
    merge = _spatial_merge_size(encoder)
    kept, counts, records = prune_encoded_videos(rows, _grids(context), settings, merge)
    context.preprocess_result.token_counts = counts
    context.aux_data[RECORDS] = records
    if trace.enabled():
        trace.record(
            "encoder_pruned", req=context.req_id, rows_before=int(rows.shape[0]), rows_after=int(kept.shape[0])
        )
    return kept


async def count_sent_bytes(original, encoder, embedding, mm_data, *args, **kwargs):
    """AROUND hook on the encoder's `_send` (traced only): the bytes of rows and of metadata it sent."""
    result = await original(encoder, embedding, mm_data, *args, **kwargs)
    if trace.enabled() and getattr(mm_data, "embedding", None) is not None:
        trace.record(
            "encoder_sent", req=mm_data.req_id, modality=getattr(mm_data.modality, "name", None),
            rows=int(mm_data.embedding.shape[0]), embedding_bytes=int(mm_data.embedding.nbytes),
            metadata_bytes=len(pickle.dumps(mm_data.copy_without_embedding())),
        )  # fmt: skip
    return result


def with_pruning_records(result: tuple, *args, **kwargs) -> tuple:
    """AFTER hook on SGLang's `video_meta_attrs_for`: the language server keeps the records that come
    with a video's rows, and hands them to its processor's `get_mm_data`."""
    return result if RECORDS in result else (*result, RECORDS)


def reportable_failed_request(receiver, recv_req, *args, **kwargs):
    """BEFORE hook on the language scheduler's `create_req`, which builds the Req that reports a request whose
    encoder failed (died, timed out, refused it): such a request has no prompt ids yet, and SGLang 0.5.23's
    output path takes their length, so the failure killed the scheduler instead of answering the client.
    With an empty prompt the client gets the error and the server serves on."""
    if recv_req.input_ids is None:
        recv_req.input_ids = array("q")  # the type SGLang gives a request's ids
