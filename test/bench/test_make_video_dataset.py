"""make_video_dataset: JSONL that SGLang's own openai-dataset loader accepts, decodable clips, static share."""

import json
from pathlib import Path

import av
import numpy as np
import pytest

from sglang_evs.bench.make_video_dataset import clip_kinds, make_video_dataset, parse_size


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("videos")
    return make_video_dataset(out, num=5, static_share=0.4, seconds=2, size=(48, 80), fps=4, max_tokens=6)


def decode(path: Path) -> np.ndarray:
    """uint8 [T, H, W, 3]."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_clip_kinds_rounds_the_static_share():
    kinds = clip_kinds(10, 0.25, "noise", seed=3)
    assert sorted(kinds) == ["noise"] * 7 + ["static"] * 3  # 2.5 rounds up
    assert clip_kinds(4, 0.0, "moving", 0) == ["moving"] * 4
    with pytest.raises(ValueError):
        clip_kinds(4, 1.5, "moving", 0)


def test_parse_size():
    assert parse_size("48x80") == (48, 80)


def test_lines_are_chat_requests_with_absolute_file_urls(dataset):
    lines = [json.loads(line) for line in dataset.read_text().splitlines()]
    assert len(lines) == 5
    for line in lines:
        video, text = line["messages"][0]["content"]
        url = video["video_url"]["url"]
        assert video["type"] == "video_url" and url.startswith("file:///") and Path(url[7:]).is_file()
        assert text["type"] == "text" and text["text"]
        assert line["max_tokens"] == 6
        assert line["stream_options"] == {"include_usage": True}


def test_sglang_openai_loader_accepts_the_dataset(dataset, tiny_model_dir):
    from sglang.benchmark.datasets.openai_dataset import sample_openai_requests
    from transformers import AutoTokenizer

    rows = sample_openai_requests(str(dataset), 3, AutoTokenizer.from_pretrained(tiny_model_dir))
    assert len(rows) == 3
    assert rows[0].output_len == 6
    assert rows[0].prompt[0]["content"][0]["type"] == "video_url"
    assert rows[0].extra_request_body == {"stream_options": {"include_usage": True}}


def test_clips_decode_and_static_share_is_honored(dataset):
    clips = json.loads((dataset.parent / "clips.json").read_text())
    assert [c["kind"] for c in clips].count("static") == 2
    for clip in clips:
        frames = decode(dataset.parent / clip["file"])
        assert frames.shape == (8, 48, 80, 3)
        change = np.abs(frames[1:].astype(int) - frames[:-1].astype(int)).max()
        assert (change <= 8) if clip["kind"] == "static" else (change > 100), (clip, change)


def test_warmup_clip_has_the_shape_of_the_clips_and_is_in_no_request(dataset):
    warmup = dataset.parent / "warmup.mp4"
    assert decode(warmup).shape == decode(dataset.parent / "clip_000.mp4").shape == (8, 48, 80, 3)
    assert "warmup.mp4" not in dataset.read_text()
    clips = {c["file"] for c in json.loads((dataset.parent / "clips.json").read_text())}
    assert not any(np.array_equal(decode(warmup), decode(dataset.parent / f)) for f in clips)


def test_with_sound_each_request_carries_a_tone_as_long_as_its_clip(tmp_path):
    """For models that hear (Qwen3-Omni): an audio part after the video, a tone per clip, its own pitch."""
    from sglang.srt.utils.common import load_audio

    from sglang_evs.testing.media import SOUND_RATE

    dataset = make_video_dataset(tmp_path, num=2, seconds=2, max_tokens=4, with_sound=True)
    lines = [json.loads(line) for line in dataset.read_text().splitlines()]
    sounds = []
    for line in lines:
        kinds = [part["type"] for part in line["messages"][0]["content"]]
        assert kinds == ["video_url", "audio_url", "text"]
        sounds.append(load_audio(line["messages"][0]["content"][1]["audio_url"]["url"].removeprefix("file://")))
    assert all(abs(len(sound) - 2 * SOUND_RATE) < 0.2 * SOUND_RATE for sound in sounds)  # AAC pads a frame or two
    assert not np.allclose(sounds[0][: len(sounds[1])], sounds[1][: len(sounds[0])], atol=1e-2)
