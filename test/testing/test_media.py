"""Synthetic clips decode to the frames they promise: static, small moving object, fresh noise."""

import av
import numpy as np
import pytest

from sglang_evs.testing import media


def decode(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]).astype(np.int16)


@pytest.mark.parametrize("kind", media.CLIP_KINDS)
def test_clip_is_h264_with_all_frames(tmp_path, kind):
    path = media.write_clip(tmp_path / f"{kind}.mp4", kind, num_frames=10, height=48, width=64, fps=5)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert (stream.width, stream.height) == (64, 48)
    assert decode(path).shape == (10, 48, 64, 3)


def test_redundancy_is_as_described(tmp_path):
    static = decode(media.write_clip(tmp_path / "s.mp4", "static", num_frames=6))
    moving = decode(media.write_clip(tmp_path / "m.mp4", "moving", num_frames=6, object_size=12))
    noise = decode(media.write_clip(tmp_path / "n.mp4", "noise", num_frames=6))

    def changed_fraction(frames):
        return (np.abs(np.diff(frames, axis=0)).max(axis=-1) > 40).mean(axis=(1, 2))

    assert changed_fraction(static).max() < 0.01
    assert 0.02 < changed_fraction(moving).min() and changed_fraction(moving).max() < 0.2
    assert changed_fraction(noise).min() > 0.5


def test_image_png(tmp_path):
    from PIL import Image

    path = media.write_image(tmp_path / "x.png", height=40, width=56, seed=3)
    assert Image.open(path).size == (56, 40)
    other = media.write_image(tmp_path / "y.png", height=40, width=56, seed=4)
    assert np.asarray(Image.open(path)).tolist() != np.asarray(Image.open(other)).tolist()


def test_tone_decodes_through_sglangs_audio_loader(tmp_path):
    """The .m4a tone is read by SGLang's own loader (PyAV; no torchaudio on the CPU route) at 16 kHz, whole."""
    from sglang.srt.utils.common import load_audio

    samples = load_audio(str(media.write_tone(tmp_path / "tone.m4a", seconds=2.0)))
    assert samples.ndim == 1 and abs(len(samples) - 32000) < 2048  # AAC pads a frame or two
    assert 0.3 < np.abs(samples).max() < 0.7  # the swell peaks at 0.6
