"""A Qwen3-VL-8B-shaped checkpoint with no weights: config, tokenizer and processor, served with
`--load-format dummy` (SGLang draws random weights on the device), for GPU timings at the real model's size.

    python -m sglang_evs.testing.qwen3_vl_8b_shape OUT_DIR

The config has Qwen3-VL-8B-Instruct's dimensions (`TEXT`, `VISION`): the language model is Qwen3-8B's (4096
wide, 36 layers, 32 query heads and 8 KV heads of 128, MLP 12288, vocabulary 151936), with interleaved M-RoPE
(sections 24/20/20, theta 5e6); the tower is 27 blocks of 1152 (MLP 4304, 16 heads, 16 px patches, 2 frames
per temporal patch, 2x2 merge) writing the language model's 4096, with deepstack levels after blocks 8, 16
and 24. transformers' `Qwen3VLConfig()` defaults are not these: its vision defaults are the 8B tower's
except `out_hidden_size` (3584), its text defaults a Qwen2-7B-like model (32 layers, 32 KV heads, MLP 22016,
theta 5e5). Tokens and special ids are the tiny tokenizer's (`tiny_core`), so the prompts of the tests serve
here unchanged; the embedding keeps the 8B's 151936 rows, of which the tokenizer uses the first few hundred.
No weights are written: transformers would draw 8.8 billion parameters (17.5 GB in bfloat16) on the CPU.
"""

import argparse
from pathlib import Path
from typing import Any

from sglang_evs.testing.tiny_core import Architecture, Fields, build_config, build_tokenizer, qwen3_vl_processor

ARCHITECTURE = "Qwen3VLForConditionalGeneration"
PROFILE = "8b-shape"
PARAMETERS = 8.77e9  # Qwen3-VL-8B-Instruct's parameter count, as published (8.77B)

TEXT: dict[str, Any] = dict(
    hidden_size=4096,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=12288,
    vocab_size=151936,
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    rope_parameters=dict(rope_type="default", rope_theta=5_000_000.0, mrope_section=[24, 20, 20],
                         mrope_interleaved=True),
)  # fmt: skip
VISION: dict[str, Any] = dict(
    depth=27,
    hidden_size=1152,
    intermediate_size=4304,
    num_heads=16,
    in_channels=3,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=4096,
    num_position_embeddings=2304,
    hidden_act="gelu_pytorch_tanh",
    deepstack_visual_indexes=[8, 16, 24],
)

# The shared config path (`tiny_core.build_config`) wires the tokenizer's ids in and checks the config; the
# vocabulary size is given again as an override because the shared path sets it to the tokenizer's length.
_SHAPE = Architecture(
    "Qwen3VLConfig", {PROFILE: lambda: Fields(text=dict(TEXT), vision=dict(VISION))}, qwen3_vl_processor, list
)


def qwen3_vl_8b_config(tokenizer=None) -> Any:
    """transformers' `Qwen3VLConfig` at the 8B's dimensions, wired to the tiny tokenizer, in bfloat16."""
    import torch

    overrides = {"text_config": {"vocab_size": TEXT["vocab_size"]}}
    config = build_config(ARCHITECTURE, _SHAPE, PROFILE, tokenizer, overrides)
    config.architectures = [ARCHITECTURE]
    config.dtype = torch.bfloat16
    return config


def build(out_dir: str | Path) -> Path:
    """Write config.json, the tokenizer and the processor to `out_dir`; no weights (serve with
    `--load-format dummy`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = qwen3_vl_8b_config(tokenizer)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    qwen3_vl_processor(tokenizer, config).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    print(f"wrote a Qwen3-VL-8B-shaped config (no weights) to {build(parser.parse_args().out_dir)}")


if __name__ == "__main__":
    main()
