"""An EAGLE3 draft for a tiny Qwen3-VL (`build_eagle3_draft`; CLI: `python -m sglang_evs.testing.tiny_model
OUT_DIR --eagle3-draft-for TARGET`).

A one-layer `LlamaForCausalLMEagle3`, as SGLang serves with `--speculative-algorithm EAGLE3
--speculative-draft-model-path`: the target's width and heads, its M-RoPE (so the draft reads the target's
positions), random weights (its drafts are rarely accepted; the target decides every token).
"""

import json
from pathlib import Path

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
