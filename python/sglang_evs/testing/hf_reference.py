"""The independent oracle for served generations: transformers' own model of a tiny checkpoint given the
kept tokens at their reference (unpruned) positions, the rule's positions against which traced forwards are
checked, and the server's traced keep-masks as oracle arguments. Shared by the model tests (Qwen3-VL,
Qwen2-VL, GLM-4V, Qwen3-Omni, the hybrid families, speculative decoding)."""

import asyncio
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import NamedTuple

import torch

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.evs_oracle import keep_mask as compute_retention_mask
from sglang_evs.testing.evs_oracle import scores
from sglang_evs.testing.requests import VIDEO, chat_prompt, logprob_gap


def load_in_transformers(model_dir: str | Path, dtype: str = "float32"):
    """transformers' own model of a tiny checkpoint (`AutoModelForImageTextToText`), in eval mode. Qwen4-Exp's
    checkpoint leaves out the sparse-attention indexer transformers always builds: drawn afresh here, it
    selects every key of a prompt under its budget (1,024 tokens, more than any test prompt), so it
    changes nothing."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from sglang_evs.testing import tiny_qwen4_exp

    config = AutoConfig.from_pretrained(model_dir)
    if config.architectures == [tiny_qwen4_exp.ARCHITECTURE]:
        config.text_config.update(tiny_qwen4_exp.DRAW_INDEXER)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, config=config, dtype=getattr(torch, dtype))
    return model.eval()


# --- the independent oracle: HF transformers' Qwen3-VL given the kept tokens and reference positions


@cache
def hf(model_dir: str):
    """transformers' own model of a tiny checkpoint (`load_in_transformers`, any family) and its processor, loaded
    once."""
    from transformers import AutoProcessor

    return load_in_transformers(model_dir), AutoProcessor.from_pretrained(model_dir)


def sampled_frames(clip: Path):
    """A clip's frames and metadata as SGLang samples them (`preprocess_video`)."""
    from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
    from sglang.srt.utils.common import load_video

    return asyncio.run(preprocess_video(load_video(str(clip), use_gpu=False)))


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
    prompt = hf_video_prompt(model_dir, clip, q, keep_mask)
    with torch.no_grad():  # the positions are copied: the controls move them in place
        return hf_greedy_on_kept(prompt.model, prompt.embeds, prompt.positions.clone(), prompt.delta, prompt.keep,
                                 prompt.is_pad, steps, shift_from_video, visual=prompt.is_pad,
                                 deepstack=prompt.deepstack)  # fmt: skip


class MediaPrompt(NamedTuple):
    """A prompt with one video or images as transformers' Qwen3-VL lays it out unpruned, with the rows a keep-mask
    keeps."""

    model: object
    ids: torch.Tensor  # [T] token ids, unpruned
    embeds: torch.Tensor  # [T, D] the language model's input rows (the video's main rows at its pads)
    positions: torch.Tensor  # [3, 1, T] get_rope_index's
    delta: int  # get_rope_index's decode offset of the unpruned prompt
    keep: torch.Tensor  # [T] bool: the rows the pruned prompt keeps
    is_pad: torch.Tensor  # [T] bool: the video's (the images') pads
    deepstack: list[torch.Tensor] | None  # per level, the kept pads' rows (None: a family without deepstack)


@cache
def hf_video_prompt(
    model_dir: Path, clip: Path, q: float, keep_mask=compute_retention_mask, prompt: str = chat_prompt(VIDEO)
) -> MediaPrompt:
    """``prompt`` (one VIDEO placeholder, the same text the server gets) with ``clip``, laid out by
    transformers' processor and Qwen3-VL, with `keep_mask(rows, grid, m, q)` applied to the video's pads.
    Computed once per arguments (a clip is written once per test run): the tensors are not to be changed."""
    model, processor = hf(str(model_dir))
    frames, metadata = sampled_frames(clip)
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
    return MediaPrompt(model, ids, embeds, positions, int(delta), keep, is_pad, [level[mask] for level in levels])


class ImageTower(NamedTuple):
    """transformers' own model of one family, as the image oracle reads it (`hf_image_model`)."""

    model: object  # what `hf_greedy_decode` reads: `.model.language_model`, `.lm_head`, and `.config`, `.dtype`
    processor: object
    image_features: Callable  # (pixel_values, image_grid_thw) -> transformers' output (pooler_output per image)
    rope_index: Callable  # (processor inputs) -> (positions [3, 1, T], delta) of the unpruned prompt


@cache
def hf_image_model(model_dir: str, dtype: str = "float32") -> ImageTower:
    """transformers' own model of a tiny checkpoint of any family the plugin serves, loaded once per dtype:
    `AutoModelForImageTextToText` (`hf`, `load_in_transformers`), or Qwen3-Omni's thinker (SGLang serves the
    thinker alone) behind the same attributes."""
    from types import SimpleNamespace

    from transformers import AutoConfig, AutoProcessor

    if AutoConfig.from_pretrained(model_dir).architectures != ["Qwen3OmniMoeForConditionalGeneration"]:
        if dtype == "float32":
            model, processor = hf(model_dir)
        else:
            model, processor = load_in_transformers(model_dir, dtype), AutoProcessor.from_pretrained(model_dir)

        def rope_index(inputs):
            return model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                              image_grid_thw=inputs["image_grid_thw"])  # fmt: skip

        return ImageTower(model, processor, model.model.get_image_features, rope_index)
    from transformers import Qwen3OmniMoeForConditionalGeneration

    omni = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    thinker = omni.thinker.eval()
    model = SimpleNamespace(model=SimpleNamespace(language_model=thinker.model), lm_head=thinker.lm_head,
                            config=thinker.config, dtype=thinker.dtype)  # fmt: skip

    def thinker_rope_index(inputs):
        ids = inputs["input_ids"]
        positions, delta = thinker.get_rope_index(ids, image_grid_thw=inputs["image_grid_thw"],
                                                  attention_mask=torch.ones_like(ids))  # fmt: skip
        return positions.long(), delta

    return ImageTower(model, AutoProcessor.from_pretrained(model_dir), thinker.get_image_features, thinker_rope_index)


def hf_image_prompt(model_dir: Path, images: Sequence[Path], keep_kept: Callable[[list[list[float]], int], list[int]],
                    q: float, prompt: str, dtype: str = "float32") -> MediaPrompt:  # fmt: skip
    """``prompt`` (one image placeholder per image, the family's) with ``images``, laid out unpruned by transformers'
    processor and model of the checkpoint's family (`hf_image_model`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (+MoE), Qwen3.5
    (+MoE), Qwen4-Exp, GLM-4.1V, Qwen3-Omni's thinker) in ``dtype``, each image's pads kept as ``keep_kept(rows,
    count)`` (a plain oracle over the image's rows as lists of floats: every column the tower returns, ``[main |
    deepstack...]`` where it has deepstack levels, keeping ``max(1, int(N * (1 - q)))``) chooses. ``deepstack`` is
    None for a tower without levels."""
    from PIL import Image

    tower = hf_image_model(str(model_dir), dtype)
    model, cfg = tower.model, tower.model.config
    pictures = [Image.open(path).convert("RGB") for path in images]
    inputs = tower.processor(text=[prompt], images=pictures, return_tensors="pt")
    ids, grid = inputs["input_ids"][0], inputs["image_grid_thw"]
    with torch.no_grad():
        positions, delta = tower.rope_index(inputs)
        feats = tower.image_features(inputs["pixel_values"].to(model.dtype), grid)
        main = torch.cat(list(feats.pooler_output))
        levels = [torch.cat(list(per_image)) for per_image in getattr(feats, "deepstack_features", None) or []]
        rows = torch.cat([main, *levels], dim=1)
        masks = []
        for image_rows in rows.split([int(n) // cfg.vision_config.spatial_merge_size**2 for n in grid.prod(-1)]):
            mask = torch.zeros(image_rows.shape[0], dtype=torch.bool)
            mask[keep_kept(image_rows.float().tolist(), max(1, int(image_rows.shape[0] * (1 - q))))] = True
            masks.append(mask)
        mask = torch.cat(masks)
        is_pad = ids == cfg.image_token_id
        keep = torch.ones_like(ids, dtype=torch.bool)
        keep[is_pad] = mask
        embeds = model.model.language_model.embed_tokens(ids)
        embeds[is_pad] = main.to(embeds.dtype)
    deepstack = [level[mask] for level in levels] if levels else None
    return MediaPrompt(model, ids, embeds, positions, int(delta), keep, is_pad, deepstack)


def hf_greedy_on_prompt(prompt: MediaPrompt, steps: int = 8, forced: list[int] | None = None,
                        shift_from_video: int = 0, shift_text_back: bool = False) -> HFReference:  # fmt: skip
    """The reference rule on `prompt`: its kept rows at their unpruned positions, greedily decoded (the deepstack
    levels where the tower has them; the token ids beside the rows where the language model reads them, Qwen4-Exp's
    per-layer embeddings; ``forced``: the served tokens to follow). The controls are `hf_greedy_on_kept`'s, the
    media's rows (``is_pad``) in the video's place: every token from the first one on moved by ``shift_from_video``
    positions, or the text after the last one moved back by the pruned count (``shift_text_back``)."""
    reads_ids = bool(getattr(getattr(prompt.model.config, "text_config", None), "ple_layer_ids", None))
    visual = None if prompt.deepstack is None else prompt.is_pad
    with torch.no_grad():
        return hf_greedy_on_kept(prompt.model, prompt.embeds, prompt.positions.clone(), prompt.delta, prompt.keep,
                                 prompt.is_pad, steps, shift_from_video, shift_text_back, visual=visual,
                                 deepstack=prompt.deepstack, ids=prompt.ids if reads_ids else None,
                                 forced=forced)  # fmt: skip


class StreamInputs(NamedTuple):
    """A stream's prompt as transformers lays it out unpruned, with its segments' rows from transformers' tower."""

    model: object
    ids: torch.Tensor  # [T] token ids
    grid: torch.Tensor  # [segments, 3] (T, H, W) each
    positions: torch.Tensor  # [3, 1, T] get_rope_index's
    delta: int  # get_rope_index's decode offset
    main: list[torch.Tensor]  # per segment, its rows
    levels: list[list[torch.Tensor]] | None  # per deepstack level, per segment, its rows; None: no deepstack

    def rows(self) -> list[torch.Tensor]:
        """Per segment, the rows EVS scores: its main rows with its deepstack levels' as further columns."""
        return [torch.cat([m, *(level[i] for level in self.levels or [])], dim=1) for i, m in enumerate(self.main)]


@cache
def hf_stream_inputs(model_dir: Path, clips: tuple[Path, ...]) -> StreamInputs:
    """``chat_prompt(VIDEO, ...)`` with ``clips`` as one stream's segments, laid out by transformers' processor and
    Qwen3-VL as a `video_stream` request is served: each segment's frames sampled as SGLang samples them, its frame
    indices counted on from the segments before (so its timestamps continue). Computed once per arguments."""
    model, processor = hf(str(model_dir))
    videos, metadata, before = [], [], 0
    for clip in clips:
        frames, meta = sampled_frames(clip)
        videos.append(frames)
        metadata.append({**meta, "frames_indices": meta["frames_indices"] + before})
        before += int(meta["total_num_frames"])
    prompt = chat_prompt(*[VIDEO] * len(clips))
    inputs = processor(text=[prompt], videos=videos, video_metadata=metadata, do_sample_frames=False,
                       return_tensors="pt")  # fmt: skip
    ids, grid = inputs["input_ids"][0], inputs["video_grid_thw"]
    with torch.no_grad():
        positions, delta = model.model.get_rope_index(ids[None], inputs["mm_token_type_ids"], video_grid_thw=grid)
        feats = model.model.get_video_features(inputs["pixel_values_videos"], grid)
    levels = [list(per_video) for per_video in feats.deepstack_features]
    return StreamInputs(model, ids, grid, positions, int(delta), list(feats.pooler_output), levels)


@cache
def hf_untimestamped_stream_inputs(model_dir: Path, clips: tuple[Path, ...]) -> StreamInputs:
    """``chat_prompt(VIDEO, ...)`` with ``clips`` as one stream's segments, as a `video_stream` request is served to a
    family that writes no timestamps (Qwen2.5-VL, Qwen2-VL): each segment's frames sampled as SGLang samples them and
    handed to transformers' processor as SGLang hands them (frames alone), the segments placed as transformers'
    `get_rope_index` places a prompt's videos, each after the one before (with `second_per_grid_ts`: absolute time
    for Qwen2.5-VL). No deepstack. Computed once per arguments."""
    model, processor = hf(str(model_dir))
    videos = [sampled_frames(clip)[0] for clip in clips]
    inputs = processor(text=[chat_prompt(*[VIDEO] * len(clips))], videos=videos, return_tensors="pt")
    ids, grid = inputs["input_ids"][0], inputs["video_grid_thw"]
    timing = {"second_per_grid_ts": inputs["second_per_grid_ts"]} if "second_per_grid_ts" in inputs else {}
    with torch.no_grad():
        positions, delta = model.model.get_rope_index(
            ids[None], inputs["mm_token_type_ids"], video_grid_thw=grid, **timing
        )
        features = model.model.get_video_features(inputs["pixel_values_videos"], grid)
    main = list(getattr(features, "pooler_output", features))
    return StreamInputs(model, ids, grid, positions, int(delta), main, None)


def stream_rule_masks(inputs: StreamInputs, q: float | None, threshold: float | None) -> list[torch.Tensor]:
    """Per segment, the rows the stream rule keeps (`evs_oracle.stream_keep_masks`) on HF's rows of the segments."""
    from sglang_evs.testing.evs_oracle import stream_keep_masks

    merge = inputs.model.config.vision_config.spatial_merge_size
    return stream_keep_masks(inputs.rows(), inputs.grid.tolist(), merge, q, threshold)


def stream_video_prompt(inputs: StreamInputs, masks: Sequence[torch.Tensor]) -> MediaPrompt:
    """The stream's prompt with each segment's rows at its pads, and the rows ``masks`` keep (per segment, [T*h*w])."""
    model, ids = inputs.model, inputs.ids
    mask = torch.cat(list(masks))
    is_pad = ids == model.config.video_token_id
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[is_pad] = mask
    with torch.no_grad():
        embeds = model.model.language_model.embed_tokens(ids)
        embeds[is_pad] = torch.cat(inputs.main)
    deepstack = None if inputs.levels is None else [torch.cat(level)[mask] for level in inputs.levels]
    return MediaPrompt(model, ids, embeds, inputs.positions, inputs.delta, keep, is_pad, deepstack)


def hf_stream_greedy(model_dir: Path, clips: tuple[Path, ...], q: float | None = None, threshold: float | None = None,
                     steps: int = 8, layout=hf_stream_inputs,
                     masks: Sequence[torch.Tensor] | None = None) -> HFReference:  # fmt: skip
    """HF's greedy reply to a stream's prompt laid out by ``layout`` (`hf_stream_inputs`, Qwen3-VL's, its timestamps
    continuing; `hf_untimestamped_stream_inputs`, Qwen2.5-VL's and Qwen2-VL's), the kept rows at their unpruned
    positions: those of ``masks`` (per segment, [T*h*w] bool), by default the stream rule's
    (`evs_oracle.stream_keep_masks`, an oracle written here, on HF's rows of the segments)."""
    inputs = layout(model_dir, clips)
    prompt = stream_video_prompt(inputs, stream_rule_masks(inputs, q, threshold) if masks is None else masks)
    visual = None if prompt.deepstack is None else prompt.is_pad
    with torch.no_grad():
        return hf_greedy_on_kept(prompt.model, prompt.embeds, prompt.positions.clone(), prompt.delta, prompt.keep,
                                 prompt.is_pad, steps, visual=visual, deepstack=prompt.deepstack)  # fmt: skip


def append_text(
    model, embeds: torch.Tensor, positions: torch.Tensor, offset: int, ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``embeds`` [T, D] and ``positions`` [3, 1, T] with the text ``ids`` appended, each at its index plus
    ``offset`` on all three axes (where every token after a prompt goes)."""
    index = torch.arange(embeds.shape[0], embeds.shape[0] + len(ids))
    text = model.model.language_model.embed_tokens(torch.tensor(list(ids)))
    return torch.cat([embeds, text]), torch.cat([positions, (index + offset).expand(3, 1, -1)], dim=2)


def hf_session_greedy(
    model_dir: Path, turns: Sequence[tuple[str, Path] | Sequence[int]], q: float, steps: int = 8,
    keep_mask=compute_retention_mask,
) -> HFReference:  # fmt: skip
    """A session's whole conversation as transformers' Qwen3-VL sees it, greedily continued. Each of ``turns``
    is either a (text with one VIDEO placeholder, clip) turn, laid out by transformers on its own, pruned
    (`hf_video_prompt`) and moved past what precedes it (positions plus the next index plus the decode
    offset so far), or token ids (a reply, a question's text) at their index plus the decode offset. Both
    rules are the one transformers' `get_rope_index` gives the conversation laid out whole, since text
    continues one position per token; pruned rows deleted, the offset grows by their count."""
    model = hf(str(model_dir))[0]
    width = model.config.text_config.hidden_size
    embeds, positions, offset = torch.zeros(0, width), torch.zeros(3, 1, 0, dtype=torch.int64), 0
    visual, deepstack = torch.zeros(0, dtype=torch.bool), None
    with torch.no_grad():
        for turn in turns:
            if isinstance(turn, tuple):
                text, clip = turn
                prompt = hf_video_prompt(model_dir, clip, q, keep_mask, text)
                keep, moved_by = prompt.keep, embeds.shape[0] + offset
                embeds = torch.cat([embeds, prompt.embeds[keep]])
                positions = torch.cat([positions, prompt.positions[:, :, keep] + moved_by], dim=2)
                visual = torch.cat([visual, prompt.is_pad[keep]])
                levels = prompt.deepstack
                if deepstack is not None:
                    levels = [torch.cat(pair) for pair in zip(deepstack, levels, strict=True)]
                deepstack = levels
                offset += prompt.delta + int((~keep).sum())
            else:
                embeds, positions = append_text(model, embeds, positions, offset, turn)
                visual = torch.cat([visual, torch.zeros(len(turn), dtype=torch.bool)])
        tokens, logprobs, _ = hf_greedy_decode(model, embeds, positions, offset, steps, visual, deepstack)
    return HFReference(tokens, embeds.shape[0], logprobs)


def hf_prompt_logprobs(prompt: MediaPrompt) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept prompt's token ids [N] and the log-softmax of every row's next-token logits [N, vocab]: row i
    scores token i + 1, at the kept rows' reference positions."""
    model, keep = prompt.model, prompt.keep
    with torch.no_grad():
        out = model.model.language_model(
            inputs_embeds=prompt.embeds[keep][None], position_ids=prompt.positions[:, :, keep], use_cache=False,
            visual_pos_masks=prompt.is_pad[keep][None], deepstack_visual_embeds=prompt.deepstack,
        )  # fmt: skip
        return prompt.ids[keep], torch.log_softmax(model.lm_head(out.last_hidden_state[0]).float(), dim=-1)


# --- the rule's positions, against which traced forwards are checked


@cache
def rule_positions(model_dir: str, clip: str, kept: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """The video prompt's kept tokens at the positions transformers' `get_rope_index` gives them in the
    unpruned sequence ([3, kept tokens]), and the offset of every later token (its position minus its
    index in the pruned sequence: the unpruned delta plus the pruned count)."""
    model, processor = hf(str(model_dir))
    frames, metadata = sampled_frames(clip)
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


def assert_served_at_the_rules_positions(served: Sequence[tuple], rule: torch.Tensor, offset: int) -> None:
    """Every prefill chunk and decode step of each traced request (`served`: (reply, its rope_positions events), a
    first request and its radix repeat) handed the language model exactly `rule` ([3, prompt] positions of the kept
    tokens) and, after the prompt, index + `offset`; the prompt prefilled in several chunks. The control: the rule
    with every token from the middle of the prompt on one position later is not what the first request was given."""
    first_events = served[0][1]
    assert sum(event["mode"] == "EXTEND" for event in first_events) > 2  # the prompt in several chunks
    for reply, events in served:
        assert reply.prompt_tokens == rule.shape[1]
        assert {event["mode"] for event in events} == {"EXTEND", "DECODE"}
        prefilled = sum(event["rows"] for event in events if event["mode"] == "EXTEND")
        assert prefilled == rule.shape[1] - reply.cached_tokens
        for event in events:
            assert torch.equal(torch.tensor(event["positions"]), expected_positions(event, rule, offset)), event
    one_off = rule.clone()
    one_off[:, rule.shape[1] // 2 :] += 1
    assert any(
        not torch.equal(torch.tensor(event["positions"]), expected_positions(event, one_off, offset + 1))
        for event in first_events if event["mode"] == "EXTEND"
    )  # fmt: skip


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


def served_stream_masks(events: Sequence[dict], inputs: StreamInputs) -> list[torch.Tensor]:
    """The keep-masks a server decided for a stream's segments, from its `keep_mask` trace events (one per segment,
    in the segments' order), each [T*h*w] bool as `inputs` counts the segment's rows."""
    assert len(events) == len(inputs.main), f"{len(events)} keep-masks traced for {len(inputs.main)} segments"
    masks = []
    for event, rows in zip(events, inputs.main, strict=True):
        mask = torch.zeros(rows.shape[0], dtype=torch.bool)
        mask[event["kept"]] = True
        masks.append(mask)
    return masks


def assert_stream_masks_agree_up_to_ties(served: Sequence[torch.Tensor], inputs: StreamInputs, q: float | None,
                                         threshold: float | None, tie: float = MASK_TIE) -> None:  # fmt: skip
    """A server's keep-masks of a stream's segments are the stream rule's on HF's rows (`stream_rule_masks`) except at
    rows whose stream scores are within `tie` of the segment's cut (the threshold; at a rate, the lowest score the
    rule keeps of the segment, whose count the server's must be): two encoders' roundings may rank those apart."""
    from sglang_evs.testing.evs_oracle import scores as stream_scores

    merge = inputs.model.config.vision_config.spatial_merge_size
    grids = inputs.grid.tolist()
    row_scores = stream_scores(torch.cat(inputs.rows()), (sum(g[0] for g in grids), *grids[0][1:]), merge)
    start = 0
    for index, (got, want) in enumerate(zip(served, stream_rule_masks(inputs, q, threshold), strict=True)):
        segment = row_scores[start : start + want.numel()]
        start += want.numel()
        if threshold is None:
            assert int(got.sum()) == int(want.sum()), (
                f"segment {index} keeps {int(got.sum())}, the rule {int(want.sum())}"
            )
        cut = threshold if threshold is not None else min(segment[i] for i in want.nonzero().flatten().tolist())
        for i in (got ^ want).nonzero().flatten().tolist():
            assert abs(segment[i] - cut) < tie, (
                f"segment {index}: the masks differ beyond ties at row {i} ({segment[i]:.4g})"
            )


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


def assert_limited_masks_agree_up_to_ties(served, oracle_rows, grid, merge, q, budget: int = 0, floor: int = 0,
                                          tie: float = MASK_TIE):  # fmt: skip
    """Under a token budget and a per-group floor (0: off): the server's mask keeps the oracle's count
    (`evs_oracle.limited_keep_mask` on HF's features) and agrees with it up to ties (`_assert_agree_near_cuts`)."""
    from sglang_evs.testing.evs_oracle import limited_keep_mask

    oracle = limited_keep_mask(oracle_rows, grid, merge, q, budget, floor)
    assert int(served.sum()) == int(oracle.sum())
    _assert_agree_near_cuts(served, oracle, scores(oracle_rows, grid, merge), int(grid[0]), floor, tie)


def assert_threshold_masks_agree_up_to_ties(served, oracle_rows, grid, merge, threshold: float, budget: int = 0,
                                            floor: int = 0, tie: float = MASK_TIE):  # fmt: skip
    """Under a threshold (and a budget and a floor, 0: off): the server's mask is the oracle's
    (`evs_oracle.threshold_keep_mask` on HF's features) up to ties (`_assert_agree_near_cuts`), the threshold
    itself one of the cuts."""
    from sglang_evs.testing.evs_oracle import threshold_keep_mask as oracle_mask

    oracle = oracle_mask(oracle_rows, grid, merge, threshold, budget, floor)
    _assert_agree_near_cuts(served, oracle, scores(oracle_rows, grid, merge), int(grid[0]), floor, tie,
                            cuts=(threshold,), past_group_0=True)  # fmt: skip


def _assert_agree_near_cuts(served, oracle, row_scores: list[float], groups: int, floor: int, tie: float,
                            cuts: tuple[float, ...] = (), past_group_0: bool = False) -> None:  # fmt: skip
    """The server's mask keeps at least the floor in every group, and differs from `oracle` only at rows whose
    scores are within `tie` of a cut: one of `cuts`, the lowest score the oracle keeps past the floors (and past
    group 0 where `past_group_0`), or the row's group's floor (its `floor`-th best score)."""
    from sglang_evs.testing.evs_oracle import ranked

    tpf = len(row_scores) // groups
    k = min(floor, tpf)
    assert min(served.view(groups, tpf).sum(dim=1).tolist()) >= k
    order = ranked(row_scores)
    floors = [[i for i in order if i // tpf == g][:k] for g in range(groups)]
    in_floors = {i for group in floors for i in group}
    past_floors = [i for i in order if oracle[i] and i not in in_floors and (i >= tpf or not past_group_0)]
    rest_cuts = [*cuts, *([row_scores[past_floors[-1]]] if past_floors else [])]
    for i in (served ^ oracle).nonzero().flatten().tolist():
        group_cut = [row_scores[floors[i // tpf][-1]]] if k else []
        near = [abs(row_scores[i] - cut) < tie for cut in group_cut + rest_cuts]
        assert any(near), f"the masks differ beyond ties at row {i} (score {row_scores[i]:.4g})"
