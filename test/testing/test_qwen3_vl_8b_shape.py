"""The Qwen3-VL-8B-shaped config (no weights) loads in transformers at the 8B's dimensions and size."""

import pytest

from sglang_evs.testing import qwen3_vl_8b_shape


@pytest.fixture(scope="module")
def shape_dir(tmp_path_factory):
    return qwen3_vl_8b_shape.build(tmp_path_factory.mktemp("qwen3-vl-8b-shape"))


def test_config_loads_at_the_8b_dimensions(shape_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(shape_dir)
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        4096, 36, 32, 8,
    )  # fmt: skip
    assert (text.head_dim, text.intermediate_size, text.vocab_size) == (128, 12288, 151936)
    assert text.rope_parameters["rope_theta"] == 5e6 and text.rope_parameters["mrope_section"] == [24, 20, 20]
    assert text.rope_parameters["mrope_interleaved"] is True
    assert (vision.depth, vision.hidden_size, vision.intermediate_size, vision.num_heads) == (27, 1152, 4304, 16)
    assert (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size) == (16, 2, 2)
    assert vision.out_hidden_size == 4096 and list(vision.deepstack_visual_indexes) == [8, 16, 24]
    assert str(config.dtype).endswith("bfloat16") and config.architectures == [qwen3_vl_8b_shape.ARCHITECTURE]


def test_it_has_the_8b_parameter_count_and_no_weights(shape_dir):
    import torch
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    with torch.device("meta"):  # shapes only: nothing is allocated
        model = Qwen3VLForConditionalGeneration(AutoConfig.from_pretrained(shape_dir))
    parameters = sum(p.numel() for p in model.parameters())
    assert abs(parameters - qwen3_vl_8b_shape.PARAMETERS) < 0.01e9, parameters
    assert not list(shape_dir.glob("*.safetensors")) and not list(shape_dir.glob("*.bin"))


def test_tiny_tokenizer_ids_are_the_configs_media_tokens(shape_dir):
    from transformers import AutoConfig, AutoProcessor

    config, processor = AutoConfig.from_pretrained(shape_dir), AutoProcessor.from_pretrained(shape_dir)
    tokenizer = processor.tokenizer
    assert tokenizer.convert_tokens_to_ids("<|video_pad|>") == config.video_token_id
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
    assert len(tokenizer) <= config.text_config.vocab_size
    assert processor.video_processor.patch_size == 16 and processor.video_processor.merge_size == 2
