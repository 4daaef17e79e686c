"""A tiny LLaVA checkpoint (`LlavaForConditionalGeneration`), built by the shared path (`tiny_core.build`).

A family the plugin does not prune, to show it changes nothing for it (image only, tiny only), with its own
tokenizer (trained like the Qwen one, on the same corpus) and its family's special tokens: a Pixtral tower
under a Mistral language model, as the released pixtral-12b LLaVA checkpoint: one [IMG] per 16-pixel patch,
[IMG_BREAK] after each row, [IMG_END] last. SGLang 0.5.23's LLaVA resolves its tower through its own model
registry, which has Pixtral's but not CLIP's or SigLIP's vision model (a CLIP tower falls to the Transformers
backend and fails). Its prompts, as the chat template writes them: `requests.llava_chat_prompt`.
"""

from sglang_evs.testing.tiny_core import Architecture, Fields, Vocabulary, text_ids

# Pixtral's [INST] format: one [IMG] per image, which the processor expands into rows of patches.
LLAVA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}[INST]"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}[IMG]"
    "{%- elif 'text' in part -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "[/INST]"
    "{%- else -%}{{ message['content'] }}{{ eos_token }}{%- endif -%}"
    "{%- endfor -%}"
)
LLAVA_VOCABULARY = Vocabulary(
    ("[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"), LLAVA_CHAT_TEMPLATE, eos="</s>", pad="<pad>", bos="<s>"
)


def _llava_fields() -> Fields:
    # pixtral-12b's shape: the tower's last layer, every patch ("full"), through a GELU projector.
    return Fields(
        text=dict(
            model_type="mistral",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=32768,
            sliding_window=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        ),
        vision=dict(
            model_type="pixtral",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=64,  # the longest edge the processor resizes to
            patch_size=16,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        ),
        top=dict(vision_feature_layer=-1, vision_feature_select_strategy="full", projector_hidden_act="gelu"),
    )


def _llava_processor(tokenizer, config):
    from transformers import PixtralImageProcessor, PixtralProcessor

    vision = config.vision_config
    return PixtralProcessor(
        image_processor=PixtralImageProcessor(
            size={"longest_edge": vision.image_size},
            patch_size={"height": vision.patch_size, "width": vision.patch_size},
        ),
        tokenizer=tokenizer,
        patch_size=vision.patch_size,
        chat_template=LLAVA_CHAT_TEMPLATE,
    )


def _llava_token_id_fields(tokenizer) -> Fields:
    return Fields(
        text_ids(tokenizer, LLAVA_VOCABULARY), {}, {"image_token_index": tokenizer.convert_tokens_to_ids("[IMG]")}
    )


ARCHITECTURES: dict[str, Architecture] = {
    "LlavaForConditionalGeneration": Architecture(
        "LlavaConfig",
        {"tiny": _llava_fields},
        _llava_processor,
        vision_output=lambda model: [model.model.multi_modal_projector.linear_2.weight],
        vocabulary=LLAVA_VOCABULARY,
        token_ids=_llava_token_id_fields,
        check=lambda config: None,
    ),
}
