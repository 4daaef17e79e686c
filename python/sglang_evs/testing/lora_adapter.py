"""A LoRA adapter for a tiny Qwen-VL checkpoint's language model, written offline without peft
(`build_lora_adapter`; served with `--enable-lora --lora-paths NAME=DIR`).

The files are what peft saves for a Qwen-VL model: `adapter_config.json` (`peft_type` LORA, rank `r`,
`lora_alpha`, `target_modules`) and `adapter_model.safetensors` with one `lora_A` `[r, in]` and one `lora_B`
`[out, r]` per targeted projection of every decoder layer, named under
`base_model.model.model.language_model.layers.{i}` as transformers names the language model of its Qwen-VL
classes. Both factors are random (peft starts `lora_B` at zero, which would change nothing), scaled so the
adapter moves the tiny model's greedy tokens.
"""

import json
from pathlib import Path

LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def projection_shapes(text_config: dict) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each targeted projection of one decoder layer."""
    hidden, inter = text_config["hidden_size"], text_config["intermediate_size"]
    head_dim = text_config.get("head_dim") or hidden // text_config["num_attention_heads"]
    q_width = text_config["num_attention_heads"] * head_dim
    kv_width = text_config["num_key_value_heads"] * head_dim
    return {
        "q_proj": (q_width, hidden), "k_proj": (kv_width, hidden), "v_proj": (kv_width, hidden),
        "o_proj": (hidden, q_width), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }  # fmt: skip


def build_lora_adapter(out_dir: str | Path, base_dir: str | Path, rank: int = 4, seed: int = 0) -> Path:
    """Write a rank-`rank` LoRA adapter of every attention and MLP projection of the language model of the
    checkpoint at `base_dir` (its config.json's `text_config`) to `out_dir`; returns `out_dir`."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(base_dir) / "config.json").read_text())
    text = config.get("text_config", config)
    generator = torch.Generator().manual_seed(seed + 11)
    weights = {}
    for layer in range(text["num_hidden_layers"]):
        prefix = f"base_model.model.model.language_model.layers.{layer}"
        for name, (out_features, in_features) in projection_shapes(text).items():
            block = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            stem = f"{prefix}.{block}.{name}"
            weights[f"{stem}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) * in_features**-0.5
            weights[f"{stem}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * rank**-0.5
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base_dir),
        "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": list(LORA_TARGET_MODULES), "use_dora": False, "use_rslora": False,
    }  # fmt: skip
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    save_file({name: value.contiguous() for name, value in weights.items()}, out / ADAPTER_WEIGHTS,
              metadata={"format": "pt"})  # fmt: skip
    return out
