"""EVS on Qwen2.5-VL and Qwen2-VL, served end to end on tiny models (float32).

Their videos are one run of pads with no text between groups; positions come from
upstream's own `get_rope_index` (absolute time for Qwen2.5-VL). The same guarantees as
Qwen3-VL: exact counts, an HF oracle, chunked prefill and radix hits, mixed media.
"""

from pathlib import Path

import pytest
import torch

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.chunked import assert_chunks_equal, served_in_chunks
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.evs_oracle import keep_mask
from sglang_evs.testing.hf_reference import (
    HFReference,
    assert_masks_agree_up_to_ties,
    assert_matches_hf,
    checked_mask,
    hf,
    hf_greedy_on_kept,
    sampled_frames,
    served_mask,
    unseen_clip,
)
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    chat_prompt,
    counter_increase,
    flush_cache,
    generate,
    logprob_gap,
    media_kwargs,
    per_request_rate,
    pruning_metrics,
)
from sglang_evs.testing.server import PRUNING_DEFAULT_ARGS, running_server
from sglang_evs.testing.vidcom2_oracle import keep_mask as vidcom2_keep_mask
from sglang_evs.testing.workload import send_alone, send_together

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)

ARCHITECTURES = {
    "Qwen2_5_VLForConditionalGeneration": "tiny_qwen2_5_vl_dir",
    "Qwen2VLForConditionalGeneration": "tiny_qwen2_vl_dir",
}
GROUPS = 4  # a 16-frame 4 fps clip -> SGLang samples 8 frames -> 4 temporal groups
THRESHOLD = {"video_pruning_threshold": 0.3}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("qwen2_clips")
    return {
        kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=3) for kind in media.CLIP_KINDS
    }


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def served(request, tmp_path_factory):
    """(architecture, model_dir, server, trace_path) for one architecture, default rate 0."""
    architecture = request.param
    model_dir = request.getfixturevalue(ARCHITECTURES[architecture])
    out = tmp_path_factory.mktemp(architecture)
    env = {"SGLANG_EVS_TRACE": str(out / "trace.jsonl")}
    with running_server(model_dir, out / "server.log", ["--dtype", "float32", "--enable-metrics"], env=env) as server:
        yield architecture, model_dir, server, out / "trace.jsonl"


def video(server, clip, q, **extra):
    kwargs = {**media_kwargs(videos=[clip]), **per_request_rate(q), **extra}
    return generate(server.base_url, chat_prompt(VIDEO), **kwargs)[0]


def test_our_adapter_serves_with_fixed_buffers(served):
    architecture, _, server, trace_path = served
    video(server, media.write_clip(trace_path.parent / "c.mp4", "moving", num_frames=8, fps=4), 0.5)
    (allocated,) = trace.read(trace_path, "graph_inputs_allocated")
    assert allocated["model"] == architecture and allocated["deepstack_ptr"] is None
    calls = [c for c in trace.read(trace_path, "language_model_inputs") if c["mode"] == "EXTEND"]
    assert calls and {c["positions_ptr"] for c in calls} == {allocated["positions_ptr"]}


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 0.9])
def test_prompt_tokens_drop_by_exactly_the_pruned_count(served, clips, q):
    _, _, server, trace_path = served
    unpruned = video(server, clips["moving"], 0.0)
    tokens = unpruned.meta["video_tokens"]
    per_group = tokens // GROUPS
    assert per_group * GROUPS == tokens
    kept = max(per_group, int(GROUPS * per_group * (1 - q)))  # the EVS count, written out here
    pruned = video(server, clips["moving"], q)
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (tokens - kept)
    assert pruned.meta["video_tokens"] == kept
    if q > 0:
        assert pruned.meta["video_tokens_before_pruning"] == tokens
        assert pruned.meta["video_tokens_after_pruning"] == kept


def test_images_are_never_pruned(served, media_dir):
    _, _, server, _ = served
    prompt, kwargs = chat_prompt(IMAGE, IMAGE), media_kwargs(images=[media_dir / "image.png", media_dir / "image2.png"])
    runs = []
    for q in (0.9, 0.0):
        flush_cache(server.base_url)
        runs.append(generate(server.base_url, prompt, **kwargs, **per_request_rate(q))[0])
    assert runs[0] == runs[1]


def test_mixed_media_in_either_order_and_batched_equal_each_request_alone(served, clips, media_dir):
    """Video then image and image then video (vLLM's Qwen2.5-VL EVS crashed on the first: vLLM issue
    27859), two videos, and a batch of 8 concurrent mixed requests, one of them with two videos that
    are not pruned (SGLang keeps those in one item). Each alone, then all at once from an empty cache."""
    _, _, server, trace_path = served
    image, image2 = media_dir / "image.png", media_dir / "image2.png"
    cases = [
        (chat_prompt(VIDEO, IMAGE), media_kwargs(images=[image], videos=[clips["moving"]]), 0.75),
        (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[image2], videos=[clips["noise"]]), 0.75),
        # two videos SGLang bundles in one item, split and laid out by a threshold as the scheduler admits them
        (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[clips["noise"], clips["moving"]]), THRESHOLD),
        (chat_prompt(IMAGE), media_kwargs(images=[image]), 0.75),
        (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[clips["static"], clips["noise"]]), 0.0),
        (chat_prompt(text="Count the objects."), {}, 0.75),
        (
            chat_prompt(VIDEO, IMAGE, VIDEO),
            media_kwargs(images=[image2], videos=[clips["static"], clips["noise"]]),
            0.5,
        ),
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]]), 0.75),
    ]
    alone = send_alone(server.base_url, cases)
    together, (shared_forwards, cached, prompt_tokens) = send_together(server.base_url, cases, trace_path)
    assert shared_forwards > 0 and cached < prompt_tokens // 4, (shared_forwards, cached, prompt_tokens)
    decided = alone[2].meta
    assert 0 < decided["video_tokens_after_pruning"] < decided["video_tokens_before_pruning"]
    for one, many in zip(alone, together, strict=True):
        assert many.prompt_tokens == one.prompt_tokens
        assert_same_greedy(many, one, "batched vs alone")


def test_chunked_prefill_and_radix_hits_equal_single_chunk(served, clips, media_dir, tmp_path):
    """The module's server (SGLang's default chunk size holds each prompt whole) is the reference; 7- and
    50-token chunks cut inside and at the edges of every video, the 50-token ones in graph mode."""
    architecture, model_dir, server, _ = served
    cases = [
        (chat_prompt(VIDEO), {**media_kwargs(videos=[clips["moving"]]), **per_request_rate(0.5)}),
        (chat_prompt(IMAGE, VIDEO, VIDEO),
         {**media_kwargs(images=[media_dir / "image.png"], videos=[clips["noise"], clips["moving"]]),
          **per_request_rate(0.5)}),
    ]  # fmt: skip
    flush_cache(server.base_url)
    reference = [generate(server.base_url, prompt, **kwargs)[0] for prompt, kwargs in cases]
    args = ["--dtype", "float32", *PRUNING_DEFAULT_ARGS]  # prefill graphs on in graph mode (each case names its rate)
    results = served_in_chunks(model_dir, cases, (7, 50), args, tmp_path, graph_chunk=50)
    assert_chunks_equal(results, reference, architecture)


# --- the independent oracle: HF transformers' model given the kept tokens at the reference positions


def hf_pruned_greedy(
    model_dir: Path, clip: Path, q: float, steps: int = 8, mask_oracle=keep_mask, shift_text_back: bool = False,
    shift_from_video: int = 0,
) -> HFReference:  # fmt: skip
    """Transformers' own processor, vision tower, `get_rope_index` (with `second_per_grid_ts` for
    Qwen2.5-VL) and language model; the pruned pads' rows deleted from its tokens and positions.
    Two controls: ``shift_text_back``, the text after the video moved back by the pruned count, as a
    rule that renumbers the compacted sequence would place it; ``shift_from_video``, every token from
    the video's first pad on (generated ones too) moved by that many positions (a one-position error)."""
    model, processor = hf(str(model_dir))
    frames, _ = sampled_frames(clip)
    inputs = processor(text=[chat_prompt(VIDEO)], videos=[frames], return_tensors="pt")  # as SGLang calls it
    ids, grid = inputs["input_ids"][0], inputs["video_grid_thw"]
    with torch.no_grad():
        timing = {"second_per_grid_ts": inputs["second_per_grid_ts"]} if "second_per_grid_ts" in inputs else {}
        positions, delta = model.model.get_rope_index(
            ids[None], inputs["mm_token_type_ids"], video_grid_thw=grid, **timing
        )
        features = model.model.get_video_features(inputs["pixel_values_videos"], grid)
        rows = torch.cat(list(getattr(features, "pooler_output", features)))
        mask = mask_oracle(rows, grid[0], model.config.vision_config.spatial_merge_size, q)
        is_pad = ids == model.config.video_token_id
        keep = torch.ones_like(ids, dtype=torch.bool)
        keep[is_pad] = mask
        embeds = model.model.language_model.embed_tokens(ids)
        embeds[is_pad] = rows
        return hf_greedy_on_kept(model, embeds, positions, delta, keep, is_pad, steps, shift_from_video,
                                 shift_text_back)  # fmt: skip


# Served vs HF logprobs, float32 (measured on these clips): Qwen2-VL within 1e-4, as Qwen3-VL.
# Qwen2.5-VL: upstream SGLang's vision tower and transformers' differ by up to 5e-3 in logprobs
# already at q = 0 (no pruning; the plugin serves bit-identically to upstream there), up to 1.6e-2
# pruned. The control below (text after the video moved back by the pruned count) moves them by
# 0.5 to 1.7, so these tolerances tell the exact rule from an inexact one.
HF_TOLERANCE = {"Qwen2_5_VLForConditionalGeneration": 5e-2, "Qwen2VLForConditionalGeneration": 1e-3}
VIDCOM2_SWAPS = {"Qwen2_5_VLForConditionalGeneration": 0.03, "Qwen2VLForConditionalGeneration": 0.0}


@pytest.mark.parametrize("q", [0.5, 0.75])
@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_greedy_tokens_and_logprobs_equal_hf_oracle(served, clips, q, clip):
    """HF given the server's mask (which must be the oracle's up to ties) at the reference positions."""
    architecture, model_dir, server, trace_path = served
    clip = unseen_clip(trace_path, clip, f"evs{q}")
    reply = video(server, clip, q)
    seen = {}
    reference = hf_pruned_greedy(model_dir, clip, q, mask_oracle=checked_mask(served_mask(trace_path), seen))
    assert_matches_hf(reply, reference, HF_TOLERANCE[architecture])
    assert_masks_agree_up_to_ties(seen["served"], *seen["args"])


def test_the_tolerance_tells_an_inexact_position_rule_and_a_one_position_error(served, clips):
    architecture, model_dir, server, trace_path = served
    clip = unseen_clip(trace_path, "moving", "control")
    reply = video(server, clip, 0.75)
    mask = served_mask(trace_path)
    renumbered = hf_pruned_greedy(model_dir, clip, 0.75, mask_oracle=mask, shift_text_back=True)
    assert logprob_gap(reply, renumbered) > 10 * HF_TOLERANCE[architecture]
    one_off = hf_pruned_greedy(model_dir, clip, 0.75, mask_oracle=mask, shift_from_video=1)
    assert logprob_gap(reply, one_off) > HF_TOLERANCE[architecture]


@pytest.mark.parametrize("q", [0.5, 0.75])
def test_vidcom2_count_and_hf_oracle(served, clips, q):
    """VidCom2 on the same mechanism: its own count and mask, the same exact positions."""
    architecture, model_dir, server, trace_path = served
    clip = unseen_clip(trace_path, "noise", f"vidcom2{q}")
    unpruned = video(server, clip, 0.0)
    tokens = unpruned.meta["video_tokens"]
    kept = max(GROUPS, min(int(tokens * (1 - q)), tokens))  # the VidCom2 count, written out here
    reply = generate(
        server.base_url, chat_prompt(VIDEO), **media_kwargs(videos=[clip]), **per_request_rate(q, "vidcom2")
    )[0]
    assert reply.prompt_tokens == unpruned.prompt_tokens - (tokens - kept)
    assert reply.meta["video_pruning_method"] == "vidcom2" and reply.meta["video_tokens"] == kept
    mask, seen = served_mask(trace_path), {}

    def checked(rows, grid, merge, q):
        seen["served"], seen["oracle"] = mask(rows, grid, merge, q), vidcom2_keep_mask(rows, grid, merge, q)
        return seen["served"]

    reference = hf_pruned_greedy(model_dir, clip, q, mask_oracle=checked)
    assert_matches_hf(reply, reference, HF_TOLERANCE[architecture])
    # Qwen2.5-VL's two encoders round apart by ~1e-3 (see HF_TOLERANCE): a few near-equal rows
    # may swap (measured: 2 swaps in 288 at ratio .5); Qwen2-VL's agree to 1e-5 and so must the masks.
    swaps = int((seen["served"] ^ seen["oracle"]).sum()) // 2
    assert swaps <= VIDCOM2_SWAPS[architecture] * kept


def test_bad_rates_get_400_and_prometheus_counts_what_was_pruned(served, clips):
    """The same bad-input behaviour and server-wide counters as Qwen3-VL (one processor serves both)."""
    import requests

    _, _, server, _ = served
    good = video(server, clips["moving"], 0.75)
    for bad in (1.5, -0.5, "fast"):
        reply = requests.post(
            f"{server.base_url}/generate",
            json={"text": chat_prompt(VIDEO), "video_data": [str(clips["moving"])], **per_request_rate(bad),
                  "sampling_params": {"max_new_tokens": 2}},
            timeout=120,
        )  # fmt: skip
        assert reply.status_code == 400 and "video_pruning_rate must be a number in [0, 1)" in reply.text
        assert video(server, clips["moving"], 0.75).output_ids == good.output_ids  # still serving everyone

    before = pruning_metrics(server.base_url)
    pruned = video(server, clips["noise"], 0.5)
    after = pruning_metrics(server.base_url)
    delta = counter_increase(before, after)
    for name in ("video_tokens_before_pruning", "video_tokens_after_pruning"):
        assert delta[name] == pruned.meta[name]
