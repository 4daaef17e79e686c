"""Matmul FLOPs per video token of a Qwen3-VL's vision tower and language model (2 per multiply-add).

Attention scores are left out of both: the tower attends within a frame and the language model's
share grows with the context, so the weights' GEMMs are the like-for-like part. The profiles of
the random benchmark models are sized with these (`testing/tiny_core.PROFILES`).
"""

from sglang_evs.testing.tiny_core import Profile

# Qwen/Qwen3-VL-2B-Instruct's config.json (text_config, vision_config)
QWEN3_VL_2B = Profile(text_hidden=2048, text_layers=28, text_heads=16, text_kv_heads=8, head_dim=128,
                      text_intermediate=6144, mrope_section=(24, 20, 20), vision_hidden=1024, vision_depth=24,
                      vision_heads=16, vision_intermediate=4096, deepstack_indexes=(5, 11, 17))  # fmt: skip


def language_flops_per_token(p: Profile) -> float:
    """One token through the decoder layers: q, k, v, o projections and the gated MLP."""
    qkv = p.text_hidden * p.head_dim * (p.text_heads + 2 * p.text_kv_heads)
    attention = qkv + p.text_heads * p.head_dim * p.text_hidden
    return 2.0 * p.text_layers * (attention + 3 * p.text_hidden * p.text_intermediate)


def vision_flops_per_token(p: Profile, patch: int = 16, temporal_patch: int = 2, merge: int = 2) -> float:
    """One merged video token: its ``merge**2`` patches through the patch embedding and every block
    (qkv, proj, MLP), then the merger and one merger per deepstack level (into the LM's width)."""
    patches = merge**2
    embed = 3 * temporal_patch * patch * patch * p.vision_hidden
    block = 4 * p.vision_hidden**2 + 2 * p.vision_hidden * p.vision_intermediate
    merged = p.vision_hidden * patches
    merger = merged * merged + merged * p.text_hidden
    return 2.0 * (patches * (embed + p.vision_depth * block) + (1 + len(p.deepstack_indexes)) * merger)


def vision_over_language(p: Profile) -> float:
    return vision_flops_per_token(p) / language_flops_per_token(p)
