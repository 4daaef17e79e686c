"""Video pruning under encoder disaggregation: the encoder server prunes, the language server lays out.

With `--encoder-only` servers encoding for a `--language-only` one (SGLang's `zmq_to_scheduler`
transport), a request's videos travel to an encoder server as URLs and come back as embedding rows;
the language server builds the prompt only when the rows arrive (its processor's `get_mm_data`).
So pruning happens where the rows are made (the records and layout, pure functions, are `encoder_records.py`'s;
the hooks here carry them):

1. language tokenizer: the request's method and rate (over the language server's default) ride with
   each video entry sent to the encoder (`carry_pruning_to_encoders`, `settings_to_video_entries`);
2. encoder server: after the tower, each video's keep-mask (`methods`) picks its kept rows; only those
   rows are sent, with a record per video (method, rate, kept indices) (`prune_on_encoder`);
3. language scheduler: the prompt is laid out unpruned by upstream's processor (over stand-in rows),
   then the pruned pads are deleted from its ids, positions and items, and the received rows placed
   (`encoder_records.lay_out_pruned`, from the processor's `get_mm_data`): the same rule as one server
   (unpruned positions, pruned rows deleted, decode offset grown by the pruned count).

Every hook here acts only for the architectures the plugin serves (`serves_this_model`, from the config the
hooked object holds): for any other model, a language server's requests, an encoder's rows, what the
language scheduler keeps of them and how it reports a failed request are SGLang's own.

The request's setting also rides to the language scheduler (in its sampling parameters' `custom_params`,
SGLang's own private channel for per-request facts), so that rows coming back without a record (an encoder
that does not run this plugin) fail that request by name instead of serving it at another rate
(`refuse_rows_without_records`).
"""

import pickle
from array import array

from sglang_evs import trace
from sglang_evs.methods import PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING
from sglang_evs.pruning.encoder_records import RECORDS, kept_counts, prune_encoded_videos, settings_for_encoder
from sglang_evs.pruning.refusals import conflicting_setup, rate_only_setup, refuse_unsupported, serves_this_model
from sglang_evs.pruning.settings import NO_PRUNING, Pruning, pruning_from, server_pruning

ASKED = "__sglang_evs_video_pruning"  # the request's setting, in its sampling parameters' custom_params
ENCODER_SETTINGS = "evs_video_settings"  # each video's settings, on the encode context until the rows exist


def _model_config(holder):
    """The HF config of a tokenizer manager's, encoder's or scheduler's model (None where it has none)."""
    return getattr(getattr(holder, "model_config", None), "hf_config", None)


def _processor_config(holder):
    """The HF config of a receiver's (or waiting request's) multimodal processor (None where it has none)."""
    return getattr(getattr(holder, "mm_processor", None), "hf_config", None)


def carry_pruning_to_encoders(tokenizer_manager, request, *args, **kwargs):
    """BEFORE hook on a `--language-only` server's dispatch of a request's media to its encoder servers:
    the request's method and rate over the server's (a bad one is SGLang's HTTP 400 here, before anything
    is sent), written back into its `mm_processor_kwargs` for `settings_to_video_entries`."""
    hf_config = _model_config(tokenizer_manager)
    if not serves_this_model(hf_config):
        return
    default = server_pruning(hf_config)
    conflict = conflicting_setup(tokenizer_manager.server_args, hf_config)
    rate_only = rate_only_setup(tokenizer_manager.server_args)  # a budget or floor would not reach the encoders
    given = request.mm_processor_kwargs  # a batch request may give one dict per sub-request
    resolved, prunings = [], set()
    for settings in given if isinstance(given, list) else [given]:
        pruning = pruning_from(settings or {}, default)
        refuse_unsupported(pruning, conflict, rate_only)
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
    if not serves_this_model(_processor_config(waiting)):
        return
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
    if not serves_this_model(_processor_config(receiver)):
        return result
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
    its grids, onto the context for `prune_on_encoder`; a setting that prunes on an encoder whose setup cannot
    prune (`refusals.conflicting_setup`: its global multimodal cache) fails the request naming both."""
    context = await original(encoder, requests, modality, *args, **kwargs)
    if getattr(modality, "name", None) != "VIDEO" or not serves_this_model(_model_config(encoder)):
        return context
    leaves = [leaf for request in requests for leaf in encoder.preprocessor._flatten_nested_items(request["mm_items"])]
    keys = (PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING)
    settings = [{key: leaf[key] for key in keys if key in leaf} if isinstance(leaf, dict) else {} for leaf in leaves]
    if not any(setting.get(PRUNING_RATE_SETTING) for setting in settings):
        return context
    conflict = conflicting_setup(encoder.server_args, encoder.model_config.hf_config)
    for setting in settings:
        refuse_unsupported(pruning_from(setting, NO_PRUNING), conflict)
    if len(settings) != context.num_items or len(context.items_per_req) != 1:
        raise RuntimeError(
            f"sglang-evs: cannot prune {context.num_items} encoded videos of {len(context.items_per_req)} "
            f"requests from {len(settings)} video entries"
        )
    context.aux_data[ENCODER_SETTINGS] = settings
    return context


def _spatial_merge_size(encoder) -> int:
    """The checkpoint's vision merge size (the encoder's model may hold only the text config, as Qwen3.5's)."""
    return int(encoder.model_config.hf_config.vision_config.spatial_merge_size)


def _grids(context) -> list[list[int]]:
    return [[int(v) for v in grid] for grid in context.preprocess_result.grid_thw]


async def publish_pruned_sizes(original, encoder, context, requests, *args, **kwargs):
    """AROUND hook on the encoder's `_publish_preprocess_metadata` (sizes announced before the forward, and
    checked against what is staged): the pruned row counts. The forward itself still sees the full ones."""
    settings = context.aux_data.get(ENCODER_SETTINGS)  # set for a served model only
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
    settings = context.aux_data.pop(ENCODER_SETTINGS, None)  # set for a served model only
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
    if (
        trace.enabled()
        and getattr(mm_data, "embedding", None) is not None
        and serves_this_model(_model_config(encoder))
    ):
        trace.record(
            "encoder_sent", req=mm_data.req_id, modality=getattr(mm_data.modality, "name", None),
            rows=int(mm_data.embedding.shape[0]), embedding_bytes=int(mm_data.embedding.nbytes),
            metadata_bytes=len(pickle.dumps(mm_data.copy_without_embedding())),
        )  # fmt: skip
    return result


def with_pruning_records(result: tuple, *args, **kwargs) -> tuple:
    """AFTER hook on SGLang's `video_meta_attrs_for` (handed a model type only: the server's checkpoint
    decides): the language server keeps the records that come with a video's rows, and hands them to its
    processor's `get_mm_data`."""
    return result if RECORDS in result or not serves_this_model() else (*result, RECORDS)


def reportable_failed_request(receiver, recv_req, *args, **kwargs):
    """BEFORE hook on the language scheduler's `create_req`, which builds the Req that reports a request whose
    encoder failed (died, timed out, refused it): such a request has no prompt ids yet, and SGLang 0.5.23's
    output path takes their length, so the failure killed the scheduler instead of answering the client.
    With an empty prompt the client gets the error and the server serves on (for the plugin's models: another
    model's failure is left to SGLang)."""
    if recv_req.input_ids is None and serves_this_model(_model_config(getattr(receiver, "scheduler", None))):
        recv_req.input_ids = array("q")  # the type SGLang gives a request's ids
