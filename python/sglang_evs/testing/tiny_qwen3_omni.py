"""A tiny Qwen3-Omni checkpoint (`Qwen3OmniMoeForConditionalGeneration`: the thinker, with its vision and
audio towers; no talker), built offline from transformers' own thinker with seeded random weights.

SGLang 0.5.23 serves Qwen3-Omni as its thinker (a Qwen3-VL-MoE with an audio tower), reading the checkpoint
the way released ones are written: the thinker's weights under `thinker.`, its experts one by one
(`experts.{e}.gate_proj`, `up_proj`, `down_proj`), which this builder writes from transformers' fused
tensors. The processor is transformers' `Qwen3OmniMoeProcessor` (Whisper features of 128 mel bins, Qwen2-VL
image and video processors at the Qwen3-VL patch of 16), the tokenizer the shared byte-level BPE with
Qwen3-Omni's special tokens.

    python -m sglang_evs.testing.tiny_model OUT_DIR --architecture Qwen3OmniMoeForConditionalGeneration
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_evs.testing.tiny_core import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    VISION_OUTPUT_GAIN,
    Vocabulary,
    build_tokenizer,
    merge,
    profile_of,
    redraw_language_model,
)

ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"

AUDIO_TOKENS = ("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>")
OMNI_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{%- elif 'text' in part -%}",
    "{%- elif part['type'] == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "<|audio_start|><|audio_pad|><|audio_end|>"
    "{%- elif 'text' in part -%}",
)
OMNI_VOCABULARY = Vocabulary(
    (*SPECIAL_TOKENS, *AUDIO_TOKENS),
    OMNI_CHAT_TEMPLATE,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    named={  # what Qwen3OmniMoeProcessor reads off the tokenizer by name
        "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
        "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
        "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
    },
)  # fmt: skip

TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1,
    max_position_embeddings=32768,
    # interleaved M-RoPE, under both names: transformers' (`interleaved`) and the one SGLang reads
    rope_parameters=dict(
        rope_type="default", rope_theta=1_000_000.0, mrope_section=[4, 2, 2], interleaved=True, mrope_interleaved=True
    ),
)  # fmt: skip
VISION = dict(
    depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16, spatial_merge_size=2,
    temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=576, deepstack_visual_indexes=[0, 1],
)  # fmt: skip
AUDIO = dict(
    num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32, output_dim=64,
    downsample_hidden_size=16, n_window=50, n_window_infer=800, conv_chunksize=500, max_source_positions=1500,
)  # fmt: skip


def build_config(tokenizer, overrides: Mapping[str, Any] | None = None):
    """The whole model's config (talker off); `overrides` go to the thinker's `text_config`,
    `vision_config` and `audio_config` by those keys, and to the thinker itself otherwise."""
    from transformers import Qwen3OmniMoeConfig

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in OMNI_VOCABULARY.special_tokens}
    overrides = dict(overrides or {})
    thinker = dict(
        text_config={**TEXT, "vocab_size": len(tokenizer), **overrides.pop("text_config", {})},
        vision_config={**VISION, **overrides.pop("vision_config", {})},
        audio_config={**AUDIO, **overrides.pop("audio_config", {})},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"], audio_token_id=ids["<|audio_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        audio_start_token_id=ids["<|audio_start|>"], audio_end_token_id=ids["<|audio_end|>"],
        position_id_per_seconds=25, **overrides,
    )  # fmt: skip
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, enable_audio_output=False, architectures=[ARCHITECTURE],
        im_start_token_id=ids["<|im_start|>"], im_end_token_id=ids["<|im_end|>"],
    )  # fmt: skip


# `small`: a thinker whose language model dominates prefill time, for the EVS time-to-first-token benchmark:
# 8 MoE layers at 2048 wide (16 query heads of 128 with 4 KV heads, 4 experts of 3072, 2 per token; M-RoPE
# 24/20/20), the tiny vision (a third block) and audio towers writing that width.
SMALL = dict(
    text_config=dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
        head_dim=128, moe_intermediate_size=3072,
        rope_parameters={**TEXT["rope_parameters"], "mrope_section": [24, 20, 20]},  # build_config merges one level
    ),
    # three deepstack levels, as released: SGLang's Qwen3-VL-MoE language model adds them after layers 0-2
    vision_config=dict(out_hidden_size=2048, depth=3, deepstack_visual_indexes=[0, 1, 2]),
    audio_config=dict(output_dim=2048),
)  # fmt: skip
PROFILES = {"tiny": {}, "small": SMALL}


def build(
    out_dir: str | Path, config_overrides: Mapping[str, Any] | None = None, seed: int = 0, profile: str = "tiny"
) -> Path:
    """Write config (the `profile`'s fields, then `config_overrides`), seeded random bf16 thinker weights in the
    released layout, tokenizer, processor and chat template to `out_dir`."""
    import torch
    from safetensors.torch import save_file
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe

    tokenizer = build_tokenizer(vocabulary=OMNI_VOCABULARY)
    config = build_config(tokenizer, merge(profile_of(PROFILES, profile, ARCHITECTURE), config_overrides or {}))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    thinker = modeling_qwen3_omni_moe.Qwen3OmniMoeThinkerForConditionalGeneration(config.thinker_config)
    make_context_matter(thinker)
    weights = released_layout(thinker.to(torch.bfloat16).state_dict())
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config.dtype = torch.bfloat16
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    processor(tokenizer).save_pretrained(out)
    provenance = {"architecture": ARCHITECTURE, "seed": seed, "config_overrides": dict(config_overrides or {})}
    (out / "sglang_evs_profile.json").write_text(json.dumps(provenance))
    return out


def make_context_matter(thinker) -> None:
    """As the shared builder does for the other families: transformers' init (std 0.02) leaves each layer's
    update tiny beside the residual stream and the towers' outputs far weaker than text embeddings, so the
    next token would hardly depend on the media. Redraw the language model at unit scale, and raise what
    the vision mergers and the audio tower's head write by the shared gain."""
    import torch

    redraw_language_model(thinker.model, thinker.lm_head)
    with torch.no_grad():
        for weight in [m.mlp[2].weight for m in (thinker.visual.merger, *thinker.visual.merger_list)]:
            weight.mul_(VISION_OUTPUT_GAIN)
        # the audio tower at unit scale too: at a std of 0.02 its convolutions leave the sound far below
        # its sinusoidal positions, and the answer would not depend on what is heard
        audio = thinker.audio_tower
        for module in audio.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
                module.weight.normal_(0.0, module.weight[0].numel() ** -0.5)
        audio.proj2.weight.mul_(VISION_OUTPUT_GAIN)


def released_layout(state: Mapping[str, Any]) -> dict[str, Any]:
    """transformers' thinker state dict as released checkpoints name it: under `thinker.`, each expert's
    projections apart (transformers fuses them: `gate_up_proj` [E, 2 * inter, hidden], `down_proj`
    [E, hidden, inter])."""
    out = {}
    for name, value in state.items():
        stem = f"thinker.{name.rpartition('.')[0]}"
        if name.endswith("mlp.experts.gate_up_proj"):
            gate, up = value.chunk(2, dim=1)
            for expert in range(value.shape[0]):
                out[f"{stem}.{expert}.gate_proj.weight"] = gate[expert].contiguous()
                out[f"{stem}.{expert}.up_proj.weight"] = up[expert].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            for expert in range(value.shape[0]):
                out[f"{stem}.{expert}.down_proj.weight"] = value[expert].contiguous()
        else:
            out[f"thinker.{name}"] = value.contiguous()
    return out


def processor(tokenizer):
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        Qwen3OmniMoeProcessor,
        WhisperFeatureExtractor,
    )

    patches = dict(patch_size=16, merge_size=2, temporal_patch_size=2)  # Qwen3-VL's tower
    return Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(**patches, size={"shortest_edge": 65536, "longest_edge": 16777216}),
        video_processor=Qwen2VLVideoProcessor(**patches, size={"shortest_edge": 4096, "longest_edge": 25165824}),
        feature_extractor=WhisperFeatureExtractor(feature_size=AUDIO["num_mel_bins"]),
        tokenizer=tokenizer,
        chat_template=OMNI_CHAT_TEMPLATE,
    )
