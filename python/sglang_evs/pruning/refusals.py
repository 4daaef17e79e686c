"""What a server refuses video pruning with, and why: the setups it cannot run exactly with, and the errors.

A setup is named by `conflicting_setup` (a flag not run with pruning, `UNPROVEN_FLAGS`; speculative decoding
with a draft blind to the pruned positions, under pipeline parallelism or with draft trees; context parallelism;
prefill/decode disaggregation over another transfer backend than Mooncake; encoder disaggregation over another
transport than the one that carries the records, with the global multimodal cache, or of an architecture whose
record says its encoder path is unproven, `served.py`); `refuse_unsupported` turns it into the error a server (at
startup) or a request (HTTP 400) gets when it asks to prune. A disaggregated setup hands a video's pruning from
server to server as its method and rate alone (`rate_only_setup`), so a token budget or a per-group floor is
refused there by name. The checkpoint checks read config.json without running remote code (`checkpoint_config`).
One request feature is refused with pruning too: input logprobs over a pruned video
(`refuse_prompt_logprobs_over_pruned_videos`).
"""

import functools
import json
from pathlib import Path

from sglang_evs import sglang_compat
from sglang_evs.methods import (
    MIN_TOKENS_PER_GROUP_SETTING,
    PRUNING_RATE_SETTING,
    PRUNING_THRESHOLD_SETTING,
    TOKEN_BUDGET_SETTING,
)
from sglang_evs.methods.images import IMAGE_PRUNING_RATE_SETTING
from sglang_evs.pruning.fields import is_pruned, pruned_limits, pruned_with, region_span
from sglang_evs.pruning.settings import ImagePruning, Pruning
from sglang_evs.served import EAGLE3_DRAFT, SERVED, mtp_draft_of, serves


def conflicting_setup(server_args, hf_config=None) -> str | None:
    """What of a server's setup video pruning cannot run with, named for the error; None: nothing.

    - speculative decoding with a draft that does not read the target's positions
      (`draft_reads_target_positions`), or under pipeline parallelism (the draft runs on the last stage,
      which learns the pruned positions for the target's forward only), or with draft trees (no test has
      run a tree with pruning, on any device: the CPU route runs chains only);
    - encoder disaggregation over a transport other than SGLang's default `zmq_to_scheduler` (the
      encoder prunes and sends a record per video with the kept rows, `pruning/disaggregated.py`;
      Mooncake publishes the row counts before the encoder has run), or with SGLang's global multimodal
      cache on the encoder (`--enable-mm-global-cache`: a video whose hash it holds takes its rows from the
      cache instead of the encoder's forward, so it gets no keep-mask and no record), or of a model whose
      encoder path is inexact upstream or has not been run with pruning;
    - context parallelism (`--attn-cp-size` > 1, `--enable-prefill-cp`): each rank runs part of a prompt's tokens,
      cut from the positions SGLang hands the model, which never held the pruned ones; no run of it with pruning
      exists (SGLang's own first forward fails on the CPU route's attention backend, `docs/compatibility.md`);
    - prefill/decode disaggregation over a transfer backend other than Mooncake: the layout handshake
      (`pruning/prefill_decode.py`) reads Mooncake's record of the decode server's KV slots, and no other
      backend has been run (Mooncake's TCP transport is, on the CPU route: `test/e2e/test_pd_disaggregation.py`).
    """
    unproven = [flag for attr, flag in UNPROVEN_FLAGS.items() if getattr(server_args, attr, False)]
    if unproven:
        return f"{', '.join(unproven)} (not run with pruning)"
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm is not None and not draft_reads_target_positions(server_args, hf_config):
        return f"speculative decoding with a draft blind to M-RoPE positions (--speculative-algorithm {algorithm})"
    if algorithm is not None and getattr(server_args, "pp_size", 1) > 1:
        return f"speculative decoding under pipeline parallelism (--pp-size {server_args.pp_size})"
    topk = getattr(server_args, "speculative_eagle_topk", None) or 1
    if algorithm is not None and topk > 1:
        return f"speculative draft trees (--speculative-eagle-topk {topk}; chains, topk 1, are proven)"
    cp_size = int(getattr(server_args, "attn_cp_size", 1) or 1)
    prefill_cp = bool(getattr(server_args, "enable_prefill_cp", False))
    if cp_size > 1 or prefill_cp:
        flags = [f"--attn-cp-size {cp_size}"] if cp_size > 1 else []
        return f"context parallelism ({' '.join(flags + ['--enable-prefill-cp'] * prefill_cp)})"
    mode = getattr(server_args, "disaggregation_mode", "null")
    backend = getattr(server_args, "disaggregation_transfer_backend", PD_TRANSFER_BACKEND)
    if mode in ("prefill", "decode") and backend != PD_TRANSFER_BACKEND:
        flag = f"--disaggregation-transfer-backend {backend}"
        return f"prefill/decode disaggregation (--disaggregation-mode {mode}) over {flag}"
    role = encoder_role(server_args)
    transport = getattr(server_args, "encoder_transfer_backend", PRUNING_TRANSPORT)
    if role is not None and transport not in (PRUNING_TRANSPORT, "auto"):  # auto: zmq_to_scheduler for ours
        return f"{role} over --encoder-transfer-backend {transport}"
    if role is not None and getattr(server_args, "enable_mm_global_cache", False):
        return f"{role} with --enable-mm-global-cache (a video it finds cached skips the encoder, and the pruning)"
    architecture = (getattr(hf_config, "architectures", None) or [None])[0]
    served = SERVED.get(architecture)
    if role is not None and served is not None and served.unproven_encoder_path is not None:
        return f"{role} of {architecture} ({served.unproven_encoder_path})"
    return None


# Server flags that touch batches, positions or embeddings and have not been run with pruning (SGLang 0.5.23;
# docs/compatibility.md says what each does): ServerArgs attribute -> the flag, as errors name it.
UNPROVEN_FLAGS = {
    "enable_multi_layer_eagle": "--enable-multi-layer-eagle",  # its draft layers' positions: not checked
    "enable_return_aux_hidden_states": "--enable-return-aux-hidden-states",
    "enable_dynamic_chunking": "--enable-dynamic-chunking",  # pipeline chunks sized from measured latency
    "enable_int8_mamba_checkpoint": "--enable-int8-mamba-checkpoint",  # radix-cached linear-attention state
    "enable_pd_role_switch": "--enable-pd-role-switch",  # a server switching between prefill and decode
    "enable_lmcache": "--enable-lmcache",  # KV kept outside SGLang under its token keys
    "enable_unified_cache_external_linker": "--enable-unified-cache-external-linker",
    "grpc_mode": "--grpc-mode",  # a front end that may prepare media without the plugin's processor
    "smg_grpc_mode": "--smg-grpc-mode",
    "enable_precise_embedding_interpolation": "--enable-precise-embedding-interpolation",  # the tower's embeddings
    "enable_prefill_delayer": "--enable-prefill-delayer",  # prefills held back and batched
}

# The prefill/decode transfer backend pruning has been run over (and whose decode-side KV slots the prefill
# server checks, pruning/prefill_decode.py); SGLang's default.
PD_TRANSFER_BACKEND = "mooncake"

# The encoder transport that carries a video's pruning record with its kept rows (pruning/disaggregated.py).
PRUNING_TRANSPORT = "zmq_to_scheduler"


def draft_reads_target_positions(server_args, hf_config) -> bool:
    """Whether the speculative draft is given the target's M-RoPE positions, which are the pruned prompt's
    exact ones (SGLang builds them for the draft's batch from the request, `PrunedVideos.write_positions`):
    - NEXTN (SGLang's EAGLE worker drafting with the checkpoint's own MTP layer, declared in the config as
      released Qwen3.5 configs do) for a target whose record names its MTP draft (`served.mtp_draft_of`): the
      plugin's draft class reads them;
    - EAGLE3 with a `LlamaForCausalLMEagle3` draft whose config sets `mrope_section`: upstream's draft reads
      them. Every other draft reads 1-D positions, or positions of its own."""
    algorithm = getattr(server_args, "speculative_algorithm", None)
    draft = getattr(server_args, "speculative_draft_model_path", None)
    model = getattr(server_args, "model_path", None)
    if algorithm in ("EAGLE", "NEXTN") and draft in (None, model):
        text_config = getattr(hf_config, "text_config", hf_config)
        target = (getattr(hf_config, "architectures", None) or [None])[0]
        return int(getattr(text_config, "mtp_num_hidden_layers", 0) or 0) > 0 and mtp_draft_of(target) is not None
    if algorithm == "EAGLE3" and draft not in (None, model):
        config = checkpoint_config(draft)
        rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
        return EAGLE3_DRAFT.architecture in (config.get("architectures") or []) and "mrope_section" in rope
    return False


@functools.cache
def checkpoint_config(path: str) -> dict:
    """A checkpoint's config.json as a dict ({} where it cannot be read here); read once per path (a
    language server asks for every request it dispatches to its encoders). Not to be modified."""
    local = Path(path) / "config.json"
    if local.is_file():
        return json.loads(local.read_text())
    try:
        from transformers import PretrainedConfig

        return PretrainedConfig.get_config_dict(path)[0]  # the file as written: no remote code runs
    except (OSError, ValueError, KeyError):
        return {}


def server_checkpoint() -> dict:
    """The config.json of the checkpoint this process serves (`--model-path`; in a draft worker, the target's,
    which a draft is built beside), as `checkpoint_config` reads it; {} outside a server."""
    try:
        model_path = sglang_compat.get_server_args().model_path
    except ValueError:  # "Global server args is not set yet": not a server process
        return {}
    return {} if model_path is None else checkpoint_config(str(model_path))


def serves_this_model(hf_config=None) -> bool:
    """Whether this server's model is one the plugin serves (`served.serves`): the test every hook of encoder
    and prefill/decode disaggregation (`disaggregated.py`, `prefill_decode.py`) makes before it acts, leaving
    any other model to SGLang. `hf_config`: the model config the hooked object holds; None where it holds none
    (then the server's checkpoint, `server_checkpoint`; False outside a server)."""
    return serves(server_checkpoint() if hf_config is None else hf_config)


# ServerArgs attribute (also set on an encoder server's model config) -> the role, as errors name it
DISAGGREGATED_ROLES = {
    "encoder_only": "encoder disaggregation (--encoder-only)",
    "language_only": "encoder disaggregation (--language-only)",
}


def encoder_role(server_args) -> str | None:
    """The server's role in encoder disaggregation (`DISAGGREGATED_ROLES`), named for an error; None: it has none."""
    return next((role for attr, role in DISAGGREGATED_ROLES.items() if getattr(server_args, attr, False)), None)


def rate_only_setup(server_args) -> str | None:
    """The disaggregated setup of a server whose servers hand each other a video's pruning as its method and
    rate alone, named for the error; None: one server lays out and prunes. Prefill/decode: the layout
    handshake (`prefill_decode.py`) compares the method and rate; encoder disaggregation: the settings that
    ride with each video entry and its record (`encoder_records.py`) are the method and rate. A token budget
    or a per-group floor would reach neither, so they are refused there (`refuse_unsupported`)."""
    mode = getattr(server_args, "disaggregation_mode", "null")
    if mode in ("prefill", "decode"):
        return f"prefill/decode disaggregation (--disaggregation-mode {mode})"
    return encoder_role(server_args)


def content_unreached_setup(server_args) -> str | None:
    """The setup of a server where a threshold's layout (decided when the scheduler admits a request,
    `admission.py`) is not reached, named for the error; None: one server, tensor or data parallel, decides it.
    Pipeline parallelism (only the first stage has the tower), speculative decoding (its drafts have not been
    run over an admission-time layout), data-parallel attention, and disaggregation (prefill/decode: the decode
    server lays the prompt out without an encoder; encoder: the encoder announces its row counts before its
    forward)."""
    pp_size, algorithm = getattr(server_args, "pp_size", 1), getattr(server_args, "speculative_algorithm", None)
    if pp_size > 1:
        return f"pipeline parallelism (--pp-size {pp_size})"
    if algorithm is not None:
        return f"speculative decoding (--speculative-algorithm {algorithm})"
    if getattr(server_args, "enable_dp_attention", False):
        return "data-parallel attention (--enable-dp-attention)"
    return rate_only_setup(server_args)


def refuse_encoder_default(pruning: Pruning) -> None:
    """An `--encoder-only` server prunes as each request asks, over the language server's default: a default
    of its own would never be read, so it is refused naming the setting."""
    if pruning.prunes:
        raise ValueError(
            f"{pruning.named()}: an encoder server (--encoder-only) prunes as each request "
            "asks, over its language server's default; set the pruning default on the --language-only server"
        )


def refuse_unsupported_images(pruning: ImagePruning, conflict: str | None, encoder: str | None) -> None:
    """ValueError naming `image_pruning_rate` where images are to be pruned under `conflict` (a `conflicting_setup`
    answer: what videos cannot be pruned with either) or encoder disaggregation (an `encoder_role` answer: its
    encoders' records and the language server's layout carry videos only)."""
    setup = conflict or encoder
    if pruning.prunes and setup is not None:
        raise ValueError(
            f"{IMAGE_PRUNING_RATE_SETTING}={pruning.rate}: image pruning ({pruning.method.name}) is not supported "
            f"with {setup} yet; set {IMAGE_PRUNING_RATE_SETTING} to 0 (or unset it) or serve without {setup}"
        )


def refuse_unsupported(
    pruning: Pruning, conflict: str | None, rate_only: str | None = None, content_unreached: str | None = None
) -> None:
    """ValueError naming the setting and `conflict` (a `conflicting_setup` answer) if both are there, naming
    a threshold and `content_unreached` (a `content_unreached_setup` answer) if both are there, or naming a token
    budget or floor and `rate_only` (a `rate_only_setup` answer) if both are there."""
    if pruning.prunes and conflict is not None:
        raise ValueError(
            f"{pruning.named()}: video pruning ({pruning.method.name}) is not supported with "
            f"{conflict} yet; set {PRUNING_RATE_SETTING} to 0 (or unset it) or serve without {conflict}"
        )
    if pruning.follows_content and content_unreached is not None:
        raise ValueError(
            f"{pruning.named()}: {PRUNING_THRESHOLD_SETTING} is not served with {content_unreached} yet (its count "
            "is decided when one server's scheduler admits the request, by encoding the video); prune with "
            f"{PRUNING_RATE_SETTING} there, or serve without {content_unreached}"
        )
    if pruning.limits_count and rate_only is not None:
        raise ValueError(
            f"{pruning.named()}: {TOKEN_BUDGET_SETTING} and {MIN_TOKENS_PER_GROUP_SETTING} are not served with "
            f"{rate_only} yet (its servers hand each other a video's method and rate only); prune with "
            f"{PRUNING_RATE_SETTING} alone, or serve without {rate_only}"
        )


# The /generate field that asks for input (prompt) logprobs from that index of the prompt on.
LOGPROB_START_SETTING = "logprob_start_len"


def prompt_logprobs_refusal(request, items: list, prompt_tokens: int) -> str | None:
    """Why `request` (its `return_logprob`, `logprob_start_len`) cannot have input logprobs over the prompt whose
    media `items` are laid out (offsets in the same prompt, `prompt_tokens` long), or None: it can.

    Refused: a start before the end of a pruned video's region. `logprob_start_len` indexes the served prompt,
    the pruned one, as every other prompt index does. SGLang scores every token of a media item's span as the
    placeholder (token id 0, and the logprob of the clamped placeholder id as the next token), and a pruned
    region is one span that also holds the framing text between temporal groups (timestamps, vision markers),
    whose rows the keep-mask places only when the video is encoded, after the scheduler fixed which token each
    row scores. So those tokens would be scored as placeholders where upstream scores their text. From the
    region's end on, every row is a text token at its exact position: served as upstream serves it."""
    start = getattr(request, "logprob_start_len", None)
    if not getattr(request, "return_logprob", False) or start is None or start < 0:
        return None
    regions = [(region_span(item)[1], item) for item in items if item.is_video() and is_pruned(item)]
    if not regions or start >= max(end for end, _ in regions):
        return None
    end, item = max(regions, key=lambda region: region[0])
    method, rate = pruned_with(item)
    budget, floor = pruned_limits(item)
    limits = f", {TOKEN_BUDGET_SETTING}={budget}" if budget else ""
    limits += f", {MIN_TOKENS_PER_GROUP_SETTING}={floor}" if floor else ""
    unset = f" and {TOKEN_BUDGET_SETTING}" if budget else ""
    return (
        f"{LOGPROB_START_SETTING}={start}: input logprobs over a video pruned with {PRUNING_RATE_SETTING}={rate}"
        f"{limits} ({method}) are not served, since its framing text is laid out only when it is encoded; ask from "
        f"{LOGPROB_START_SETTING}={end} on (the first token after the pruned video; it indexes the pruned prompt, "
        f"of {prompt_tokens} tokens) or set {PRUNING_RATE_SETTING}{unset} to 0"
    )


def refuse_request_features_with_threshold(request_obj) -> None:
    """ValueError (HTTP 400) for what a threshold request cannot have yet: input logprobs (`logprob_start_len`
    indexes the served prompt, whose length the scheduler decides after this process has passed the request on)."""
    wants = getattr(request_obj, "return_logprob", False)
    starts = getattr(request_obj, "logprob_start_len", None)
    both_lists = isinstance(wants, list) and isinstance(starts, list)
    pairs = zip(wants, starts, strict=True) if both_lists else [(wants, starts)]
    start = next((s for w, s in pairs if w and s is not None and not isinstance(s, list) and s >= 0), None)
    if start is not None:
        raise ValueError(
            f"input logprobs ({LOGPROB_START_SETTING}={start}) with {PRUNING_THRESHOLD_SETTING}: the served "
            "prompt's length is decided by the video's content in the scheduler; ask for output logprobs only"
        )


def refuse_prompt_logprobs_over_pruned_videos(request_obj, output) -> None:
    """ValueError (HTTP 400) where `prompt_logprobs_refusal` refuses a request whose processor `output` has its
    regions laid out. A session turn's `logprob_start_len` indexes the whole session's prompt, which only the
    scheduler assembles: it is checked there (`sessions.refuse_session_logprobs_over_pruned_videos`)."""
    if getattr(request_obj, "session_params", None) is not None:
        return
    message = prompt_logprobs_refusal(request_obj, output.mm_items, len(output.input_ids))
    if message is not None:
        raise ValueError(message)
