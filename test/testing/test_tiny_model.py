"""The offline tiny checkpoints load and run in HF transformers, and the builder's options land in them."""

import json
import sys

import numpy as np
import pytest
import torch

from sglang_evs.testing import tiny_core, tiny_model
from sglang_evs.testing.requests import (
    AUDIO,
    GEMMA3_IMAGE,
    GLM4V_IMAGE,
    GLM4V_VIDEO,
    IMAGE,
    LLAVA_IMAGE,
    VIDEO,
    chat_prompt,
    gemma3_chat_prompt,
    glm4v_chat_prompt,
    llava_chat_prompt,
)

FIXTURES = {
    "Qwen3VLForConditionalGeneration": "tiny_model_dir",
    "Qwen3VLMoeForConditionalGeneration": "tiny_qwen3_vl_moe_dir",
    "Qwen2_5_VLForConditionalGeneration": "tiny_qwen2_5_vl_dir",
    "Qwen2VLForConditionalGeneration": "tiny_qwen2_vl_dir",
    "Qwen3_5ForConditionalGeneration": "tiny_qwen3_5_dir",
    "Qwen3_5MoeForConditionalGeneration": "tiny_qwen3_5_moe_dir",
}
# Families the plugin does not prune (image only): fixture, prompt writer, image placeholder.
OTHER_FAMILIES = {
    "Gemma3ForConditionalGeneration": ("tiny_gemma3_dir", gemma3_chat_prompt, GEMMA3_IMAGE),
    "LlavaForConditionalGeneration": ("tiny_llava_dir", llava_chat_prompt, LLAVA_IMAGE),
}
# GLM-4.1V and GLM-4.5V: their own processor, tokenizer and video layout (pruned through the same mechanism).
GLM_FIXTURES = {
    "Glm4vForConditionalGeneration": "tiny_glm4v_dir",
    "Glm4vMoeForConditionalGeneration": "tiny_glm4v_moe_dir",
}
# Far above float32 rounding (~1e-5 on logits of size ~10): the pixels reach the output.
PIXEL_EFFECT = 0.1


def test_every_architecture_has_a_fixture():
    assert set(FIXTURES) | set(OTHER_FAMILIES) | set(GLM_FIXTURES) == {
        architecture
        for architecture, builder in tiny_model.BUILDERS.items()
        if isinstance(builder, tiny_model.SharedPathBuilder)
    }
    assert set(FIXTURES) == set(tiny_model.QWEN_ARCHITECTURES)


@pytest.fixture(params=list(FIXTURES))
def checkpoint(request):
    return request.param, request.getfixturevalue(FIXTURES[request.param])


def test_config_tokenizer_and_chat_template_agree(checkpoint):
    from transformers import AutoConfig, AutoProcessor

    architecture, path = checkpoint
    config = AutoConfig.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    tok = processor.tokenizer
    assert config.architectures == [architecture]
    assert tok.convert_tokens_to_ids("<|video_pad|>") == config.video_token_id
    assert tok.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
    assert tok.convert_tokens_to_ids("<|vision_start|>") == config.vision_start_token_id
    assert tok.convert_tokens_to_ids("<|vision_end|>") == config.vision_end_token_id
    assert config.text_config.vocab_size == len(tok)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "video"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert text.count("<|vision_start|><|video_pad|><|vision_end|>") == 2


def _image(seed: int):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 96, 3), dtype=np.uint8))


def _clip(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (8, 64, 64, 3), dtype=np.uint8)


def test_image_and_video_forwards_depend_on_the_pixels(checkpoint):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    architecture, path = checkpoint
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(path)
    assert type(model).__name__ == architecture

    def last_logits(**media) -> torch.Tensor:
        kind = IMAGE if "images" in media else VIDEO
        inputs = processor(text=[chat_prompt(kind)], return_tensors="pt", **media)
        if architecture == "Qwen2_5_VLForConditionalGeneration" and "videos" in media:
            assert inputs["second_per_grid_ts"].numel() == 1  # drives the temporal positions
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
        assert torch.isfinite(logits).all()
        return logits

    assert (last_logits(images=[_image(0)]) - last_logits(images=[_image(1)])).abs().max() > PIXEL_EFFECT
    assert (last_logits(videos=[_clip(0)]) - last_logits(videos=[_clip(1)])).abs().max() > PIXEL_EFFECT


@pytest.mark.parametrize("architecture", list(GLM_FIXTURES))
def test_glm4v_loads_in_transformers_and_lays_videos_out_per_group(architecture, request):
    """The chat template writes the prompt the tests send; every weight loads; a video becomes one image-token
    run per temporal group, each followed by its timestamp, between the video markers; pixels reach the output."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
    from transformers.video_utils import VideoMetadata

    path = request.getfixturevalue(GLM_FIXTURES[architecture])
    config, processor = AutoConfig.from_pretrained(path), AutoProcessor.from_pretrained(path)
    tok = processor.tokenizer
    assert config.architectures == [architecture]
    assert config.text_config.vocab_size == len(tok)
    assert tok.convert_tokens_to_ids("<|image|>") == config.image_token_id
    assert tok.convert_tokens_to_ids("<|begin_of_video|>") == config.video_start_token_id
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "image"}, {"type": "text", "text": "hi"}]}]
    prompt = glm4v_chat_prompt(GLM4V_VIDEO, GLM4V_IMAGE, text="hi")
    assert processor.apply_chat_template(messages, add_generation_prompt=True) == prompt

    model, loading = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    model.eval()
    assert type(model).__name__ == architecture
    assert not any(loading.values()), loading

    def last_logits(seed: int) -> torch.Tensor:
        clip = np.random.default_rng(seed).integers(0, 256, (8, 112, 112, 3), dtype=np.uint8)
        metadata = VideoMetadata(total_num_frames=8, fps=2.0, duration=4.0, frames_indices=list(range(8)))
        inputs = processor(text=[glm4v_chat_prompt(GLM4V_VIDEO)], videos=[clip], video_metadata=[metadata],
                           do_sample_frames=False, return_tensors="pt")  # fmt: skip
        text = tok.decode(inputs["input_ids"][0])
        for second in range(4):  # 8 frames at 2 fps: 4 groups of 2 frames, 16 tokens each
            assert f"<|begin_of_image|>{'<|image|>' * 16}<|end_of_image|>{second}" in text
        assert (inputs["input_ids"] == config.image_token_id).sum() == 64
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
        assert torch.isfinite(logits).all()
        return logits

    assert (last_logits(0) - last_logits(1)).abs().max() > PIXEL_EFFECT


@pytest.mark.parametrize("architecture", list(GLM_FIXTURES))
def test_glm4v_config_overrides_land_in_the_checkpoint_and_bad_ones_fail(architecture, tmp_path, monkeypatch):
    overrides = {"text_config": {"num_hidden_layers": 3}, "vision_config": {"depth": 1}}
    argv = [str(tmp_path), "--architecture", architecture, "--config-json", json.dumps(overrides)]
    monkeypatch.setattr(sys, "argv", ["tiny_model", *argv])
    tiny_model.main()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["text_config"]["num_hidden_layers"] == 3 and saved["vision_config"]["depth"] == 1
    bad_sections = {"text_config": {"rope_parameters": {"mrope_section": [8, 4, 4]}}}  # 32, not the 16 rotated
    with pytest.raises(ValueError, match="mrope_section"):
        tiny_model.build_config(architecture, "tiny", config_overrides=bad_sections)


@pytest.fixture(params=list(OTHER_FAMILIES))
def other_family(request):
    fixture, prompt, image = OTHER_FAMILIES[request.param]
    return request.param, request.getfixturevalue(fixture), prompt, image


def test_other_family_loads_in_transformers_and_its_pixels_matter(other_family):
    """Gemma 3 and LLaVA: the chat template writes the prompt the tests send, the processor expands each image
    into the config's placeholder tokens, every weight loads, and the logits depend on the pixels."""
    from PIL import Image
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    architecture, path, prompt, image_token = other_family
    config = AutoConfig.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    assert config.architectures == [architecture]
    assert config.text_config.vocab_size == len(processor.tokenizer)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "hi"}]}]
    assert processor.apply_chat_template(messages, add_generation_prompt=True) == prompt(
        image_token, image_token, text="hi"
    )

    model, loading = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    model.eval()
    assert type(model).__name__ == architecture
    assert not any(loading.values()), loading  # no missing, unexpected or mismatched weights

    def last_logits(seed: int) -> torch.Tensor:
        image = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8))
        inputs = processor(text=[prompt(image_token)], images=[image], return_tensors="pt")
        assert (inputs["input_ids"] == config.image_token_id).sum() == 16  # 4 x 4 patches or pooled tokens
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
        assert torch.isfinite(logits).all()
        return logits

    assert (last_logits(0) - last_logits(1)).abs().max() > PIXEL_EFFECT


@pytest.mark.parametrize("architecture", list(OTHER_FAMILIES))
def test_other_family_config_overrides_land_in_the_checkpoint(architecture, tmp_path, monkeypatch):
    overrides = {"text_config": {"num_hidden_layers": 3}, "vision_config": {"num_hidden_layers": 1}}
    argv = [str(tmp_path), "--architecture", architecture, "--config-json", json.dumps(overrides)]
    monkeypatch.setattr(sys, "argv", ["tiny_model", *argv])
    tiny_model.main()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["text_config"]["num_hidden_layers"] == 3 and saved["vision_config"]["num_hidden_layers"] == 1


@pytest.mark.parametrize(
    ("architecture", "overrides", "message"),
    [
        ("Gemma3ForConditionalGeneration", {"mm_tokens_per_image": 9}, "mm_tokens_per_image"),
        ("Gemma3ForConditionalGeneration", {"vision_config": {"depth": 3}}, "depth"),
        ("LlavaForConditionalGeneration", {"text_config": {"num_hidden_layer": 3}}, "num_hidden_layer"),
    ],
)
def test_other_family_bad_overrides_fail_naming_the_problem(architecture, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_model.build_config(architecture, "tiny", config_overrides=overrides)


@pytest.mark.parametrize("architecture", list(FIXTURES))
def test_cli_config_overrides_land_in_the_checkpoint(architecture, tmp_path, monkeypatch):
    from transformers import AutoModelForImageTextToText

    base = tiny_model.build_config(architecture, "tiny", tiny_model.build_tokenizer())
    layers, depth = base.text_config.num_hidden_layers + 1, base.vision_config.depth + 1
    overrides = {"text_config": {"num_hidden_layers": layers}, "vision_config": {"depth": depth}}
    if hasattr(base.vision_config, "deepstack_visual_indexes"):
        overrides["vision_config"]["deepstack_visual_indexes"] = []
    argv = [str(tmp_path), "--architecture", architecture, "--config-json", json.dumps(overrides), "--seed", "3"]
    monkeypatch.setattr(sys, "argv", ["tiny_model", *argv])
    tiny_model.main()

    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["text_config"]["num_hidden_layers"] == layers
    assert saved["vision_config"]["depth"] == depth
    assert saved["vision_config"].get("deepstack_visual_indexes", []) == []
    assert json.loads((tmp_path / "sglang_evs_profile.json").read_text())["config_overrides"] == overrides
    model = AutoModelForImageTextToText.from_pretrained(tmp_path)
    assert len(model.model.language_model.layers) == layers
    assert len(model.model.visual.blocks) == depth


@pytest.mark.parametrize(
    ("architecture", "overrides", "message"),
    [
        ("Qwen3VLForConditionalGeneration", {"text_config": {"num_hidden_layer": 3}}, "num_hidden_layer"),
        ("Qwen2_5_VLForConditionalGeneration", {"vision_config": {"window": 64}}, "window"),
        ("Qwen3VLForConditionalGeneration", {"image_token": 5}, "image_token"),
        ("Qwen3VLForConditionalGeneration", {"text_config": {"head_dim": 32}}, "mrope_section"),
        ("Qwen3_5ForConditionalGeneration", {"vision_config": {"deepstack_visual_indexes": [0]}}, "deepstack"),
        ("Qwen3_5ForConditionalGeneration", {"text_config": {"layer_types": ["full_attention"] * 4}}, "interval"),
        ("Qwen2VLForConditionalGeneration", {"text_config": 3}, "JSON objects"),
        ("Qwen2VLForConditionalGeneration", [1, 2], "JSON object"),
    ],
)
def test_bad_overrides_fail_naming_the_problem(architecture, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_model.build_config(architecture, "tiny", tiny_model.build_tokenizer(), overrides)


def test_profiles_an_architecture_lacks_are_refused():
    with pytest.raises(ValueError, match="small"):
        tiny_model.build_config("Qwen2VLForConditionalGeneration", "small", tiny_model.build_tokenizer())
    with pytest.raises(ValueError, match="balanced"):
        tiny_model.build_config("Qwen3_5ForConditionalGeneration", "balanced", tiny_model.build_tokenizer())


def test_qwen3_5_small_profile_is_hybrid_and_language_model_bound():
    config = tiny_model.build_config("Qwen3_5ForConditionalGeneration", "small", tiny_model.build_tokenizer())
    text, vision = config.text_config, config.vision_config
    assert text.full_attention_interval == 4 and text.num_hidden_layers == 8
    assert text.layer_types.count("linear_attention") == 6
    assert (
        2 * sum(text.rope_parameters["mrope_section"]) == text.head_dim * text.rope_parameters["partial_rotary_factor"]
    )
    assert vision.out_hidden_size == text.hidden_size and vision.deepstack_visual_indexes == []
    mlp = 3 * text.hidden_size * text.intermediate_size
    assert text.num_hidden_layers * mlp > 100 * vision.depth * 12 * vision.hidden_size**2


def test_qwen3_5_is_hybrid_as_sglang_reads_it(tiny_qwen3_5_dir, tiny_qwen3_5_moe_dir):
    for path in (tiny_qwen3_5_dir, tiny_qwen3_5_moe_dir):
        text = json.loads((path / "config.json").read_text())["text_config"]
        interval = text["full_attention_interval"]  # SGLang 0.5.23 ignores layer_types
        expected = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(text["num_hidden_layers"])
        ]
        assert text["layer_types"] == expected and set(expected) == {"full_attention", "linear_attention"}
        rotary_dim = text["head_dim"] * text["rope_parameters"]["partial_rotary_factor"]
        assert 2 * sum(text["rope_parameters"]["mrope_section"]) == rotary_dim


@pytest.mark.parametrize("fixture", ["tiny_qwen3_5_mtp_dir", "tiny_qwen3_5_moe_mtp_dir"])
def test_mtp_head_is_written_as_released_and_transformers_loads_past_it(fixture, request):
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    path = request.getfixturevalue(fixture)
    text = json.loads((path / "config.json").read_text())["text_config"]
    assert text["mtp_num_hidden_layers"] == 1 and text["mtp_use_dedicated_embeddings"] is False
    with safe_open(path / "model.safetensors", "pt") as weights:
        shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}  # noqa: SIM118
    hidden = text["hidden_size"]
    assert shapes["mtp.fc.weight"] == (hidden, 2 * hidden)
    for norm in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        assert shapes[norm] == (hidden,)
    last_full = max(i for i, kind in enumerate(text["layer_types"]) if kind == "full_attention")
    target = f"model.language_model.layers.{last_full}."
    layer = {name[len(target) :]: shape for name, shape in shapes.items() if name.startswith(target)}
    draft = {name[len("mtp.layers.0.") :]: shape for name, shape in shapes.items() if name.startswith("mtp.layers.0.")}
    assert draft == layer and "self_attn.q_proj.weight" in draft
    model = AutoModelForImageTextToText.from_pretrained(path)
    assert not [name for name, _ in model.named_parameters() if "mtp" in name]


@pytest.mark.parametrize(
    ("architecture", "overrides", "message"),
    [
        ("Qwen3_5ForConditionalGeneration", {"text_config": {"mtp_num_hidden_layers": 2}}, "exactly one layer"),
        ("Qwen3_5MoeForConditionalGeneration", {"text_config": {"mtp_use_dedicated_embeddings": True}}, "shares"),
        ("Qwen3VLForConditionalGeneration", {"text_config": {"mtp_num_hidden_layers": 1}}, "mtp_num_hidden_layers"),
    ],
)
def test_mtp_heads_sglang_cannot_build_are_refused(architecture, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_model.build_config(architecture, "tiny", tiny_model.build_tokenizer(), overrides)


def test_build_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    a = load_file(tiny_model.build_tiny_qwen3_vl(tmp_path / "a") / "model.safetensors")
    b = load_file(tiny_model.build_tiny_qwen3_vl(tmp_path / "b") / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_small_profile_language_model_dominates():
    def params(p: tiny_core.Profile) -> tuple[int, int]:
        per_layer = 4 * p.text_hidden * p.head_dim * p.text_heads + 3 * p.text_hidden * p.text_intermediate
        vision_layer = 4 * p.vision_hidden**2 + 2 * p.vision_hidden * p.vision_intermediate
        return p.text_layers * per_layer, p.vision_depth * vision_layer

    text, vision = params(tiny_core.PROFILES["small"])
    assert text > 100 * vision


def test_qwen3_omni_loads_in_transformers_and_its_media_matter(tiny_qwen3_omni_dir, media_dir):
    """Qwen3-Omni (its own builder module): token ids agree with the config, the chat template writes the
    placeholders the tests send, transformers reads back every weight of the released layout (experts one by
    one under `thinker.`), and the thinker's logits depend on the pixels and on the sound."""
    from sglang.srt.utils.common import load_audio
    from transformers import AutoConfig, AutoProcessor, Qwen3OmniMoeForConditionalGeneration

    path = tiny_qwen3_omni_dir
    config, processor = AutoConfig.from_pretrained(path), AutoProcessor.from_pretrained(path)
    thinker_config, tok = config.thinker_config, processor.tokenizer
    for token, field in (("<|image_pad|>", "image_token_id"), ("<|video_pad|>", "video_token_id"),
                         ("<|audio_pad|>", "audio_token_id"), ("<|audio_start|>", "audio_start_token_id")):  # fmt: skip
        assert tok.convert_tokens_to_ids(token) == getattr(thinker_config, field)
    assert thinker_config.text_config.vocab_size == len(tok)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "audio"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert VIDEO in text and AUDIO in text

    model, loading = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, output_loading_info=True
    )
    assert not any(loading.values()), loading
    thinker = model.thinker.eval()

    def last_logits(prompt: str, **media) -> torch.Tensor:
        inputs = processor(text=[prompt], return_tensors="pt", **media)
        with torch.no_grad():
            logits = thinker(**inputs).logits[0, -1]
        assert torch.isfinite(logits).all()
        return logits

    image = last_logits(chat_prompt(IMAGE), images=[_image(0)]) - last_logits(chat_prompt(IMAGE), images=[_image(1)])
    tone = load_audio(str(media_dir / "tone.m4a"))
    noise = np.random.default_rng(0).uniform(-0.3, 0.3, tone.shape).astype(np.float32)
    sound = last_logits(chat_prompt(AUDIO), audio=[tone]) - last_logits(chat_prompt(AUDIO), audio=[noise])
    assert image.abs().max() > PIXEL_EFFECT and sound.abs().max() > PIXEL_EFFECT
