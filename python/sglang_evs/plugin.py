"""SGLang plugin entry point (group `sglang.srt.plugins`), run in every SGLang process.

SGLang calls `load_plugins()` in the main process, the scheduler, the
detokenizer and the DP controller, in the scheduler before its logging is
configured; the announcement therefore goes through a handler of our own.
"""

import functools
import logging
import os
import sys

logger = logging.getLogger("sglang_evs")

_loaded_in_pid: int | None = None


def _announce_logger() -> logging.Logger:
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def _calling_sglang_function() -> str:
    """Name of the SGLang function that called load_plugins(): tells which process this is."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "load_plugins" and frame.f_back is not None:
            return frame.f_back.f_code.co_name
        frame = frame.f_back
    return "unknown"


def load_plugin() -> None:
    global _loaded_in_pid
    if _loaded_in_pid == os.getpid():
        return
    _loaded_in_pid = os.getpid()

    from sglang_evs import __version__
    from sglang_evs.sglang_compat import UnsupportedSGLangError, check_sglang_compatibility

    try:
        sglang_version = check_sglang_compatibility()
    except UnsupportedSGLangError as exc:
        # SGLang's load_plugins() logs and swallows Exceptions; serving on
        # without the plugin would be silently wrong, so stop the process.
        _announce_logger().error("%s", exc)
        raise SystemExit(str(exc)) from exc
    register_hooks()
    _announce_logger().info(
        "sglang-evs %s plugin loaded (sglang %s, pid %d, in %s)",
        __version__,
        sglang_version,
        os.getpid(),
        _calling_sglang_function(),
    )


def register_hooks() -> None:
    """Everything the plugin changes in SGLang; applied by SGLang's load_plugins() right after."""
    from sglang_evs import sglang_compat as sglang
    from sglang_evs import trace
    from sglang_evs.models import registry
    from sglang_evs.pruning import (
        admission,
        disaggregated,
        holds,
        keys,
        prefill_decode,
        sessions,
        stream_sessions,
        streams,
    )

    # No hook on SGLang's embedding routine: this project's models call this project's routine
    # (models/adapter.py), every other model keeps calling upstream's, untouched.
    around, after = sglang.HookType.AROUND, sglang.HookType.AFTER
    register = sglang.HookRegistry.register
    register(sglang.hook_target("resolve_model_cls"), registry.resolve_model_cls_around, around)
    register(sglang.hook_target("import_processors"), register_processors, after)
    register(sglang.hook_target("compute_mm_token_counts"), count_kept_video_tokens, around)
    register(sglang.hook_target("handle_batch_output"), _on_batch_output, around)
    register(sglang.hook_target("open_session"), stream_sessions.note_streaming_session, around)
    register(sglang.hook_target("close_session"), stream_sessions.forget_closed_session, around)
    register(sglang.hook_target("key_media_item"), keys.fold_deferred_key, around)
    register(sglang.hook_target("release_media"), holds.release_media, after)
    register(sglang.hook_target("release_aborted_turn"), holds.release_aborted_turn, sglang.HookType.BEFORE)
    register(sglang.hook_target("validate_request"), streams.refuse_streams_nothing_serves, sglang.HookType.BEFORE)
    register(sglang.hook_target("validate_request"), stream_sessions.forget_refused_turn, around)
    register(sglang.hook_target("tokenize_request"), stream_sessions.queue_pipelined_turn, around)
    register(sglang.hook_target("abort_echo"), stream_sessions.forget_aborted_turn, sglang.HookType.BEFORE)
    register(sglang.hook_target("check_server_args"), refuse_unsupported_server_args, after)
    register(sglang.hook_target("multimodal_reservation"), reserve_held_videos, around)
    register(sglang.hook_target("chat_to_generate_request"), carry_chat_pruning_setting, after)
    register(sglang.hook_target("dispatch_to_encoder"), disaggregated.carry_pruning_to_encoders, sglang.HookType.BEFORE)
    register(sglang.hook_target("encoder_video_entries"), disaggregated.settings_to_video_entries, after)
    register(sglang.hook_target("encoder_prepare_context"), disaggregated.remember_video_settings, around)
    register(sglang.hook_target("encoder_publish_sizes"), disaggregated.publish_pruned_sizes, around)
    register(sglang.hook_target("encoder_compute_embedding"), disaggregated.prune_on_encoder, around)
    register(sglang.hook_target("encoder_send"), disaggregated.count_sent_bytes, around)
    register(sglang.hook_target("video_meta_attrs"), disaggregated.with_pruning_records, after)
    before = sglang.HookType.BEFORE
    register(sglang.hook_target("encoder_failed_request"), disaggregated.reportable_failed_request, before)
    register(sglang.hook_target("assemble_encoded_rows"), disaggregated.refuse_rows_without_records, before)
    register(sglang.hook_target("encoder_data_parallel"), refuse_encoder_data_parallel, before)
    register(sglang.hook_target("pd_metadata_row"), prefill_decode.send_layout, after)
    register(sglang.hook_target("pd_prefill_bootstrapped"), prefill_decode.check_decode_allocation, around)
    register(sglang.hook_target("pd_decode_commit"), prefill_decode.check_prefill_layout, around)
    register(sglang.hook_target("pd_room_status"), prefill_decode.cleared_room_reads_failed, around)
    register(sglang.hook_target("init_prefill_graph"), keep_mrope_draft_prefill_eager, around)
    register(sglang.hook_target("extend_session_media"), sessions.move_pruned_regions_with_the_turn, around)
    register(sglang.hook_target("queue_request"), sessions.refuse_session_logprobs_over_pruned_videos, before)
    register(sglang.hook_target("admit_request"), admission.lay_out_at_admission, around)
    register(sglang.hook_target("breakable_prefill_rules"), allow_prefill_graphs_where_the_default_prunes, around)
    if trace.enabled():
        from sglang_evs.graph_trace import trace_graph_replay, trace_vit_graph_replay

        for runner in ("prefill", "decode", "draft_decode", "draft_extend"):
            register(sglang.hook_target(f"{runner}_graph_execute"), trace_graph_replay, around)
        register(sglang.hook_target("vit_graph_replay"), trace_vit_graph_replay, around)
        register(sglang.hook_target("admit_request"), trace.record_arrival, before)
    if trace.transfers_enabled():
        from sglang_evs.transfer_trace import record_transfer

        register(sglang.hook_target("pd_transfer_data"), record_transfer, around)


class UnsupportedServerArgsError(ValueError):
    """A server flag this plugin cannot serve with, raised while SGLang validates its arguments."""


def refuse_unsupported_server_args(result, server_args, *args, **kwargs):
    """AFTER hook on ServerArgs.check_server_args: refuse, at startup, for a model this plugin serves
    (`served.SERVED`), the flags whose code path bypasses its embedding routine (they would fail at
    the first multimodal forward); and a server-wide pruning setting that nothing would read."""
    from sglang_evs.served import SERVED
    from sglang_evs.sglang_compat import UNSUPPORTED_SERVER_FLAGS

    given = [flag for attr, flag in UNSUPPORTED_SERVER_FLAGS.items() if getattr(server_args, attr, False)]
    if given and (architecture := checkpoint_architecture(server_args)) in SERVED:
        raise UnsupportedServerArgsError(
            f"sglang-evs does not support {', '.join(given)} for {architecture}: this project's embedding "
            "routine serves it and has no adaptive-dispatch path; remove the flag or uninstall sglang-evs"
        )
    refuse_pruning_nothing_reads(server_args)
    load_plugin_in_tokenizer_workers(server_args)
    return result


def reserve_held_videos(original, *args, **kwargs) -> float:
    """AROUND hook on SGLang's `mm_runtime_reservation_gb`, the GB of the KV budget SGLang keeps for multimodal
    allocations made after the pool is sized (its embedding cache): for a model this plugin serves, also the bound of
    the encoded videos a scheduler holds between chunks (`pruning/holds.py`), so the KV pool is that much smaller
    and the holds fit the memory SGLang planned. Servers that hold none (encoder-only, language-only, decode)
    reserve nothing more."""
    from sglang_evs import sglang_compat as sglang
    from sglang_evs.pruning import holds
    from sglang_evs.served import SERVED

    reserved = original(*args, **kwargs)
    server_args = sglang.get_server_args()
    if not kwargs.get("is_multimodal") or server_args is None:  # SGLang's function takes keywords only
        return reserved
    holds_nothing = server_args.encoder_only or server_args.language_only or server_args.disaggregation_mode == "decode"
    if holds_nothing or checkpoint_architecture(server_args) not in SERVED:
        return reserved
    held_gb = holds.bound_bytes() / 2**30
    logger.info("sglang-evs: reserving %.2f GB of the KV budget for encoded videos held between chunks (%s)",
                held_gb, holds.BOUND_ENV)  # fmt: skip
    return reserved + held_gb


# The HTTP app of a tokenizer worker: SGLang's, once the plugin is loaded (importing it loads SGLang's plugins)
TOKENIZER_WORKER_APP_PATH = "sglang_evs.tokenizer_workers:app"


def load_plugin_in_tokenizer_workers(server_args) -> None:
    """With several tokenizer workers (`--tokenizer-worker-num` > 1), the HTTP app SGLang's worker processes
    import is `TOKENIZER_WORKER_APP_PATH` (`tokenizer_workers.py`), which loads the plugin first (SGLang never
    loads plugins there, so those workers would tokenize videos unpruned). A server whose app path was set to
    another app cannot have it, and is refused for this project's models."""
    from sglang_evs.served import SERVED
    from sglang_evs.sglang_compat import HTTP_APP_PATH_ENV, UPSTREAM_HTTP_APP_PATH

    workers = int(getattr(server_args, "tokenizer_worker_num", 1) or 1)
    if workers <= 1:
        return
    app_path = os.environ.get(HTTP_APP_PATH_ENV, UPSTREAM_HTTP_APP_PATH)
    if app_path in (UPSTREAM_HTTP_APP_PATH, TOKENIZER_WORKER_APP_PATH):
        os.environ[HTTP_APP_PATH_ENV] = TOKENIZER_WORKER_APP_PATH
        return
    if (architecture := checkpoint_architecture(server_args)) in SERVED:
        raise UnsupportedServerArgsError(
            f"sglang-evs does not support --tokenizer-worker-num {workers} with {HTTP_APP_PATH_ENV}={app_path} "
            f"for {architecture}: each tokenizer worker must import {TOKENIZER_WORKER_APP_PATH}, which loads the "
            f"plugin before SGLang's app; unset {HTTP_APP_PATH_ENV} or serve with one tokenizer worker"
        )


def refuse_encoder_data_parallel(server_args, *args, **kwargs) -> None:
    """BEFORE hook on the encoder server's DP launch (`--encoder-only --dp-size N`, which SGLang never
    passes through `check_server_args`): SGLang starts an encoder's DP workers without plugins, so for this
    project's models they would send unpruned rows, without records, for requests that ask for pruning."""
    from sglang_evs.served import SERVED

    architecture = checkpoint_architecture(server_args)
    if architecture in SERVED:
        raise UnsupportedServerArgsError(
            f"sglang-evs does not support --encoder-only with --dp-size {server_args.dp_size} for {architecture}: "
            "SGLang starts an encoder's DP workers without plugins, so they could not prune; start one "
            "--encoder-only server per worker instead (--encoder-urls takes several)"
        )


def refuse_pruning_nothing_reads(server_args) -> None:
    """A server-wide pruning setting (`--json-model-override-args`) is read by this plugin for the
    architectures it prunes, and by SGLang itself for the models with SGLang's own EVS (which read the
    rate and prune videos with EVS only: no other method, no token budget or floor, no image). Any other setting
    that would prune is refused by name, since it would be ignored; so is a bad value, a misspelt key of the
    settings' namespace. A request's own setting is left to the
    model's processor, as SGLang leaves every `mm_processor_kwargs`."""
    import json

    from sglang_evs.methods import DEFAULT_METHOD, PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING
    from sglang_evs.models.registry import pruned_by_sglang
    from sglang_evs.pruning.settings import NO_IMAGE_PRUNING, NO_PRUNING, image_pruning_from, pruning_from
    from sglang_evs.served import SERVED

    overrides = json.loads(getattr(server_args, "json_model_override_args", None) or "{}")
    pruning, images = pruning_from(overrides, NO_PRUNING), image_pruning_from(overrides, NO_IMAGE_PRUNING)
    if not (pruning.prunes or images.prunes):
        return
    architecture = checkpoint_architecture(server_args)
    if architecture is None or architecture in SERVED:
        return
    if images.prunes:  # SGLang's own EVS prunes no image either
        raise UnsupportedServerArgsError(
            f"sglang-evs: {architecture} does not prune images, so its image_pruning_rate would be ignored; remove "
            f"it from --json-model-override-args (image pruning serves {', '.join(SERVED)})"
        )
    if pruned_by_sglang(architecture):
        if pruning.method != DEFAULT_METHOD:
            raise UnsupportedServerArgsError(
                f"sglang-evs: {architecture} prunes videos with SGLang's own EVS, which does not read "
                f"{PRUNING_METHOD_SETTING}={pruning.method.name!r}; remove it from --json-model-override-args"
            )
        if pruning.limits_count or pruning.follows_content:
            raise UnsupportedServerArgsError(
                f"sglang-evs: {architecture} prunes videos with SGLang's own EVS, which reads "
                f"{PRUNING_RATE_SETTING} alone, not {pruning.named()}; remove it from --json-model-override-args"
            )
        return
    pruned = ", ".join(SERVED)
    raise UnsupportedServerArgsError(
        f"sglang-evs: {architecture} does not prune videos, so its video_pruning_rate would be ignored; "
        f"remove the pruning settings from --json-model-override-args (video pruning serves {pruned}, "
        "and SGLang's own EVS its models built on it)"
    )


def checkpoint_architecture(server_args) -> str | None:
    """The checkpoint's first architecture as its config.json names it (no remote code is run); None
    where it cannot be read here (SGLang then reports the checkpoint itself)."""
    from sglang_evs.pruning.refusals import checkpoint_config

    return (checkpoint_config(server_args.model_path).get("architectures") or [None])[0]


def keep_mrope_draft_prefill_eager(original, model_runner, *args, **kwargs):
    """AROUND hook on `ModelRunner.init_prefill_cuda_graph`: a draft model that reads M-RoPE positions
    from a checkpoint SGLang does not take for multimodal (an EAGLE3 draft of a Qwen-VL target) gets
    a prefill graph whose capture batch has no M-RoPE positions, and its capture fails (the server
    stops at startup). Upstream never captures one for this project's models, whose prefill graphs it
    keeps off; the plugin turns them on where the server's default prunes (`prefill_graphs_serve_pruning`),
    so for them the draft's prefill stays eager (the target's prefill, and every decode, verify and draft
    step, still replay graphs)."""
    from sglang_evs.served import SERVED

    model = model_runner.model
    reads_mrope = any(getattr(m, "is_mrope_enabled", False) for m in (model, getattr(model, "model", None)))
    if (
        model_runner.is_draft_worker
        and reads_mrope
        and not model_runner.model_config.is_multimodal
        and checkpoint_architecture(model_runner.server_args) in SERVED
    ):
        model_runner.prefill_cuda_graph_runner = None
        return None
    return original(model_runner, *args, **kwargs)


def prefill_graphs_serve_pruning(hf_config) -> bool:
    """Whether the plugin turns breakable prefill graphs on for a server of this model: one it serves whose
    record leaves its prefill to graphs (`served.ServedModel.eager_prefill`) and whose server-wide default
    prunes videos or images (`pruning.settings.server_pruning`, `server_image_pruning`). Its language model reads
    nothing but `input_embeds` outside fixed buffers (`models/graph_inputs.py`), so a replay serves pruned videos
    and images at their exact positions. A server
    whose default prunes nothing keeps upstream's choice (eager prefill for the architectures off SGLang's
    allowlist), so at q = 0 it computes what upstream computes; a request there that asks for pruning itself
    prefills eagerly, exact as well."""
    from sglang_evs.pruning.settings import server_image_pruning, server_pruning
    from sglang_evs.served import SERVED

    model = SERVED.get((getattr(hf_config, "architectures", None) or [None])[0])
    prunes = server_pruning(hf_config).prunes or server_image_pruning(hf_config).prunes
    return model is not None and model.eager_prefill is None and prunes


def allow_prefill_graphs_where_the_default_prunes(original, server_args, *args, **kwargs):
    """AROUND hook on SGLang's `disable_breakable_cudagraph_if_incompatible`, the server-argument resolution
    step (launching process, before any scheduler starts) whose "multimodal model" rule turns breakable prefill
    graphs off for a multimodal architecture off SGLang's allowlist (`ModelConfig
    .is_multimodal_breakable_cuda_graph_supported`, read from the allowlist when the config is built, and by
    nothing else): for a server where `prefill_graphs_serve_pruning`, this server's model config passes that
    rule; every other rule, and every other server, is SGLang's. An explicit `--cuda-graph-backend-prefill`
    skips the step, for any model, as upstream."""
    from sglang_evs import sglang_compat as sglang

    model_config = sglang.model_config_of(server_args)
    if prefill_graphs_serve_pruning(model_config.hf_config):
        model_config.is_multimodal_breakable_cuda_graph_supported = True
    return original(server_args, *args, **kwargs)


def carry_chat_pruning_setting(result, *args, **kwargs):
    """AFTER hook on the OpenAI chat handler's request conversion, for the models the plugin serves:
    - a pruning setting in the chat request's `chat_template_kwargs` (the field sglang-router forwards) reaches
      the processor through the GenerateReqInput's `mm_processor_kwargs`. A ValueError here is SGLang's HTTP 400;
    - the chat request's `session_params` (which SGLang's chat request takes and its conversion drops) make it a
      session's turn, as on `/generate`: a live stream sent turn by turn through an OpenAI client, each turn
      carrying only its own segment and question."""
    from sglang_evs.pruning.settings import chat_processor_kwargs
    from sglang_evs.served import serves

    generate_request, chat_request = result
    if not serves(args[0].tokenizer_manager.model_config.hf_config):  # another model's: what the client sent
        return result
    generate_request.mm_processor_kwargs = chat_processor_kwargs(
        chat_request.chat_template_kwargs, generate_request.mm_processor_kwargs
    )
    if chat_request.session_params and generate_request.session_params is None:
        generate_request.session_params = chat_request.session_params
    return result


def register_processors(result, *args, **kwargs):
    """AFTER hook on SGLang's import_processors: the pruning processor of its family replaces the upstream
    one for every architecture whose videos the plugin prunes."""
    from sglang_evs import sglang_compat as sglang
    from sglang_evs.models.registry import pruned_families
    from sglang_evs.pruning.processor import pruning_processor

    mapping = sglang.PROCESSOR_MAPPING
    families = pruned_families()
    names = {cls.__name__ for cls in families}
    for model_cls in [cls for cls in mapping if cls.__name__ in names]:
        del mapping[model_cls]
    mapping.update({model_cls: pruning_processor(family) for model_cls, family in families.items()})
    return result


def count_kept_video_tokens(upstream, mm_inputs):
    """AROUND hook on MultimodalInputs.compute_mm_token_counts: a pruned video's region also holds
    the framing text between its groups; report only its kept video tokens."""
    from sglang_evs.pruning.fields import VIDEO_TOKENS, is_pruned

    image, audio, video = upstream(mm_inputs)
    for item in mm_inputs.mm_items:
        if item.is_video() and is_pruned(item) and item.offsets:
            start, end = item.offsets[0]
            video += item.model_specific_data[VIDEO_TOKENS][1] - (end - start + 1)
    return image, audio, video


async def _on_batch_output(upstream, *args, **kwargs):
    """AROUND hook on `TokenizerManager._handle_batch_output`, one for both concerns (SGLang warns of two AROUND
    hooks on one target): a session's finished turns recorded (`stream_sessions`), then each output given its
    request's pruning counts (`usage`)."""
    from sglang_evs.pruning.stream_sessions import commit_finished_turns
    from sglang_evs.pruning.usage import add_usage_to_meta_info

    return await commit_finished_turns(functools.partial(add_usage_to_meta_info, upstream), *args, **kwargs)
