"""A tiny Qwen4-Exp checkpoint (`Qwen4ExpForConditionalGeneration`), weights drawn by transformers' own model.

Qwen4-Exp is a Qwen3-VL subclass in SGLang 0.5.23 on a Qwen3.5-style hybrid backbone (Gated DeltaNet and full
attention) with hyper-connections, per-layer embeddings (PLE), n-gram embeddings and MoE; its videos go
through the same Qwen processor as Qwen3-VL's. SGLang builds the n-gram embeddings and hyper-connections in
bfloat16 whatever `--dtype` says, so it serves in bfloat16 only.

The sparse-attention indexer (QSA, the `indexer_*` fields) is left out of the checkpoint SGLang reads: it
forces a page size of 64, which SGLang's hybrid radix cache refuses here, so a server with it runs without
the radix cache (the CPU route runs the indexer itself on `runtime/qsa.py`'s stand-ins). transformers'
model always builds an indexer, so the weights are drawn with one (`DRAW_INDEXER`) and written without it:
the checkpoint is SGLang's to serve, not transformers' to load.
"""

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_evs.testing.tiny_core import (
    QWEN_VOCABULARY,
    VISION_OUTPUT_GAIN,
    build_tokenizer,
    merge,
    profile_of,
    qwen3_vl_processor,
    qwen_token_id_fields,
    redraw_language_model,
    write_released_expert_layout,
)

ARCHITECTURE = "Qwen4ExpForConditionalGeneration"

TEXT = dict(
    model_type="qwen4_exp_text", hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, hidden_act="silu", full_attention_interval=2,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_conv_kernel_dim=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, decoder_sparse_step=1, norm_topk_prob=True, max_position_embeddings=32768,
    rms_norm_eps=1e-6, mtp_num_hidden_layers=0,
    rope_parameters=dict(
        rope_type="default", rope_theta=10_000_000.0, partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
        mrope_interleaved=True,
    ),
    hc_count=2, hc_lowrank=16,  # hyper-connections (SGLang requires at least 2 streams)
    ple_layer_ids=[1], ple_embed_dim=64, ple_conv_kernel_size=4,  # per-layer embeddings
    ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=1000, make_ngram_vocab_size_divisible_by=128,
)  # fmt: skip
DRAW_INDEXER = dict(  # budget / compress ratio: 512, one of the two block counts both implementations take
    indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=1024, indexer_compress_ratio=2
)  # fmt: skip
VISION = dict(
    model_type="qwen4_exp", depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16,
    spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=576,
    deepstack_visual_indexes=[], in_channels=3, hidden_act="gelu_pytorch_tanh",
)  # fmt: skip


# `small`: a language model that dominates prefill time, for the EVS time-to-first-token benchmark, as Qwen3.5's
# `small`: 8 hybrid layers at 2048 wide (3 Gated DeltaNet per full attention; 16 query heads of 128 with 2 KV
# heads: 128 is the widest head whose rotary quarter fits the indexer's 32-wide heads), 16 key and 32 value
# heads of 128 in the linear layers, experts and the shared expert 3072 wide, under the tiny tower.
SMALL = dict(
    text_config=dict(
        hidden_size=2048, num_hidden_layers=8, full_attention_interval=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, rope_parameters=dict(mrope_section=[6, 5, 5]),
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        moe_intermediate_size=3072, shared_expert_intermediate_size=3072,
    ),
    vision_config=dict(out_hidden_size=2048),
)  # fmt: skip
PROFILES = {"tiny": {}, "small": SMALL}


def build(
    out_dir: str | Path, config_overrides: Mapping[str, Any] | None = None, seed: int = 0, profile: str = "tiny"
) -> Path:
    """Write config.json (the `profile`'s fields, then `config_overrides` merged: `text_config`, `vision_config`
    and top-level keys), seeded random bf16 weights (the language model at unit scale, the vision merger's
    output at VISION_OUTPUT_GAIN, experts in the released layout, no indexer), the Qwen tokenizer and
    Qwen3-VL's processor."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    tokenizer = build_tokenizer(vocabulary=QWEN_VOCABULARY)
    ids = qwen_token_id_fields(tokenizer)
    config = dict(
        architectures=[ARCHITECTURE], model_type="qwen4_exp", dtype="bfloat16",
        text_config={**TEXT, **ids.text}, vision_config=dict(VISION), **ids.top,
    )  # fmt: skip
    config = merge(merge(config, profile_of(PROFILES, profile, ARCHITECTURE)), config_overrides or {})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawn = transformers.Qwen4ExpConfig(**merge(config, {"text_config": DRAW_INDEXER}))
    torch.manual_seed(seed)
    model = transformers.Qwen4ExpForConditionalGeneration(drawn)
    redraw_language_model(model.model.language_model, model.lm_head)
    with torch.no_grad():  # vision rows as strong as text embeddings, so that greedy tokens depend on pixels
        model.model.visual.merger.linear_fc2.weight.mul_(VISION_OUTPUT_GAIN)
    with tempfile.TemporaryDirectory() as drawn_dir:  # transformers' own file layout, then the indexer dropped
        model.to(torch.bfloat16).save_pretrained(drawn_dir)
        weights = load_file(Path(drawn_dir) / "model.safetensors")
    kept = {name: value for name, value in weights.items() if ".indexer." not in name}
    save_file(kept, out / "model.safetensors", metadata={"format": "pt"})
    write_released_expert_layout(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer.save_pretrained(out)
    qwen3_vl_processor(tokenizer).save_pretrained(out)
    return out
