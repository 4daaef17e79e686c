"""What a server refuses video pruning with, and why: the setups it cannot run exactly with, and the errors.

A setup is named by `conflicting_setup` (speculative decoding with a draft blind to the pruned positions, under
pipeline parallelism or with draft trees; prefill/decode disaggregation over another transfer backend than
Mooncake; encoder disaggregation over another transport than the one that carries the records, or of an
architecture whose record says its encoder path is unproven, `served.py`); `refuse_unsupported` turns it into
the error a server (at startup) or a request (HTTP 400) gets when it asks to prune. The checkpoint checks read
config.json without running remote code (`checkpoint_config`).
"""

import functools
import json
from pathlib import Path

from sglang_evs import sglang_compat
from sglang_evs.methods import PRUNING_RATE_SETTING
from sglang_evs.pruning.settings import Pruning
from sglang_evs.served import EAGLE3_DRAFT, SERVED, mtp_draft_of, serves


def conflicting_setup(server_args, hf_config=None) -> str | None:
    """What of a server's setup video pruning cannot run with, named for the error; None: nothing.

    - speculative decoding with a draft that does not read the target's positions
      (`draft_reads_target_positions`), or under pipeline parallelism (the draft runs on the last stage,
      which learns the pruned positions for the target's forward only), or with draft trees (no test has
      run a tree with pruning, on any device: the CPU route runs chains only);
    - encoder disaggregation over a transport other than SGLang's default `zmq_to_scheduler` (the
      encoder prunes and sends a record per video with the kept rows, `pruning/disaggregated.py`;
      Mooncake publishes the row counts before the encoder has run), or of a model whose encoder path is
      inexact upstream or has not been run with pruning;
    - prefill/decode disaggregation over a transfer backend other than Mooncake: the layout handshake
      (`pruning/prefill_decode.py`) reads Mooncake's record of the decode server's KV slots, and no other
      backend has been run (Mooncake's TCP transport is, on the CPU route: `test/e2e/test_pd_disaggregation.py`).
    """
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm is not None and not draft_reads_target_positions(server_args, hf_config):
        return f"speculative decoding with a draft blind to M-RoPE positions (--speculative-algorithm {algorithm})"
    if algorithm is not None and getattr(server_args, "pp_size", 1) > 1:
        return f"speculative decoding under pipeline parallelism (--pp-size {server_args.pp_size})"
    topk = getattr(server_args, "speculative_eagle_topk", None) or 1
    if algorithm is not None and topk > 1:
        return f"speculative draft trees (--speculative-eagle-topk {topk}; chains, topk 1, are proven)"
    mode = getattr(server_args, "disaggregation_mode", "null")
    backend = getattr(server_args, "disaggregation_transfer_backend", PD_TRANSFER_BACKEND)
    if mode in ("prefill", "decode") and backend != PD_TRANSFER_BACKEND:
        flag = f"--disaggregation-transfer-backend {backend}"
        return f"prefill/decode disaggregation (--disaggregation-mode {mode}) over {flag}"
    role = next((role for attr, role in DISAGGREGATED_ROLES.items() if getattr(server_args, attr, False)), None)
    transport = getattr(server_args, "encoder_transfer_backend", PRUNING_TRANSPORT)
    if role is not None and transport not in (PRUNING_TRANSPORT, "auto"):  # auto: zmq_to_scheduler for ours
        return f"{role} over --encoder-transfer-backend {transport}"
    architecture = (getattr(hf_config, "architectures", None) or [None])[0]
    served = SERVED.get(architecture)
    if role is not None and served is not None and served.unproven_encoder_path is not None:
        return f"{role} of {architecture} ({served.unproven_encoder_path})"
    return None


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


def refuse_encoder_default(pruning: Pruning) -> None:
    """An `--encoder-only` server prunes as each request asks, over the language server's default: a default
    of its own would never be read, so it is refused naming the setting."""
    if pruning.prunes:
        raise ValueError(
            f"{PRUNING_RATE_SETTING}={pruning.rate}: an encoder server (--encoder-only) prunes as each request "
            "asks, over its language server's default; set the pruning default on the --language-only server"
        )


def refuse_unsupported(pruning: Pruning, conflict: str | None) -> None:
    """ValueError naming the setting and `conflict` (a `conflicting_setup` answer) if both are there."""
    if pruning.prunes and conflict is not None:
        raise ValueError(
            f"{PRUNING_RATE_SETTING}={pruning.rate}: video pruning ({pruning.method.name}) is not supported with "
            f"{conflict} yet; set {PRUNING_RATE_SETTING} to 0 (or unset it) or serve without {conflict}"
        )
