"""Qwen3-Omni's videos pruned by this project's thinker on the CPU route (float32): audio and images never.

SGLang serves Qwen3-Omni as its thinker (a Qwen3-VL-MoE with an audio tower; `models/qwen3_omni.py`). Its
videos are one run of pads each; their M-RoPE positions are upstream's `get_rope_index_qwen3_omni`, audio and
video on one time axis (`position_id_per_seconds`), computed on the unpruned layout. q = 0 against upstream is
`test_other_families.py` (text, image, video, audio, video + audio, cut by 16-token chunks).

Two plugin servers: one with 128-token chunks (traced, metrics on), and one with 29-token chunks that cut the
video and the audio, whose default rate is .5 (its positions traced), in graph mode (`sglang_evs.testing.server`,
as a GPU serves by default: SGLang's breakable prefill graphs, which the plugin turns on for Qwen3-Omni, and its
decode graphs). Then upstream in graph mode with the second one's flags, and the second one again with its fixed
buffers never written (`SKIP_GRAPH_BUFFERS_ENV`, tests only), whose pruned replies must part from the eager
server's. The oracle is transformers' own Qwen3-Omni thinker given the kept rows at their unpruned positions, with
the one-position and renumbering controls.
"""

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_evs import trace
from sglang_evs.models.graph_inputs import SKIP_GRAPH_BUFFERS_ENV
from sglang_evs.testing import media
from sglang_evs.testing.chunked import assert_every_forward_replayed, chunk_graph_args, traced_request
from sglang_evs.testing.compare import assert_same_generation, assert_same_greedy
from sglang_evs.testing.evs_oracle import keep_mask as evs_keep_mask
from sglang_evs.testing.hf_reference import (
    HFReference,
    assert_masks_agree_up_to_ties,
    assert_matches_hf,
    checked_mask,
    hf_greedy_on_kept,
    served_mask,
)
from sglang_evs.testing.requests import (
    AUDIO,
    IMAGE,
    VIDEO,
    Generation,
    chat_prompt,
    counter_increase,
    flush_cache,
    generate,
    logprob_gap,
    media_kwargs,
    per_request_rate,
    pruning_metrics,
)
from sglang_evs.testing.server import Launch, running_servers
from sglang_evs.testing.vidcom2_oracle import keep_mask as vidcom2_keep_mask
from sglang_evs.testing.workload import send_alone, send_together

pytestmark = pytest.mark.slow  # four servers, two at a time

CHUNK = 128  # above the image's prompt, below a video's
SMALL_CHUNK = 29  # cuts the video's pads and the audio's
SMALL_CHUNK_GRAPHS = chunk_graph_args(SMALL_CHUNK)  # the small-chunk servers serve one request at a time
GROUPS = 8  # a 32-frame 4 fps clip -> SGLang samples 16 frames -> 8 temporal groups (.75 keeps two groups' worth)
HF_LOGPROB_TOLERANCE = 1e-4
COUNTS = ("video_tokens_before_pruning", "video_tokens_after_pruning")


@dataclass
class Served:
    video: dict[tuple[str, float], Generation] = field(default_factory=dict)  # (clip, q)
    with_audio: dict[float, Generation] = field(default_factory=dict)  # noise clip + tone, at q
    vidcom2: dict[str, Generation] = field(default_factory=dict)  # clip, at .5
    masks: dict[tuple, Callable] = field(default_factory=dict)  # ("evs" | "vidcom2" | "with_audio", clip, q)
    repeat: Generation | None = None  # (moving, .5) again: a radix hit
    mixed_alone: list[Generation] = field(default_factory=list)
    mixed_together: list[Generation] = field(default_factory=list)
    mixed_prefill: tuple[int, int, int] = (0, 0, 0)
    metrics_delta: dict[str, float] = field(default_factory=dict)
    metered: Generation | None = None
    small_chunk: list[Generation] = field(default_factory=list)  # video + audio at the default .5: first, repeat
    small_chunk_rates: dict[float, Generation] = field(default_factory=dict)  # video + audio at q, per request
    small_chunk_positions: dict[float, list[dict]] = field(default_factory=dict)  # rope_positions at q = 0, .75
    small_chunk_kept: list[int] = field(default_factory=list)  # the .75 request's keep-mask (kept pad indices)
    small_chunk_events: dict[float, dict[str, list[dict]]] = field(default_factory=dict)  # q = 0, .75: trace events
    image: Generation | None = None  # the small-chunk server, q = 0, from an empty cache
    graphs_upstream: dict[str, Generation] = field(default_factory=dict)  # upstream in graph mode, its flags
    unwritten_buffers: Generation | None = None  # video + audio at .75 with the fixed buffers never written
    trace_path: Path | None = None  # the 128-token server's
    soundtrack: Generation | None = None  # the moving clip with a soundtrack, `use_audio_in_video`, at .75


def with_audio_prompt() -> str:
    return chat_prompt(VIDEO, AUDIO, text="What is heard?")


def mixed_cases(clips: dict[str, Path], media_dir: Path) -> list[tuple[str, dict, float]]:
    image, tone = media_dir / "image.png", media_dir / "tone.m4a"
    return [
        (with_audio_prompt(), media_kwargs(videos=[clips["noise"]], audios=[tone]), 0.75),
        (chat_prompt(AUDIO), media_kwargs(audios=[tone]), 0.75),
        (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[image], videos=[clips["moving"]]), 0.5),
        (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[clips["static"], clips["noise"]]), 0.75),
        (chat_prompt(text="Count the objects."), {}, 0.75),
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]]), 0.0),
        (chat_prompt(IMAGE, text="What is it?"), media_kwargs(images=[image]), 0.9),
        (chat_prompt(VIDEO, text="What moves?"), media_kwargs(videos=[clips["static"]]), 0.9),
    ]


def ask(base_url: str, prompt: str, kw: dict, q: float | None = None, method: str = "evs") -> Generation:
    rate = {} if q is None else per_request_rate(q, method)
    return generate(base_url, prompt, **kw, **rate)[0]


def image_case(media_dir: Path) -> tuple[str, dict]:
    """Compared with upstream in graph mode, with the video + audio prompt of `Served.small_chunk_rates`."""
    return chat_prompt(IMAGE), media_kwargs(images=[media_dir / "image.png"])


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("omni_clips")
    kinds = media.CLIP_KINDS
    return {kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=32, fps=4, seed=3) for kind in kinds}


@pytest.fixture(scope="module")
def served(tiny_qwen3_omni_dir, media_dir, clips, tmp_path_factory) -> Served:
    out = tmp_path_factory.mktemp("qwen3_omni")
    trace_path, small_trace = out / "trace.jsonl", out / "small-chunk-trace.jsonl"
    got = Served(trace_path=trace_path)
    tone = media_dir / "tone.m4a"
    small_chunk_args = ["--dtype", "float32", "--chunked-prefill-size", str(SMALL_CHUNK),
                        "--json-model-override-args", '{"video_pruning_rate": 0.5}', *SMALL_CHUNK_GRAPHS]  # fmt: skip
    launches = (
        Launch(tiny_qwen3_omni_dir, out / "plugin.log",
               ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK), "--enable-metrics"],
               {trace.ENV: str(trace_path)}),
        Launch(tiny_qwen3_omni_dir, out / "small-chunk.log", small_chunk_args,
               {trace.ENV: str(small_trace), trace.POSITIONS_ENV: "1"}, graph_mode=True),
    )  # fmt: skip
    with running_servers(*launches) as (plugin, small_chunk):
        url = plugin.base_url
        for clip, rates in (("moving", (0.0, 0.25, 0.5, 0.75, 0.9)), ("noise", (0.5, 0.75))):
            for q in rates:
                got.video[clip, q] = ask(url, chat_prompt(VIDEO), media_kwargs(videos=[clips[clip]]), q)
                if q > 0:  # each rate encodes the clip anew (the rate is part of the video's cache key)
                    got.masks["evs", clip, q] = served_mask(trace_path)
        got.repeat = ask(url, chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]]), 0.5)
        sounding = media.write_clip(out / "moving-sound.mp4", "moving", num_frames=32, fps=4, seed=3,
                                    soundtrack=media.tone(seconds=8.0))  # fmt: skip
        own_sound = media_kwargs(videos=[sounding]) | {"use_audio_in_video": True}
        got.soundtrack = ask(url, chat_prompt(VIDEO), own_sound, 0.75)
        for q in (0.0, 0.75):
            got.with_audio[q] = ask(url, with_audio_prompt(), media_kwargs(videos=[clips["noise"]], audios=[tone]), q)
        got.masks["with_audio", "noise", 0.75] = got.masks["evs", "noise", 0.75]  # the same clip at the same rate
        for clip in ("moving", "noise"):
            got.vidcom2[clip] = ask(url, chat_prompt(VIDEO), media_kwargs(videos=[clips[clip]]), 0.5, "vidcom2")
            got.masks["vidcom2", clip, 0.5] = served_mask(trace_path)
        mixed = mixed_cases(clips, media_dir)
        got.mixed_alone = send_alone(url, mixed)
        got.mixed_together, got.mixed_prefill = send_together(url, mixed, trace_path)
        before = pruning_metrics(url)
        metered_clip = media.write_clip(out / "metered.mp4", "moving", num_frames=32, fps=4, seed=7)
        got.metered = ask(url, with_audio_prompt(), media_kwargs(videos=[metered_clip], audios=[tone]), 0.5)
        got.metrics_delta = counter_increase(before, pruning_metrics(url))

        case = (with_audio_prompt(), media_kwargs(videos=[clips["noise"]], audios=[tone]))
        got.small_chunk = [ask(small_chunk.base_url, *case) for _ in range(2)]  # the server's default .5
        for q in (0.0, 0.75):  # each from an empty cache, so that every prompt row is traced
            flush_cache(small_chunk.base_url)
            got.small_chunk_rates[q], events = traced_request(small_trace, partial(ask, small_chunk.base_url, *case, q))
            got.small_chunk_positions[q], got.small_chunk_events[q] = events["rope_positions"], events
        got.small_chunk_kept = trace.read(small_trace, "keep_mask")[-1]["kept"]
        flush_cache(small_chunk.base_url)
        got.image = ask(small_chunk.base_url, *image_case(media_dir), 0.0)
    # Then (two servers at a time) upstream in graph mode with the small-chunk server's flags, and the small-chunk
    # server with its fixed buffers never written.
    launches = (
        Launch(tiny_qwen3_omni_dir, out / "graphs-upstream.log", small_chunk_args, {"SGLANG_PLUGINS": "none"},
               graph_mode=True),
        Launch(tiny_qwen3_omni_dir, out / "unwritten-buffers.log", small_chunk_args, {SKIP_GRAPH_BUFFERS_ENV: "1"},
               graph_mode=True),
    )  # fmt: skip
    with running_servers(*launches) as (graphs_upstream, unwritten_buffers):
        got.graphs_upstream["image"] = ask(graphs_upstream.base_url, *image_case(media_dir))
        flush_cache(graphs_upstream.base_url)
        got.graphs_upstream["video_audio"] = ask(graphs_upstream.base_url, *case)
        got.unwritten_buffers = ask(unwritten_buffers.base_url, *case, 0.75)
    return got


def test_the_thinker_is_this_projects_with_deepstack_in_its_fixed_buffer(served):
    """The thinker answers through this project's routine; its deepstack rows (videos' and images', none for
    audio) travel in the fixed buffer."""
    (allocated,) = trace.read(served.trace_path, "graph_inputs_allocated")
    assert allocated["model"] == "Qwen3OmniMoeThinker" and allocated["deepstack_ptr"] is not None
    assert sum(sum(call["media_rows"]) for call in trace.read(served.trace_path, "embed_routine")) > 0
    written = trace.read(served.trace_path, "deepstack")
    assert {w["data_ptr"] for w in written} == {allocated["deepstack_ptr"]}
    assert all(w["nonzero_rows"] <= w["media_rows"] for w in written) and sum(w["nonzero_rows"] for w in written)


# --- counts: the video's tokens go, the audio's and the image's stay


@pytest.mark.parametrize("q", [0.25, 0.5, 0.75, 0.9])
def test_prompt_tokens_follow_the_evs_count(served, q):
    unpruned, pruned = served.video["moving", 0.0], served.video["moving", q]
    tokens = unpruned.meta["video_tokens"]
    per_group = tokens // GROUPS
    assert per_group * GROUPS == tokens
    kept = max(per_group, int(tokens * (1 - q)))  # the EVS count, written out here
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (tokens - kept)
    assert (pruned.meta["video_tokens_before_pruning"], pruned.meta["video_tokens_after_pruning"]) == (tokens, kept)


def test_audio_is_never_pruned_nor_counted_as_video(served):
    """A video + audio prompt at .75: the video's counts are those of the same video alone."""
    unpruned, pruned = served.with_audio[0.0], served.with_audio[0.75]
    video_only = served.video["noise", 0.75]
    assert pruned.meta["video_tokens_before_pruning"] == video_only.meta["video_tokens_before_pruning"]
    assert pruned.meta["video_tokens_after_pruning"] == video_only.meta["video_tokens_after_pruning"]
    pruned_count = pruned.meta["video_tokens_before_pruning"] - pruned.meta["video_tokens_after_pruning"]
    assert pruned.prompt_tokens == unpruned.prompt_tokens - pruned_count  # the audio's rows all stayed
    # SGLang's own usage reports each medium apart: the audio's count unchanged, the video's the kept rows
    assert pruned.meta["audio_tokens"] == unpruned.meta["audio_tokens"] > 0
    assert pruned.meta["video_tokens"] == pruned.meta["video_tokens_after_pruning"] < unpruned.meta["video_tokens"]


def test_audio_rows_keep_their_count_and_positions_at_q75(served, tiny_qwen3_omni_dir, clips, media_dir):
    """A video + audio prompt at q = .75, in 29-token chunks: its positions are q = 0's with the pruned video
    rows deleted, so every audio row is there at its q = 0 position on the shared time axis."""
    tone = media_dir / "tone.m4a"
    inputs, config = hf_processor_inputs(tiny_qwen3_omni_dir, with_audio_prompt(), clips["noise"], tone)
    ids = inputs["input_ids"][0]
    prefill = {q: [e for e in served.small_chunk_positions[q] if e["mode"] == "EXTEND"] for q in (0.0, 0.75)}
    unpruned, pruned = (torch.cat([torch.tensor(e["positions"]) for e in prefill[q]], dim=1) for q in (0.0, 0.75))
    assert len(prefill[0.75]) > 2 and unpruned.shape[1] == ids.numel()  # chunked, every row traced
    pads = (ids == config.video_token_id).nonzero().flatten()
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[pads] = False
    keep[pads[served.small_chunk_kept]] = True
    assert 0 < len(served.small_chunk_kept) < pads.numel()
    assert torch.equal(pruned, unpruned[:, keep])
    audio = ids == config.audio_token_id
    assert audio.sum() > 0 and torch.equal(pruned[:, audio[keep]], unpruned[:, audio])


def test_a_videos_own_soundtrack_is_laid_out_as_sglang_lays_it_out(served):
    """`use_audio_in_video` (a video's own soundtrack, interleaved with its frames by time chunk in
    transformers): SGLang 0.5.23's Qwen-VL processor lays audio and video out as separate items only (it hands
    transformers' processor and its own `get_rope_index_qwen3_omni` `use_audio_in_video=False`; the request
    field is read by Nemotron's processor alone), so the soundtrack is not extracted, with or without the
    plugin: the request is the silent clip's, pruned alike."""
    got, silent = served.soundtrack, served.video["moving", 0.75]
    assert got.meta["video_tokens_before_pruning"] == silent.meta["video_tokens_before_pruning"]
    assert_same_generation(got, silent, 1e-4, "the clip with its soundtrack vs without")


def test_prometheus_counts_video_tokens_only(served):
    got = served.metered
    for name in COUNTS:
        assert served.metrics_delta[name] == got.meta[name], name
    assert served.metrics_delta["pruned_videos"] == 1
    assert got.meta["video_tokens_after_pruning"] < got.meta["video_tokens_before_pruning"]


# --- the same tokens however the prompt is cut, cached or batched


def test_chunks_and_radix_hits_give_identical_tokens(served):
    """The small-chunk server (default .5) cuts the video and the audio in 29-token pieces, then serves the
    prompt again from its radix cache; at q = 0 and .75 given per request it equals the 128-token server."""
    first, again = served.small_chunk
    assert again.cached_tokens > 0
    assert_same_generation(again, first, 1e-4, "radix hit, 29-token chunks")
    assert served.repeat.cached_tokens > 0
    assert_same_generation(served.repeat, served.video["moving", 0.5], 1e-4, "radix hit, 128-token chunks")
    assert_same_generation(served.small_chunk_rates[0.0], served.with_audio[0.0], 1e-4, "unpruned, 29 vs 128")
    assert_same_generation(served.small_chunk_rates[0.75], served.with_audio[0.75], 1e-4, "q = .75, 29 vs 128")


def test_eight_mixed_requests_batched_equal_each_alone(served):
    shared_forwards, cached, prompt_tokens = served.mixed_prefill
    assert shared_forwards > 0 and cached < prompt_tokens // 4, served.mixed_prefill
    for one, many in zip(served.mixed_alone, served.mixed_together, strict=True):
        assert_same_generation(many, one, 1e-4, "batched vs alone")


# --- graph mode, as a GPU serves by default

# The plugin's small-chunk server replays prefill graphs, upstream's prefills Qwen3-Omni eagerly (its allowlist
# leaves it off); a replayed chunk is padded to its bucket, and a CPU GEMM rounds a row otherwise with the row
# count: measured 1.2e-6 apart in logprobs. A position or deepstack row off moves them by units.
GRAPH_TOLERANCE = 1e-4  # `assert_same_greedy`'s


def test_graph_mode_at_q0_matches_upstream_in_graph_mode(served):
    """An image, and a video with audio, at q = 0 in 29-token chunks, each from an empty cache: the same tokens and
    top-5 tokens as upstream in graph mode with the same flags, logprobs within GRAPH_TOLERANCE."""
    ours = {"image": served.image, "video_audio": served.small_chunk_rates[0.0]}
    assert set(ours) == set(served.graphs_upstream)
    for name, want in served.graphs_upstream.items():
        assert ours[name].prompt_tokens == want.prompt_tokens, name
        assert_same_greedy(ours[name], want, f"{name}: graph mode vs upstream in graph mode")  # GRAPH_TOLERANCE


def test_every_forward_of_a_pruned_video_replays_a_graph(served):
    """The video + audio prompt at .75 in 29-token chunks on the graph-mode server: every prefill chunk replayed a
    prefill graph reading the model's position buffer, every decode step a decode graph (the trace), and the reply
    is the eager server's (128-token chunks; logprobs within 1e-4). Its positions are the rule's
    (`test_audio_rows_keep_their_count_and_positions_at_q75`, from the buffer each replay read)."""
    reply = served.small_chunk_rates[0.75]
    assert_every_forward_replayed(reply, served.small_chunk_events[0.75], math.ceil(reply.prompt_tokens / SMALL_CHUNK))
    assert_same_generation(reply, served.with_audio[0.75], HF_LOGPROB_TOLERANCE, "graph mode vs eager")
    assert reply.meta["video_tokens_after_pruning"] < reply.meta["video_tokens_before_pruning"]


def test_a_graph_mode_server_whose_buffers_are_never_written_parts_from_eager(served):
    """The comparison above has teeth: the same server with `post_process`'s writes of positions and deepstack
    into the fixed buffers left out (every forward carries temporaries, which an eager forward reads and a replay
    does not) answers the pruned request otherwise than the eager server, which the server that writes them
    matches."""
    eager, broken = served.with_audio[0.75], served.unwritten_buffers
    assert_same_generation(served.small_chunk_rates[0.75], eager, HF_LOGPROB_TOLERANCE, "buffers written")
    assert broken.prompt_tokens == eager.prompt_tokens
    assert broken.output_ids != eager.output_ids or logprob_gap(broken, eager) > 100 * HF_LOGPROB_TOLERANCE


# --- the independent oracle: transformers' Qwen3-Omni thinker given the kept rows at their positions


def hf_processor_inputs(model_dir: Path, prompt: str, clip: Path, audio: Path | None = None):
    """transformers' processor on the prompt, as SGLang calls it: (its inputs, the thinker's config)."""
    from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
    from sglang.srt.utils.common import load_audio, load_video

    frames, _ = asyncio.run(preprocess_video(load_video(str(clip), use_gpu=False)))
    kwargs: dict = {"videos": [frames]} | ({"audio": [load_audio(str(audio))]} if audio else {})
    processor, config = processor_and_config(str(model_dir))
    return processor(text=[prompt], return_tensors="pt", **kwargs), config


@cache
def processor_and_config(model_dir: str):
    """transformers' processor of the checkpoint and its thinker's config, read once."""
    from transformers import AutoConfig, AutoProcessor

    return AutoProcessor.from_pretrained(model_dir), AutoConfig.from_pretrained(model_dir).thinker_config


@cache
def hf(model_dir: str):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).thinker.eval()


def hf_greedy(model_dir: Path, prompt: str, clip: Path, audio: Path | None = None, q: float = 0.0,
              keep_mask=evs_keep_mask, shift_from_video: int = 0,
              shift_text_back: bool = False) -> HFReference:  # fmt: skip
    """transformers' processor, towers, `get_rope_index` (audio and video on one time axis) and text model:
    the video's pruned rows (`keep_mask(rows, grid, m, q)` over [main | deepstack levels]) deleted from its
    tokens and positions, the decode offset grown by their count; the controls as `hf_greedy_on_kept`'s."""
    thinker = hf(str(model_dir))
    inputs, cfg = hf_processor_inputs(model_dir, prompt, clip, audio)
    ids = inputs["input_ids"][0]
    with torch.no_grad():
        positions, delta = thinker.get_rope_index(
            ids[None], image_grid_thw=None, video_grid_thw=inputs["video_grid_thw"],
            attention_mask=torch.ones_like(ids)[None], use_audio_in_video=False,
            audio_seqlens=inputs["feature_attention_mask"].sum(-1) if audio else None,
            second_per_grids=inputs.get("video_second_per_grid"),
        )  # fmt: skip
        embeds = thinker.get_input_embeddings()(ids)
        if audio:
            heard = thinker.get_audio_features(inputs["input_features"], inputs["feature_attention_mask"])
            embeds[ids == cfg.audio_token_id] = heard.last_hidden_state
        grid = inputs["video_grid_thw"]
        feats = thinker.get_video_features(inputs["pixel_values_videos"], grid)
        main = torch.cat(list(feats.pooler_output))
        levels = [torch.cat(list(per_video)) for per_video in feats.deepstack_features]
        is_pad = ids == cfg.video_token_id
        keep = torch.ones_like(ids, dtype=torch.bool)
        if q > 0:
            merge = cfg.vision_config.spatial_merge_size
            keep[is_pad] = keep_mask(torch.cat([main, *levels], dim=1), grid[0], merge, q)
        embeds[is_pad] = main
        deepstack = [level[keep[is_pad]] for level in levels]
        shim = SimpleNamespace(model=SimpleNamespace(language_model=thinker.model), lm_head=thinker.lm_head)
        return hf_greedy_on_kept(shim, embeds, positions.long(), delta, keep, is_pad, 8, shift_from_video,
                                 shift_text_back, visual=is_pad, deepstack=deepstack)  # fmt: skip


def test_unpruned_greedy_tokens_equal_hf(served, tiny_qwen3_omni_dir, clips, media_dir):
    assert_matches_hf(served.video["moving", 0.0], hf_greedy(tiny_qwen3_omni_dir, chat_prompt(VIDEO), clips["moving"]),
                      HF_LOGPROB_TOLERANCE)  # fmt: skip
    with_audio = hf_greedy(tiny_qwen3_omni_dir, with_audio_prompt(), clips["noise"], media_dir / "tone.m4a")
    assert_matches_hf(served.with_audio[0.0], with_audio, HF_LOGPROB_TOLERANCE)


@pytest.mark.parametrize("q", [0.5, 0.75])
@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_pruned_greedy_tokens_equal_hf_oracle(served, tiny_qwen3_omni_dir, clips, clip, q):
    """HF given the server's mask, which must be the oracle's on HF's features up to ties."""
    seen = {}
    reference = hf_greedy(tiny_qwen3_omni_dir, chat_prompt(VIDEO), clips[clip], q=q,
                          keep_mask=checked_mask(served.masks["evs", clip, q], seen))  # fmt: skip
    assert_matches_hf(served.video[clip, q], reference, HF_LOGPROB_TOLERANCE)
    assert_masks_agree_up_to_ties(seen["served"], *seen["args"])
    assert seen["served"][int(seen["served"].numel()) // GROUPS :].any()  # kept rows beyond the first group


def test_video_and_audio_pruned_equal_hf_oracle(served, tiny_qwen3_omni_dir, clips, media_dir):
    reference = hf_greedy(tiny_qwen3_omni_dir, with_audio_prompt(), clips["noise"], media_dir / "tone.m4a", q=0.75,
                          keep_mask=served.masks["with_audio", "noise", 0.75])  # fmt: skip
    assert_matches_hf(served.with_audio[0.75], reference, HF_LOGPROB_TOLERANCE)


@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_vidcom2_greedy_tokens_equal_hf_oracle(served, tiny_qwen3_omni_dir, clips, clip):
    seen = {}
    reference = hf_greedy(tiny_qwen3_omni_dir, chat_prompt(VIDEO), clips[clip], q=0.5,
                          keep_mask=checked_mask(served.masks["vidcom2", clip, 0.5], seen))  # fmt: skip
    assert_matches_hf(served.vidcom2[clip], reference, HF_LOGPROB_TOLERANCE)
    assert torch.equal(seen["served"], vidcom2_keep_mask(*seen["args"]))


def test_the_hf_oracle_tells_an_inexact_position_rule(served, tiny_qwen3_omni_dir, clips, media_dir):
    """The controls on the video + audio prompt at .75: every token from the video on one position later, and
    the text after the video renumbered as if the pruned rows never existed; both far from what was served."""
    kw = {"q": 0.75, "keep_mask": served.masks["with_audio", "noise", 0.75]}
    args = (tiny_qwen3_omni_dir, with_audio_prompt(), clips["noise"], media_dir / "tone.m4a")
    one_off = hf_greedy(*args, shift_from_video=1, **kw)
    renumbered = hf_greedy(*args, shift_text_back=True, **kw)
    assert logprob_gap(served.with_audio[0.75], one_off) > HF_LOGPROB_TOLERANCE
    assert logprob_gap(served.with_audio[0.75], renumbered) > 100 * HF_LOGPROB_TOLERANCE
