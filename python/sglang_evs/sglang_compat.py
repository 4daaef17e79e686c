"""The one place that knows SGLang's internals.

Every other module reaches SGLang through the names defined here
(`sglang_compat.NAME`, resolved on first use), so moving to another SGLang
release means reading this file against the new source.
`check_sglang_compatibility()` runs when the plugin loads and refuses, loudly,
any SGLang version or layout this package was not written against.
"""

import argparse
import functools
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

SUPPORTED_SGLANG_VERSION = "0.5.23"

# name used in this package -> "module:attribute" in SGLang 0.5.23
INTERNALS: dict[str, str] = {
    # plugin machinery
    "HookRegistry": "sglang.srt.plugins.hook_registry:HookRegistry",
    "HookType": "sglang.srt.plugins.hook_registry:HookType",
    "ModelRegistry": "sglang.srt.models.registry:ModelRegistry",
    # SGLang's allowlist of multimodal architectures given breakable prefill graphs (read into each ModelConfig)
    "BREAKABLE_CUDA_GRAPH_MM_ARCHS": (
        "sglang.srt.configs.model_config:multimodal_breakable_cuda_graph_supported_model_archs"
    ),
    # the server's ModelConfig during server-argument resolution (built once, memoized on the ServerArgs)
    "model_config_of": "sglang.srt.arg_groups.model_override_base:model_config_of",
    # the multimodal embedding routine ours stands beside (every other model keeps calling it), and what
    # ours builds on
    "general_mm_embed_routine": "sglang.srt.managers.mm_utils:general_mm_embed_routine",
    "get_embedding_and_mask": "sglang.srt.managers.mm_schedule:get_embedding_and_mask",
    "scatter_mm_embedding": "sglang.srt.managers.mm_utils:_scatter_mm_embedding",
    "slice_model_data": "sglang.srt.managers.mm_utils:_slice_model_data",
    "mm_schedule": "sglang.srt.managers.mm_schedule:",
    "Modality": "sglang.srt.managers.schedule_batch:Modality",
    # the base of a feature held in a GPU pool for another process to read (`--mm-feature-transport cuda_ipc`)
    "DeviceFeatureHandle": "sglang.srt.multimodal.transport.memory_pool:StreamOrderedPoolConsumerMixin",
    # a request's multimodal inputs that failed: the scheduler aborts that request and serves on
    "MMInputsProcessError": "sglang.srt.managers.io_struct:MMInputsProcessError",
    "ForwardBatch": "sglang.srt.model_executor.forward_batch_info:ForwardBatch",
    "get_disagg": "sglang.srt.runtime_context:get_disagg",
    "get_server_args": "sglang.srt.runtime_context:get_server_args",
    "get_exec": "sglang.srt.runtime_context:get_exec",
    "get_schedule": "sglang.srt.runtime_context:get_schedule",
    "get_cuda_graph_max_batch_size": "sglang.srt.utils.common:get_cuda_graph_max_batch_size",
    # process ranks and groups (`.attn_tp_group`: the ranks that run the same batch)
    "get_parallel": "sglang.srt.runtime_context:get_parallel",
    # multimodal processors (tokenizer process)
    "UpstreamQwenVLProcessor": "sglang.srt.multimodal.processors.qwen_vl:QwenVLImageProcessor",
    "UpstreamGlm4vProcessor": "sglang.srt.multimodal.processors.glm4v:Glm4vImageProcessor",
    "PROCESSOR_MAPPING": "sglang.srt.managers.multimodal_processor:PROCESSOR_MAPPING",
    # Qwen3-VL
    "UpstreamQwen3VL": "sglang.srt.models.qwen3_vl:Qwen3VLForConditionalGeneration",
    "UpstreamQwen3LLMModel": "sglang.srt.models.qwen3_vl:Qwen3LLMModel",
    "UpstreamQwen3VLMoe": "sglang.srt.models.qwen3_vl_moe:Qwen3VLMoeForConditionalGeneration",
    "UpstreamQwen3MoeLLMModel": "sglang.srt.models.qwen3_vl_moe:Qwen3MoeLLMModel",
    # Qwen3.5 / Qwen3.6 (hybrid Gated DeltaNet language models)
    "UpstreamQwen3_5": "sglang.srt.models.qwen3_5:Qwen3_5ForConditionalGeneration",
    "UpstreamQwen3_5LLMModel": "sglang.srt.models.qwen3_5:Qwen3_5ForCausalLM",
    "UpstreamQwen3_5Moe": "sglang.srt.models.qwen3_5:Qwen3_5MoeForConditionalGeneration",
    "UpstreamQwen3_5MoeLLMModel": "sglang.srt.models.qwen3_5:Qwen3_5MoeForCausalLM",
    "UpstreamQwen3_5MTP": "sglang.srt.models.qwen3_5_mtp:Qwen3_5ForCausalLMMTP",  # the NEXTN draft (dense, MoE)
    "UpstreamLlamaEagle3": "sglang.srt.models.llama_eagle3:LlamaForCausalLMEagle3",  # EAGLE3 drafts
    # Qwen3-Omni: a wrapper whose forward is its thinker's (a Qwen3-VL-MoE with an audio tower)
    "UpstreamQwen3Omni": "sglang.srt.models.qwen3_omni_moe:Qwen3OmniMoeForConditionalGeneration",
    "UpstreamQwen3OmniThinker": "sglang.srt.models.qwen3_omni_moe:Qwen3OmniMoeThinkerForConditionalGeneration",
    # Qwen4-Exp (a Qwen3-VL on a hybrid language model with hyper-connections and per-layer embeddings)
    "UpstreamQwen4Exp": "sglang.srt.models.qwen4_exp:Qwen4ExpForConditionalGeneration",
    "UpstreamQwen4ExpVLModel": "sglang.srt.models.qwen4_exp:Qwen4ExpVLModel",
    "UpstreamQwen4ExpMTP": "sglang.srt.models.qwen4_exp_mtp:Qwen4ExpForCausalLMMTP",  # its NEXTN draft
    "LogitsProcessorOutput": "sglang.srt.layers.logits_processor:LogitsProcessorOutput",
    # Qwen2-VL, Qwen2.5-VL (both on SGLang's Qwen2 language model)
    "UpstreamQwen2VL": "sglang.srt.models.qwen2_vl:Qwen2VLForConditionalGeneration",
    "UpstreamQwen2_5_VL": "sglang.srt.models.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration",
    "UpstreamQwen2Model": "sglang.srt.models.qwen2:Qwen2Model",
    # GLM-4.1V, GLM-4.5V (dense and MoE GLM-4 language models)
    "UpstreamGlm4v": "sglang.srt.models.glm4v:Glm4vForConditionalGeneration",
    "UpstreamGlm4vMoe": "sglang.srt.models.glm4v_moe:Glm4vMoeForConditionalGeneration",
    "UpstreamGlm4Model": "sglang.srt.models.glm4:Glm4Model",
    "UpstreamGlm4MoeModel": "sglang.srt.models.glm4_moe:Glm4MoeModel",
    # SGLang's own EVS: the base of the models SGLang prunes itself (Nemotron-Nano-VL)
    "SGLangEVS": "sglang.srt.multimodal.evs:EVS",
    # EVS maths (pure torch), used by sglang_evs.methods.evs through resolve_file()
    "evs_core": "sglang.srt.multimodal.evs.evs_core:",
    # tools that run SGLang's pieces in their own process (visualize.py, bench/inprocess.py)
    "preprocess_video": "sglang.srt.multimodal.processors.qwen_vl:preprocess_video",
    "glm_sample_and_decode": "sglang.srt.multimodal.processors.glm4v:glm_sample_and_decode_sync",
    "glm_video_config": "sglang.srt.multimodal.processors.glm4v:glm_processor_video_config",
    "load_video": "sglang.srt.utils.common:load_video",
    "one_batch": "sglang.benchmark.one_batch:",
    "bench_serving_cli": "sglang.benchmark.serving:cli_main",  # `python -m sglang.benchmark.serving`, run in-process
    "ServerArgs": "sglang.srt.server_args:ServerArgs",
    "PortArgs": "sglang.srt.server_args:PortArgs",
    "SpawnRanks": "sglang.srt.runtime_context:SpawnRanks",
    "publish_server_args": "sglang.srt.runtime_context:publish",
    "sglang_envs": "sglang.srt.environ:envs",
    "set_default_torch_dtype": "sglang.srt.model_loader.utils:set_default_torch_dtype",
    "get_mm_processor": "sglang.srt.managers.multimodal_processor:get_mm_processor",
    "import_processors": "sglang.srt.managers.multimodal_processor:import_processors",
    "get_processor_wrapper": "sglang.srt.managers.tokenizer_manager:get_processor_wrapper",
    "determine_tensor_transport_mode": "sglang.srt.multimodal.transport:determine_tensor_transport_mode",
    "Req": "sglang.srt.managers.schedule_batch:Req",
    "FINISH_ABORT": "sglang.srt.managers.schedule_batch:FINISH_ABORT",  # a request refused or aborted
    "ScheduleBatch": "sglang.srt.managers.schedule_batch:ScheduleBatch",
    "MultimodalInputs": "sglang.srt.managers.schedule_batch:MultimodalInputs",
    "SamplingParams": "sglang.srt.sampling.sampling_params:SamplingParams",
    "GenerateReqInput": "sglang.srt.managers.io_struct:GenerateReqInput",
    # a session opened and closed by its own turns (pruning/session_turns.py)
    "OpenSessionReqInput": "sglang.srt.managers.io_struct:OpenSessionReqInput",
    "CloseSessionReqInput": "sglang.srt.managers.io_struct:CloseSessionReqInput",
    "duplicate_pad_mm_input_ids": "sglang.srt.managers.mm_utils:duplicate_pad_mm_input_ids",
    "SpeculativeAlgorithm": "sglang.srt.speculative.spec_info:SpeculativeAlgorithm",
    "ForwardContext": "sglang.srt.model_executor.forward_context:ForwardContext",
    "forward_context": "sglang.srt.model_executor.forward_context:forward_context",
    # prefill/decode disaggregation (pruning/prefill_decode.py): a warm-up's transfer without a prefill server,
    # and how a scheduler fails a request it holds for a transfer
    "is_fake_transfer": "sglang.srt.disaggregation.utils:_is_fake_transfer",
    "prepare_abort": "sglang.srt.disaggregation.utils:prepare_abort",
    "KVPoll": "sglang.srt.disaggregation.base.conn:KVPoll",  # a KV transfer room's status
    # several tokenizer workers (`--tokenizer-worker-num` > 1): each is a fresh process that imports the HTTP app
    # by the path in HTTP_APP_PATH_ENV and never calls `load_plugins` (`tokenizer_workers.py`)
    "load_plugins": "sglang.srt.plugins:load_plugins",
    "http_server_app": "sglang.srt.entrypoints.http_server:app",
}
HTTP_APP_PATH_ENV = "SGLANG_HTTP_SERVER_APP_PATH"
UPSTREAM_HTTP_APP_PATH = "sglang.srt.entrypoints.http_server:app"  # its default: INTERNALS["http_server_app"]
# What the plugin hooks (HookRegistry targets), name used in this package -> "module:attribute path".
HOOK_TARGETS: dict[str, str] = {
    "resolve_model_cls": "sglang.srt.models.registry:_ModelRegistry.resolve_model_cls",
    "import_processors": "sglang.srt.managers.multimodal_processor:import_processors",
    "compute_mm_token_counts": "sglang.srt.managers.schedule_batch:MultimodalInputs.compute_mm_token_counts",
    "handle_batch_output": "sglang.srt.managers.tokenizer_manager:TokenizerManager._handle_batch_output",
    # a media item's key (content hash, pad values), set where SGLang hashes it (pruning/keys.py)
    "key_media_item": "sglang.srt.managers.schedule_batch:MultimodalDataItem.set_pad_value",
    # a request's media dropped by the scheduler (finished, aborted): the plugin's held encodings go with it
    "release_media": "sglang.srt.managers.schedule_batch:MultimodalInputs.release_features",
    # a request's media dropped on abort, a session turn's without release_features (its history is kept)
    "release_aborted_turn": "sglang.srt.managers.schedule_batch:Req.release_mm_inputs_on_abort",
    # a session opened and closed, in the tokenizer process (pruning/stream_sessions.py keeps a stream's end per
    # session)
    "open_session": "sglang.srt.managers.tokenizer_manager:TokenizerManager.open_session",
    "close_session": "sglang.srt.managers.tokenizer_manager:TokenizerManager.close_session",
    # every request's check in the tokenizer process, media or none (a `video_stream` request without video)
    "validate_request": "sglang.srt.managers.tokenizer_manager:TokenizerManager._validate_one_request",
    # a request the scheduler aborted, echoed to the tokenizer apart from the batch outputs
    "abort_echo": "sglang.srt.managers.tokenizer_manager:TokenizerManager._handle_abort_req",
    # a request's tokenization and media processing, in the tokenizer process (a session turn waits there)
    "tokenize_request": "sglang.srt.managers.tokenizer_manager:TokenizerManager._tokenize_one_request",
    # validation of the server arguments, in the launching process before any subprocess starts
    "check_server_args": "sglang.srt.server_args:ServerArgs.check_server_args",
    # the GPU bytes multimodal allocations take after the KV pool is sized, reserved out of its budget
    "multimodal_reservation": "sglang.srt.mem_cache.kv_cache_configurator:mm_runtime_reservation_gb",
    # an OpenAI chat request turned into a GenerateReqInput (the pruning setting in chat_template_kwargs)
    "chat_to_generate_request": (
        "sglang.srt.entrypoints.openai.serving_chat:OpenAIServingChat._convert_to_internal_request"
    ),
    # a `--language-only` server hands a request's media to its encoder servers (before tokenizing it)
    "dispatch_to_encoder": (
        "sglang.srt.managers.tokenizer_manager:TokenizerManager._handle_epd_disaggregation_encode_request"
    ),
    # encoder disaggregation with pruning (pruning/disaggregated.py): the language server's media entries for
    # its encoders, the encoder's context and rows, what it sends, and the per-video metadata kept with rows
    "encoder_video_entries": "sglang.srt.disaggregation.encoder.receiver:MMReceiverBase._extract_url_data",
    "encoder_prepare_context": "sglang.srt.disaggregation.encoder.server:MMEncoder._prepare_encode_context",
    "encoder_publish_sizes": "sglang.srt.disaggregation.encoder.server:MMEncoder._publish_preprocess_metadata",
    "encoder_compute_embedding": "sglang.srt.disaggregation.encoder.server:MMEncoder._compute_embedding",
    "encoder_send": "sglang.srt.disaggregation.encoder.server:MMEncoder._send",
    "video_meta_attrs": "sglang.srt.disaggregation.encoder.receiver:video_meta_attrs_for",
    # an `--encoder-only` server's DP launch (its workers start without plugins)
    "encoder_data_parallel": "sglang.srt.disaggregation.encoder.runtime:launch_dp_runtime",
    # the Req a `--language-only` scheduler builds to report a request whose media never came back
    "encoder_failed_request": "sglang.srt.disaggregation.encoder.receiver:MMReceiverBase.create_req",
    # a `--language-only` scheduler assembling a request's prompt from the rows its encoders sent
    "assemble_encoded_rows": "sglang.srt.disaggregation.encoder.receiver:WaitingMMRequestBase._finish_assemble",
    # prefill/decode disaggregation (pruning/prefill_decode.py): the prefill server filling a request's
    # metadata row for the decode server, and sizing its KV send once the decode server's slots are known;
    # the decode server committing a received row to its request
    "pd_metadata_row": "sglang.srt.disaggregation.utils:MetadataBuffers.set_buf",
    "pd_prefill_bootstrapped": "sglang.srt.disaggregation.prefill:PrefillBootstrapQueue.finalize_bootstrap",
    "pd_decode_commit": "sglang.srt.disaggregation.decode:DecodeTransferQueue._commit_transfer_to_req",
    # a transfer room's status, read by both servers' schedulers and transfer threads (its module is imported
    # by the three above already)
    "pd_room_status": "sglang.srt.disaggregation.common.conn:CommonKVManager.check_status",
    # a session turn's media appended to the session's request, its positions moved past the history
    # (pruning/sessions.py moves a pruned video's region positions with them)
    "extend_session_media": "sglang.srt.managers.schedule_batch:Req._extend_session_image_inputs",
    # a request entering the scheduler's waiting queue, its prompt assembled (a session turn's with its history)
    "queue_request": "sglang.srt.managers.scheduler:Scheduler._add_request_to_queue",
    # a tokenized request reaching the scheduler, before its Req exists (a threshold's layout, admission.py)
    "admit_request": "sglang.srt.managers.scheduler:Scheduler.handle_generate_request",
    # a model runner capturing its prefill graph (a draft's: `keep_mrope_draft_prefill_eager`)
    "init_prefill_graph": "sglang.srt.model_executor.model_runner:ModelRunner.init_prefill_cuda_graph",
    # server-argument resolution's rules that turn breakable prefill graphs off (the multimodal allowlist among
    # them), in the launching process (`plugin.allow_prefill_graphs_where_the_default_prunes`)
    "breakable_prefill_rules": "sglang.srt.arg_groups.cuda_graph_hook:disable_breakable_cudagraph_if_incompatible",
    # traced only (SGLANG_EVS_TRACE): each replay of a graph runner (graph_trace.py)
    "prefill_graph_execute": (
        "sglang.srt.model_executor.runner.prefill_cuda_graph_runner:PrefillCudaGraphRunner.execute"
    ),
    "decode_graph_execute": "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.execute",
    "draft_decode_graph_execute": (
        "sglang.srt.speculative.eagle_draft_cuda_graph_runner:EAGLEDraftCudaGraphRunner.execute"
    ),
    "draft_extend_graph_execute": (
        "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner:EAGLEDraftExtendCudaGraphRunner.execute"
    ),
    # traced only: each replay of SGLang's vision-tower CUDA graphs (`SGLANG_VIT_ENABLE_CUDA_GRAPH=1`)
    "vit_graph_replay": "sglang.srt.multimodal.vit_cuda_graph_runner:ViTCudaGraphRunner.replay",
    # traced only: each batch of blocks a prefill server's Mooncake transfers move (transfer_trace.py)
    "pd_transfer_data": "sglang.srt.disaggregation.mooncake.conn:MooncakeKVManager._transfer_data",
}

# Server flags the plugin cannot serve with: ServerArgs attribute -> the command-line flag.
UNSUPPORTED_SERVER_FLAGS: dict[str, str] = {
    # encoder disaggregation's adaptive dispatch embeds through SGLang's own split routine (refused for the
    # architectures this project serves only)
    "enable_adaptive_dispatch_to_encoder": "--enable-adaptive-dispatch-to-encoder",
}

# Checked at startup, with every hook target; the Qwen3-VL names are checked when those models load.
STARTUP_INTERNALS = (
    "HookRegistry", "HookType", "ModelRegistry", "general_mm_embed_routine", "get_embedding_and_mask", "SGLangEVS",
)  # fmt: skip


def hook_target(name: str) -> str:
    """The dotted path HookRegistry takes for one of HOOK_TARGETS."""
    return HOOK_TARGETS[name].replace(":", ".")


@dataclass(frozen=True)
class PrefillLimits:
    """What bounds the tokens of one extend forward in this server (all 0 outside a server)."""

    max_prefill_tokens: int = 0
    chunked_prefill_size: int = 0
    graph_buckets: tuple[int, ...] = ()  # prefill CUDA graph sizes, rounded as the graph runner rounds them
    mixed_decode_rows: int = 0  # decode rows a mixed chunk may append


def prefill_limits() -> PrefillLimits:
    try:
        args = resolve("get_server_args")()
    except ValueError:  # "Global server args is not set yet": not in a server process
        return PrefillLimits()
    if args is None:
        return PrefillLimits()
    try:
        prefill_graph = resolve("get_exec")().graph.cuda_graph_config.prefill
        round_up = resolve("get_cuda_graph_max_batch_size")
        buckets = tuple(round_up(n) for n in (prefill_graph.bs or ()))
    except (ValueError, AttributeError):  # no graph configuration published in this process
        buckets = ()
    mixed_rows = int(args.max_running_requests or 0) if getattr(args, "enable_mixed_chunk", False) else 0
    return PrefillLimits(int(args.max_prefill_tokens or 0), int(args.chunked_prefill_size or 0), buckets, mixed_rows)


def same_batch_group() -> Any | None:
    """SGLang's group (a `GroupCoordinator`) of the ranks that run this rank's batches, when there
    are several (`--tp-size` > 1); None at one rank or outside a server. Its `broadcast(tensor, src=0)`
    sends rank 0's tensor to the others in place."""
    try:
        group = resolve("get_parallel")().attn_tp_group
    except (AttributeError, RuntimeError, ValueError):  # no parallel groups in this process
        return None
    return group if group is not None and group.world_size > 1 else None


class UnsupportedSGLangError(RuntimeError):
    """Raised at startup when the installed SGLang is not the one this plugin supports."""


def resolve(name: str) -> Any:
    return _resolve_path(INTERNALS[name])


def server_flags(args: Sequence[str]) -> argparse.Namespace:
    """A server's command line as SGLang's own parser reads it (`ServerArgs.add_cli_args`: every alias, `--flag value`
    and `--flag=value`), SGLang's defaults for what it leaves out; flags SGLang does not know are ignored. Only
    what the caller reads is meaningful: the model path is a stand-in where `args` give none."""
    known, _ = _server_flags_parser().parse_known_args(["--model-path", "-", *args])
    return known


@functools.cache
def _server_flags_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    resolve("ServerArgs").add_cli_args(parser)
    return parser


def _resolve_path(path: str) -> Any:
    module_name, _, attrs = path.partition(":")
    found = importlib.import_module(module_name)
    for attr in attrs.split(".") if attrs else ():
        found = getattr(found, attr)
    return found


_FILE_MODULES: dict[str, ModuleType] = {}


def resolve_file(name: str) -> Any:
    """Like `resolve`, but loads the module from its own file when it is not imported yet.

    For leaf modules that import only torch, such as `evs_core`, whose package
    `__init__` imports the scheduler (about 8 s and 4,800 modules on the CPU
    machine).  Inside a server the module is already in `sys.modules` and that
    one is used.
    """
    module_name, _, attr = INTERNALS[name].partition(":")
    module = sys.modules.get(module_name) or _FILE_MODULES.get(module_name)
    if module is None:
        top, *parts = module_name.split(".")
        spec = importlib.util.find_spec(top)  # a top-level find_spec runs no package code
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{top} is not installed (needed for {module_name})")
        path = Path(next(iter(spec.submodule_search_locations)), *parts).with_suffix(".py")
        file_spec = importlib.util.spec_from_file_location(module_name, path)
        if not path.is_file() or file_spec is None or file_spec.loader is None:
            raise ImportError(f"{module_name} not found at {path}")
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        _FILE_MODULES[module_name] = module
    return getattr(module, attr) if attr else module


def __getattr__(name: str) -> Any:
    if name in INTERNALS:
        return resolve(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def installed_sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# Hook targets the startup check leaves to their registration (which fails as loudly where one is missing):
# importing Mooncake's `conn` module in every process at plugin load runs SGLang's metrics imports before a
# server sets its Prometheus multiprocess directory, and every server's /metrics then answers empty. Its hook
# is registered only while tracing transfers (`trace.TRANSFERS_ENV`, `transfer_trace.py`).
RESOLVED_WHEN_REGISTERED = frozenset({"pd_transfer_data"})


def missing_internals(names: tuple[str, ...] | None = None) -> list[str]:
    """The internals (default: the startup ones and every hook target) this SGLang lacks."""
    paths = (
        [INTERNALS[name] for name in names]
        if names is not None
        else [
            *(INTERNALS[name] for name in STARTUP_INTERNALS),
            *(path for name, path in HOOK_TARGETS.items() if name not in RESOLVED_WHEN_REGISTERED),
        ]
    )
    missing = []
    for path in paths:
        try:
            _resolve_path(path)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{path} ({exc})")
    return missing


def check_sglang_compatibility(version: str | None = None) -> str:
    """Return the SGLang version, or raise UnsupportedSGLangError naming found and supported versions."""
    found = installed_sglang_version() if version is None else version
    if found != SUPPORTED_SGLANG_VERSION:
        raise UnsupportedSGLangError(
            f"sglang-evs supports SGLang {SUPPORTED_SGLANG_VERSION} only, but found SGLang {found}. "
            f"Install sglang=={SUPPORTED_SGLANG_VERSION} or uninstall sglang-evs."
        )
    missing = missing_internals()
    if missing:
        raise UnsupportedSGLangError(
            f"sglang-evs: SGLang {found} lacks internals this plugin needs "
            f"(supported: SGLang {SUPPORTED_SGLANG_VERSION}): {', '.join(missing)}"
        )
    return found
