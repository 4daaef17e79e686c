"""GLM-4.1V and GLM-4.5V's tiny checkpoints (Glm4vForConditionalGeneration, Glm4vMoeForConditionalGeneration;
GLM-4.1V also `small`), built by the shared path (`tiny_core.build`).

Their own tokenizer (GLM's special tokens, trained on the same corpus as the Qwen one), chat template and
processor. A video becomes one <|image|> run per temporal group of two frames, each followed by
<|end_of_image|> and its second, between <|begin_of_video|> and <|end_of_video|>; the text model rotates
half of each head (M-RoPE 4/2/2 of 32). The MoE one routes layer 1 over 4 experts (2 per token) beside a
shared one.
"""

from sglang_evs.testing.tiny_core import Architecture, Fields, Vocabulary, text_ids

# GLM-4.1V's turn format: `[gMASK]<sop>`, then `<|role|>` lines; an image is
# <|begin_of_image|><|image|><|end_of_image|>, a video <|begin_of_video|><|video|><|end_of_video|>, which the
# processor expands (a video into one image-token run per temporal group, each followed by its second).
GLM4V_CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>{{ '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif part['type'] == 'video' or 'video' in part or 'video_url' in part -%}"
    "<|begin_of_video|><|video|><|end_of_video|>"
    "{%- elif 'text' in part -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{{ '\\n' }}{%- endif -%}"
)
GLM4V_VOCABULARY = Vocabulary(
    (
        "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_image|>", "<|end_of_image|>",
        "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>",
    ),
    GLM4V_CHAT_TEMPLATE,
    eos="<|user|>",
    pad="<|endoftext|>",
)  # fmt: skip


def _glm4v_fields() -> Fields:
    # As released: rotary on half of each head (SGLang's GLM layer assumes 0.5; HF reads it here), so the
    # M-RoPE sections sum to head_dim / 4; the tower's merger writes the text width.
    return Fields(
        text=dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_parameters=dict(
                rope_type="default", rope_theta=10_000.0, partial_rotary_factor=0.5, mrope_section=[4, 2, 2]
            ),
        ),
        vision=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=4,
            image_size=112,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=128,
        ),
    )


def _glm4v_small_fields() -> Fields:
    """Eight layers of a 2048-wide GLM-4 language model (16 heads of 128, 2 KV heads, MLP 6144, M-RoPE 8/12/12
    on half of each head, as released) over the tiny tower: the language-model-bound case, like Qwen3-VL's
    `small`, for GLM-4.1V's pruning benchmark."""
    tiny = _glm4v_fields()
    text = dict(
        tiny.text, hidden_size=2048, intermediate_size=6144, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=2, rope_parameters=dict(tiny.text["rope_parameters"], mrope_section=[8, 12, 12]),
    )  # fmt: skip
    return Fields(text=text, vision=dict(tiny.vision, out_hidden_size=2048))


def _glm4v_moe_fields() -> Fields:
    # Layer 0 dense, layer 1 routed (4 experts, 2 per token) with one shared expert, as released in shape.
    fields = _glm4v_fields()
    moe = dict(
        moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True, attention_bias=True,
    )  # fmt: skip
    return Fields({**fields.text, **moe}, fields.vision)


def _glm4v_processor(tokenizer, config):
    from transformers import Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

    patches = dict(patch_size=14, merge_size=2, temporal_patch_size=2)
    return Glm4vProcessor(
        image_processor=Glm4vImageProcessor(**patches),
        tokenizer=tokenizer,
        video_processor=Glm4vVideoProcessor(**patches),
        chat_template=GLM4V_CHAT_TEMPLATE,
    )


def _glm4v_token_id_fields(tokenizer) -> Fields:
    ids = tokenizer.convert_tokens_to_ids
    top = {
        "image_token_id": ids("<|image|>"),
        "video_token_id": ids("<|video|>"),
        "image_start_token_id": ids("<|begin_of_image|>"),
        "image_end_token_id": ids("<|end_of_image|>"),
        "video_start_token_id": ids("<|begin_of_video|>"),
        "video_end_token_id": ids("<|end_of_video|>"),
        "tie_word_embeddings": False,
    }
    return Fields(text_ids(tokenizer, GLM4V_VOCABULARY), {}, top)


def _merger_output(model) -> list:
    """The tower merger's projection into the text width."""
    return [model.model.visual.merger.down_proj.weight]


ARCHITECTURES: dict[str, Architecture] = {
    "Glm4vForConditionalGeneration": Architecture(
        "Glm4vConfig",
        {"tiny": _glm4v_fields, "small": _glm4v_small_fields},
        _glm4v_processor,
        _merger_output,
        vocabulary=GLM4V_VOCABULARY,
        token_ids=_glm4v_token_id_fields,
    ),
    "Glm4vMoeForConditionalGeneration": Architecture(
        "Glm4vMoeConfig",
        {"tiny": _glm4v_moe_fields},
        _glm4v_processor,
        _merger_output,
        vocabulary=GLM4V_VOCABULARY,
        token_ids=_glm4v_token_id_fields,
    ),
}
