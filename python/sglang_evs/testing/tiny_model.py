"""Write a random-weight VLM checkpoint that HF transformers and SGLang both load, offline.

    python -m sglang_evs.testing.tiny_model OUT_DIR [--architecture ARCH] [--profile tiny|small]
        [--config-json '{"text_config": {"num_hidden_layers": 3}}'] [--seed 0]

Architectures (HF class names): Qwen3VLForConditionalGeneration (default), Qwen3VLMoeForConditionalGeneration,
Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration, Qwen3_5ForConditionalGeneration,
Qwen3_5MoeForConditionalGeneration. All share one tokenizer, so the special-token ids are the same.

GLM-4.1V and GLM-4.5V (Glm4vForConditionalGeneration, Glm4vMoeForConditionalGeneration; GLM-4.1V also
`small`): their own tokenizer (GLM's special tokens, trained on the same corpus), chat template and processor.
A video becomes one <|image|> run per temporal group of two frames, each followed by <|end_of_image|> and its
second, between <|begin_of_video|> and <|end_of_video|>; the text model rotates half of each head (M-RoPE
4/2/2 of 32). The MoE one routes layer 1 over 4 experts (2 per token) beside a shared one.

Two families the plugin does not prune, to show it changes nothing for them (image only, tiny only), each
with its own tokenizer (trained like the Qwen one, on the same corpus) and its family's special tokens:
  Gemma3ForConditionalGeneration  SigLIP tower, average-pooled to `mm_tokens_per_image` soft tokens per
      image between <start_of_image> and <end_of_image>; SGLang serves it with --enable-multimodal.
  LlavaForConditionalGeneration   a Pixtral tower under a Mistral language model, as the released
      pixtral-12b LLaVA checkpoint: one [IMG] per 16-pixel patch, [IMG_BREAK] after each row, [IMG_END]
      last. SGLang 0.5.23's LLaVA resolves its tower through its own model registry, which has Pixtral's
      but not CLIP's or SigLIP's vision model (a CLIP tower falls to the Transformers backend and fails).
Their prompts, as the chat templates write them: `requests.gemma3_chat_prompt`, `requests.llava_chat_prompt`.

Profiles:
  tiny   seconds on CPU; for correctness tests. Every architecture has one.
  small  Qwen3-VL, Qwen2.5-VL, Qwen3.5 and GLM-4.1V: a language model that dominates prefill time, for
         performance ratios such as EVS time-to-first-token, with the vision tower tiny. Qwen3-VL:
         Qwen3-VL-2B's language-model width (2048, 16 heads of 128, 8 KV heads, M-RoPE
         sections 24/20/20) with 8 of its 28 layers. Qwen2.5-VL: Qwen2.5-VL-3B's (2048, 16
         heads of 128, 2 KV heads, MLP 11008, M-RoPE 16/24/24) with 8 of its 36 layers.
         Qwen3.5: 8 hybrid layers at 2048 wide (3 Gated DeltaNet per full attention), see
         _qwen3_5_small_fields.
  balanced  Qwen3-VL: small's language model under a tower with Qwen3-VL-2B's vision:language cost.

--config-json overrides config fields: top-level keys, and dicts under "text_config" /
"vision_config" merged into those sub-configs (nested dicts such as rope_parameters merge too).
A key that neither the config class nor the profile knows is an error.

MTP head (Qwen3.5 / Qwen3.5-MoE): `"text_config": {"mtp_num_hidden_layers": 1}`, as the released configs
declare it, adds the multi-token-prediction layer SGLang's NEXTN drafts with (`mtp.*`, which transformers
loads past). A random draft would almost never be accepted, so the checkpoint is made for drafts that are:
the target's blocks write at MTP_BLOCK_SCALE of their usual size (the next token then depends mostly on
the current one, still on the whole context), and the MTP head computes that same function of the token
it is given.

EAGLE3 draft (`build_eagle3_draft`, `--eagle3-draft-for TARGET`): a one-layer `LlamaForCausalLMEagle3` for a
tiny Qwen3-VL, as SGLang serves with `--speculative-algorithm EAGLE3 --speculative-draft-model-path`: the
target's width and heads, its M-RoPE (so the draft reads the target's positions), random weights (its
drafts are rarely accepted; the target decides every token).

Deepstack levels (`vision_config.deepstack_visual_indexes`): Qwen3-VL's are built by transformers.
Qwen3.5's tiny models have none by default, as the released checkpoints; given levels (three: SGLang
0.5.23's Qwen3.5 language model adds exactly three), the builder adds the mergers SGLang's Qwen3.5
vision tower builds for them, which transformers' Qwen3.5 (having no deepstack) loads past and ignores.
"""

import argparse
import dataclasses
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    # small's language model under a tower whose cost per video token, relative to its language
    # model, is Qwen3-VL-2B's (bench/flops.py: 0.89 here, 0.93 there): 5 blocks of 2B's width.
    "balanced": Profile(2048, 8, 16, 8, 128, 6144, (24, 20, 20), 1024, 5, 16, 4096, (1, 2, 3)),
}


VISION_OUTPUT_GAIN = 20.0


@dataclass(frozen=True)
class Vocabulary:
    """A family's special tokens and chat template. `named`: tokens its processor reads by name from the
    tokenizer (e.g. `tokenizer.boi_token`)."""

    special_tokens: tuple[str, ...]
    chat_template: str
    eos: str
    pad: str
    bos: str | None = None
    named: Mapping[str, str] = dataclasses.field(default_factory=dict)


QWEN_VOCABULARY = Vocabulary(tuple(SPECIAL_TOKENS), CHAT_TEMPLATE, eos="<|im_end|>", pad="<|endoftext|>")

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


def build_tokenizer(vocab_size: int = 400, vocabulary: Vocabulary = QWEN_VOCABULARY):
    """A byte-level BPE trained on CORPUS, plus the family's special tokens and chat template."""
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
    named = {"model_specific_special_tokens": dict(vocabulary.named)} if vocabulary.named else {}
    bos = {"bos_token": vocabulary.bos} if vocabulary.bos else {}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=vocabulary.eos,
        pad_token=vocabulary.pad,
        additional_special_tokens=list(vocabulary.special_tokens),
        **bos,
        **named,
    )
    tokenizer.chat_template = vocabulary.chat_template
    return tokenizer


@dataclass(frozen=True)
class Fields:
    """Config fields of one architecture at one profile, before token ids and overrides."""

    text: dict[str, Any]
    vision: dict[str, Any]
    top: dict[str, Any] = dataclasses.field(default_factory=dict)


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


def _qwen3_vl_processor(tokenizer, config=None):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    # Pixel bounds as in the released Qwen3-VL preprocessor configs.
    patches = dict(patch_size=16, merge_size=2, temporal_patch_size=2)
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**patches, size={"shortest_edge": 65536, "longest_edge": 16777216}),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**patches, size={"shortest_edge": 4096, "longest_edge": 25165824}),
        chat_template=CHAT_TEMPLATE,
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


@dataclass(frozen=True)
class Architecture:
    config_class: str  # in transformers
    profiles: Mapping[str, Callable[[], Fields]]
    processor: Callable[[Any, Any], Any]  # (tokenizer, config) -> processor
    sglang_only_deepstack: bool = False  # SGLang builds deepstack mergers that transformers lacks
    vocabulary: Vocabulary = QWEN_VOCABULARY
    token_ids: Callable[[Any], "Fields"] = lambda tok: _token_id_fields(tok)  # tokenizer -> id fields
    check: Callable[[Any, "Architecture"], None] = lambda config, arch: _check_consistent(config, arch)
    vision_output: Callable[[Any], list] = lambda model: _qwen_merger_outputs(model)  # projections to rescale
    released_layout: Callable[[Path], None] | None = None  # rewrites model.safetensors as released
    mtp_head: bool = False  # the config may declare an MTP layer (text_config.mtp_num_hidden_layers)
    language_model_gains: Callable[[Any], None] | None = None  # after _make_context_matter's draws


def _qwen2_processor(processor_cls: str) -> Callable[[Any, Any], Any]:
    return lambda tok, _config: _qwen2_vl_processor(
        tok, "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor", processor_cls
    )


DEFAULT_ARCHITECTURE = "Qwen3VLForConditionalGeneration"
ARCHITECTURES: dict[str, Architecture] = {
    DEFAULT_ARCHITECTURE: Architecture(
        "Qwen3VLConfig", {name: (lambda p=p: _qwen3_vl_fields(p)) for name, p in PROFILES.items()}, _qwen3_vl_processor
    ),
    "Qwen3VLMoeForConditionalGeneration": Architecture(
        "Qwen3VLMoeConfig",
        {"tiny": _qwen3_vl_moe_fields},
        _qwen3_vl_processor,
        released_layout=lambda weights_file: _write_released_expert_layout(weights_file),
    ),
    "Qwen2_5_VLForConditionalGeneration": Architecture(
        "Qwen2_5_VLConfig",
        {"tiny": _qwen2_5_vl_fields, "small": _qwen2_5_vl_small_fields},
        _qwen2_processor("Qwen2_5_VLProcessor"),
    ),
    "Qwen2VLForConditionalGeneration": Architecture(
        "Qwen2VLConfig", {"tiny": _qwen2_vl_fields}, _qwen2_processor("Qwen2VLProcessor")
    ),
    "Qwen3_5ForConditionalGeneration": Architecture(
        "Qwen3_5Config",
        {"tiny": _qwen3_5_fields, "small": _qwen3_5_small_fields},
        _qwen3_vl_processor,
        sglang_only_deepstack=True,
        mtp_head=True,
    ),
    "Qwen3_5MoeForConditionalGeneration": Architecture(
        "Qwen3_5MoeConfig",
        {"tiny": _qwen3_5_moe_fields},
        _qwen3_vl_processor,
        sglang_only_deepstack=True,
        mtp_head=True,
    ),
    "Gemma3ForConditionalGeneration": Architecture(
        "Gemma3Config",
        {"tiny": _gemma3_fields},
        _gemma3_processor,
        vocabulary=GEMMA3_VOCABULARY,
        token_ids=lambda tok: _gemma3_token_id_fields(tok),
        check=lambda config, arch: _check_gemma3(config),
        vision_output=lambda model: [model.model.multi_modal_projector.mm_input_projection_weight],
        released_layout=lambda weights_file: _write_released_siglip_layout(weights_file),
        language_model_gains=lambda model: _gemma3_update_gains(model),
    ),
    "LlavaForConditionalGeneration": Architecture(
        "LlavaConfig",
        {"tiny": _llava_fields},
        _llava_processor,
        vocabulary=LLAVA_VOCABULARY,
        token_ids=lambda tok: _llava_token_id_fields(tok),
        check=lambda config, arch: None,
        vision_output=lambda model: [model.model.multi_modal_projector.linear_2.weight],
    ),
    "Glm4vForConditionalGeneration": Architecture(
        "Glm4vConfig",
        {"tiny": _glm4v_fields, "small": _glm4v_small_fields},
        _glm4v_processor,
        vocabulary=GLM4V_VOCABULARY,
        token_ids=lambda tok: _glm4v_token_id_fields(tok),
        vision_output=lambda model: [model.model.visual.merger.down_proj.weight],
    ),
    "Glm4vMoeForConditionalGeneration": Architecture(
        "Glm4vMoeConfig",
        {"tiny": _glm4v_moe_fields},
        _glm4v_processor,
        vocabulary=GLM4V_VOCABULARY,
        token_ids=lambda tok: _glm4v_token_id_fields(tok),
        vision_output=lambda model: [model.model.visual.merger.down_proj.weight],
    ),
}
QWEN_ARCHITECTURES = tuple(name for name, arch in ARCHITECTURES.items() if arch.vocabulary is QWEN_VOCABULARY)


def _token_id_fields(tokenizer) -> Fields:
    """The tokenizer's special ids (and vocabulary size) as Qwen-VL config fields."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = {
        "vocab_size": len(tokenizer),
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
    return Fields(text, {}, top)


def _text_ids(tokenizer, vocabulary: Vocabulary) -> dict[str, Any]:
    bos = {"bos_token_id": tokenizer.convert_tokens_to_ids(vocabulary.bos)} if vocabulary.bos else {}
    return {
        "vocab_size": len(tokenizer),
        **bos,
        "eos_token_id": tokenizer.convert_tokens_to_ids(vocabulary.eos),
        "pad_token_id": tokenizer.convert_tokens_to_ids(vocabulary.pad),
    }


def _gemma3_token_id_fields(tokenizer) -> Fields:
    ids = tokenizer.convert_tokens_to_ids
    top = {
        "boi_token_index": ids("<start_of_image>"),
        "eoi_token_index": ids("<end_of_image>"),
        "image_token_index": ids("<image_soft_token>"),
    }
    return Fields(_text_ids(tokenizer, GEMMA3_VOCABULARY), {}, top)


def _llava_token_id_fields(tokenizer) -> Fields:
    return Fields(
        _text_ids(tokenizer, LLAVA_VOCABULARY), {}, {"image_token_index": tokenizer.convert_tokens_to_ids("[IMG]")}
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
    return Fields(_text_ids(tokenizer, GLM4V_VOCABULARY), {}, top)


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _check_known(where: str, keys: Any, config_cls: type, ours: Mapping[str, Any]) -> None:
    if config_cls.__name__ == "AutoConfig":  # LLaVA's sub-configs: the class their model_type names
        from transformers import CONFIG_MAPPING

        config_cls = CONFIG_MAPPING[ours["model_type"]]
    known = {f.name for f in dataclasses.fields(config_cls)} | set(config_cls.attribute_map) | set(ours)
    unknown = sorted(set(keys) - known)
    if unknown:
        raise ValueError(f"unknown {where} keys {unknown} for {config_cls.__name__}")


def build_config(
    architecture: str, profile: str, tokenizer=None, config_overrides: Mapping[str, Any] | None = None
) -> Any:
    """The architecture's config at the profile, wired to the tokenizer, with the overrides merged in."""
    import transformers

    if not isinstance(config_overrides or {}, Mapping):
        raise ValueError(f"config overrides must be a JSON object, not {config_overrides!r}")

    arch = ARCHITECTURES[architecture]
    if profile not in arch.profiles:
        raise ValueError(f"{architecture} has profiles {sorted(arch.profiles)}, not {profile!r}")
    config_cls = getattr(transformers, arch.config_class)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer(vocabulary=arch.vocabulary)
    fields, ids = arch.profiles[profile](), arch.token_ids(tokenizer)
    text, vision, top = {**fields.text, **ids.text}, fields.vision, {**fields.top, **ids.top}

    overrides = dict(config_overrides or {})
    text_overrides, vision_overrides = overrides.pop("text_config", {}), overrides.pop("vision_config", {})
    if not isinstance(text_overrides, Mapping) or not isinstance(vision_overrides, Mapping):
        raise ValueError("text_config and vision_config overrides must be JSON objects")
    _check_known("top-level", overrides, config_cls, top)
    mtp_keys = dict.fromkeys(MTP_CONFIG_KEYS) if arch.mtp_head else {}
    _check_known("text_config", text_overrides, config_cls.sub_configs["text_config"], {**text, **mtp_keys})
    _check_known("vision_config", vision_overrides, config_cls.sub_configs["vision_config"], vision)
    text, vision, top = _merge(text, text_overrides), _merge(vision, vision_overrides), _merge(top, overrides)

    interval = text.pop("full_attention_interval", None)
    if interval is not None and "layer_types" in text_overrides:
        raise ValueError("set full_attention_interval, not layer_types: SGLang 0.5.23 derives the layers from it")
    config = config_cls(
        text_config=text if interval is None else {**text, "full_attention_interval": interval},
        vision_config=vision,
        **top,
    )
    if interval is not None:
        config.text_config.full_attention_interval = interval  # HF drops it; SGLang reads only it
    arch.check(config, arch)
    return config


def _check_consistent(config: Any, arch: Architecture) -> None:
    text, vision = config.text_config, config.vision_config
    rope = text.rope_parameters
    rotary_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    rotary_dim = int(rotary_dim * rope.get("partial_rotary_factor", 1.0))
    if 2 * sum(rope["mrope_section"]) != rotary_dim:
        raise ValueError(f"mrope_section {rope['mrope_section']} must sum to half the rotary dim {rotary_dim}")
    has_deepstack = "deepstack_visual_indexes" in {f.name for f in dataclasses.fields(type(vision))}
    levels = getattr(vision, "deepstack_visual_indexes", [])
    if not has_deepstack and levels and not arch.sglang_only_deepstack:
        raise ValueError(f"{type(vision).__name__} builds no deepstack mergers; keep deepstack_visual_indexes []")
    if levels and not all(0 <= level < vision.depth for level in levels):
        raise ValueError(f"deepstack_visual_indexes {levels} must be vision layers in [0, {vision.depth})")
    if levels and arch.sglang_only_deepstack and len(set(levels)) != 3:
        raise ValueError(f"SGLang 0.5.23's Qwen3.5 language model adds exactly three deepstack levels, not {levels}")
    if arch.mtp_head:
        _check_mtp(config)


def _check_mtp(config: Any) -> None:
    if mtp_layers(config) not in (0, 1):
        raise ValueError("SGLang 0.5.23's Qwen3.5 MTP draft has exactly one layer: mtp_num_hidden_layers 0 or 1")
    if getattr(config.text_config, "mtp_use_dedicated_embeddings", False):
        raise ValueError("SGLang 0.5.23's Qwen3.5 MTP draft shares the target's embeddings")


def mtp_layers(config: Any) -> int:
    """How many MTP layers the config declares (released Qwen3.5 configs: 1)."""
    return int(getattr(config.text_config, "mtp_num_hidden_layers", 0) or 0)


def _check_gemma3(config: Any) -> None:
    vision = config.vision_config
    patches, side = vision.image_size // vision.patch_size, round(config.mm_tokens_per_image**0.5)
    if side * side != config.mm_tokens_per_image or patches % side:
        raise ValueError(
            f"mm_tokens_per_image {config.mm_tokens_per_image} must be a square whose side divides the "
            f"{patches} patches per image side (image_size / patch_size): the tower average-pools to it"
        )


# Families built by a module of their own (`build(out_dir, config_overrides, seed)`), outside ARCHITECTURES.
FAMILY_MODULES = {
    "Qwen3OmniMoeForConditionalGeneration": "tiny_qwen3_omni",
    "NemotronH_Nano_VL_V2": "tiny_nemotron_vl",  # config and tokenizer only: served with --load-format dummy
    "Qwen4ExpForConditionalGeneration": "tiny_qwen4_exp",
}


def build_tiny_model(
    out_dir: str | Path,
    architecture: str = DEFAULT_ARCHITECTURE,
    profile: str = "tiny",
    config_overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> Path:
    """Write config, seeded random bf16 weights (rescaled, see _make_context_matter), tokenizer,
    processor and chat template to out_dir."""
    import torch
    import transformers

    if architecture in FAMILY_MODULES:  # a family in a module of its own
        family = importlib.import_module(f"sglang_evs.testing.{FAMILY_MODULES[architecture]}")
        return family.build(out_dir, config_overrides, seed)
    arch = ARCHITECTURES[architecture]
    tokenizer = build_tokenizer(vocabulary=arch.vocabulary)
    config = build_config(architecture, profile, tokenizer, config_overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).to(torch.bfloat16)
    _make_context_matter(model, torch, arch)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    if arch.sglang_only_deepstack and config.vision_config.deepstack_visual_indexes:
        _add_deepstack_mergers(out / "model.safetensors", config.vision_config, seed)
    if arch.released_layout is not None:
        arch.released_layout(out / "model.safetensors")
    if mtp_layers(config):
        _add_agreeing_mtp_head(out / "model.safetensors", config.text_config, seed)
    tokenizer.save_pretrained(out)
    arch.processor(tokenizer, config).save_pretrained(out)
    provenance: dict[str, Any] = {"profile": profile, "seed": seed}
    if architecture != DEFAULT_ARCHITECTURE or config_overrides:
        provenance |= {"architecture": architecture, "config_overrides": dict(config_overrides or {})}
    (out / "sglang_evs_profile.json").write_text(json.dumps(provenance))
    return out


def build_tiny_qwen3_vl(out_dir: str | Path, profile: str = "tiny", seed: int = 0) -> Path:
    """The default architecture; kept for the demo and the benchmark sweep."""
    return build_tiny_model(out_dir, profile=profile, seed=seed)


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


MTP_CONFIG_KEYS = ("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings")  # released text_config keys
MTP_BLOCK_SCALE = 0.3  # measured: tiny Qwen3.5 NEXTN accepts 1.6-1.8 of 3 verify tokens on average
BLOCK_OUTPUTS = ("o_proj.weight", "down_proj.weight", "out_proj.weight", "experts.down_proj")


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


EAGLE3_AUX_LAYERS = (0, 2, 4)  # the target layers whose outputs the draft reads (needs 6 layers or more)


def build_eagle3_draft(out_dir: str | Path, target_dir: str | Path, seed: int = 0) -> Path:
    """Write an EAGLE3 draft checkpoint (config and weights, released names: `midlayer.*`, `fc`, `norm`)
    for the Qwen3-VL at target_dir; embeddings and LM head are the target's (SGLang shares them)."""
    import torch
    from safetensors.torch import save_file

    text = json.loads((Path(target_dir) / "config.json").read_text())["text_config"]
    if text["num_hidden_layers"] <= max(EAGLE3_AUX_LAYERS):
        raise ValueError(f"an EAGLE3 draft reads target layers {EAGLE3_AUX_LAYERS}: the target needs more layers")
    hidden, heads, kv_heads, head_dim = (text[k] for k in ("hidden_size", "num_attention_heads",
                                                          "num_key_value_heads", "head_dim"))  # fmt: skip
    inter = 2 * hidden
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "num_hidden_layers": 1, "vocab_size": text["vocab_size"], "draft_vocab_size": None,
        "target_hidden_size": hidden, "hidden_act": "silu", "rms_norm_eps": text["rms_norm_eps"],
        "max_position_embeddings": text["max_position_embeddings"], "tie_word_embeddings": False,
        "rope_theta": text["rope_parameters"]["rope_theta"],
        "rope_scaling": {**text["rope_parameters"], "rope_type": "default"},  # with mrope_section: M-RoPE
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYERS)},
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    generator = torch.Generator().manual_seed(seed + 3)

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=generator) * in_features**-0.5

    weights = {
        "fc.weight": linear(hidden, hidden * len(EAGLE3_AUX_LAYERS)),
        "midlayer.self_attn.q_proj.weight": linear(heads * head_dim, 2 * hidden),  # [embedding | hidden] in
        "midlayer.self_attn.k_proj.weight": linear(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": linear(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": linear(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": linear(inter, hidden),
        "midlayer.mlp.up_proj.weight": linear(inter, hidden),
        "midlayer.mlp.down_proj.weight": linear(hidden, inter),
        **{f"midlayer.{norm}.weight": torch.ones(hidden)
           for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm")},
        "norm.weight": torch.ones(hidden),
    }  # fmt: skip
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({name: value.to(torch.bfloat16) for name, value in weights.items()}, out / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    return out


def _write_released_expert_layout(weights_file: Path) -> None:
    """Released Qwen3-VL-MoE checkpoints store the fused experts input-major (`gate_up_proj` [E, hidden,
    2 * inter], `down_proj` [E, inter, hidden]); transformers 5.19 saves its own [E, out, in] and
    transposes released ones on load, and SGLang's loader reads only the released layout."""
    from safetensors.torch import load_file, save_file

    weights = load_file(weights_file)
    for name, value in weights.items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            weights[name] = value.transpose(1, 2).contiguous()
    save_file(weights, weights_file, metadata={"format": "pt"})


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


def _qwen_merger_outputs(model) -> list:
    """The merger linears that write the text model's width (deepstack mergers included)."""
    import torch

    hidden = model.config.text_config.hidden_size
    return [
        module.weight
        for name, module in model.model.visual.named_modules()
        if "merger" in name and isinstance(module, torch.nn.Linear) and module.out_features == hidden
    ]


GEMMA3_UPDATE_GAIN = 4.0


def _gemma3_update_gains(model) -> None:
    """Gemma 3 normalises what each attention and MLP block writes (its post-block norms), so their
    gains, not the weights, set how much a layer writes: x4 here, so a layer's update outweighs the
    token's own (sqrt(hidden)-scaled) embedding and the tied head does not just repeat the last token."""
    for name, param in model.model.language_model.named_parameters():
        if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
            param.data.fill_(GEMMA3_UPDATE_GAIN - 1.0)  # Gemma's norms scale by (1 + weight)


def redraw_language_model(language_model, lm_head) -> None:
    """Every weight of a language model at unit scale (embeddings N(0, 1), N(0, 0.2) where the head is tied
    to them; the head N(0, 0.5); linear, expert and router weights N(0, fan_in^-1/2))."""
    import torch

    tied = lm_head.weight.data_ptr() == language_model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        language_model.embed_tokens.weight.normal_(0.0, 0.2 if tied else 1.0)
        if not tied:
            lm_head.weight.normal_(0.0, 0.5)
        for module in language_model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features**-0.5)
        for name, param in language_model.named_parameters():
            # MoE experts ([experts, out, in]) and routers ([experts, in]) are bare parameters.
            if name.endswith(("experts.gate_up_proj", "experts.down_proj", "mlp.gate.weight")):
                param.normal_(0.0, param.shape[-1] ** -0.5)


def _make_context_matter(model, torch, arch: Architecture) -> None:
    # HF's init (std 0.02) leaves every layer's update tiny next to the
    # residual stream, so the next token would depend on the last token only,
    # and vision features come out ~20x weaker than text embeddings. Rescale so
    # greedy tokens depend on the whole context, pixels included: otherwise a
    # parity test would pass even if an image were ignored.
    # Gemma 3 ties its output head to the embeddings (which it scales by sqrt(hidden)): one smaller draw
    # (SGLang 0.5.23's Gemma 3 never loads a separate head).
    redraw_language_model(model.model.language_model, model.lm_head)
    with torch.no_grad():
        for weight in arch.vision_output(model):
            if not weight.abs().max() > 0:  # Gemma 3 initialises its projection to zeros
                weight.normal_(0.0, 0.02)
            weight.mul_(VISION_OUTPUT_GAIN)
        if arch.language_model_gains is not None:
            arch.language_model_gains(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--architecture", choices=[*ARCHITECTURES, *FAMILY_MODULES], default=DEFAULT_ARCHITECTURE)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="tiny")
    parser.add_argument("--config-json", type=json.loads, default={}, help="config overrides, a JSON object")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eagle3-draft-for", metavar="TARGET", default=None,
                        help="write an EAGLE3 draft for the tiny Qwen3-VL at TARGET instead of a model")  # fmt: skip
    args = parser.parse_args()
    if args.eagle3_draft_for:
        print(f"wrote an EAGLE3 draft to {build_eagle3_draft(args.out_dir, args.eagle3_draft_for, args.seed)}")
        return
    path = build_tiny_model(args.out_dir, args.architecture, args.profile, args.config_json, args.seed)
    print(f"wrote {args.architecture} ({args.profile}) to {path}")


if __name__ == "__main__":
    main()
