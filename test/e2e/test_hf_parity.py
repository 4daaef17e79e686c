"""Oracle: float32 greedy tokens from SGLang equal HF transformers' Qwen3-VL generate().

Both sides get the same prompt and the same frames: the video is sampled and
resized by SGLang's own `preprocess_video` and handed to the HF processor the
way SGLang hands it over (metadata, no resampling); the model is HF's.
"""

import asyncio
from functools import cache

import pytest
import requests
import torch

NEW_TOKENS = 16


@cache
def hf_model_and_processor(model_dir: str):
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(model_dir)


def prompt_for(processor, kind: str) -> str:
    messages = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "Describe this."}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True)


def sglang_greedy(server, prompt: str, **media) -> tuple[list[int], int]:
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
        **media,
    }
    out = requests.post(f"{server.base_url}/generate", json=body, timeout=120).json()
    return out["output_ids"], out["meta_info"]["prompt_tokens"]


def hf_greedy(model, inputs) -> list[int]:
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("image_name", ["image.png", "image2.png"])
def test_image_tokens_equal_hf(tiny_server, tiny_model_dir, media_dir, image_name):
    from PIL import Image

    model, processor = hf_model_and_processor(str(tiny_model_dir))
    prompt = prompt_for(processor, "image")
    inputs = processor(text=[prompt], images=[Image.open(media_dir / image_name)], return_tensors="pt")
    expected = hf_greedy(model, inputs)
    tokens, prompt_len = sglang_greedy(tiny_server, prompt, image_data=str(media_dir / image_name))
    assert prompt_len == inputs["input_ids"].shape[1]
    assert tokens == expected


@pytest.mark.parametrize("clip", ["moving.mp4", "noise.mp4"])
def test_video_tokens_equal_hf(tiny_server, tiny_model_dir, media_dir, clip):
    from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
    from sglang.srt.utils.common import load_video

    model, processor = hf_model_and_processor(str(tiny_model_dir))
    prompt = prompt_for(processor, "video")
    frames, metadata = asyncio.run(preprocess_video(load_video(str(media_dir / clip), use_gpu=False)))
    inputs = processor(
        text=[prompt],
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        return_tensors="pt",
    )
    inputs.pop("video_metadata", None)
    expected = hf_greedy(model, inputs)
    tokens, prompt_len = sglang_greedy(tiny_server, prompt, video_data=str(media_dir / clip))
    assert prompt_len == inputs["input_ids"].shape[1]
    assert tokens == expected


def test_outputs_depend_on_the_pixels(tiny_server, tiny_model_dir, media_dir):
    """Guards the oracle tests above: the tiny model must not ignore its visual input."""
    _, processor = hf_model_and_processor(str(tiny_model_dir))
    image_prompt, video_prompt = prompt_for(processor, "image"), prompt_for(processor, "video")
    a, _ = sglang_greedy(tiny_server, image_prompt, image_data=str(media_dir / "image.png"))
    b, _ = sglang_greedy(tiny_server, image_prompt, image_data=str(media_dir / "image2.png"))
    c, _ = sglang_greedy(tiny_server, video_prompt, video_data=str(media_dir / "moving.mp4"))
    d, _ = sglang_greedy(tiny_server, video_prompt, video_data=str(media_dir / "noise.mp4"))
    assert a != b and c != d
