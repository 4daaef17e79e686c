"""The hybrid families served by this project's classes on the CPU route: Qwen3.5 and Qwen3.5-MoE (float32)
and Qwen4-Exp (bfloat16, the only dtype SGLang serves it in; see `Checkpoint` for what that changes).

The language models are hybrid (Gated DeltaNet layers with per-request recurrent state, and full
attention; Qwen4-Exp adds hyper-connections and per-layer embeddings that read the token ids), served
with SGLang's hybrid cache, chunked prefill and its radix cache. Servers are few and run one at a time:
the module fixture runs every request first and the tests assert on what came back.

Per architecture: an upstream server (`SGLANG_PLUGINS=none`) and a plugin server, both with a
chunk size that cuts the video but not the image, and a third server whose default rate is 0.5,
with a chunk size that cuts inside the video's groups, its positions traced. For Qwen3.5 and Qwen3.5-MoE that
third server runs in graph mode (`sglang_evs.testing.server`, as a GPU serves by default: SGLang's breakable
prefill graphs and its decode graphs, no speculation), and upstream in graph mode with its flags follows it.
Then the dense Qwen3.5 with a third vision layer and three deepstack levels (upstream, plugin, small chunks)
and without them, and Qwen4-Exp in graph mode and at `--tp-size 2` beside upstream with the same flags. VidCom2
reaches them through the same mechanism as EVS: the plugin servers also answer requests that choose it.
"""

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
import requests
import torch

from sglang_evs import trace
from sglang_evs.testing import evs_oracle, media, vidcom2_oracle
from sglang_evs.testing.chunked import assert_every_forward_replayed, chunk_graph_args, traced_request
from sglang_evs.testing.compare import assert_same_generation
from sglang_evs.testing.evs_oracle import keep_mask as evs_keep_mask
from sglang_evs.testing.hf_reference import (
    MASK_TIE,
    HFReference,
    assert_limited_masks_agree_up_to_ties,
    assert_masks_agree_up_to_ties,
    assert_matches_hf,
    assert_served_at_the_rules_positions,
    assert_threshold_masks_agree_up_to_ties,
    checked_mask,
    hf_greedy_on_kept,
    load_in_transformers,
    rule_positions,
    served_mask,
)
from sglang_evs.testing.requests import (
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
from sglang_evs.testing.workload import replayed_padded, send_alone, send_together

pytestmark = pytest.mark.slow  # 19 servers, a few at a time

# SGLang keeps the Gated DeltaNet conv state between prefill chunks in bfloat16 unless told
# otherwise, so where a chunk ends would round the next chunk's input: up to 2.4e-3 in logprobs
# measured here with chunks of 33 against one chunk, upstream's classes alike. Every server of this
# float32 harness keeps it in float32 (then chunked equals one chunk to ~1e-6).
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# Served vs HF transformers, both float32: the same weights through other kernels (SGLang's
# torch-native attention and this project's Gated DeltaNet stand-ins vs transformers' modules).
HF_LOGPROB_TOLERANCE = 1e-4  # measured on these prompts: up to 3.2e-6


@dataclass(frozen=True)
class Checkpoint:
    """An architecture of this module: its checkpoint's fixture and the dtype its servers and HF run in.

    In float32 two ways of serving one request (chunks, batches, radix hits vs one prefill) and HF agree
    on every token and to `tolerance` in logprobs, and the served keep-masks are the oracles' on HF's
    features (EVS up to exact ties). In bfloat16 every one of them rounds otherwise: a near-tie may break
    either way (compared up to it), HF follows the served tokens, and the masks agree up to bfloat16's
    ties. Measured on Qwen4-Exp: chunks and batches vs one prefill up to 0.031 apart, served vs HF up to
    0.032 (HF in bfloat16 vs float32: 0.027) and 0.20 once, one step after a near-tie; EVS masks differ
    only on static cells scoring 0 or 0.0039 where the cut-off is 0.0039; VidCom2 masks share 97-98.5 %
    of their rows (its per-frame budgets follow a softmax at temperature 0.01).
    """

    fixture: str
    dtype: str = "float32"
    graphs: bool = False  # its small-chunk server in graph mode, then upstream in graph mode with the same flags

    @property
    def bfloat16(self) -> bool:
        return self.dtype == "bfloat16"

    @property
    def tolerance(self) -> float:
        return 0.35 if self.bfloat16 else HF_LOGPROB_TOLERANCE  # bfloat16: measured up to 0.20, see above

    @property
    def mask_tie(self) -> float:
        return 0.02 if self.bfloat16 else MASK_TIE

    @property
    def vidcom2_overlap(self) -> float:
        """The least share of the oracle's kept rows the served VidCom2 mask keeps too."""
        return 0.9 if self.bfloat16 else 1.0


ARCHITECTURES = {
    "Qwen3_5ForConditionalGeneration": Checkpoint("tiny_qwen3_5_dir", graphs=True),
    "Qwen3_5MoeForConditionalGeneration": Checkpoint("tiny_qwen3_5_moe_dir", graphs=True),
    # bfloat16 only: SGLang builds its n-gram embeddings and hyper-connections in bfloat16 whatever --dtype says
    "Qwen4ExpForConditionalGeneration": Checkpoint("tiny_qwen4_exp_dir", "bfloat16"),
}
RATES = (0.0, 0.25, 0.5, 0.75, 0.9)
ORACLE_RATES = (0.5, 0.75)
GROUPS = 4  # a 16-frame 4 fps clip -> SGLang samples 8 frames -> 4 temporal groups
CHUNK = 128  # above the image's prompt (80 tokens), below every video's
SMALL_CHUNK = 29  # cuts inside groups and on framing tokens
SMALL_CHUNK_GRAPHS = chunk_graph_args(SMALL_CHUNK)  # it serves one request at a time
GRAPH_ARCHITECTURES = [name for name, checkpoint in ARCHITECTURES.items() if checkpoint.graphs]
GRAPH_CASES = ("image", "video")  # of `parity_cases`, against upstream in graph mode
VIDCOM2_RATES = (0.5, 0.75)
BAD_RATES = (1.5, -0.5, "fast")
LIMITS_ARCHITECTURE = "Qwen3_5ForConditionalGeneration"  # the budget and the floor: one hybrid checkpoint suffices
BAD_LIMITS = (
    ({"video_pruning_threshold": 0.3, "video_pruning_rate": 0.5}, "and video_pruning_threshold=0.3: name one"),
    ({"video_pruning_min_tokens": 4}, "unknown video pruning setting 'video_pruning_min_tokens'"),
)


def limit_settings(tokens: int) -> dict[str, dict]:
    """Per method, a rate, a budget under its count and a floor that binds, for a video of `tokens`."""
    per_group = tokens // GROUPS
    return {
        "evs": {"video_pruning_rate": 0.5, "video_token_budget": tokens * 3 // 8,
                "video_pruning_min_tokens_per_group": per_group * 3 // 10},
        "vidcom2": {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.5,
                    "video_token_budget": tokens * 3 // 10, "video_pruning_min_tokens_per_group": per_group // 4},
        # the tiny checkpoint's moving clip keeps ~a third at .01; the floor then binds in a later group
        "threshold": {"video_pruning_threshold": 0.01, "video_pruning_min_tokens_per_group": per_group * 15 // 100},
    }  # fmt: skip


LIMIT_CLIPS = {"evs": "moving", "vidcom2": "noise", "threshold": "moving"}
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
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["noise"]]), 0.5),
        (chat_prompt(IMAGE, IMAGE, text="Compare them."), media_kwargs(images=[image, image2]), 0.75),
        (chat_prompt(VIDEO, text="What moves?"), media_kwargs(videos=[clips["static"]]), 0.9),
        (chat_prompt(text="Say yes or no."), {}, 0.0),
    ]


@dataclass
class Served:
    """What one architecture's servers answered."""

    upstream: dict[str, Generation] = field(default_factory=dict)
    plugin: dict[str, Generation] = field(default_factory=dict)
    evs: dict[tuple[str, float], Generation] = field(default_factory=dict)  # (clip, q)
    masks: dict[tuple[str, str, float], Callable] = field(default_factory=dict)  # (method, clip, q): served_mask
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
    small_chunk: list[Generation] = field(default_factory=list)  # default .5, SMALL_CHUNK: first, radix repeat
    small_chunk_positions: list[list[dict]] = field(default_factory=list)  # each one's traced rope_positions
    small_chunk_events: list[dict[str, list[dict]]] = field(default_factory=list)  # each one's trace events
    small_chunk_kept: list[int] = field(default_factory=list)  # their keep-mask (kept pad indices)
    small_chunk_mixed: Generation | None = None
    small_chunk_unpruned: Generation | None = None
    # a token budget and a per-group floor (LIMITS_ARCHITECTURE only): name -> (setting, reply at chunk 128)
    limits: dict[str, tuple[dict, Generation]] = field(default_factory=dict)
    limits_small_chunk: list[Generation] = field(default_factory=list)  # LIMITS["evs"] at SMALL_CHUNK, then again
    limits_kept: dict[str, list[int]] = field(default_factory=dict)  # their keep-masks (kept pad indices)
    limits_small_chunk_kept: list[int] = field(default_factory=list)  # the small-chunk server's
    threshold_small_chunk: list[Generation] = field(default_factory=list)  # LIMITS["threshold"] likewise
    threshold_small_chunk_kept: list[int] = field(default_factory=list)
    bad_limits: list[tuple[int, str]] = field(default_factory=list)
    after_bad_limits: Generation | None = None  # (moving, .75) after them
    graphs_q0: dict[str, Generation] = field(default_factory=dict)  # graph-mode small-chunk server, q = 0
    graphs_upstream: dict[str, Generation] = field(default_factory=dict)  # upstream in graph mode, its flags


def video(base_url: str, clip: Path, q: float | None = None, **extra) -> Generation:
    extra = {**per_request_rate(q), **extra} if q is not None else extra
    return generate(base_url, chat_prompt(VIDEO), **media_kwargs(videos=[clip]), **extra)[0]


def serve_architecture(architecture: str, model_dir: Path, media_dir: Path, clips: dict, out: Path) -> Served:
    served = Served(trace_path=out / "trace.jsonl")
    dtype = ARCHITECTURES[architecture].dtype
    args = ["--dtype", dtype, "--chunked-prefill-size", str(CHUNK)]
    cases = parity_cases(media_dir)

    def run_parity(base_url: str) -> dict[str, Generation]:
        results = {name: generate(base_url, prompt, **kw)[0] for name, (prompt, kw) in cases.items()}
        results["radix_repeat"] = generate(base_url, cases["image_video"][0], **cases["image_video"][1])[0]
        return results

    graphs = ARCHITECTURES[architecture].graphs
    small_chunk_args = ["--dtype", dtype, "--chunked-prefill-size", str(SMALL_CHUNK),
                        "--json-model-override-args", '{"video_pruning_rate": 0.5}',
                        *(SMALL_CHUNK_GRAPHS if graphs else ())]  # fmt: skip
    small_chunk_trace = out / "small-chunk-trace.jsonl"
    positions_traced = {trace.ENV: str(small_chunk_trace), trace.POSITIONS_ENV: "1"}
    launches = (
        Launch(model_dir, out / "upstream.log", args, {**HYBRID_ENV, "SGLANG_PLUGINS": "none"}),
        Launch(model_dir, out / "plugin.log", [*args, "--enable-metrics"],
               {**HYBRID_ENV, "SGLANG_EVS_TRACE": str(served.trace_path)}),
        Launch(model_dir, out / "small-chunk.log", small_chunk_args, {**HYBRID_ENV, **positions_traced},
               graph_mode=graphs),
    )  # fmt: skip

    def run_q0(base_url: str, rate: dict) -> dict[str, Generation]:
        """`GRAPH_CASES`, each from an empty cache (so that both servers cut the same chunks)."""
        results = {}
        for name in GRAPH_CASES:
            prompt, kw = cases[name]
            flush_cache(base_url)
            results[name] = generate(base_url, prompt, **kw, **rate)[0]
        return results

    with running_servers(*launches) as (upstream, plugin, small_chunk):
        served.upstream = run_parity(upstream.base_url)
        url = plugin.base_url
        served.plugin = run_parity(url)
        for q in RATES:
            served.evs["moving", q] = video(url, clips["moving"], q)
            if q > 0:  # each rate encodes the clip anew (the rate is part of the video's cache key)
                served.masks["evs", "moving", q] = served_mask(served.trace_path)
        for q in ORACLE_RATES:
            served.evs["noise", q] = video(url, clips["noise"], q)
            served.masks["evs", "noise", q] = served_mask(served.trace_path)
        served.evs_repeat = video(url, clips["moving"], 0.5)
        for q in VIDCOM2_RATES:
            for clip in ("moving", "noise"):
                served.vidcom2[clip, q] = video(url, clips[clip], **per_request_rate(q, "vidcom2"))
                served.masks["vidcom2", clip, q] = served_mask(served.trace_path)
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
        if architecture == LIMITS_ARCHITECTURE:
            for name, setting in limit_settings(served.evs["moving", 0.0].meta["video_tokens"]).items():
                served.limits[name] = setting, video(url, clips[LIMIT_CLIPS[name]], mm_processor_kwargs=setting)
                served.masks["limits", name, 0.5] = served_mask(served.trace_path)
                served.limits_kept[name] = trace.read(served.trace_path, "keep_mask")[-1]["kept"]
            for setting, _ in BAD_LIMITS:
                body = {"text": chat_prompt(VIDEO), "video_data": [str(clips["moving"])],
                        "mm_processor_kwargs": setting, "sampling_params": {"max_new_tokens": 2}}  # fmt: skip
                reply = requests.post(f"{url}/generate", json=body, timeout=120)
                served.bad_limits.append((reply.status_code, reply.text))
            served.after_bad_limits = video(url, clips["moving"], 0.75)
        before = pruning_metrics(url)
        served.metered = video(url, media.write_clip(out / "metered.mp4", "moving", num_frames=16, fps=4, seed=7), 0.5)
        after = pruning_metrics(url)
        served.metrics_delta = counter_increase(before, after)

        for _ in range(2):
            reply, events = traced_request(small_chunk_trace, lambda: video(small_chunk.base_url, clips["moving"]))
            served.small_chunk.append(reply)
            served.small_chunk_positions.append(events["rope_positions"])
            served.small_chunk_events.append(events)
        served.small_chunk_kept = trace.read(small_chunk_trace, "keep_mask")[-1]["kept"]
        prompt, kw, _ = mixed_cases(clips, media_dir)[1]
        served.small_chunk_mixed = generate(small_chunk.base_url, prompt, **kw)[0]
        served.small_chunk_unpruned = video(small_chunk.base_url, clips["moving"], 0.0)
        if architecture == LIMITS_ARCHITECTURE:  # the server's default rate, the request's budget and floor
            setting = {key: value for key, value in served.limits["evs"][0].items() if key != "video_pruning_rate"}
            for _ in range(2):
                served.limits_small_chunk.append(
                    video(small_chunk.base_url, clips["moving"], mm_processor_kwargs=setting)
                )
            served.limits_small_chunk_kept = trace.read(small_chunk_trace, "keep_mask")[-1]["kept"]
            threshold = served.limits["threshold"][0]
            for _ in range(2):
                served.threshold_small_chunk.append(
                    video(small_chunk.base_url, clips["moving"], mm_processor_kwargs=threshold)
                )
            served.threshold_small_chunk_kept = trace.read(small_chunk_trace, "keep_mask")[-1]["kept"]
        if graphs:
            served.graphs_q0 = run_q0(small_chunk.base_url, per_request_rate(0.0))
    if graphs:  # after the fleet: at most three servers at once
        upstream_env = {**HYBRID_ENV, "SGLANG_PLUGINS": "none"}
        graph_upstream = Launch(model_dir, out / "small-chunk-upstream.log", small_chunk_args, upstream_env,
                                graph_mode=True)  # fmt: skip
        with running_servers(graph_upstream) as (graph_upstream_server,):
            served.graphs_upstream = run_q0(graph_upstream_server.base_url, {})
    return served


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("qwen3_5_clips")
    return {
        kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=3) for kind in media.CLIP_KINDS
    }


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def served(arch, request, media_dir, clips, tmp_path_factory) -> Served:
    """One architecture's servers (pytest runs every test of one architecture before the next's start)."""
    model_dir = request.getfixturevalue(ARCHITECTURES[arch].fixture)
    return serve_architecture(arch, model_dir, media_dir, clips, tmp_path_factory.mktemp(arch))


# --- q = 0: this project's classes serve exactly as upstream's


def test_plugin_serves_bit_identically_to_upstream(served, arch):
    """Text, image, video, image + video (the videos cut by the chunk size) and a radix repeat:
    tokens, logprobs and top-5 logprobs equal exactly."""
    got = served
    assert set(got.plugin) == {"text", "image", "video", "image_video", "radix_repeat"}
    assert got.plugin == got.upstream
    assert got.plugin["radix_repeat"].cached_tokens > 0
    assert got.plugin["image"].output_ids != got.plugin["video"].output_ids  # media reach the model


def test_our_classes_and_routine_served_with_no_deepstack_buffer(served, arch):
    trace_path = served.trace_path
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
    unpruned, pruned = served.evs["moving", 0.0], served.evs["moving", q]
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


def test_chunk_sizes_and_radix_hits_give_identical_tokens(served, arch):
    """The plugin server cuts the video at 128 tokens; the small-chunk server (default rate 0.5)
    cuts inside its groups and on framing tokens, then serves it again from the radix cache."""
    got, checkpoint = served, ARCHITECTURES[arch]

    def same(one: Generation, other: Generation, context: str) -> None:
        assert_same_generation(one, other, checkpoint.tolerance, context, checkpoint.bfloat16)

    reference = got.evs["moving", 0.5]
    assert got.evs_repeat.cached_tokens > 0
    same(got.evs_repeat, reference, "radix hit, chunk 128")
    first, again = got.small_chunk
    assert again.cached_tokens > 0
    same(first, reference, f"chunk {SMALL_CHUNK}")
    same(again, reference, f"chunk {SMALL_CHUNK}, radix hit")
    same(got.small_chunk_mixed, got.mixed_alone[1], "image and two videos, small chunk vs 128")
    same(got.small_chunk_unpruned, got.evs["moving", 0.0], "unpruned, small chunk vs 128")


def test_every_forward_of_a_chunked_pruned_video_is_at_the_rules_positions(served, arch, model_dir, clips):
    """Every prefill chunk (of SMALL_CHUNK tokens, cutting the video's groups) and decode step of a video at
    the server's default .5, and of its radix repeat, handed the language model exactly the positions of
    transformers' `get_rope_index` on the unpruned prompt, the server's keep-mask applied (integers: what
    no dtype's rounding blurs). The control: the rule with every token from the middle of the prompt on
    one position later is not what was served."""
    rule, offset = rule_positions(str(model_dir), str(clips["moving"]), tuple(served.small_chunk_kept))
    (first, again), (first_events, again_events) = served.small_chunk, served.small_chunk_positions
    assert again.cached_tokens > 0
    assert_served_at_the_rules_positions(((first, first_events), (again, again_events)), rule, offset)


def test_the_rate_is_part_of_the_cache_key(served, arch):
    """The hybrid cache keeps linear-attention state only where a prefill chunk ended, so a repeat
    hits up to the last chunk boundary (a multiple of the chunk size) inside the video."""
    first, again, other = served.cache_keys
    assert again.cached_tokens >= (first.prompt_tokens - 1) // CHUNK * CHUNK > 20
    assert other.cached_tokens < 20  # at most the text before the video


def test_mixed_media_batched_equal_each_request_alone(served, arch):
    got = served
    shared_forwards, cached, prompt_tokens = got.mixed_prefill
    assert shared_forwards > 0 and cached < prompt_tokens // 4, got.mixed_prefill  # batched, not cache hits
    for one, many in zip(got.mixed_alone, got.mixed_together, strict=True):
        checkpoint = ARCHITECTURES[arch]
        assert_same_generation(many, one, checkpoint.tolerance, "batched vs alone", checkpoint.bfloat16)


def test_bad_rates_get_400_and_serving_goes_on(served, arch):
    got = served
    for status, text in got.bad:
        assert status == 400 and "video_pruning_rate must be a number in [0, 1)" in text
    assert {tuple(g.output_ids) for g in got.after_bad} == {tuple(got.evs["moving", 0.75].output_ids)}


def test_prometheus_counts_what_was_pruned(served, arch):
    got = served
    for name in COUNTS:
        assert got.metrics_delta[name] == got.metered.meta[name], name
    assert got.metrics_delta["pruned_videos"] == 1
    assert got.metered.meta["video_tokens_after_pruning"] < got.metered.meta["video_tokens_before_pruning"]


# --- the independent oracle: HF transformers' Qwen3.5 given the kept tokens at the reference positions


@pytest.fixture(scope="module")
def model_dir(arch, request) -> Path:
    return request.getfixturevalue(ARCHITECTURES[arch].fixture)


@cache
def hf(model_dir: str, architecture: str):
    from transformers import AutoProcessor

    model = load_in_transformers(model_dir, ARCHITECTURES[architecture].dtype)
    return model, AutoProcessor.from_pretrained(model_dir)


def hf_greedy(architecture: str, model_dir: Path, prompt: str, image: Path | None = None, clip: Path | None = None,
              q: float = 0.0, steps: int = 8, keep_mask=evs_keep_mask, shift_text_back: bool = False,
              shift_from_video: int = 0, follow: Generation | None = None) -> HFReference:  # fmt: skip
    """Transformers' own processor, vision tower, `get_rope_index` and language model; a video's
    pruned pads (`keep_mask(rows, grid, m, q)`, an oracle written here) deleted from its tokens and
    positions (the reference rule), the decode offset grown by their count. `shift_text_back` is the
    control: the text after the video moved back by the pruned count, as a rule that renumbers the
    compacted sequence would place it; `shift_from_video` another: every token from the video's first
    pad on (generated ones too) moved by that many positions (a one-position error). `follow`: a served
    reply whose tokens HF continues with, where the checkpoint is in bfloat16 (`Checkpoint`)."""
    from PIL import Image
    from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
    from sglang.srt.utils.common import load_video

    model, processor = hf(str(model_dir), architecture)
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
            pixels = inputs["pixel_values"].to(model.dtype)
            rows = inner.get_image_features(pixels, inputs["image_grid_thw"]).pooler_output
            embeds[ids == cfg.image_token_id] = torch.cat(list(rows))
        if clip is not None:
            grid = inputs["video_grid_thw"]
            pixels = inputs["pixel_values_videos"].to(model.dtype)
            rows = torch.cat(list(inner.get_video_features(pixels, grid).pooler_output))
            is_pad = ids == cfg.video_token_id
            embeds[is_pad] = rows
            if q > 0:
                keep[is_pad] = keep_mask(rows, grid[0], cfg.vision_config.spatial_merge_size, q)
        video_rows = ids == cfg.video_token_id
        reads_ids = bool(getattr(cfg.text_config, "ple_layer_ids", None))  # Qwen4-Exp's per-layer embeddings
        forced = follow.output_ids if follow is not None and ARCHITECTURES[architecture].bfloat16 else None
        return hf_greedy_on_kept(model, embeds, positions, delta, keep, video_rows, steps, shift_from_video,
                                 shift_text_back, ids=ids if reads_ids else None, forced=forced)  # fmt: skip


def test_unpruned_greedy_tokens_equal_hf(served, arch, model_dir, media_dir):
    got, tolerance = served.plugin, ARCHITECTURES[arch].tolerance
    image, _ = parity_cases(media_dir)["image"]
    reference = hf_greedy(arch, model_dir, image, image=media_dir / "image.png", follow=got["image"])
    assert_matches_hf(got["image"], reference, tolerance)
    reference = hf_greedy(arch, model_dir, chat_prompt(VIDEO), clip=media_dir / "moving.mp4", follow=got["video"])
    assert_matches_hf(got["video"], reference, tolerance)


@pytest.mark.parametrize("q", ORACLE_RATES)
@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_pruned_greedy_tokens_equal_hf_oracle(served, arch, model_dir, clips, q, clip):
    """HF given the server's mask, which must be the oracle's on HF's features up to ties (a static
    background's cells score alike, and two encoders' rounding picks among them)."""
    got, seen = served.evs[clip, q], {}
    mask = checked_mask(served.masks["evs", clip, q], seen)
    reference = hf_greedy(arch, model_dir, chat_prompt(VIDEO), clip=clips[clip], q=q, keep_mask=mask, follow=got)
    assert_matches_hf(got, reference, ARCHITECTURES[arch].tolerance)
    assert_masks_agree_up_to_ties(seen["served"], *seen["args"], tie=ARCHITECTURES[arch].mask_tie)


@pytest.mark.parametrize(
    "arch", [name for name, checkpoint in ARCHITECTURES.items() if checkpoint.dtype == "float32"], scope="module"
)
def test_the_hf_oracle_tells_an_inexact_position_rule(served, arch, model_dir, clips):
    """The control: HF with the text after the video renumbered as if the pruned tokens never
    existed is far from what was served, so the tolerance above separates exact from inexact.
    Float32 checkpoints only: in bfloat16 (Qwen4-Exp) a one-position error moves these logprobs by
    0.01-0.02, less than the two implementations' rounding (0.02-0.03); there the positions test above,
    which compares integers, tells exact from inexact."""
    got, tolerance = served.evs["moving", 0.75], ARCHITECTURES[arch].tolerance
    kw = {"clip": clips["moving"], "q": 0.75, "keep_mask": served.masks["evs", "moving", 0.75], "follow": got}
    control = hf_greedy(arch, model_dir, chat_prompt(VIDEO), shift_text_back=True, **kw)
    assert logprob_gap(got, control) > 100 * tolerance
    one_off = hf_greedy(arch, model_dir, chat_prompt(VIDEO), shift_from_video=1, **kw)
    assert logprob_gap(got, one_off) > tolerance  # a one-position error


# --- VidCom2, the second method, through the same mechanism


@pytest.mark.parametrize("q", VIDCOM2_RATES)
def test_vidcom2_prompt_tokens_follow_its_count(served, arch, q):
    unpruned, pruned = served.evs["moving", 0.0], served.vidcom2["moving", q]
    tokens = unpruned.meta["video_tokens"]
    kept = max(GROUPS, int(tokens * (1 - q)))  # VidCom2's count, written out here
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (tokens - kept)
    assert pruned.meta["video_pruning_method"] == "vidcom2" and pruned.meta["video_pruning_rate"] == q
    assert pruned.meta["video_tokens_after_pruning"] == pruned.meta["video_tokens"] == kept


@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_vidcom2_greedy_tokens_equal_hf_oracle(served, arch, model_dir, clips, clip):
    """HF given the server's mask, which must be the VidCom2 oracle's on HF's features (`Checkpoint`)."""
    q, seen = VIDCOM2_RATES[0], {}
    got, mask = served.vidcom2[clip, q], checked_mask(served.masks["vidcom2", clip, q], seen)
    reference = hf_greedy(arch, model_dir, chat_prompt(VIDEO), clip=clips[clip], q=q, keep_mask=mask, follow=got)
    assert_matches_hf(got, reference, ARCHITECTURES[arch].tolerance)
    oracle = vidcom2_keep_mask(*seen["args"])
    assert int(seen["served"].sum()) == int(oracle.sum())
    assert int((seen["served"] & oracle).sum()) >= ARCHITECTURES[arch].vidcom2_overlap * int(oracle.sum())


# --- a token budget and a per-group floor, through the same mechanism (one hybrid checkpoint)


def hf_video_rows(architecture: str, model_dir: Path, clip: Path) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Transformers' vision rows of a video prompt as `hf_greedy` computes them: ([T * h * w, D], grid, m)."""
    from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
    from sglang.srt.utils.common import load_video

    model, processor = hf(str(model_dir), architecture)
    frames, metadata = asyncio.run(preprocess_video(load_video(str(clip), use_gpu=False)))
    inputs = processor(text=[chat_prompt(VIDEO)], videos=[frames], video_metadata=[metadata], do_sample_frames=False,
                       return_tensors="pt")  # fmt: skip
    grid = inputs["video_grid_thw"]
    with torch.no_grad():
        pixels = inputs["pixel_values_videos"].to(model.dtype)
        rows = torch.cat(list(model.model.get_video_features(pixels, grid).pooler_output))
    return rows, grid[0], model.config.vision_config.spatial_merge_size


def assert_limits_laid_out(got: Generation, setting: dict) -> tuple[int, int]:
    """The count laid out is the rule's at rate .5, where the budget binds; returns (budget, floor)."""
    budget, floor = setting["video_token_budget"], setting["video_pruning_min_tokens_per_group"]
    tokens = got.meta["video_tokens_before_pruning"]
    kept = max(min(budget, max(GROUPS, tokens // 2)), floor * GROUPS)  # the count, written out: rate .5
    assert got.meta["video_tokens_after_pruning"] == got.meta["video_tokens"] == kept == budget
    assert (got.meta["video_token_budget"], got.meta["video_pruning_min_tokens_per_group"]) == (budget, floor)
    return budget, floor


@pytest.mark.parametrize("arch", [LIMITS_ARCHITECTURE], scope="module")
def test_budget_and_floor_greedy_tokens_equal_hf_oracle(served, arch, model_dir, clips):
    """EVS under a budget and a floor that both bind: HF given the server's mask at the reference positions
    agrees, and the mask is the oracle's on HF's features up to ties."""
    setting, got = served.limits["evs"]
    budget, floor = assert_limits_laid_out(got, setting)
    seen, checkpoint = {}, ARCHITECTURES[arch]
    mask = checked_mask(served.masks["limits", "evs", 0.5], seen)
    reference = hf_greedy(arch, model_dir, chat_prompt(VIDEO), clip=clips[LIMIT_CLIPS["evs"]], q=0.5, keep_mask=mask,
                          follow=got)  # fmt: skip
    assert_matches_hf(got, reference, checkpoint.tolerance)
    rows, grid, merge, q = seen["args"]
    assert_limited_masks_agree_up_to_ties(seen["served"], rows, grid, merge, q, budget, floor, checkpoint.mask_tie)
    budget_alone = evs_oracle.limited_keep_mask(rows, grid, merge, q, budget)
    assert min(budget_alone.view(GROUPS, -1).sum(dim=1).tolist()) < floor  # the floor binds


@pytest.mark.parametrize("arch", [LIMITS_ARCHITECTURE], scope="module")
def test_vidcom2_takes_the_budget_and_the_floor(served, arch, model_dir, clips):
    """VidCom2 under a budget and a floor that both bind: the count laid out is the rule's and the served mask is
    the oracle's on HF's features, exactly (float32). (The mask's layout is the mechanism's, whatever the method:
    the EVS case above holds it to HF.)"""
    setting, got = served.limits["vidcom2"]
    budget, floor = assert_limits_laid_out(got, setting)
    rows, grid, merge = hf_video_rows(arch, model_dir, clips[LIMIT_CLIPS["vidcom2"]])
    kept = served.masks["limits", "vidcom2", 0.5](rows, grid, merge, 0.5)
    assert torch.equal(kept, vidcom2_oracle.limited_keep_mask(rows, grid, merge, 0.5, budget, floor))
    budget_alone = vidcom2_oracle.limited_keep_mask(rows, grid, merge, 0.5, budget)
    assert min(budget_alone.view(GROUPS, -1).sum(dim=1).tolist()) < floor  # the floor binds


@pytest.mark.parametrize("arch", [LIMITS_ARCHITECTURE], scope="module")
def test_budget_and_floor_in_small_chunks_and_after_a_radix_hit(served, arch):
    """The EVS case at the small-chunk server's default rate: its chunks cut inside the groups; served as at
    chunk 128 (the same mask, the same tokens), then again from the radix cache."""
    _, reference = served.limits["evs"]
    first, again = served.limits_small_chunk
    assert again.cached_tokens > 0
    assert served.limits_small_chunk_kept == served.limits_kept["evs"]
    for reply, context in ((first, f"chunk {SMALL_CHUNK}"), (again, f"chunk {SMALL_CHUNK}, radix hit")):
        assert reply.prompt_tokens == reference.prompt_tokens
        assert_same_generation(reply, reference, HF_LOGPROB_TOLERANCE, f"budget and floor, {context}")


@pytest.mark.parametrize("arch", [LIMITS_ARCHITECTURE], scope="module")
def test_a_threshold_equals_hf_oracle_in_small_chunks_and_after_a_radix_hit(served, arch, model_dir, clips):
    """A threshold and a floor that binds: laid out when the scheduler admitted the request, HF given the server's
    mask at the reference positions agrees, the mask is the oracle's on HF's features up to ties; the small-chunk
    server (29-token chunks, in graph mode) decides the same mask and serves the same tokens, then again from its
    radix cache."""
    setting, got = served.limits["threshold"]
    threshold, floor = setting["video_pruning_threshold"], setting["video_pruning_min_tokens_per_group"]
    seen, checkpoint = {}, ARCHITECTURES[arch]
    mask = checked_mask(served.masks["limits", "threshold", 0.5], seen)
    reference = hf_greedy(arch, model_dir, chat_prompt(VIDEO), clip=clips["moving"], q=threshold, keep_mask=mask,
                          follow=got)  # fmt: skip
    assert_matches_hf(got, reference, checkpoint.tolerance)
    rows, grid, merge, _ = seen["args"]
    kept, tokens = int(seen["served"].sum()), got.meta["video_tokens_before_pruning"]
    assert got.meta["video_tokens_after_pruning"] == got.meta["video_tokens"] == kept
    assert tokens // GROUPS < kept < tokens  # the content decided: more than group 0, less than all
    assert got.meta["video_pruning_threshold"] == threshold
    assert_threshold_masks_agree_up_to_ties(seen["served"], rows, grid, merge, threshold, 0, floor, checkpoint.mask_tie)
    alone = evs_oracle.threshold_keep_mask(rows, grid, merge, threshold)
    assert min(alone.view(GROUPS, -1).sum(dim=1).tolist()) < floor  # the floor binds
    first, again = served.threshold_small_chunk
    assert again.cached_tokens > 0  # a hybrid model's radix hits end where a state was kept: a chunk's end
    assert served.threshold_small_chunk_kept == served.limits_kept["threshold"]
    for reply, context in ((first, f"chunk {SMALL_CHUNK}"), (again, f"chunk {SMALL_CHUNK}, radix hit")):
        assert reply.prompt_tokens == got.prompt_tokens  # the HF oracle's served prompt, at chunk 128
        assert_same_generation(reply, got, HF_LOGPROB_TOLERANCE, f"threshold, {context}")


@pytest.mark.parametrize("arch", [LIMITS_ARCHITECTURE], scope="module")
def test_a_threshold_beside_a_rate_and_a_misspelt_setting_get_400_and_serving_goes_on(served, arch):
    for (status, text), (_, message) in zip(served.bad_limits, BAD_LIMITS, strict=True):
        assert status == 400 and message in text, text
    assert served.after_bad_limits.output_ids == served.evs["moving", 0.75].output_ids


# --- graph mode without speculation (Qwen3.5 and Qwen3.5-MoE; speculating: test_speculative_decoding.py)


@pytest.mark.parametrize("arch", GRAPH_ARCHITECTURES, scope="module")
def test_graph_mode_at_q0_is_bit_identical_to_upstream_in_graph_mode(served, arch):
    """An image and a video in 29-token chunks at q = 0, both servers replaying SGLang's prefill graphs (upstream
    has them on for Qwen3.5) and decode graphs: tokens, logprobs and top-5 equal exactly."""
    assert set(served.graphs_q0) == set(GRAPH_CASES)
    assert served.graphs_q0 == served.graphs_upstream
    unpruned = served.plugin["video"].meta["video_tokens"]  # the eager server's, q = 0
    assert served.graphs_q0["video"].meta["video_tokens"] == unpruned > 0


@pytest.mark.parametrize("arch", GRAPH_ARCHITECTURES, scope="module")
def test_every_forward_of_a_pruned_video_replays_a_graph(served, arch):
    """The video at the graph-mode server's default .5, in 29-token chunks, then again from its radix cache: every
    prefill chunk replayed a prefill graph reading the model's position buffer, every decode step a decode graph
    (the trace); the replies are the eager server's (tokens; logprobs within 1e-4, the eager server's chunks are
    128 tokens). Their positions are the rule's (`test_every_forward_of_a_chunked_pruned_video_is_at_the_rules_...`
    above, which reads the replays' positions from the buffer they read)."""
    eager, tolerance = served.evs["moving", 0.5], ARCHITECTURES[arch].tolerance
    assert served.small_chunk[1].cached_tokens > 0
    for reply, events in zip(served.small_chunk, served.small_chunk_events, strict=True):
        chunks = math.ceil((reply.prompt_tokens - reply.cached_tokens) / SMALL_CHUNK)
        assert_every_forward_replayed(reply, events, chunks)
        assert_same_generation(reply, eager, tolerance, "graph mode in 29-token chunks vs eager in 128")


# --- Qwen4-Exp under graph mode and at --tp-size 2 (Qwen3.5's with speculation: test_speculative_decoding.py)

QWEN4_EXP = "Qwen4ExpForConditionalGeneration"
LAYOUTS = {  # name -> (server arguments beyond the dtype, graph mode)
    # few graph sizes: one request at a time, and media prefills stay eager (test below); 26 s of capture saved
    "graphs": (
        (
            "--chunked-prefill-size",
            str(CHUNK),
            "--cuda-graph-bs-prefill",
            "64",
            "--cuda-graph-bs-decode",
            "1",
            "2",
            "4",
        ),
        True,
    ),  # fmt: skip
    "tp2": (("--chunked-prefill-size", str(CHUNK), "--tp-size", "2"), False),
}


@pytest.fixture(scope="module")
def layouts(arch, model_dir, media_dir, clips, tmp_path_factory) -> dict:
    """{(layout, "plugin" | "upstream", case): reply}, and ("trace",): the plugin's graph-mode trace. Cases:
    image and video at q = 0 on both; the video at .75 on the plugin's."""
    out = tmp_path_factory.mktemp("qwen4_exp_layouts")
    cases = {name: parity_cases(media_dir)[name] for name in ("image", "video")}
    args = ["--dtype", ARCHITECTURES[arch].dtype]
    launches, keys, results = [], [], {("trace",): out / "graphs-trace.jsonl"}
    for layout, (flags, graphs) in LAYOUTS.items():
        for side in ("plugin", "upstream"):
            env = {**HYBRID_ENV, "SGLANG_PLUGINS": "none"} if side == "upstream" else dict(HYBRID_ENV)
            if side == "plugin" and graphs:
                env[trace.ENV] = str(results["trace",])
            launches.append(Launch(model_dir, out / f"{layout}-{side}.log", [*args, *flags], env, graph_mode=graphs))
            keys.append((layout, side))
    with running_servers(*launches) as servers:
        for (layout, side), server in zip(keys, servers, strict=True):
            for name, (prompt, kw) in cases.items():
                results[layout, side, name] = generate(server.base_url, prompt, **kw)[0]
            if side == "plugin":
                results[layout, side, "pruned"] = video(server.base_url, clips["moving"], 0.75)
            if side == "plugin" and LAYOUTS[layout][1]:
                padded = [mixed_cases(clips, media_dir)[i] for i in PADDED]
                results[layout, "padded"] = replayed_padded(server.base_url, padded, results["trace",], "DECODE")
    return results


PADDED = (3, 7, 5)  # of `mixed_cases`: two texts and two images, at once: 3 live rows of a 4-row decode graph


@pytest.mark.parametrize("arch", [QWEN4_EXP], scope="module")
def test_qwen4_exp_in_graph_mode_and_at_tp2_as_upstream_and_as_one_eager_rank(layouts, served, arch):
    """At q = 0 the plugin serves image and video bit-identically to upstream with the same flags (SGLang's
    CUDA-graph runners on the CPU route; two tensor-parallel ranks); the video pruned at .75 gives the tokens
    of one eager rank (up to bfloat16's near-ties), decoding in replayed graphs. SGLang keeps Qwen4-Exp's
    prefill eager for batches with media (`PrefillCudaGraphRunner.can_replay_locally`: its hyper-connection
    side channel), so those run as upstream runs them."""
    checkpoint = ARCHITECTURES[arch]
    for layout in LAYOUTS:
        for name in ("image", "video"):
            assert layouts[layout, "plugin", name] == layouts[layout, "upstream", name], (layout, name)
        pruned = layouts[layout, "plugin", "pruned"]
        assert pruned.meta["video_tokens_after_pruning"] < pruned.meta["video_tokens_before_pruning"]
        eager = served.evs["moving", 0.75]
        assert_same_generation(pruned, eager, checkpoint.tolerance, f"{layout} vs eager", checkpoint.bfloat16)
    replays = trace.read(layouts["trace",], "graph_replay")
    assert any(event["mode"] == "DECODE" and event["media"] for event in replays)
    assert not any(event["mode"] == "EXTEND" and event["media"] for event in replays)


@pytest.mark.parametrize("arch", [QWEN4_EXP], scope="module")
def test_qwen4_exp_padded_decode_replays_give_each_request_its_eager_tokens(layouts, served, arch):
    """Three requests at once decode in graphs of 4 rows, the fourth SGLang's padding (Mamba slot -1): each
    gets the tokens the eager server gave it alone (up to bfloat16's near-ties: a batch of three rounds
    otherwise than one request)."""
    checkpoint = ARCHITECTURES[arch]
    for layout, (_, graphs) in LAYOUTS.items():
        if not graphs:
            continue
        replies, replays = layouts[layout, "padded"]
        assert any(event["mode"] == "DECODE" and event["requests"] == len(PADDED) for event in replays), layout
        for index, reply in zip(PADDED, replies, strict=True):
            want = served.mixed_alone[index]
            assert_same_generation(reply, want, checkpoint.tolerance, f"{layout}, case {index}", checkpoint.bfloat16)


# --- a Qwen3.5 checkpoint with deepstack levels: they travel in the fixed buffer


@dataclass
class DeepstackServed:
    upstream: dict[str, Generation]
    plugin: dict[str, Generation]
    without_levels: dict[str, Generation]  # the same weights but the deepstack mergers
    pruned: Generation  # (moving, 0.5), chunk 128
    pruned_small_chunk: list[Generation]  # the same with chunk SMALL_CHUNK, then again from the radix cache
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
    assert_same_generation(first, pruned, 1e-4, f"deepstack, chunk {SMALL_CHUNK}")
    assert_same_generation(again, pruned, 1e-4, f"deepstack, chunk {SMALL_CHUNK}, radix hit")
