"""A tiny Gemma 3 checkpoint (`Gemma3ForConditionalGeneration`), built by the shared path (`tiny_core.build`).

A family the plugin does not prune, to show it changes nothing for it (image only, tiny only), with its own
tokenizer (trained like the Qwen one, on the same corpus) and Gemma's special tokens: a SigLIP tower,
average-pooled to `mm_tokens_per_image` soft tokens per image between <start_of_image> and <end_of_image>;
SGLang serves it with --enable-multimodal. Its prompts, as the chat template writes them:
`requests.gemma3_chat_prompt`.
"""

from pathlib import Path
from typing import Any

from sglang_evs.testing.tiny_core import Architecture, Fields, Vocabulary, text_ids

# Gemma 3's turn format. The newlines are written as expressions so that whitespace control keeps them.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}{{ '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}<start_of_image>"
    "{%- elif 'text' in part -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "<end_of_turn>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<start_of_turn>model{{ '\\n' }}{%- endif -%}"
)
GEMMA3_VOCABULARY = Vocabulary(
    ("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"),
    GEMMA3_CHAT_TEMPLATE,
    eos="<end_of_turn>",
    pad="<pad>",
    bos="<bos>",
    named={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
)


def _gemma3_fields() -> Fields:
    # A 64-pixel image is 8 x 8 patches of 8, pooled 2 x 2 into 16 soft tokens. Layer 0 slides (window 512,
    # longer than any test prompt), layer 1 attends globally, each with its own rotary base, as released.
    return Fields(
        text=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=512,
            sliding_window_pattern=2,  # every second layer global, at any depth
            max_position_embeddings=32768,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        ),
        vision=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=64,
            patch_size=8,
            vision_use_head=False,
        ),
        top=dict(mm_tokens_per_image=16),
    )


def _gemma3_processor(tokenizer, config):
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    side = config.vision_config.image_size
    return Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": side, "width": side}),
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=config.mm_tokens_per_image,
    )


def _gemma3_token_id_fields(tokenizer) -> Fields:
    ids = tokenizer.convert_tokens_to_ids
    top = {
        "boi_token_index": ids("<start_of_image>"),
        "eoi_token_index": ids("<end_of_image>"),
        "image_token_index": ids("<image_soft_token>"),
    }
    return Fields(text_ids(tokenizer, GEMMA3_VOCABULARY), {}, top)


def _check_gemma3(config: Any) -> None:
    vision = config.vision_config
    patches, side = vision.image_size // vision.patch_size, round(config.mm_tokens_per_image**0.5)
    if side * side != config.mm_tokens_per_image or patches % side:
        raise ValueError(
            f"mm_tokens_per_image {config.mm_tokens_per_image} must be a square whose side divides the "
            f"{patches} patches per image side (image_size / patch_size): the tower average-pools to it"
        )


GEMMA3_UPDATE_GAIN = 4.0


def _gemma3_update_gains(model) -> None:
    """Gemma 3 normalises what each attention and MLP block writes (its post-block norms), so their
    gains, not the weights, set how much a layer writes: x4 here, so a layer's update outweighs the
    token's own (sqrt(hidden)-scaled) embedding and the tied head does not just repeat the last token."""
    for name, param in model.model.language_model.named_parameters():
        if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
            param.data.fill_(GEMMA3_UPDATE_GAIN - 1.0)  # Gemma's norms scale by (1 + weight)


def _write_released_siglip_layout(weights_file: Path) -> None:
    """Released Gemma 3 checkpoints keep the SigLIP tower under `vision_tower.vision_model.`; transformers
    5.19 saves it without `vision_model.` (and loads either), SGLang 0.5.23 loads only the released names."""
    from safetensors.torch import load_file, save_file

    prefix = "vision_tower."
    weights = {
        (prefix + "vision_model." + name[len(prefix) :] if name.startswith(prefix) else name): value
        for name, value in load_file(weights_file).items()
    }
    save_file(weights, weights_file, metadata={"format": "pt"})


ARCHITECTURES: dict[str, Architecture] = {
    "Gemma3ForConditionalGeneration": Architecture(
        "Gemma3Config",
        {"tiny": _gemma3_fields},
        _gemma3_processor,
        vision_output=lambda model: [model.model.multi_modal_projector.mm_input_projection_weight],
        vocabulary=GEMMA3_VOCABULARY,
        token_ids=_gemma3_token_id_fields,
        check=_check_gemma3,
        released_layout=_write_released_siglip_layout,
        language_model_gains=_gemma3_update_gains,
    ),
}
