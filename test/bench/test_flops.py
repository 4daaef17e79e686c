"""The benchmark profiles' cost proportions, from the FLOP counts."""

from sglang_evs.bench.flops import QWEN3_VL_2B, language_flops_per_token, vision_flops_per_token, vision_over_language
from sglang_evs.testing.tiny_core import PROFILES


def test_language_flops_count_every_projection():
    # 2B: per layer q 2048x2048, k and v 2048x1024, o 2048x2048, MLP 3 x 2048x6144; 28 layers; 2 per MAC
    per_layer = 2048 * 2048 * 2 + 2048 * 1024 * 2 + 3 * 2048 * 6144
    assert language_flops_per_token(QWEN3_VL_2B) == 2 * 28 * per_layer


def test_vision_flops_count_patches_blocks_and_mergers():
    # 2B: 4 patches of 3x2x16x16 into 1024, 24 blocks (4 h^2 + 2 h x 4096), 4 mergers (4096^2 + 4096 x 2048)
    per_patch = 3 * 2 * 16 * 16 * 1024 + 24 * (4 * 1024**2 + 2 * 1024 * 4096)
    assert vision_flops_per_token(QWEN3_VL_2B) == 2 * (4 * per_patch + 4 * (4096**2 + 4096 * 2048))


def test_balanced_profile_has_qwen3_vl_2b_proportions_and_small_is_language_bound():
    reference = vision_over_language(QWEN3_VL_2B)
    assert 0.85 < reference < 1.0  # the tower costs about as much per video token as the language model
    assert abs(vision_over_language(PROFILES["balanced"]) / reference - 1) < 0.1
    assert vision_over_language(PROFILES["small"]) < 0.01
    assert PROFILES["balanced"].text_hidden == PROFILES["small"].text_hidden  # the same language model
