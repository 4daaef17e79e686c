"""The offline tiny Qwen3-VL loads in HF transformers, and the profiles have the intended shape."""

import torch

from sglang_evs.testing import tiny_model


def test_checkpoint_loads_in_transformers(tiny_model_dir):
    from transformers import AutoConfig, AutoProcessor

    config = AutoConfig.from_pretrained(tiny_model_dir)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    tok = processor.tokenizer
    assert config.model_type == "qwen3_vl"
    assert tok.convert_tokens_to_ids("<|video_pad|>") == config.video_token_id
    assert tok.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
    assert tok.convert_tokens_to_ids("<|vision_start|>") == config.vision_start_token_id
    assert config.text_config.vocab_size == len(tok)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert "<|vision_start|><|video_pad|><|vision_end|>" in text


def test_build_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    a = load_file(tiny_model.build_tiny_qwen3_vl(tmp_path / "a") / "model.safetensors")
    b = load_file(tiny_model.build_tiny_qwen3_vl(tmp_path / "b") / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_small_profile_language_model_dominates():
    def params(p: tiny_model.Profile) -> tuple[int, int]:
        per_layer = 4 * p.text_hidden * p.head_dim * p.text_heads + 3 * p.text_hidden * p.text_intermediate
        vision_layer = 4 * p.vision_hidden**2 + 2 * p.vision_hidden * p.vision_intermediate
        return p.text_layers * per_layer, p.vision_depth * vision_layer

    text, vision = params(tiny_model.PROFILES["small"])
    assert text > 100 * vision
