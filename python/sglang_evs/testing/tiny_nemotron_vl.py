"""A tiny Nemotron-Nano-VL checkpoint (`NemotronH_Nano_VL_V2`, the model SGLang 0.5.23 prunes with its own EVS):
config, tokenizer and chat template, no weights (serve it with `--load-format dummy`).

transformers has no Nemotron-Nano-VL to draw weights with, so SGLang's dummy loader draws them (seeded, the
same in every server). On the CPU route its Mamba2 layers run on pure-torch stand-ins (`runtime/mamba2.py`).

The config is the smallest SGLang's `NemotronH_Nano_VL_V2_Config` takes: a NemotronH language model with
one Mamba2 (`M`), one attention (`*`) and MLP (`-`) layers, and a RADIO tower of timm's smallest ViT name
(RADIO accepts only timm names). `n_groups` is written beside `mamba_n_groups` because SGLang's
`NemotronHConfig.mamba2_cache_params` reads it; the tokenizer has an unk token because the processor
asserts one.
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_evs.testing.tiny_core import Vocabulary, build_tokenizer, profile_of

ARCHITECTURE = "NemotronH_Nano_VL_V2"

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}<image>"
    "{%- elif part['type'] == 'video' or 'video' in part or 'video_url' in part -%}<video>"
    "{%- elif 'text' in part -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
VOCABULARY = Vocabulary(
    ("<|im_start|>", "<|im_end|>", "<image>", "<video>", "<img>", "</img>", "<unk>"),
    CHAT_TEMPLATE,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    bos="<s>",
)
PROFILES = {"tiny": None}  # its one profile


def build(
    out_dir: str | Path, config_overrides: Mapping[str, Any] | None = None, seed: int = 0, profile: str = "tiny"
) -> Path:
    """Write config.json (top-level `config_overrides` applied), generation_config.json and the tokenizer;
    bfloat16, since SGLang's RADIO path casts pixels to bfloat16 and the tower would not take float32
    weights. No weights are written, so `seed` draws nothing: SGLang's dummy loader seeds its own. `tiny` is
    its one profile."""
    profile_of(PROFILES, profile, ARCHITECTURE)
    tokenizer = build_tokenizer(vocabulary=VOCABULARY)
    tokenizer.add_special_tokens({"unk_token": "<unk>"})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    special = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    language_model = dict(
        model_type="nemotron_h", architectures=["NemotronHForCausalLM"], vocab_size=512, hidden_size=64,
        intermediate_size=128, hybrid_override_pattern="M*-M-", num_attention_heads=4, head_dim=16,
        num_key_value_heads=2, mlp_hidden_act="relu2", ssm_state_size=16, mamba_num_heads=4, mamba_n_groups=1,
        n_groups=1, mamba_head_dim=16, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=64,
        max_position_embeddings=4096, torch_dtype="bfloat16", tie_word_embeddings=False, **special,
    )  # fmt: skip
    vision = dict(
        args={"model": "vit_small_patch16_224", "register_multiple": 8}, preferred_resolution=[64, 64],
        image_size=64, patch_size=16, max_img_size=2048,
    )  # fmt: skip
    config = dict(
        architectures=[ARCHITECTURE], model_type=ARCHITECTURE, torch_dtype="bfloat16", force_image_size=64,
        patch_size=16, downsample_ratio=0.5, ps_version="v2", image_tag_type="internvl", projector_hidden_size=64,
        vit_hidden_size=384, video_pruning_rate=0.0, use_thumbnail=True,
        norm_mean=[0.48145466, 0.4578275, 0.40821073], norm_std=[0.26862954, 0.26130258, 0.27577711],
        vision_config=vision, llm_config=language_model, **dict(config_overrides or {}),
    )  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(special))
    return out
