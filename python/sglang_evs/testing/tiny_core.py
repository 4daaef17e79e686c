"""The shared core of the tiny-checkpoint builders: what more than one family uses. `tiny_model.py` is the
entry (the registry of architectures and the CLI); each family is a module of its own beside this one and
imports only from here.

- Profiles (`Profile`, `PROFILES`): the sizes the `--profile` names stand for.
- The tokenizer (`build_tokenizer`): a byte-level BPE every family trains on the same CORPUS, with the
  family's `Vocabulary` (special tokens, chat template). Qwen's is the default: the Qwen-VL family, Qwen3-Omni
  (which extends it) and Qwen4-Exp share it, its config fields (`qwen_token_id_fields`) and Qwen3-VL's
  processor (`qwen3_vl_processor`).
- The shared build path, for a family that describes each architecture as an `Architecture`: its config
  fields at a profile (`Fields`) and token ids, the overrides merged in and checked (`build_config`), seeded
  random weights from transformers' model, rescaled so the greedy tokens depend on the whole context, pixels
  included (`make_context_matter`), then the family's own steps (weights SGLang reads beyond transformers'
  model, the released file layout), the tokenizer and the processor (`build`).
- Helpers the families' own builders use: `merge`, `redraw_language_model`, `VISION_OUTPUT_GAIN`,
  `write_released_expert_layout`.
"""

import dataclasses
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


def qwen_token_id_fields(tokenizer) -> Fields:
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


def text_ids(tokenizer, vocabulary: Vocabulary) -> dict[str, Any]:
    """A text config's vocabulary size and special ids, for a family with a vocabulary of its own."""
    bos = {"bos_token_id": tokenizer.convert_tokens_to_ids(vocabulary.bos)} if vocabulary.bos else {}
    return {
        "vocab_size": len(tokenizer),
        **bos,
        "eos_token_id": tokenizer.convert_tokens_to_ids(vocabulary.eos),
        "pad_token_id": tokenizer.convert_tokens_to_ids(vocabulary.pad),
    }


def qwen3_vl_processor(tokenizer, config=None):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    # Pixel bounds as in the released Qwen3-VL preprocessor configs.
    patches = dict(patch_size=16, merge_size=2, temporal_patch_size=2)
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**patches, size={"shortest_edge": 65536, "longest_edge": 16777216}),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**patches, size={"shortest_edge": 4096, "longest_edge": 25165824}),
        chat_template=CHAT_TEMPLATE,
    )


def profile_of(profiles: Mapping[str, Any], profile: str, architecture: str) -> Any:
    """A family's entry for `profile`, or an error naming the profiles the family has."""
    if profile not in profiles:
        raise ValueError(f"{architecture} has no {profile!r} profile (it has: {', '.join(profiles)})")
    return profiles[profile]


def merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
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


def check_consistent(config: Any, sglang_only_deepstack: bool = False) -> None:
    """M-RoPE sections that fill the rotary half of each head, and deepstack levels the tower builds.
    `sglang_only_deepstack`: the levels are SGLang's alone (transformers' vision config has none)."""
    text, vision = config.text_config, config.vision_config
    rope = text.rope_parameters
    rotary_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    rotary_dim = int(rotary_dim * rope.get("partial_rotary_factor", 1.0))
    if 2 * sum(rope["mrope_section"]) != rotary_dim:
        raise ValueError(f"mrope_section {rope['mrope_section']} must sum to half the rotary dim {rotary_dim}")
    has_deepstack = "deepstack_visual_indexes" in {f.name for f in dataclasses.fields(type(vision))}
    levels = getattr(vision, "deepstack_visual_indexes", [])
    if not has_deepstack and levels and not sglang_only_deepstack:
        raise ValueError(f"{type(vision).__name__} builds no deepstack mergers; keep deepstack_visual_indexes []")
    if levels and not all(0 <= level < vision.depth for level in levels):
        raise ValueError(f"deepstack_visual_indexes {levels} must be vision layers in [0, {vision.depth})")


@dataclass(frozen=True)
class Architecture:
    """One architecture a family builds through the shared path (`build`): its config class, the config
    fields of each profile, its processor, tokenizer and checks, and the steps of its own."""

    config_class: str  # in transformers
    profiles: Mapping[str, Callable[[], Fields]]
    processor: Callable[[Any, Any], Any]  # (tokenizer, config) -> processor
    vision_output: Callable[[Any], list]  # model -> the projections into the text width, to rescale
    vocabulary: Vocabulary = QWEN_VOCABULARY
    token_ids: Callable[[Any], Fields] = qwen_token_id_fields  # tokenizer -> id fields
    check: Callable[[Any], None] = check_consistent  # config -> None; raises ValueError naming the problem
    extra_text_keys: tuple[str, ...] = ()  # text_config keys the config class lacks but SGLang reads
    # (model.safetensors, config, seed): adds weights SGLang reads that transformers' model lacks
    extra_weights: Callable[[Path, Any, int], None] | None = None
    released_layout: Callable[[Path], None] | None = None  # rewrites model.safetensors as released
    language_model_gains: Callable[[Any], None] | None = None  # after make_context_matter's draws


def build_config(
    architecture: str,
    arch: Architecture,
    profile: str,
    tokenizer=None,
    config_overrides: Mapping[str, Any] | None = None,
) -> Any:
    """The architecture's config at the profile, wired to the tokenizer, with the overrides merged in."""
    import transformers

    if not isinstance(config_overrides or {}, Mapping):
        raise ValueError(f"config overrides must be a JSON object, not {config_overrides!r}")

    if profile not in arch.profiles:
        raise ValueError(f"{architecture} has profiles {sorted(arch.profiles)}, not {profile!r}")
    config_cls = getattr(transformers, arch.config_class)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer(vocabulary=arch.vocabulary)
    fields, ids = profile_of(arch.profiles, profile, architecture)(), arch.token_ids(tokenizer)
    text, vision, top = {**fields.text, **ids.text}, fields.vision, {**fields.top, **ids.top}

    overrides = dict(config_overrides or {})
    text_overrides, vision_overrides = overrides.pop("text_config", {}), overrides.pop("vision_config", {})
    if not isinstance(text_overrides, Mapping) or not isinstance(vision_overrides, Mapping):
        raise ValueError("text_config and vision_config overrides must be JSON objects")
    _check_known("top-level", overrides, config_cls, top)
    extra_keys = dict.fromkeys(arch.extra_text_keys)
    _check_known("text_config", text_overrides, config_cls.sub_configs["text_config"], {**text, **extra_keys})
    _check_known("vision_config", vision_overrides, config_cls.sub_configs["vision_config"], vision)
    text, vision, top = merge(text, text_overrides), merge(vision, vision_overrides), merge(top, overrides)

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
    arch.check(config)
    return config


def build(
    out_dir: str | Path,
    architecture: str,
    arch: Architecture,
    profile: str,
    config_overrides: Mapping[str, Any] | None,
    seed: int,
) -> Path:
    """Write config, seeded random bf16 weights (rescaled, see make_context_matter), tokenizer, processor
    and chat template to out_dir."""
    import torch
    import transformers

    tokenizer = build_tokenizer(vocabulary=arch.vocabulary)
    config = build_config(architecture, arch, profile, tokenizer, config_overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).to(torch.bfloat16)
    make_context_matter(model, arch)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    if arch.extra_weights is not None:
        arch.extra_weights(out / "model.safetensors", config, seed)
    if arch.released_layout is not None:
        arch.released_layout(out / "model.safetensors")
    tokenizer.save_pretrained(out)
    arch.processor(tokenizer, config).save_pretrained(out)
    return out


def write_released_expert_layout(weights_file: Path) -> None:
    """Released Qwen3-VL-MoE checkpoints store the fused experts input-major (`gate_up_proj` [E, hidden,
    2 * inter], `down_proj` [E, inter, hidden]); transformers 5.19 saves its own [E, out, in] and
    transposes released ones on load, and SGLang's loader reads only the released layout."""
    from safetensors.torch import load_file, save_file

    weights = load_file(weights_file)
    for name, value in weights.items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            weights[name] = value.transpose(1, 2).contiguous()
    save_file(weights, weights_file, metadata={"format": "pt"})


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


def make_context_matter(model, arch: Architecture) -> None:
    # HF's init (std 0.02) leaves every layer's update tiny next to the
    # residual stream, so the next token would depend on the last token only,
    # and vision features come out ~20x weaker than text embeddings. Rescale so
    # greedy tokens depend on the whole context, pixels included: otherwise a
    # parity test would pass even if an image were ignored.
    # Gemma 3 ties its output head to the embeddings (which it scales by sqrt(hidden)): one smaller draw
    # (SGLang 0.5.23's Gemma 3 never loads a separate head).
    import torch

    redraw_language_model(model.model.language_model, model.lm_head)
    with torch.no_grad():
        for weight in arch.vision_output(model):
            if not weight.abs().max() > 0:  # Gemma 3 initialises its projection to zeros
                weight.normal_(0.0, 0.02)
            weight.mul_(VISION_OUTPUT_GAIN)
        if arch.language_model_gains is not None:
            arch.language_model_gains(model)
