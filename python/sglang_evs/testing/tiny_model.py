"""Write a random-weight Qwen3-VL checkpoint that HF transformers and SGLang both load, offline.

    python -m sglang_evs.testing.tiny_model OUT_DIR [--profile tiny|small] [--seed 0]

Profiles:
  tiny   seconds on CPU; for correctness tests.
  small  a language model that dominates prefill time, for performance ratios such
         as EVS time-to-first-token: Qwen3-VL-2B's language-model width (2048, 16
         heads of 128, 8 KV heads, M-RoPE sections 24/20/20) with 8 of its 28
         layers; the vision tower stays tiny.
"""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen-style chat template: one <|vision_start|><|..._pad|><|vision_end|> per medium.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'video' or 'video' in part or 'video_url' in part -%}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in part -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)

CORPUS = """The quick brown fox jumps over the lazy dog. Describe this image. What is
happening in this video? A red square moves across a gray background. Count the objects.
The answer is yes or no. Summarize the scene in one sentence. Which frame shows the ball?
Numbers 0 1 2 3 4 5 6 7 8 9 10 seconds. user assistant system You are a helpful assistant.
"""


@dataclass(frozen=True)
class Profile:
    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    head_dim: int
    text_intermediate: int
    mrope_section: tuple[int, int, int]
    vision_hidden: int
    vision_depth: int
    vision_heads: int
    vision_intermediate: int
    deepstack_indexes: tuple[int, ...]


PROFILES = {
    "tiny": Profile(64, 2, 4, 2, 16, 128, (4, 2, 2), 64, 2, 4, 128, (0, 1)),
    # Half as wide (1024), the LM was only 60 % of a video request's TTFT on the CPU machine: SGLang's
    # CPU vision attention is dense over each video, so even a tiny tower costs ~0.9 s per 8 s clip.
    "small": Profile(2048, 8, 16, 8, 128, 6144, (24, 20, 20), 64, 3, 4, 128, (0, 1, 2)),
}


VISION_OUTPUT_GAIN = 20.0


def build_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _token_id_fields(tokenizer) -> tuple[dict, dict]:
    """The tokenizer's special ids as (text-config fields, top-level fields) of a Qwen-VL config."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    top = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
    }
    return text, top


def build_config(profile: Profile, tokenizer):
    from transformers import Qwen3VLConfig

    text_ids, top_ids = _token_id_fields(tokenizer)
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=profile.text_hidden,
            intermediate_size=profile.text_intermediate,
            num_hidden_layers=profile.text_layers,
            num_attention_heads=profile.text_heads,
            num_key_value_heads=profile.text_kv_heads,
            head_dim=profile.head_dim,
            max_position_embeddings=32768,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=5_000_000.0,
                mrope_section=list(profile.mrope_section),
                mrope_interleaved=True,
            ),
            **text_ids,
        ),
        vision_config=dict(
            depth=profile.vision_depth,
            hidden_size=profile.vision_hidden,
            intermediate_size=profile.vision_intermediate,
            num_heads=profile.vision_heads,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=profile.text_hidden,
            num_position_embeddings=576,
            deepstack_visual_indexes=list(profile.deepstack_indexes),
        ),
        **top_ids,
    )


def build_qwen2_vl_config(tokenizer):
    """A tiny Qwen2-VL: a VLM with no model-specific embedding needs (no deepstack)."""
    from transformers import Qwen2VLConfig

    text_ids, top_ids = _token_id_fields(tokenizer)
    return Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[2, 3, 3]),
            **text_ids,
        ),
        vision_config=dict(
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
        **top_ids,
    )


def build_qwen2_vl_processor(tokenizer):
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
    return Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, size=size),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, size=size),
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_qwen2_vl(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random Qwen2-VL (same tokenizer and weight rescaling as the Qwen3-VL builder)."""
    from transformers import Qwen2VLForConditionalGeneration

    tokenizer = build_tokenizer()
    return _write_checkpoint(
        out_dir, Qwen2VLForConditionalGeneration, build_qwen2_vl_config(tokenizer), tokenizer,
        build_qwen2_vl_processor(tokenizer), seed,
    )  # fmt: skip


def _write_checkpoint(out_dir, model_cls, config, tokenizer, processor, seed: int) -> Path:
    """Seeded random bf16 weights (rescaled, see _make_context_matter), tokenizer and processor."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.bfloat16)
    _make_context_matter(model, torch)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def _make_context_matter(model, torch) -> None:
    # HF's init (std 0.02) leaves every layer's update tiny next to the
    # residual stream, so the next token would depend on the last token only,
    # and vision features come out ~20x weaker than text embeddings. Rescale so
    # greedy tokens depend on the whole context, pixels included: otherwise a
    # parity test would pass even if an image were ignored.
    with torch.no_grad():
        model.model.language_model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.5)
        for module in model.model.language_model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features**-0.5)
        for name, module in model.model.visual.named_modules():
            if (
                "merger" in name
                and isinstance(module, torch.nn.Linear)
                and module.out_features == model.config.text_config.hidden_size
            ):
                module.weight.mul_(VISION_OUTPUT_GAIN)


def build_processor(tokenizer):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    # Pixel bounds as in the released Qwen3-VL preprocessor configs.
    image_processor = Qwen2VLImageProcessor(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": 65536, "longest_edge": 16777216},
    )
    video_processor = Qwen3VLVideoProcessor(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": 4096, "longest_edge": 25165824},
    )
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_qwen3_vl(out_dir: str | Path, profile: str = "tiny", seed: int = 0) -> Path:
    """Write config, safetensors weights, tokenizer, processor and chat template to out_dir."""
    from transformers import Qwen3VLForConditionalGeneration

    tokenizer = build_tokenizer()
    config = build_config(PROFILES[profile], tokenizer)
    out = _write_checkpoint(
        out_dir, Qwen3VLForConditionalGeneration, config, tokenizer, build_processor(tokenizer), seed
    )
    (out / "sglang_evs_profile.json").write_text(json.dumps({"profile": profile, "seed": seed}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="tiny")
    parser.add_argument("--arch", choices=["qwen3_vl", "qwen2_vl"], default="qwen3_vl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.arch == "qwen2_vl":
        path = build_tiny_qwen2_vl(args.out_dir, args.seed)
    else:
        path = build_tiny_qwen3_vl(args.out_dir, args.profile, args.seed)
    print(f"wrote {args.arch} ({args.profile}) to {path}")


if __name__ == "__main__":
    main()
