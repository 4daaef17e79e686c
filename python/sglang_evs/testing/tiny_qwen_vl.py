"""The Qwen-VL family's tiny checkpoints, built by the shared path (`tiny_core.build`):
Qwen3VLForConditionalGeneration (the default architecture), Qwen3VLMoeForConditionalGeneration,
Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration, Qwen3_5ForConditionalGeneration,
Qwen3_5MoeForConditionalGeneration. All share one tokenizer (`tiny_core.QWEN_VOCABULARY`), so the
special-token ids are the same.

The `small` profiles (Qwen3-VL, Qwen2.5-VL, Qwen3.5): a language model that dominates prefill time, for
performance ratios such as EVS time-to-first-token, with the vision tower tiny. Qwen3-VL: Qwen3-VL-2B's
language-model width (2048, 16 heads of 128, 8 KV heads, M-RoPE sections 24/20/20) with 8 of its 28
layers; `balanced`, the same language model under a tower with Qwen3-VL-2B's vision:language cost.
Qwen2.5-VL: Qwen2.5-VL-3B's (2048, 16 heads of 128, 2 KV heads, MLP 11008, M-RoPE 16/24/24) with 8 of its
36 layers. Qwen3.5: 8 hybrid layers at 2048 wide (3 Gated DeltaNet per full attention), see
_qwen3_5_small_fields.

MTP head (Qwen3.5 / Qwen3.5-MoE): `"text_config": {"mtp_num_hidden_layers": 1}`, as the released configs
declare it, adds the multi-token-prediction layer SGLang's NEXTN drafts with (`mtp.*`, which transformers
loads past). A random draft would almost never be accepted, so the checkpoint is made for drafts that are:
the target's blocks write at MTP_BLOCK_SCALE of their usual size (the next token then depends mostly on
the current one, still on the whole context), and the MTP head computes that same function of the token
it is given.

Deepstack levels (`vision_config.deepstack_visual_indexes`): Qwen3-VL's are built by transformers.
Qwen3.5's tiny models have none by default, as the released checkpoints; given levels (three: SGLang
0.5.23's Qwen3.5 language model adds exactly three), the builder adds the mergers SGLang's Qwen3.5
vision tower builds for them, which transformers' Qwen3.5 (having no deepstack) loads past and ignores.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_evs.testing.tiny_core import (
    CHAT_TEMPLATE,
    PROFILES,
    Architecture,
    Fields,
    Profile,
    check_consistent,
    qwen3_vl_processor,
    write_released_expert_layout,
)


def _qwen3_vl_fields(p: Profile) -> Fields:
    return Fields(
        text=dict(
            hidden_size=p.text_hidden,
            intermediate_size=p.text_intermediate,
            num_hidden_layers=p.text_layers,
            num_attention_heads=p.text_heads,
            num_key_value_heads=p.text_kv_heads,
            head_dim=p.head_dim,
            max_position_embeddings=32768,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=5_000_000.0,
                mrope_section=list(p.mrope_section),
                mrope_interleaved=True,
            ),
        ),
        vision=dict(
            depth=p.vision_depth,
            hidden_size=p.vision_hidden,
            intermediate_size=p.vision_intermediate,
            num_heads=p.vision_heads,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=p.text_hidden,
            num_position_embeddings=576,
            deepstack_visual_indexes=list(p.deepstack_indexes),
        ),
    )


TINY_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def _qwen3_vl_moe_fields() -> Fields:
    fields = _qwen3_vl_fields(PROFILES["tiny"])
    # 2 * 16 != 64: the fused experts are not square, so a loader can tell the released layout from
    # transformers' own by shape (transformers transposes only when the shapes differ)
    return Fields({**fields.text, **TINY_MOE, "moe_intermediate_size": 16, "decoder_sparse_step": 1}, fields.vision)


def _qwen2_vl_fields() -> Fields:
    return Fields(
        text=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[2, 3, 3]),
        ),
        vision=dict(
            depth=2,
            embed_dim=64,
            hidden_size=64,
            mlp_ratio=2,
            num_heads=4,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_chans=3,  # the released checkpoints carry it and SGLang 0.5.23 reads it
        ),
    )


def _qwen2_5_vl_fields() -> Fields:
    text = _qwen2_vl_fields().text
    return Fields(
        text=text,
        vision=dict(
            depth=4,
            hidden_size=64,
            intermediate_size=128,  # SGLang rounds it up to a multiple of 8
            num_heads=4,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,  # 8 patches, 4 merged tokens per window side
            fullatt_block_indexes=[1, 3],  # blocks 0 and 2 attend within windows
            out_hidden_size=text["hidden_size"],
            tokens_per_second=2,  # as in the released Qwen2.5-VL configs
        ),
    )


def _qwen2_5_vl_small_fields() -> Fields:
    """Eight layers of Qwen2.5-VL-3B's language model (2048 wide, 16 heads of 128, 2 KV heads) over
    the tiny tower: the language-model-bound case, like Qwen3-VL's `small`."""
    tiny = _qwen2_5_vl_fields()
    text = dict(
        tiny.text, hidden_size=2048, intermediate_size=11008, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=2, rope_parameters=dict(tiny.text["rope_parameters"], mrope_section=[16, 24, 24]),
    )  # fmt: skip
    return Fields(text=text, vision=dict(tiny.vision, out_hidden_size=2048))


def _qwen3_5_fields() -> Fields:
    # As in the released Qwen3.5: rotary on a quarter of each head (partial_rotary_factor 0.25,
    # which SGLang 0.5.23 assumes whatever the config says), so mrope_section sums to head_dim / 8.
    return Fields(
        text=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            full_attention_interval=2,  # linear, full, linear, full
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            linear_conv_kernel_dim=4,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            max_position_embeddings=32768,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=10_000_000.0,
                partial_rotary_factor=0.25,
                mrope_section=[2, 1, 1],
                mrope_interleaved=True,
            ),
        ),
        vision=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=4,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=64,
            num_position_embeddings=576,
            # transformers 5.19 has no deepstack in Qwen3.5; said explicitly because SGLang's config
            # class would otherwise default to levels [8, 16, 24] whose weights do not exist.
            deepstack_visual_indexes=[],
        ),
    )


def _qwen3_5_small_fields() -> Fields:
    """The language-model-bound case for Qwen3.5, like Qwen3-VL's `small`: eight hybrid layers at 2048
    wide (three Gated DeltaNet layers per full-attention layer, as released; Qwen3-Next-shaped heads:
    16 query heads of 256 with 2 KV heads, 16 key and 32 value heads of 128 in the linear layers,
    MLP 6144, M-RoPE 11/11/10 on a quarter of each head) over the tiny tower."""
    tiny = _qwen3_5_fields()
    text = dict(
        tiny.text, hidden_size=2048, intermediate_size=6144, num_hidden_layers=8, full_attention_interval=4,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        rope_parameters=dict(tiny.text["rope_parameters"], mrope_section=[11, 11, 10]),
    )  # fmt: skip
    return Fields(text=text, vision=dict(tiny.vision, depth=3, out_hidden_size=2048))


def _qwen3_5_moe_fields() -> Fields:
    fields = _qwen3_5_fields()
    text = {k: v for k, v in fields.text.items() if k != "intermediate_size"}
    return Fields({**text, **TINY_MOE, "shared_expert_intermediate_size": 32}, fields.vision)


def _qwen2_vl_processor(tokenizer, image_processor_cls: str, video_processor_cls: str, processor_cls: str):
    import transformers

    size = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
    patches = dict(patch_size=14, merge_size=2, temporal_patch_size=2, size=size)
    return getattr(transformers, processor_cls)(
        image_processor=getattr(transformers, image_processor_cls)(**patches),
        tokenizer=tokenizer,
        video_processor=getattr(transformers, video_processor_cls)(**patches),
        chat_template=CHAT_TEMPLATE,
    )


def _qwen2_processor(processor_cls: str) -> Callable[[Any, Any], Any]:
    return lambda tok, _config: _qwen2_vl_processor(
        tok, "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor", processor_cls
    )


def _qwen_merger_outputs(model) -> list:
    """The merger linears that write the text model's width (deepstack mergers included)."""
    import torch

    hidden = model.config.text_config.hidden_size
    return [
        module.weight
        for name, module in model.model.visual.named_modules()
        if "merger" in name and isinstance(module, torch.nn.Linear) and module.out_features == hidden
    ]


MTP_CONFIG_KEYS = ("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings")  # released text_config keys
MTP_BLOCK_SCALE = 0.3  # measured: tiny Qwen3.5 NEXTN accepts 1.6-1.8 of 3 verify tokens on average
BLOCK_OUTPUTS = ("o_proj.weight", "down_proj.weight", "out_proj.weight", "experts.down_proj")


def mtp_layers(config: Any) -> int:
    """How many MTP layers the config declares (released Qwen3.5 configs: 1)."""
    return int(getattr(config.text_config, "mtp_num_hidden_layers", 0) or 0)


def _check_qwen3_5(config: Any) -> None:
    check_consistent(config, sglang_only_deepstack=True)
    levels = getattr(config.vision_config, "deepstack_visual_indexes", [])
    if levels and len(set(levels)) != 3:
        raise ValueError(f"SGLang 0.5.23's Qwen3.5 language model adds exactly three deepstack levels, not {levels}")
    _check_mtp(config)


def _check_mtp(config: Any) -> None:
    if mtp_layers(config) not in (0, 1):
        raise ValueError("SGLang 0.5.23's Qwen3.5 MTP draft has exactly one layer: mtp_num_hidden_layers 0 or 1")
    if getattr(config.text_config, "mtp_use_dedicated_embeddings", False):
        raise ValueError("SGLang 0.5.23's Qwen3.5 MTP draft shares the target's embeddings")


def _add_sglang_weights(weights_file: Path, config: Any, seed: int) -> None:
    """What SGLang's Qwen3.5 reads beyond transformers' model: the deepstack mergers of the levels the
    config gives, and the MTP layer it declares."""
    if config.vision_config.deepstack_visual_indexes:
        _add_deepstack_mergers(weights_file, config.vision_config, seed)
    if mtp_layers(config):
        _add_agreeing_mtp_head(weights_file, config.text_config, seed)


def _add_deepstack_mergers(weights_file: Path, vision: Any, seed: int) -> None:
    """Qwen3-VL's deepstack mergers (post-shuffle norm, two linears), one per level, under the names
    SGLang's Qwen3.5 loader maps to its vision tower. Scaled so their rows are as large as the text
    embeddings: a level added at the wrong rows, or not at all, changes the greedy tokens."""
    import torch
    from safetensors.torch import load_file, save_file

    width = vision.hidden_size * vision.spatial_merge_size**2
    generator = torch.Generator().manual_seed(seed + 1)

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=generator) * in_features**-0.5

    weights = load_file(weights_file)
    for level in range(len(vision.deepstack_visual_indexes)):
        prefix = f"model.visual.deepstack_merger_list.{level}."
        merger = {
            "norm.weight": torch.ones(width),
            "norm.bias": torch.zeros(width),
            "linear_fc1.weight": linear(width, width),
            "linear_fc1.bias": torch.zeros(width),
            "linear_fc2.weight": linear(vision.out_hidden_size, width),
            "linear_fc2.bias": torch.zeros(vision.out_hidden_size),
        }
        weights |= {prefix + name: value.to(torch.bfloat16) for name, value in merger.items()}
    save_file(weights, weights_file, metadata={"format": "pt"})


def _add_agreeing_mtp_head(weights_file: Path, text: Any, seed: int) -> None:
    """Write Qwen3.5's MTP layer as released (`mtp.fc` [H, 2H] over [norm(embedding), norm(hidden)],
    `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*` named as a target
    full-attention layer, `mtp.norm`; embeddings and head shared with the target), made to agree
    with the target: both damp their blocks' outputs by MTP_BLOCK_SCALE, `fc` passes the normalised
    embedding of the token it is given, and `mtp.norm` is the target's final norm. Gemma-style norms
    scale by (1 + weight), so a zero weight is a plain RMS norm."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(weights_file)
    dtype = weights["lm_head.weight"].dtype
    hidden = text.hidden_size
    last_full = max(i for i, kind in enumerate(text.layer_types) if kind == "full_attention")
    target_layer = f"model.language_model.layers.{last_full}."
    generator = torch.Generator().manual_seed(seed + 2)
    head: dict[str, torch.Tensor] = {}
    for name, value in weights.items():
        if name.startswith(target_layer):
            fresh = torch.zeros(value.shape)
            if value.dim() >= 2:  # linears and fused experts: [..., out, in]
                fresh = torch.randn(value.shape, generator=generator) * value.shape[-1] ** -0.5
            head["mtp.layers.0." + name[len(target_layer) :]] = fresh
    fc = torch.zeros(hidden, 2 * hidden)
    fc[:, :hidden] = torch.eye(hidden)
    head |= {
        "mtp.fc.weight": fc,
        "mtp.pre_fc_norm_embedding.weight": torch.zeros(hidden),
        "mtp.pre_fc_norm_hidden.weight": torch.zeros(hidden),
        "mtp.norm.weight": weights["model.language_model.norm.weight"].float(),
    }
    for name, value in [*weights.items(), *head.items()]:
        if name.startswith(("model.language_model.layers.", "mtp.layers.")) and name.endswith(BLOCK_OUTPUTS):
            (weights if name in weights else head)[name] = value.float() * MTP_BLOCK_SCALE
    weights = {name: value.to(dtype) for name, value in {**weights, **head}.items()}
    save_file(weights, weights_file, metadata={"format": "pt"})


DEFAULT_ARCHITECTURE = "Qwen3VLForConditionalGeneration"
ARCHITECTURES: dict[str, Architecture] = {
    DEFAULT_ARCHITECTURE: Architecture(
        "Qwen3VLConfig",
        {name: (lambda p=p: _qwen3_vl_fields(p)) for name, p in PROFILES.items()},
        qwen3_vl_processor,
        _qwen_merger_outputs,
    ),
    "Qwen3VLMoeForConditionalGeneration": Architecture(
        "Qwen3VLMoeConfig",
        {"tiny": _qwen3_vl_moe_fields},
        qwen3_vl_processor,
        _qwen_merger_outputs,
        released_layout=write_released_expert_layout,
    ),
    "Qwen2_5_VLForConditionalGeneration": Architecture(
        "Qwen2_5_VLConfig",
        {"tiny": _qwen2_5_vl_fields, "small": _qwen2_5_vl_small_fields},
        _qwen2_processor("Qwen2_5_VLProcessor"),
        _qwen_merger_outputs,
    ),
    "Qwen2VLForConditionalGeneration": Architecture(
        "Qwen2VLConfig", {"tiny": _qwen2_vl_fields}, _qwen2_processor("Qwen2VLProcessor"), _qwen_merger_outputs
    ),
    "Qwen3_5ForConditionalGeneration": Architecture(
        "Qwen3_5Config",
        {"tiny": _qwen3_5_fields, "small": _qwen3_5_small_fields},
        qwen3_vl_processor,
        _qwen_merger_outputs,
        check=_check_qwen3_5,
        extra_text_keys=MTP_CONFIG_KEYS,
        extra_weights=_add_sglang_weights,
    ),
    "Qwen3_5MoeForConditionalGeneration": Architecture(
        "Qwen3_5MoeConfig",
        {"tiny": _qwen3_5_moe_fields},
        qwen3_vl_processor,
        _qwen_merger_outputs,
        check=_check_qwen3_5,
        extra_text_keys=MTP_CONFIG_KEYS,
        extra_weights=_add_sglang_weights,
    ),
}
# All share the Qwen tokenizer, so the special-token ids are the same.
QWEN_ARCHITECTURES = tuple(ARCHITECTURES)
