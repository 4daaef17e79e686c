"""Families the plugin changes nothing for at q = 0: Gemma 3 and LLaVA, which it does not prune, and Qwen3-Omni (the
thinker, with its audio tower), whose videos it prunes (`test_qwen3_omni.py`), serve bit-identically with and
without it.

Installed, the plugin leaves Gemma 3 and LLaVA to SGLang: its own classes and its own `general_mm_embed_routine`
(the registry-wide table is `test_registry.py`; these servers show it on live requests); Qwen3-Omni's thinker
is this project's, through its routine. Each family runs
the same requests on two servers started together (float32): plugin on, and plugin off
(`SGLANG_PLUGINS=none`: SGLang loads no plugin, so its own routine serves). Prefill chunks of 16 tokens
cut images' placeholder runs (16 pooled soft tokens for Gemma 3, 4 rows of 4 patches plus row ends for
LLaVA, 64 for Qwen3-Omni) and its videos and audio across chunks. Greedy tokens, the logprob of
every generated token and the top-5 logprobs at every step must be equal exactly (a batch's logprobs
closely: see the batch test). An event trace in both servers shows which routine embedded the media, and
that no process of the upstream one ran the plugin.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.requests import (
    AUDIO,
    GEMMA3_IMAGE,
    IMAGE,
    LLAVA_IMAGE,
    VIDEO,
    chat_prompt,
    flush_cache,
    gemma3_chat_prompt,
    generate,
    llava_chat_prompt,
    logprob_gap,
    media_kwargs,
)
from sglang_evs.testing.server import Launch, running_servers
from sglang_evs.testing.workload import side_by_side

pytestmark = pytest.mark.slow  # eight servers: the full suite only (see pyproject.toml)

CHUNK = 16
# Gemma 3's images need --enable-multimodal (without it SGLang 0.5.23 serves Gemma 3 as text and drops them);
# LLaVA is multimodal by default. LLaVA's /flush_cache answers 500 in SGLang 0.5.23 with or without the plugin
# (its processor wrapper lacks the preprocess cache the endpoint clears), so its servers are not flushed:
# both get the same requests in the same order, and the cached-token counts are compared too.


@dataclass(frozen=True)
class Family:
    fixture: str
    flags: tuple[str, ...]
    flushable: bool
    prompt: Callable[..., str]
    image: str  # its image placeholder
    other_media: tuple[str, ...] = ()  # cases beyond images: "video", "audio", "video_audio"


FAMILIES = {
    "gemma3": Family("tiny_gemma3_dir", ("--enable-multimodal",), True, gemma3_chat_prompt, GEMMA3_IMAGE),
    "llava": Family("tiny_llava_dir", (), False, llava_chat_prompt, LLAVA_IMAGE),
    "qwen3_omni": Family("tiny_qwen3_omni_dir", (), True, chat_prompt, IMAGE, ("video", "audio", "video_audio")),
}
IMAGE_ROWS = 16  # placeholder rows a 64-pixel image's embedding fills, at least (LLaVA's row ends are text)


def run_all(base_url: str, family: str, images: tuple[Path, Path, Path], media_dir: Path) -> dict:
    """The same requests, in the same order (from an empty radix cache where the server can flush it)."""
    flushable, prompt, image = FAMILIES[family].flushable, FAMILIES[family].prompt, FAMILIES[family].image
    image1, image2, image3 = images
    if flushable:
        flush_cache(base_url)  # the readiness probes may have sent the servers different warm-up requests
    results = {"text": generate(base_url, prompt(text="Count the objects in the scene."))[0]}
    results["image"] = generate(base_url, prompt(image), **media_kwargs(images=[image1]))[0]
    two = media_kwargs(images=[image2, image1])
    if family == "llava":
        two["modalities"] = ["multi-images"]  # SGLang's LLaVA path reads only the first image otherwise
    results["two_images"] = generate(base_url, prompt(image, image, text="Compare them."), **two)[0]
    results["radix_repeat"] = generate(base_url, prompt(image), **media_kwargs(images=[image1]))[0]
    if flushable:
        flush_cache(base_url)
    batch = [prompt(image), prompt(text="Say yes or no."), prompt(image)]  # a new image and a cached one
    results["batch"] = generate(base_url, batch, image_data=[[str(image3)], [], [str(image1)]])
    other = FAMILIES[family].other_media
    if other:
        results |= run_other_media(base_url, media_dir, other)
    return results


def run_other_media(base_url: str, media_dir: Path, cases: tuple[str, ...]) -> dict:
    """Video and audio requests (Qwen chat prompts), and a batch of them where the model hears."""
    video, noise, tone = media_dir / "moving.mp4", media_dir / "noise.mp4", media_dir / "tone.m4a"
    requests = {
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[video])),
        "audio": (chat_prompt(AUDIO), media_kwargs(audios=[tone])),
        "video_audio": (chat_prompt(VIDEO, AUDIO, text="What is heard?"), media_kwargs(videos=[noise], audios=[tone])),
    }
    results = {case: generate(base_url, requests[case][0], **requests[case][1])[0] for case in cases}
    if "audio" not in cases:
        return results
    flush_cache(base_url)
    batch = [chat_prompt(AUDIO), chat_prompt(text="Say yes or no."), chat_prompt(VIDEO, AUDIO)]
    results["media_batch"] = generate(
        base_url, batch, video_data=[[], [], [str(video)]], audio_data=[[str(tone)], [], [str(tone)]]
    )
    return results


@pytest.fixture(scope="module")
def served(request, media_dir, tmp_path_factory) -> dict:
    """{(family, plugin): results}, {("log" | "trace", family, plugin): server log | trace path}; the
    servers start together."""
    work = tmp_path_factory.mktemp("other_families")
    images = (media_dir / "image.png", media_dir / "image2.png", media.write_image(work / "image3.png", seed=9))
    launches, keys, out = [], [], {}
    for family, spec in FAMILIES.items():
        model = request.getfixturevalue(spec.fixture)
        args = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK), *spec.flags]
        for plugin in ("on", "off"):
            # Both servers are traced: a plugin loaded anywhere in the upstream server would write events.
            out["trace", family, plugin] = work / f"trace-{family}-{plugin}.jsonl"
            env = {"SGLANG_EVS_TRACE": str(out["trace", family, plugin])}
            env |= {} if plugin == "on" else {"SGLANG_PLUGINS": "none"}
            launches.append(Launch(model, work / f"{family}-{plugin}.log", args, env))
            keys.append((family, plugin))
    with running_servers(*launches) as servers:

        def serve(with_plugin: str) -> None:
            for (family, plugin), server in zip(keys, servers, strict=True):
                if plugin == with_plugin:
                    out[family, plugin] = run_all(server.base_url, family, images, media_dir)
                    out["log", family, plugin] = server.log()

        side_by_side(lambda: serve("on"), lambda: serve("off"))  # the plugin's servers beside upstream's
    return out


CASES = ["text", "image", "two_images", "radix_repeat"]


@pytest.mark.parametrize(
    ("family", "case"), [(family, case) for family, spec in FAMILIES.items() for case in CASES + [*spec.other_media]]
)
def test_bit_identical_without_the_plugin(served, family, case):
    ours, upstream = served[family, "on"][case], served[family, "off"][case]
    assert ours.output_ids == upstream.output_ids
    assert ours.logprobs == upstream.logprobs  # exactly
    assert ours.top_logprobs == upstream.top_logprobs
    assert (ours.prompt_tokens, ours.cached_tokens) == (upstream.prompt_tokens, upstream.cached_tokens)


@pytest.mark.parametrize(
    ("family", "batch"), [(family, "batch") for family in FAMILIES] + [("qwen3_omni", "media_batch")]
)
def test_batch_matches_without_the_plugin(served, family, batch):
    """A batch is not bit-reproducible on CPU even in upstream alone: which requests share a prefill depends
    on when each one's image finishes preprocessing, and a row's CPU GEMM result depends on the batch's row
    count (measured while writing this test: a LLaVA batch differed by 1.3e-6 between the two servers).
    Tokens and prompt lengths must match exactly, logprobs closely."""
    ours, upstream = served[family, "on"][batch], served[family, "off"][batch]
    assert len(ours) == len(upstream) == 3
    for mine, theirs in zip(ours, upstream, strict=True):
        assert mine.output_ids == theirs.output_ids
        assert mine.prompt_tokens == theirs.prompt_tokens
        assert logprob_gap(mine, theirs) < 1e-4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_routine_of_the_models_class_embedded_the_media(served, family):
    """The plugin was loaded in the server. For the families it does not serve its routine never ran:
    SGLang's own embedded every image. Qwen3-Omni's media went through this project's routine."""
    assert "plugin loaded" in served["log", family, "on"]
    path = served["trace", family, "on"]
    embedded = path.exists() and trace.read(path, "embed_routine")
    assert bool(embedded) == (family == "qwen3_omni")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_requests_exercise_pixels_and_the_radix_cache(served, family):
    results = served[family, "on"]
    image, two = results["image"], results["two_images"]
    other_pixels, same_pixels = results["batch"][0], results["batch"][2]  # one prompt, two images
    assert other_pixels.output_ids != same_pixels.output_ids
    assert two.prompt_tokens > image.prompt_tokens + IMAGE_ROWS
    assert results["radix_repeat"].cached_tokens >= image.prompt_tokens - 1  # the image's rows included
    assert results["radix_repeat"].output_ids == image.output_ids


def test_qwen3_omnis_requests_exercise_video_and_audio(served):
    """Video and audio reach the thinker: each changes the answer, and both together make the longest prompt."""
    results = served["qwen3_omni", "on"]
    text, video, audio, both = (results[case] for case in ("text", "video", "audio", "video_audio"))
    assert len({tuple(r.output_ids) for r in (text, video, audio, both)}) == 4
    assert both.prompt_tokens > max(video.prompt_tokens, audio.prompt_tokens) > text.prompt_tokens + CHUNK
    assert results["media_batch"][0].output_ids == audio.output_ids  # the same audio prompt, in a batch


@pytest.mark.parametrize("family", list(FAMILIES))
def test_plugin_loaded_in_one_server_only(served, family):
    assert "plugin loaded" in served["log", family, "on"]
    assert "plugin loaded" not in served["log", family, "off"]
    assert not served["trace", family, "off"].exists()  # no process of the upstream server ran the plugin
