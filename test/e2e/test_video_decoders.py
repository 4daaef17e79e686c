"""SGLang's own video decoder on x86, torchcodec over FFmpeg (what a GPU user's server decodes with: SGLang picks it
wherever it imports), beside decord2, which the rest of the suite's servers decode with: the suite's clips give the
same frames, and a pruned video served through each is the same request, to the bit.

torchcodec is installed apart, under `.venv/torchcodec` (scripts/setup_env.sh, with Debian's FFmpeg libraries), and
put on the path of this module's torchcodec server only. Where it cannot load (no FFmpeg), the module is skipped,
naming why."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_evs.testing import media
from sglang_evs.testing.requests import VIDEO, chat_prompt, generate, media_kwargs, per_request_rate
from sglang_evs.testing.server import Launch, running_servers

TORCHCODEC = Path(sys.prefix) / "torchcodec"  # scripts/setup_env.sh installs it there, off the default path
WITH_TORCHCODEC = {"PYTHONPATH": os.pathsep.join(filter(None, [str(TORCHCODEC), os.environ.get("PYTHONPATH")]))}


def decoder_in(env: dict[str, str]) -> subprocess.CompletedProcess:
    """Which decoder SGLang picks in an interpreter with `env`'s additions (its `video_decoder._BACKEND`)."""
    probe = "from sglang.srt.utils import video_decoder; print(video_decoder._BACKEND)"
    return subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def torchcodec_missing() -> str | None:
    """Why torchcodec cannot decode here, or None."""
    if not TORCHCODEC.is_dir():
        return f"torchcodec is not installed under {TORCHCODEC} (scripts/setup_env.sh installs it)"
    probe = [sys.executable, "-c", "from torchcodec.decoders import VideoDecoder"]
    loads = subprocess.run(probe, env={**os.environ, **WITH_TORCHCODEC}, capture_output=True, text=True, timeout=300)
    return None if loads.returncode == 0 else f"torchcodec does not load here: {loads.stderr.strip()[-300:]}"


MISSING = torchcodec_missing()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("decoder_clips")
    kinds = media.CLIP_KINDS
    return {kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=3) for kind in kinds}


def test_each_server_decodes_with_the_decoder_it_is_given():
    assert decoder_in(WITH_TORCHCODEC).stdout.strip() == "torchcodec"
    assert decoder_in({}).stdout.strip() == "decord"


def test_the_suites_clips_decode_to_the_same_frames_through_both(clips, monkeypatch):
    """SGLang's `VideoDecoderWrapper`, the same clip through each backend: every frame equal, the same count and fps."""
    monkeypatch.syspath_prepend(str(TORCHCODEC))
    from sglang.srt.utils import video_decoder
    from torchcodec.decoders import VideoDecoder

    # SGLang binds torchcodec's decoder at its module's first import, which in this process may have come before
    # torchcodec was on the path: bind it here, whatever the order the suite ran in.
    monkeypatch.setattr(video_decoder, "VideoDecoder", VideoDecoder, raising=False)
    for kind, clip in clips.items():
        decoded = {}
        for backend in ("torchcodec", "decord"):
            monkeypatch.setattr(video_decoder, "_BACKEND", backend)
            reader = video_decoder.VideoDecoderWrapper(str(clip))
            decoded[backend] = reader.get_frames_as_tensor(list(range(len(reader)))), float(reader.avg_fps)
        (frames, fps), (decord_frames, decord_fps) = decoded["torchcodec"], decoded["decord"]
        assert frames.shape[0] == 16 and torch.equal(frames, decord_frames) and fps == decord_fps, kind


def test_a_pruned_video_served_through_torchcodec_is_the_one_served_through_decord(tiny_model_dir, clips, tmp_path):
    """The same requests at q = 0 and q = .5 to a server decoding with each: the same prompt and kept tokens, and the
    same tokens and logprobs, bit for bit."""
    launches = [
        Launch(tiny_model_dir, tmp_path / "torchcodec.log", ["--dtype", "float32"], WITH_TORCHCODEC),
        Launch(tiny_model_dir, tmp_path / "decord.log", ["--dtype", "float32"]),
    ]
    with running_servers(*launches) as servers:
        for rate in (0.0, 0.5):
            kwargs = {**media_kwargs(videos=[clips["moving"]]), **per_request_rate(rate)}
            replies = [generate(server.base_url, chat_prompt(VIDEO), **kwargs)[0] for server in servers]
            through_torchcodec, through_decord = replies
            assert through_torchcodec == through_decord, rate  # tokens, logprobs, prompt and cached tokens
            if rate:
                counts = [(r.meta["video_tokens_before_pruning"], r.meta["video_tokens_after_pruning"])
                          for r in (through_torchcodec, through_decord)]  # fmt: skip
                assert counts[0] == counts[1] and counts[0][1] < counts[0][0], counts
