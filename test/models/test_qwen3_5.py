"""Qwen3.5 and Qwen3.5-MoE served by this project's classes on the CPU route (float32).

The language model is hybrid (Gated DeltaNet layers with per-request recurrent state, and full
attention), served with SGLang's hybrid cache, chunked prefill and its radix cache. Servers are
few and run one at a time: the module fixture runs every request first and the tests assert on
what came back.

Per architecture: an upstream server (`SGLANG_PLUGINS=none`) and a plugin server, both with a
chunk size that cuts the video but not the image, and a third server whose default rate is 0.5,
with a chunk size that cuts inside the video's groups. Then the dense model with a third vision layer and
three deepstack levels (upstream, plugin, small chunks) and without them. VidCom2 reaches
Qwen3.5 through the same mechanism as EVS: the plugin servers also answer requests that choose it.
"""

import asyncio
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
import requests
import torch

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    Generation,
    chat_prompt,
    counter_increase,
    generate,
    logprob_gap,
    media_kwargs,
    per_request_rate,
    pruning_metrics,
)
from sglang_evs.testing.server import Launch, running_servers
from sglang_evs.testing.workload import send_alone, send_together

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "methods"))
from evs_oracle import keep_mask as evs_keep_mask  # noqa: E402  (the oracles written here)
from test_evs_serving import (  # noqa: E402
    HFReference,
    assert_matches_hf,
    assert_same_generation,
    hf_greedy_on_kept,
)
from vidcom2_oracle import keep_mask as vidcom2_keep_mask  # noqa: E402

pytestmark = pytest.mark.slow  # ten servers, one after another

# SGLang keeps the Gated DeltaNet conv state between prefill chunks in bfloat16 unless told
# otherwise, so where a chunk ends would round the next chunk's input: up to 2.4e-3 in logprobs
# measured here with chunks of 33 against one chunk, upstream's classes alike. Every server of this
# float32 harness keeps it in float32 (then chunked equals one chunk to ~1e-6).
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# Served vs HF transformers, both float32: the same weights through other kernels (SGLang's
# torch-native attention and this project's Gated DeltaNet stand-ins vs transformers' modules).
HF_LOGPROB_TOLERANCE = 1e-4  # measured on these prompts: up to 3.2e-6

ARCHITECTURES = {
    "Qwen3_5ForConditionalGeneration": "tiny_qwen3_5_dir",
    "Qwen3_5MoeForConditionalGeneration": "tiny_qwen3_5_moe_dir",
}
RATES = (0.0, 0.25, 0.5, 0.75, 0.9)
ORACLE_RATES = (0.5, 0.75)
GROUPS = 4  # a 16-frame 4 fps clip -> SGLang samples 8 frames -> 4 temporal groups
CHUNK = 128  # above the image's prompt (80 tokens), below every video's
SMALL_CHUNK = 33  # cuts inside groups and on framing tokens
VIDCOM2_RATES = (0.5, 0.75)
BAD_RATES = (1.5, -0.5, "fast")
COUNTS = ("video_tokens_before_pruning", "video_tokens_after_pruning")


def parity_cases(media_dir: Path) -> dict[str, tuple[str, dict]]:
    return {
        "text": (chat_prompt(text="Count the objects in the scene."), {}),
        "image": (chat_prompt(IMAGE), media_kwargs(images=[media_dir / "image.png"])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[media_dir / "moving.mp4"])),
        "image_video": (
            chat_prompt(IMAGE, VIDEO),
            media_kwargs(images=[media_dir / "image2.png"], videos=[media_dir / "noise.mp4"]),
        ),
    }


def mixed_cases(clips: dict[str, Path], media_dir: Path) -> list[tuple[str, dict, float]]:
    image, image2 = media_dir / "image.png", media_dir / "image2.png"
    return [
        (chat_prompt(VIDEO, IMAGE), media_kwargs(images=[image], videos=[clips["moving"]]), 0.75),
        (
            chat_prompt(IMAGE, VIDEO, VIDEO),
            media_kwargs(images=[image2], videos=[clips["noise"], clips["moving"]]),
            0.5,
        ),
        (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[clips["static"], clips["noise"]]), 0.0),
        (chat_prompt(text="Count the objects."), {}, 0.75),
    ]


@dataclass
class Served:
    """What one architecture's servers answered."""

    upstream: dict[str, Generation] = field(default_factory=dict)
    plugin: dict[str, Generation] = field(default_factory=dict)
    evs: dict[tuple[str, float], Generation] = field(default_factory=dict)  # (clip, q)
    evs_repeat: Generation | None = None  # (moving, 0.5) again: a radix hit
    vidcom2: dict[tuple[str, float], Generation] = field(default_factory=dict)  # (clip, retention ratio)
    cache_keys: list[Generation] = field(default_factory=list)  # unseen clip at .25, .25, .75
    mixed_alone: list[Generation] = field(default_factory=list)
    mixed_together: list[Generation] = field(default_factory=list)
    mixed_prefill: tuple[int, int, int] = (0, 0, 0)  # what workload.send_together says of the concurrent round
    bad: list[tuple[int, str]] = field(default_factory=list)
    after_bad: list[Generation] = field(default_factory=list)
    metrics_delta: dict[str, float] = field(default_factory=dict)
    metered: Generation | None = None
    trace_path: Path | None = None
    small_chunk: list[Generation] = field(default_factory=list)  # server default 0.5, chunk 33
    small_chunk_mixed: Generation | None = None
    small_chunk_unpruned: Generation | None = None


def video(base_url: str, clip: Path, q: float | None = None, **extra) -> Generation:
    extra = {**per_request_rate(q), **extra} if q is not None else extra
    return generate(base_url, chat_prompt(VIDEO), **media_kwargs(videos=[clip]), **extra)[0]


def serve_architecture(architecture: str, model_dir: Path, media_dir: Path, clips: dict, out: Path) -> Served:
    served = Served(trace_path=out / "trace.jsonl")
    args = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK)]
    cases = parity_cases(media_dir)

    def run_parity(base_url: str) -> dict[str, Generation]:
        results = {name: generate(base_url, prompt, **kw)[0] for name, (prompt, kw) in cases.items()}
        results["radix_repeat"] = generate(base_url, cases["image_video"][0], **cases["image_video"][1])[0]
        return results

    small_chunk_args = ["--dtype", "float32", "--chunked-prefill-size", str(SMALL_CHUNK),
                        "--json-model-override-args", '{"video_pruning_rate": 0.5}']  # fmt: skip
    launches = (
        Launch(model_dir, out / "upstream.log", args, {**HYBRID_ENV, "SGLANG_PLUGINS": "none"}),
        Launch(model_dir, out / "plugin.log", [*args, "--enable-metrics"],
               {**HYBRID_ENV, "SGLANG_EVS_TRACE": str(served.trace_path)}),
        Launch(model_dir, out / "small-chunk.log", small_chunk_args, HYBRID_ENV),
    )  # fmt: skip
    with running_servers(*launches) as (upstream, plugin, small_chunk):
        served.upstream = run_parity(upstream.base_url)
        url = plugin.base_url
        served.plugin = run_parity(url)
        for q in RATES:
            served.evs["moving", q] = video(url, clips["moving"], q)
        for q in ORACLE_RATES:
            served.evs["noise", q] = video(url, clips["noise"], q)
        served.evs_repeat = video(url, clips["moving"], 0.5)
        for q in VIDCOM2_RATES:
            for clip in ("moving", "noise"):
                served.vidcom2[clip, q] = video(url, clips[clip], **per_request_rate(q, "vidcom2"))
        unseen = media.write_clip(out / "unseen.mp4", "noise", num_frames=16, fps=4, seed=11)
        served.cache_keys = [video(url, unseen, q) for q in (0.25, 0.25, 0.75)]
        mixed = mixed_cases(clips, media_dir)
        served.mixed_alone = send_alone(url, mixed)
        served.mixed_together, served.mixed_prefill = send_together(url, mixed, served.trace_path)
        for bad in BAD_RATES:
            reply = requests.post(
                f"{url}/generate",
                json={"text": chat_prompt(VIDEO), "video_data": [str(clips["moving"])], **per_request_rate(bad),
                      "sampling_params": {"max_new_tokens": 2}},
                timeout=120,
            )  # fmt: skip
            served.bad.append((reply.status_code, reply.text))
            served.after_bad.append(video(url, clips["moving"], 0.75))
        before = pruning_metrics(url)
        served.metered = video(url, media.write_clip(out / "metered.mp4", "moving", num_frames=16, fps=4, seed=7), 0.5)
        after = pruning_metrics(url)
        served.metrics_delta = counter_increase(before, after)

        served.small_chunk = [video(small_chunk.base_url, clips["moving"]) for _ in range(2)]
        prompt, kw, _ = mixed_cases(clips, media_dir)[1]
        served.small_chunk_mixed = generate(small_chunk.base_url, prompt, **kw)[0]
        served.small_chunk_unpruned = video(small_chunk.base_url, clips["moving"], 0.0)
    return served


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("qwen3_5_clips")
    return {
        kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=3) for kind in media.CLIP_KINDS
    }


@pytest.fixture(scope="module")
def served(request, media_dir, clips, tmp_path_factory) -> dict[str, Served]:
    results = {}
    for architecture, fixture in ARCHITECTURES.items():
        out = tmp_path_factory.mktemp(architecture)
        model_dir = request.getfixturevalue(fixture)
        results[architecture] = serve_architecture(architecture, model_dir, media_dir, clips, out)
    return results


@pytest.fixture(params=list(ARCHITECTURES))
def arch(request) -> str:
    return request.param


# --- q = 0: this project's classes serve exactly as upstream's


def test_plugin_serves_bit_identically_to_upstream(served, arch):
    """Text, image, video, image + video (the videos cut by the chunk size) and a radix repeat:
    tokens, logprobs and top-5 logprobs equal exactly."""
    got = served[arch]
    assert set(got.plugin) == {"text", "image", "video", "image_video", "radix_repeat"}
    assert got.plugin == got.upstream
    assert got.plugin["radix_repeat"].cached_tokens > 0
    assert got.plugin["image"].output_ids != got.plugin["video"].output_ids  # media reach the model


def test_our_classes_and_routine_served_with_no_deepstack_buffer(served, arch):
    trace_path = served[arch].trace_path
    (allocated,) = trace.read(trace_path, "graph_inputs_allocated")
    assert allocated["model"] == arch and allocated["deepstack_ptr"] is None  # width 0: no buffer
    calls = trace.read(trace_path, "embed_routine")
    assert {c["model"] for c in calls} == {arch}
    assert sum(sum(c["media_rows"]) for c in calls) > 0
    extend = [c for c in trace.read(trace_path, "language_model_inputs") if c["mode"] == "EXTEND"]
    assert extend and {c["positions_ptr"] for c in extend} == {allocated["positions_ptr"]}
    assert {c["deepstack_ptr"] for c in extend} == {None}


# --- EVS


@pytest.mark.parametrize("q", RATES)
def test_prompt_tokens_follow_the_retained_count(served, arch, q):
    unpruned, pruned = served[arch].evs["moving", 0.0], served[arch].evs["moving", q]
    tokens = unpruned.meta["video_tokens"]
    per_group = tokens // GROUPS
    assert per_group * GROUPS == tokens
    kept = max(per_group, int(GROUPS * per_group * (1 - q)))  # the EVS count, written out here
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (tokens - kept)
    assert pruned.meta["video_tokens"] == kept
    if q > 0:
        assert pruned.meta["video_tokens_before_pruning"] == tokens
        assert pruned.meta["video_tokens_after_pruning"] == kept
        assert pruned.meta["video_pruning_rate"] == q


def assert_same_tokens(got: Generation, want: Generation, context: str) -> None:
    assert got.prompt_tokens == want.prompt_tokens, context
    assert_same_generation(got, want, context)


def test_chunk_sizes_and_radix_hits_give_identical_tokens(served, arch):
    """The plugin server cuts the video at 128 tokens; the small-chunk server (default rate 0.5)
    cuts inside its groups and on framing tokens, then serves it again from the radix cache."""
    got = served[arch]
    reference = got.evs["moving", 0.5]
    assert got.evs_repeat.cached_tokens > 0
    assert_same_tokens(got.evs_repeat, reference, "radix hit, chunk 128")
    first, again = got.small_chunk
    assert again.cached_tokens > 0
    assert_same_tokens(first, reference, "chunk 33")
    assert_same_tokens(again, reference, "chunk 33, radix hit")
    assert_same_tokens(got.small_chunk_mixed, got.mixed_alone[1], "image and two videos, chunk 33 vs 128")
    assert_same_tokens(got.small_chunk_unpruned, got.evs["moving", 0.0], "unpruned, chunk 33 vs 128")


def test_the_rate_is_part_of_the_cache_key(served, arch):
    """The hybrid cache keeps linear-attention state only where a prefill chunk ended, so a repeat
    hits up to the last chunk boundary (a multiple of the chunk size) inside the video."""
    first, again, other = served[arch].cache_keys
    assert again.cached_tokens >= (first.prompt_tokens - 1) // CHUNK * CHUNK > 20
    assert other.cached_tokens < 20  # at most the text before the video


def test_mixed_media_batched_equal_each_request_alone(served, arch):
    got = served[arch]
    shared_forwards, cached, prompt_tokens = got.mixed_prefill
    assert shared_forwards > 0 and cached < prompt_tokens // 4, got.mixed_prefill  # batched, not cache hits
    for one, many in zip(got.mixed_alone, got.mixed_together, strict=True):
        assert many.prompt_tokens == one.prompt_tokens
        assert_same_generation(many, one, "batched vs alone")


def test_bad_rates_get_400_and_serving_goes_on(served, arch):
    got = served[arch]
    for status, text in got.bad:
        assert status == 400 and "video_pruning_rate must be a number in [0, 1)" in text
    assert {tuple(g.output_ids) for g in got.after_bad} == {tuple(got.evs["moving", 0.75].output_ids)}


def test_prometheus_counts_what_was_pruned(served, arch):
    got = served[arch]
    for name in COUNTS:
        assert got.metrics_delta[name] == got.metered.meta[name], name
    assert got.metrics_delta["pruned_videos"] == 1
    assert got.metered.meta["video_tokens_after_pruning"] < got.metered.meta["video_tokens_before_pruning"]


# --- the independent oracle: HF transformers' Qwen3.5 given the kept tokens at the reference positions


@cache
def hf(model_dir: str):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(model_dir)


def hf_greedy(model_dir: Path, prompt: str, image: Path | None = None, clip: Path | None = None, q: float = 0.0,
              steps: int = 8, keep_mask=evs_keep_mask, shift_text_back: bool = False,
              shift_from_video: int = 0) -> HFReference:  # fmt: skip
    """Transformers' own processor, vision tower, `get_rope_index` and language model; a video's
    pruned pads (`keep_mask(rows, grid, m, q)`, an oracle written here) deleted from its tokens and
    positions (the reference rule), the decode offset grown by their count. `shift_text_back` is the
    control: the text after the video moved back by the pruned count, as a rule that renumbers the
    compacted sequence would place it; `shift_from_video` another: every token from the video's first
    pad on (generated ones too) moved by that many positions (a one-position error)."""
    from PIL import Image
    from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
    from sglang.srt.utils.common import load_video

    model, processor = hf(str(model_dir))
    kwargs: dict = {"images": [Image.open(image)]} if image else {}
    if clip is not None:
        frames, metadata = asyncio.run(preprocess_video(load_video(str(clip), use_gpu=False)))
        kwargs |= {"videos": [frames], "video_metadata": [metadata], "do_sample_frames": False}
    inputs = processor(text=[prompt], return_tensors="pt", **kwargs)  # as SGLang calls it
    ids, cfg, inner = inputs["input_ids"][0], model.config, model.model
    with torch.no_grad():
        positions, delta = inner.get_rope_index(
            ids[None], inputs["mm_token_type_ids"],
            image_grid_thw=inputs.get("image_grid_thw"), video_grid_thw=inputs.get("video_grid_thw"),
        )  # fmt: skip
        embeds = inner.language_model.embed_tokens(ids)
        keep = torch.ones_like(ids, dtype=torch.bool)
        if image is not None:
            rows = inner.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output
            embeds[ids == cfg.image_token_id] = torch.cat(list(rows))
        if clip is not None:
            grid = inputs["video_grid_thw"]
            rows = torch.cat(list(inner.get_video_features(inputs["pixel_values_videos"], grid).pooler_output))
            is_pad = ids == cfg.video_token_id
            embeds[is_pad] = rows
            if q > 0:
                keep[is_pad] = keep_mask(rows, grid[0], cfg.vision_config.spatial_merge_size, q)
        video_rows = ids == cfg.video_token_id
        return hf_greedy_on_kept(model, embeds, positions, delta, keep, video_rows, steps, shift_from_video,
                                 shift_text_back)  # fmt: skip


def test_unpruned_greedy_tokens_equal_hf(served, arch, media_dir, request):
    model_dir = request.getfixturevalue(ARCHITECTURES[arch])
    got = served[arch].plugin
    image, _ = parity_cases(media_dir)["image"]
    assert_matches_hf(got["image"], hf_greedy(model_dir, image, image=media_dir / "image.png"), HF_LOGPROB_TOLERANCE)
    assert_matches_hf(
        got["video"], hf_greedy(model_dir, chat_prompt(VIDEO), clip=media_dir / "moving.mp4"), HF_LOGPROB_TOLERANCE
    )


@pytest.mark.parametrize("q", ORACLE_RATES)
@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_pruned_greedy_tokens_equal_hf_oracle(served, arch, clips, q, clip, request):
    model_dir = request.getfixturevalue(ARCHITECTURES[arch])
    assert_matches_hf(
        served[arch].evs[clip, q], hf_greedy(model_dir, chat_prompt(VIDEO), clip=clips[clip], q=q), HF_LOGPROB_TOLERANCE
    )


def test_the_hf_oracle_tells_an_inexact_position_rule(served, arch, clips, request):
    """The control: HF with the text after the video renumbered as if the pruned tokens never
    existed is far from what was served, so the tolerance above separates exact from inexact."""
    model_dir = request.getfixturevalue(ARCHITECTURES[arch])
    control = hf_greedy(model_dir, chat_prompt(VIDEO), clip=clips["moving"], q=0.75, shift_text_back=True)
    assert logprob_gap(served[arch].evs["moving", 0.75], control) > 100 * HF_LOGPROB_TOLERANCE
    one_off = hf_greedy(model_dir, chat_prompt(VIDEO), clip=clips["moving"], q=0.75, shift_from_video=1)
    assert logprob_gap(served[arch].evs["moving", 0.75], one_off) > HF_LOGPROB_TOLERANCE  # a one-position error


# --- VidCom2, the second method, through the same mechanism


@pytest.mark.parametrize("q", VIDCOM2_RATES)
def test_vidcom2_prompt_tokens_follow_its_count(served, arch, q):
    unpruned, pruned = served[arch].evs["moving", 0.0], served[arch].vidcom2["moving", q]
    tokens = unpruned.meta["video_tokens"]
    kept = max(GROUPS, int(tokens * (1 - q)))  # VidCom2's count, written out here
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (tokens - kept)
    assert pruned.meta["video_pruning_method"] == "vidcom2" and pruned.meta["video_pruning_rate"] == q
    assert pruned.meta["video_tokens_after_pruning"] == pruned.meta["video_tokens"] == kept


@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_vidcom2_greedy_tokens_equal_hf_oracle(served, arch, clips, clip, request):
    q = VIDCOM2_RATES[0]
    model_dir = request.getfixturevalue(ARCHITECTURES[arch])
    reference = hf_greedy(model_dir, chat_prompt(VIDEO), clip=clips[clip], q=q, keep_mask=vidcom2_keep_mask)
    assert_matches_hf(served[arch].vidcom2[clip, q], reference, HF_LOGPROB_TOLERANCE)


# --- a Qwen3.5 checkpoint with deepstack levels: they travel in the fixed buffer


@dataclass
class DeepstackServed:
    upstream: dict[str, Generation]
    plugin: dict[str, Generation]
    without_levels: dict[str, Generation]  # the same weights but the deepstack mergers
    pruned: Generation  # (moving, 0.5), chunk 128
    pruned_small_chunk: list[Generation]  # the same with chunk 33, then again from the radix cache
    trace_path: Path


@pytest.fixture(scope="module")
def deepstack_served(tiny_qwen3_5_deepstack_dirs, media_dir, clips, tmp_path_factory) -> DeepstackServed:
    out = tmp_path_factory.mktemp("qwen3_5_deepstack")
    model_dir, without_levels = tiny_qwen3_5_deepstack_dirs
    cases = parity_cases(media_dir)
    args = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK)]
    trace_path = out / "trace.jsonl"
    launches = (
        Launch(model_dir, out / "upstream.log", args, {**HYBRID_ENV, "SGLANG_PLUGINS": "none"}),
        Launch(model_dir, out / "plugin.log", args, {**HYBRID_ENV, "SGLANG_EVS_TRACE": str(trace_path)}),
        Launch(without_levels, out / "without-levels.log", args, HYBRID_ENV),
        Launch(model_dir, out / "small-chunk.log", ["--dtype", "float32", "--chunked-prefill-size", str(SMALL_CHUNK)],
               HYBRID_ENV),
    )  # fmt: skip
    with running_servers(*launches) as (upstream_server, plugin_server, without_server, small_chunk_server):

        def parity(server) -> dict[str, Generation]:
            return {name: generate(server.base_url, p, **kw)[0] for name, (p, kw) in cases.items()}

        upstream, plugin, without = parity(upstream_server), parity(plugin_server), parity(without_server)
        pruned = video(plugin_server.base_url, clips["moving"], 0.5)
        small_chunk = [video(small_chunk_server.base_url, clips["moving"], 0.5) for _ in range(2)]
    return DeepstackServed(upstream, plugin, without, pruned, small_chunk, trace_path)


def test_deepstack_levels_serve_bit_identically_to_upstream(deepstack_served):
    got = deepstack_served
    assert got.plugin == got.upstream
    # the same weights without the mergers answer otherwise: the levels reach the language model
    assert got.without_levels["text"] == got.plugin["text"]
    for name in ("image", "video", "image_video"):
        assert got.without_levels[name].logprobs != got.plugin[name].logprobs, name


def test_deepstack_travels_in_the_fixed_buffer(deepstack_served):
    (allocated,) = trace.read(deepstack_served.trace_path, "graph_inputs_allocated")
    assert allocated["deepstack_ptr"] is not None
    written = trace.read(deepstack_served.trace_path, "deepstack")
    assert {w["data_ptr"] for w in written} == {allocated["deepstack_ptr"]}
    assert sum(w["nonzero_rows"] for w in written) > 0
    # rows only where media are, none left over from an earlier forward
    assert all(w["nonzero_rows"] <= w["media_rows"] for w in written)
    extend = [c for c in trace.read(deepstack_served.trace_path, "language_model_inputs") if c["mode"] == "EXTEND"]
    assert {c["deepstack_ptr"] for c in extend} == {allocated["deepstack_ptr"]}


def test_deepstack_videos_pruned_exactly_in_any_chunk(deepstack_served):
    pruned = deepstack_served.pruned
    tokens = pruned.meta["video_tokens_before_pruning"]
    assert pruned.meta["video_tokens_after_pruning"] == max(tokens // GROUPS, int(tokens * (1 - 0.5)))
    first, again = deepstack_served.pruned_small_chunk
    assert again.cached_tokens > 0
    assert_same_tokens(first, pruned, "deepstack, chunk 33")
    assert_same_tokens(again, pruned, "deepstack, chunk 33, radix hit")
