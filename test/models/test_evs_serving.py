"""EVS served end to end on the tiny Qwen3-VL (float32): token counts, an HF oracle, chunking, mixes.

The server's default rate is 0.5; requests override it with
`mm_processor_kwargs={"video_pruning_rate": q}`.
"""

import asyncio
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from conftest import load_in_transformers
from sglang_evs import trace
from sglang_evs.testing import media
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
from sglang_evs.testing.server import Launch, running_server, running_servers
from sglang_evs.testing.workload import send_alone, send_together

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "methods"))
from evs_oracle import keep_mask as compute_retention_mask  # noqa: E402  (the keep-mask oracles written here)
from evs_oracle import scores  # noqa: E402

SERVER_RATE = 0.5
GROUPS, TOKENS_PER_GROUP = 4, 100  # a 16-frame 4 fps clip -> 8 sampled frames -> 4 groups of 10x10


def evs_count(q: float) -> int:
    """The EVS kept count written out: max(tpf, int(T * tpf * (1 - q)))."""
    return max(TOKENS_PER_GROUP, int(GROUPS * TOKENS_PER_GROUP * (1 - q)))


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("evs_clips")
    return {
        kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=3)
        for kind in ("moving", "noise", "static")
    }


@pytest.fixture(scope="module")
def evs_trace(tmp_path_factory) -> Path:
    """The evs_server's trace file (SGLANG_EVS_TRACE): its keep-mask events feed the HF oracle."""
    return tmp_path_factory.mktemp("evs_server") / "trace.jsonl"


@pytest.fixture(scope="module")
def evs_server(tiny_model_dir, evs_trace):
    """In graph mode, as a GPU serves by default: SGLang's decode graphs, and the breakable prefill graphs
    the plugin turns on for Qwen3-VL, replay every forward whose size they were captured for (96-token
    chunks are a prefill bucket). 96-token chunks also cut the 200-token (and longer) videos: the quick
    tier runs the partial-window path."""
    args = ["--dtype", "float32", "--enable-metrics", "--chunked-prefill-size", "96"]
    args += ["--json-model-override-args", f'{{"video_pruning_rate": {SERVER_RATE}}}']
    with running_server(
        tiny_model_dir, evs_trace.parent / "server.log", args, {"SGLANG_EVS_TRACE": str(evs_trace)}, graph_mode=True
    ) as server:
        yield server


def video_request(server, clip, q=None, **extra):
    kwargs = per_request_rate(q) if q is not None else {}
    return generate(server.base_url, chat_prompt(VIDEO), **media_kwargs(videos=[clip]), **kwargs, **extra)[0]


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 0.9])
def test_prompt_tokens_drop_by_exactly_the_pruned_count(evs_server, clips, q):
    unpruned = video_request(evs_server, clips["moving"], q=0.0)
    served = video_request(evs_server, clips["moving"], q=q)
    pruned = GROUPS * TOKENS_PER_GROUP - evs_count(q)
    assert served.prompt_tokens == unpruned.prompt_tokens - pruned
    assert served.meta["video_tokens"] == evs_count(q)


def test_every_forward_of_a_pruned_video_replays_a_graph(evs_server, evs_trace):
    """Each prefill chunk replays a prefill graph reading the model's position buffer, each decode step a
    decode graph reading SGLang's static M-RoPE positions (graph mode, `sglang_evs.graph_trace`)."""
    before = {event: len(trace.read(evs_trace, event)) for event in ("graph_replay", "extend_forward")}
    reply = video_request(evs_server, unseen_clip(evs_trace, "moving", "graphs"), q=0.75)
    replays = trace.read(evs_trace, "graph_replay")[before["graph_replay"] :]
    extends = trace.read(evs_trace, "extend_forward")[before["extend_forward"] :]
    prefill = [r for r in replays if r["phase"] == "prefill"]
    decode = [r for r in replays if r["phase"] == "decode"]
    assert len(prefill) == len(extends) >= 2 and all(r["media"] for r in prefill)  # chunked: two or more
    assert {r["positions_from"] for r in prefill} == {"graph_inputs"}
    assert len(decode) == len(reply.output_ids) - 1 and {r["positions_from"] for r in decode} == {"mrope_positions"}


def test_what_evs_saved_is_reported_per_request_and_per_server(evs_server, clips):
    before = pruning_metrics(evs_server.base_url)
    served = video_request(evs_server, clips["noise"], q=0.75)
    kept = evs_count(0.75)
    assert served.meta["video_tokens_before_pruning"] == GROUPS * TOKENS_PER_GROUP
    assert served.meta["video_tokens_after_pruning"] == served.meta["video_tokens"] == kept
    assert served.meta["video_pruning_rate"] == 0.75
    assert served.meta["video_pruning_method"] == "evs"
    after = pruning_metrics(evs_server.base_url)
    delta = counter_increase(before, after)
    assert delta["video_tokens_before_pruning"] == GROUPS * TOKENS_PER_GROUP
    assert delta["video_tokens_after_pruning"] == kept
    assert delta["pruned_videos"] == 1


def test_openai_client_sets_the_rate_per_request(evs_server, clips):
    from openai import OpenAI

    client = OpenAI(base_url=f"{evs_server.base_url}/v1", api_key="none")
    content = [{"type": "video_url", "video_url": {"url": f"file://{clips['moving']}"}}, {"type": "text", "text": "hi"}]
    usage = {
        q: client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": content}], max_tokens=2,
            extra_body={"mm_processor_kwargs": {"video_pruning_rate": q}},
        ).usage
        for q in (0.0, 0.75)
    }  # fmt: skip
    assert usage[0.0].prompt_tokens - usage[0.75].prompt_tokens == GROUPS * TOKENS_PER_GROUP - TOKENS_PER_GROUP
    assert usage[0.75].prompt_tokens_details.video_tokens == TOKENS_PER_GROUP


def test_server_rate_is_the_default(evs_server, clips):
    default = video_request(evs_server, clips["static"])
    # the server's override names only the rate: EVS is the default method, as in vLLM
    assert (default.meta["video_pruning_method"], default.meta["video_pruning_rate"]) == ("evs", SERVER_RATE)
    explicit = video_request(evs_server, clips["static"], q=SERVER_RATE)
    assert explicit.prompt_tokens == default.prompt_tokens and explicit.output_ids == default.output_ids
    assert explicit.cached_tokens >= default.prompt_tokens - 1  # same cache key: same rate


def test_same_video_at_two_rates_shares_no_cached_video(evs_server, tmp_path):
    clip = media.write_clip(tmp_path / "unseen.mp4", "noise", num_frames=16, fps=4, seed=11)  # not cached yet
    first = video_request(evs_server, clip, q=0.25)
    again = video_request(evs_server, clip, q=0.25)
    other = video_request(evs_server, clip, q=0.75)
    assert again.cached_tokens >= first.prompt_tokens - 1  # everything but the last token
    assert other.cached_tokens < 20  # only the text before the video


# --- the independent oracle: HF transformers' Qwen3-VL given the kept tokens and reference positions


@cache
def hf(model_dir: str):
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32
    ).eval(), AutoProcessor.from_pretrained(model_dir)


class HFReference(NamedTuple):
    tokens: list[int]  # greedy, or the served ones where HF was made to follow them
    prompt_tokens: int
    logprobs: list[float]  # of each of those tokens
    best_logprobs: list[float] | None = None  # where HF followed the served tokens: its best choice's at each step


# Served vs HF, both float32 on CPU: the same weights through different kernels (SGLang's
# torch_native attention and fused layers vs transformers' modules) round differently; measured
# differences on these prompts stay under 1e-5 (Qwen3-VL) and 1e-4 (Qwen2-VL). A position rule
# that renumbers the compacted sequence moves them by 0.5 or more (the control in
# test_qwen2_vl_evs.py), so 1e-3 tells exact from inexact.
HF_LOGPROB_TOLERANCE = 1e-3


def assert_matches_hf(served, reference: HFReference, tolerance: float = HF_LOGPROB_TOLERANCE) -> None:
    """The served greedy tokens are HF's and their logprobs HF's within `tolerance`. Where HF followed the
    served tokens (`hf_greedy_decode`'s `forced`), a served token may be another than HF's best only where
    the two are within `tolerance` of each other (in bfloat16, near-equal tokens may swap)."""
    assert served.prompt_tokens == reference.prompt_tokens
    assert served.output_ids == reference.tokens
    worst = logprob_gap(served, reference)
    assert worst < tolerance, f"logprobs differ from HF's by up to {worst:.2e} (tolerance {tolerance:.0e})"
    if reference.best_logprobs is not None:
        margin = max(best - got for best, got in zip(reference.best_logprobs, reference.logprobs, strict=True))
        assert margin < tolerance, f"HF prefers another token by {margin:.2e} (tolerance {tolerance:.0e})"


def hf_greedy_decode(
    model, embeds: torch.Tensor, positions: torch.Tensor, offset: int, steps: int,
    visual: torch.Tensor | None = None, deepstack: list[torch.Tensor] | None = None, ids: torch.Tensor | None = None,
    forced: list[int] | None = None,
) -> tuple[list[int], list[float], list[float]]:  # fmt: skip
    """Greedy tokens and their logprobs from a transformers VLM's language model, without a KV cache.

    embeds [T, D] and positions [3, 1, T]: the prompt as the language model gets it (pruned rows
    already deleted); each generated token goes at position ``len(sequence) + offset`` on all three
    axes. ``visual`` [T] bool and ``deepstack`` (per level [visual rows, D]): Qwen3-VL's deepstack
    inputs, extended with False for generated tokens. ``ids`` [T]: the prompt's token ids, for a language
    model that reads them beside the embeddings (Qwen4-Exp's per-layer embeddings), extended likewise.
    ``forced``: the tokens to continue with (the served ones) instead of HF's greedy choices. Returns the
    tokens, their logprobs and the best logprob at each step.
    """
    language_model, tokens, logprobs, best = model.model.language_model, [], [], []
    for step in range(steps):
        extra = {} if visual is None else {"visual_pos_masks": visual[None], "deepstack_visual_embeds": deepstack}
        extra |= {} if ids is None else {"ple_input_ids": ids[None]}
        out = language_model(inputs_embeds=embeds[None], position_ids=positions, use_cache=False, **extra)
        scores = torch.log_softmax(model.lm_head(out.last_hidden_state[0, -1]).float(), dim=-1)
        token = int(scores.argmax()) if forced is None else forced[step]
        tokens.append(token)
        logprobs.append(float(scores[token]))
        best.append(float(scores.max()))
        positions = torch.cat([positions, torch.full((3, 1, 1), embeds.shape[0] + offset)], dim=2)
        embeds = torch.cat([embeds, language_model.embed_tokens(torch.tensor([token]))])
        if visual is not None:
            visual = torch.cat([visual, torch.tensor([False])])
        if ids is not None:
            ids = torch.cat([ids, torch.tensor([token])])
    return tokens, logprobs, best


def hf_greedy_on_kept(
    model, embeds: torch.Tensor, positions: torch.Tensor, delta, keep: torch.Tensor, video_rows: torch.Tensor,
    steps: int, shift_from_video: int = 0, shift_text_back: bool = False,
    visual: torch.Tensor | None = None, deepstack: list[torch.Tensor] | None = None, ids: torch.Tensor | None = None,
    forced: list[int] | None = None,
) -> HFReference:  # fmt: skip
    """The reference rule on a prompt HF laid out unpruned: the rows in ``keep`` [T] bool, at the positions
    the model's own ``get_rope_index`` gave them (``positions`` [3, 1, T], changed in place; ``delta`` its
    decode offset), greedily decoded (``hf_greedy_decode``; ``visual`` [T] bool, unpruned, and the kept
    ``deepstack`` rows for Qwen3-VL; ``ids`` [T], unpruned, for Qwen4-Exp; ``forced``, the served tokens to
    follow). ``video_rows`` [T] bool marks the
    video's rows. Two controls: ``shift_from_video``, every token from the video's first row on (generated
    ones too) moved by that many positions (a one-position error); ``shift_text_back``, the text after the
    video moved back by the pruned count, as a rule that renumbers the compacted sequence would place it."""
    pruned, index = int((~keep).sum()), torch.arange(keep.numel())
    if shift_text_back:
        positions[:, :, index > int(video_rows.nonzero().max())] -= pruned
    if shift_from_video:
        positions[:, :, index >= int(video_rows.nonzero().min())] += shift_from_video
    offset = int(delta) + (0 if shift_text_back else pruned) + shift_from_video
    kept_visual = None if visual is None else visual[keep]
    kept_ids = None if ids is None else ids[keep]
    tokens, logprobs, best = hf_greedy_decode(
        model, embeds[keep], positions[:, :, keep], offset, steps, kept_visual, deepstack, kept_ids, forced
    )
    return HFReference(tokens, int(keep.sum()), logprobs, None if forced is None else best)


def hf_pruned_greedy(
    model_dir: Path, clip: Path, q: float, steps: int = 8, keep_mask=compute_retention_mask, shift_from_video: int = 0
) -> HFReference:
    """The reference rule built from transformers' own modules, not this package: the kept tokens
    (`keep_mask(rows, grid, m, q)`, an oracle written here) at their unpruned positions.
    ``shift_from_video`` is the control: every token from the video's first pad on (generated ones
    too) moved by that many positions (a one-position error)."""
    from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
    from sglang.srt.utils.common import load_video

    model, processor = hf(str(model_dir))
    prompt = chat_prompt(VIDEO)  # the same text the server gets
    frames, metadata = asyncio.run(preprocess_video(load_video(str(clip), use_gpu=False)))
    inputs = processor(
        text=[prompt], videos=[frames], video_metadata=[metadata], do_sample_frames=False, return_tensors="pt"
    )
    ids, grid = inputs["input_ids"][0], inputs["video_grid_thw"]
    cfg = model.config
    with torch.no_grad():
        positions, delta = model.model.get_rope_index(ids[None], inputs["mm_token_type_ids"], video_grid_thw=grid)
        feats = model.model.get_video_features(inputs["pixel_values_videos"], grid)
        main = torch.cat(list(feats.pooler_output))
        levels = [torch.cat(list(per_video)) for per_video in feats.deepstack_features]
        mask = keep_mask(torch.cat([main, *levels], dim=1), grid[0], cfg.vision_config.spatial_merge_size, q)
        is_pad = ids == cfg.video_token_id
        keep = torch.ones_like(ids, dtype=torch.bool)
        keep[is_pad] = mask
        embeds = model.model.language_model.embed_tokens(ids)
        embeds[is_pad] = main
        deepstack = [level[mask] for level in levels]
        return hf_greedy_on_kept(model, embeds, positions, delta, keep, is_pad, steps, shift_from_video,
                                 visual=is_pad, deepstack=deepstack)  # fmt: skip


# --- the rule's positions, against which traced forwards are checked


@cache
def rule_positions(model_dir: str, clip: str, kept: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """The video prompt's kept tokens at the positions transformers' `get_rope_index` gives them in the
    unpruned sequence ([3, kept tokens]), and the offset of every later token (its position minus its
    index in the pruned sequence: the unpruned delta plus the pruned count)."""
    from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
    from sglang.srt.utils.common import load_video
    from transformers import AutoProcessor

    model = load_in_transformers(model_dir)
    processor = AutoProcessor.from_pretrained(model_dir)
    frames, metadata = asyncio.run(preprocess_video(load_video(clip, use_gpu=False)))
    inputs = processor(text=[chat_prompt(VIDEO)], videos=[frames], video_metadata=[metadata],
                       do_sample_frames=False, return_tensors="pt")  # fmt: skip
    ids = inputs["input_ids"][0]
    positions, delta = model.model.get_rope_index(
        ids[None], inputs["mm_token_type_ids"], video_grid_thw=inputs["video_grid_thw"]
    )
    keep = torch.ones_like(ids, dtype=torch.bool)
    pads = (ids == model.config.video_token_id).nonzero().flatten()
    keep[pads] = False
    keep[pads[list(kept)]] = True
    return positions[:, 0, keep], int(delta) + int((~keep).sum())


def expected_positions(event: dict, rule: torch.Tensor, offset: int) -> torch.Tensor:
    """[3, rows] the rule gives the rows of one forward of the traced request (its only sequence):
    prompt rows at their index; afterwards `index + offset` on all three axes. Rows pair with
    the positions upstream pairs them with: a draft row holds token t's hidden state and position
    with token t+1's embedding; a draft decode step the position of the last token it saw. A target's
    decode step (no speculation) is its sequence's last token."""
    rows, (seq_len,) = event["rows"], event["seq_lens"]
    first = {  # the sequence index of the forward's first row
        "EXTEND": seq_len - rows,
        "TARGET_VERIFY": seq_len,
        "DRAFT_EXTEND_V2": seq_len - rows,
        "DECODE": seq_len if event["model"] == "draft" else seq_len - rows,
    }[event["mode"]]
    index = torch.arange(first, first + rows)
    prompt = index < rule.shape[1]
    out = (index + offset).expand(3, rows).clone()
    out[:, prompt] = rule[:, index[prompt]]
    return out


MASK_TIE = 1e-3  # score gap within which SGLang's and HF's encoders may rank two rows differently


def unseen_clip(trace_path: Path, kind: str, tag: str) -> Path:
    """A clip of ``kind`` no earlier request sent, so the server encodes it (and traces its mask)
    instead of reusing cached features."""
    seed = 1000 + sum(map(ord, f"{kind}{tag}"))
    return media.write_clip(trace_path.parent / f"unseen-{kind}-{tag}.mp4", kind, num_frames=16, fps=4, seed=seed)


def served_mask(trace_path: Path):
    """The keep-mask the server used for its last encoded video, as an oracle `mask_oracle` argument
    (send an `unseen_clip`: a cached video is not encoded again)."""
    kept = trace.read(trace_path, "keep_mask")[-1]["kept"]

    def mask(rows, grid, spatial_merge_size, q):
        out = torch.zeros(rows.shape[0], dtype=torch.bool)
        out[kept] = True
        return out

    return mask


def checked_mask(served_mask: Callable, seen: dict) -> Callable:
    """The server's keep-mask as `hf_greedy`'s `keep_mask`, keeping what HF computed it on for a check."""

    def mask(rows, grid, merge, q):
        seen["served"], seen["args"] = served_mask(rows, grid, merge, q), (rows, grid, merge, q)
        return seen["served"]

    return mask


def assert_masks_agree_up_to_ties(served, oracle_rows, grid, merge, q, tie: float = MASK_TIE):
    """The server's mask is the oracle's on HF's features, except rows whose scores are within `tie` of
    the cut-off (static background scores ~0; the two encoders' rounding then picks among equals)."""
    oracle = compute_retention_mask(oracle_rows, grid, merge, q)
    row_scores = torch.tensor(scores(oracle_rows, grid, merge))
    cutoff = float(row_scores[oracle].min())
    differ = (served ^ oracle).nonzero().flatten()
    assert int(served.sum()) == int(oracle.sum())
    assert all(abs(float(row_scores[i]) - cutoff) < tie for i in differ), "the masks differ beyond ties"


@pytest.mark.parametrize("q", [0.5, 0.75])
@pytest.mark.parametrize("clip", ["noise", "moving"])
def test_greedy_tokens_equal_hf_oracle(evs_server, evs_trace, tiny_model_dir, q, clip):
    """HF given the server's mask (which must be the oracle's on HF's features, up to ties) at the
    reference positions."""
    clip = unseen_clip(evs_trace, clip, f"evs{q}")
    reply = video_request(evs_server, clip, q=q)
    seen = {}
    checked = checked_mask(served_mask(evs_trace), seen)
    assert_matches_hf(reply, hf_pruned_greedy(tiny_model_dir, clip, q, keep_mask=checked))
    assert_masks_agree_up_to_ties(seen["served"], *seen["args"])


def test_the_tolerance_tells_a_one_position_error(evs_server, evs_trace, tiny_model_dir):
    """The control: HF with every token from the video on one position later is farther from what was
    served than the tolerance, so the tolerance separates exact from off by one."""
    clip = unseen_clip(evs_trace, "moving", "one-off")
    reply = video_request(evs_server, clip, q=0.75)
    one_off = hf_pruned_greedy(tiny_model_dir, clip, 0.75, keep_mask=served_mask(evs_trace), shift_from_video=1)
    assert logprob_gap(reply, one_off) > HF_LOGPROB_TOLERANCE


# --- chunked prefill and the radix cache see the same positions


def assert_same_generation(got, want, context) -> None:
    """Tokens exactly; logprobs to 1e-4. Chunked prefill and radix hits compute attention in other
    pieces than one prefill does, which rounds differently on CPU (upstream too: ~1e-7 here); a
    wrong position moves logprobs by orders of magnitude more."""
    assert got.output_ids == want.output_ids, context
    assert logprob_gap(got, want) < 1e-4, context
    got_top = [[t for _, t in step] for step in got.top_logprobs]
    assert got_top == [[t for _, t in step] for step in want.top_logprobs], context


# Graph-mode chunk servers capture prefill graphs up to 64 tokens (SGLang's default stops below the chunk
# size for 33 or 50), so that their full chunks replay too, padded to the 48- or 64-token bucket.
GRAPH_CHUNK_ARGS = ("--cuda-graph-max-bs-prefill", "64")


def served_in_chunks(
    model_dir: Path, cases: list, chunk_sizes, server_args: list[str], log_dir: Path, graph_chunk: int | None = None
) -> dict:
    """chunk size (None: SGLang's default) -> (first replies, repeated replies) of `cases`, one
    server per size, started together; the repeats must hit the radix cache. The server of
    `graph_chunk` runs in graph mode (`sglang_evs.testing.server`), as a GPU serves by default."""
    launches, graph_trace = [], log_dir / "graph-trace.jsonl"
    for chunk in chunk_sizes:
        graphs = chunk is not None and chunk == graph_chunk
        args = [*server_args, *(["--chunked-prefill-size", str(chunk)] if chunk else []), *(GRAPH_CHUNK_ARGS * graphs)]
        env = {trace.ENV: str(graph_trace)} if graphs else None
        launches.append(Launch(model_dir, log_dir / f"chunk-{chunk}.log", args, env, graph_mode=graphs))
    results = {}
    with running_servers(*launches) as servers:
        for chunk, server in zip(chunk_sizes, servers, strict=True):
            first = [generate(server.base_url, p, **kw)[0] for p, kw in cases]
            again = [generate(server.base_url, p, **kw)[0] for p, kw in cases]
            assert all(a.cached_tokens > 0 for a in again), f"chunk size {chunk}: no radix hit"
            results[chunk] = first, again
    if graph_chunk is not None:
        assert_media_prefills_and_decodes_replayed(graph_trace)
    return results


def assert_media_prefills_and_decodes_replayed(trace_path: Path) -> list[dict]:
    """A graph-mode server replayed prefill graphs for media-carrying forwards, reading the model's position
    buffer, and decode graphs, reading SGLang's static M-RoPE positions (`sglang_evs.graph_trace`). Returns
    the media prefills' replays."""
    replays = trace.read(trace_path, "graph_replay")
    prefills = [r for r in replays if r["phase"] == "prefill" and r["media"]]
    assert prefills and {r["positions_from"] for r in prefills} == {"graph_inputs"}
    decodes = [r for r in replays if r["phase"] == "decode"]
    assert decodes and {r["positions_from"] for r in decodes} == {"mrope_positions"}
    return prefills


def assert_chunks_equal(results: dict, reference: list, context: str) -> None:
    for chunk, (first, again) in results.items():
        for got, want in zip([*first, *again], [*reference, *reference], strict=True):
            assert_same_generation(got, want, f"{context}, chunk size {chunk}")


@pytest.mark.slow
def test_chunked_prefill_and_radix_hits_equal_single_chunk(tiny_model_dir, clips, tmp_path):
    """7-token chunks cut inside groups, on framing tokens and at both edges of every video; 33-token ones
    cut groups unevenly with fewer windows, on a server in graph mode (its chunks and radix hits replay
    prefill graphs). (16 and 50 were dropped: they cut nothing these two miss.)"""
    image = media.write_image(tmp_path / "image.png", seed=2)
    cases = [
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]])),
        (chat_prompt(IMAGE, VIDEO, VIDEO), media_kwargs(images=[image], videos=[clips["noise"], clips["moving"]])),
    ]
    args = ["--dtype", "float32", "--json-model-override-args", '{"video_pruning_rate": 0.5}']
    results = served_in_chunks(tiny_model_dir, cases, (None, 7, 33), args, tmp_path, graph_chunk=33)
    assert_chunks_equal(results, results[None][0], "EVS")


# --- several media per request and per batch


def test_mixed_media_requests_equal_each_request_alone(evs_server, evs_trace, clips, media_dir):
    """Each request alone, then all eight at once from an empty cache, so they prefill together: the trace
    shows a forward that held media of two requests or more."""
    image, image2 = media_dir / "image.png", media_dir / "image2.png"
    cases = [
        (chat_prompt(VIDEO, IMAGE), media_kwargs(images=[image], videos=[clips["moving"]])),
        (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[image2], videos=[clips["noise"]])),
        (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[clips["noise"], clips["moving"]])),
        (chat_prompt(IMAGE), media_kwargs(images=[image])),
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["static"]])),
        (chat_prompt(text="Count the objects."), {}),
        (chat_prompt(VIDEO, IMAGE, VIDEO), media_kwargs(images=[image2], videos=[clips["static"], clips["noise"]])),
        (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]])),
    ]
    cases = [(prompt, kwargs, 0.75) for prompt, kwargs in cases]
    alone = send_alone(evs_server.base_url, cases)
    together, (shared_forwards, cached, prompt) = send_together(evs_server.base_url, cases, evs_trace)
    assert shared_forwards > 0, "no prefill forward held the media of two requests"
    assert cached < prompt // 4  # prefilled, not served from the cache (two of them share their first video)
    # the graph-mode server replayed it: one prefill replay carried the media of two requests or more
    media_prefills = assert_media_prefills_and_decodes_replayed(evs_trace)
    assert any(replay["requests"] > 1 for replay in media_prefills)
    for one, many in zip(alone, together, strict=True):
        assert many.prompt_tokens == one.prompt_tokens
        assert_same_generation(many, one, "batched vs alone")  # batched CPU GEMMs round differently


def test_images_are_never_pruned(evs_server, media_dir):
    """Bit-identical at q = 0.9 and q = 0 (cache flushed before each, so both prefill from scratch)."""
    prompt, kwargs = chat_prompt(IMAGE, IMAGE), media_kwargs(images=[media_dir / "image.png", media_dir / "image2.png"])
    runs = []
    for q in (0.9, 0.0):
        flush_cache(evs_server.base_url)
        runs.append(generate(evs_server.base_url, prompt, **kwargs, **per_request_rate(q))[0])
    assert runs[0] == runs[1]
