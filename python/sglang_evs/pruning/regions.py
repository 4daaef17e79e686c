"""Tokenizer side: rewrite an SGLang processor output so each video occupies its pruned length.

Model-agnostic: a video's region is everything from its first to its last pad (Qwen3-VL's
per-group timestamps and markers included; Qwen2-VL and Qwen2.5-VL have one run of pads),
and its positions are whatever the model family's upstream `get_rope_index` computed.

Before encoding, the keep-mask is unknown but the pruned length is not
(the method's `retained_token_count`, capped by a token budget and raised by a per-group floor:
`methods.limited_count`). Each pruned video becomes ONE placeholder region
spanning from its first pad to its last pad (framing tokens of groups 1..T-1
included), laid out with the canonical split (`methods.canonical_keep_mask`).
After encoding, the model fills the region with the true layout: the
unpruned region minus the pruned pads (framing slots get their token's text
embedding) and writes the region's true M-RoPE positions.

The unpruned region ids and positions travel on the item, so the model can
place any mask exactly: positions = unpruned positions with pruned rows
deleted (the reference rule, docs/architecture.md). Outside the regions the
positions and the decode offset computed here are already the final ones.
"""

import copy

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs.methods import canonical_keep_mask, continued_count, grid_tokens
from sglang_evs.methods.images import image_kept_count
from sglang_evs.pruning.deletion import delete_tokens
from sglang_evs.pruning.fields import (
    METHOD,
    MIN_TOKENS_PER_GROUP,
    RATE,
    REGION_IDS,
    REGION_POSITIONS,
    STREAM_CONTEXT,
    THRESHOLD,
    TOKEN_BUDGET,
    VIDEO_TOKENS,
    TokenCounts,
    continues_stream,
    image_grids,
    region_keep,
    region_span,
    video_grid,
    video_grids,
)
from sglang_evs.pruning.keys import is_device_handle, key_by_pruning
from sglang_evs.pruning.settings import ImagePruning, Pruning


def stream_digest(item) -> str | None:
    """The digest of the stream group a continued segment is scored against (`fields.STREAM_CONTEXT`), or None."""
    return item.model_specific_data[STREAM_CONTEXT]["digest"] if continues_stream(item) else None


def split_bundled_videos(items: list) -> list:
    """One item per video. SGLang splits a video item per video only when it carries one span per
    temporal group (Qwen3-VL); Qwen2-VL and Qwen2.5-VL videos have one span each, so the videos of
    a request stay bundled in one item ([N, 3] grid). Each video here gets its patches, its span and
    its rows of the per-video data (sliced as SGLang slices them), and a hash of its own."""
    out = []
    for item in items:
        grids = video_grids(item) if item.is_video() else None
        if grids is None or len(grids) == 1:
            out.append(item)
            continue
        if is_device_handle(item.feature):
            raise ValueError(
                f"cannot prune {len(grids)} videos of one request whose pixels the tokenizer holds as a device "
                "handle: serve with --mm-feature-transport cpu, or send one video per request"
            )
        if len(item.offsets) != len(grids) or not isinstance(item.feature, torch.Tensor):
            raise ValueError(f"cannot split a bundle of {len(grids)} videos with {len(item.offsets)} spans")
        bounds = [0, *torch.cumsum(grids.prod(dim=-1), 0).tolist()]
        for index in range(len(grids)):
            video = copy.copy(item)
            video.feature = item.feature[bounds[index] : bounds[index + 1]]
            video.offsets = [item.offsets[index]]
            video.model_specific_data = sglang.slice_model_data(
                item.model_specific_data, index=index, start=bounds[index], end=bounds[index + 1],
                num_items=len(grids), total_feature_len=bounds[-1],
            )  # fmt: skip
            video.hash = None
            out.append(video)
    return out


def prune_video_regions(output, pruning: Pruning, spatial_merge_size: int, video_token_id: int):
    """Shorten every video of an SGLang `MultimodalProcessorOutput` to its pruned length, in place.

    Returns the list of TokenCounts (token counts before/after), one per video.
    """
    output.mm_items = split_bundled_videos(output.mm_items)
    ids = torch.as_tensor(output.input_ids, dtype=torch.int64)
    positions = output.mrope_positions  # [3, L]
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    videos = [item for item in output.mm_items if item.is_video()]
    stats = []
    for item in videos:
        grid = video_grid(item)
        start, end = region_span(item)
        region_ids = ids[start:end].clone()
        t, h, w = grid[0], grid[1] // spatial_merge_size, grid[2] // spatial_merge_size
        if continues_stream(item):  # a segment pruned as its stream is (`streams.py`)
            kept = continued_count(h * w, t, pruning.rate, pruning.token_budget, pruning.min_tokens_per_group)
        else:
            kept = pruning.kept_count(h * w, t)
        keep[start:end] = region_keep(region_ids, video_token_id, canonical_keep_mask(grid, spatial_merge_size, kept))
        item.set(METHOD, pruning.method.name)
        item.set(RATE, pruning.rate)
        if pruning.token_budget:
            item.set(TOKEN_BUDGET, pruning.token_budget)
        if pruning.min_tokens_per_group:
            item.set(MIN_TOKENS_PER_GROUP, pruning.min_tokens_per_group)
        item.set(REGION_IDS, region_ids)
        item.set(REGION_POSITIONS, positions[:, start:end].clone())
        item.set(VIDEO_TOKENS, (t * h * w, kept))
        stats.append(TokenCounts(t * h * w, kept))

    for item in videos:
        start, end = region_span(item)
        item.offsets = [(start, end - 1)]  # one span: the whole region, framing text between groups included
    delete_tokens(output, keep)
    for item in videos:
        limits = {"token_budget": pruning.token_budget, "min_tokens_per_group": pruning.min_tokens_per_group}
        key_by_pruning(item, pruning.method.name, pruning.rate, **limits, stream_context=stream_digest(item))
    output.padded_input_ids = type(output).build_padded_input_ids(output.input_ids, output.mm_items)
    return stats


def mark_threshold_videos(output, pruning: Pruning, spatial_merge_size: int) -> list[int]:
    """Mark every video of an SGLang `MultimodalProcessorOutput` as waiting for its threshold's mask, in place:
    the prompt stays unpruned (its count is the content's, known once the encoder has run), each video one
    item, its key folded with the threshold and limits. The scheduler lays it out at admission
    (`admission.py`). Returns each video's token count."""
    output.mm_items = split_bundled_videos(output.mm_items)
    limits = {"token_budget": pruning.token_budget, "min_tokens_per_group": pruning.min_tokens_per_group}
    tokens = []
    for item in output.mm_items:
        if not item.is_video():
            continue
        t, h, w = grid_tokens(video_grid(item), spatial_merge_size)
        tokens.append(t * h * w)
        item.set(THRESHOLD, {"threshold": pruning.threshold, **limits})
        key_by_pruning(item, pruning.method.name, 0.0, **limits, threshold=pruning.threshold,
                       stream_context=stream_digest(item))  # fmt: skip
    output.padded_input_ids = type(output).build_padded_input_ids(output.input_ids, output.mm_items)
    return tokens


def prune_image_regions(output, pruning: ImagePruning, spatial_merge_size: int, image_token_id: int) -> list:
    """Shorten every image of an SGLang `MultimodalProcessorOutput` to its pruned length, in place: each image's run
    of pads (one span, all pads) cut to `image_kept_count` (its first pads: the model places the rows its method
    keeps, at their unpruned positions, `images.py`). SGLang's processor makes each image an item of its own; an item
    that still holds several is pruned image by image and never split (a device feature transport's handle cannot
    be). The item carries its images' unpruned pad positions, one after the other (`REGION_POSITIONS`, [3, pads]),
    and its key folds the method and rate. Returns the TokenCounts (tokens before/after) of each image.
    """
    ids = torch.as_tensor(output.input_ids, dtype=torch.int64)
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    items = [item for item in output.mm_items if item.is_image()]
    stats = []
    for item in items:
        grids, positions = image_grids(item), []
        if len(grids) != len(item.offsets):
            raise ValueError(f"cannot prune {len(grids)} images laid out in {len(item.offsets)} spans")
        for grid, (start, end) in zip(grids, item.offsets, strict=True):
            t, h, w = grid_tokens(grid, spatial_merge_size)
            if end - start + 1 != t * h * w or not bool((ids[start : end + 1] == image_token_id).all()):
                raise ValueError(f"an image of grid {grid.tolist()} is not one run of {t * h * w} pads")
            kept = image_kept_count(t * h * w, pruning.rate)
            keep[start : end + 1] = torch.arange(t * h * w) < kept
            positions.append(output.mrope_positions[:, start : end + 1])
            stats.append(TokenCounts(t * h * w, kept))
        item.set(METHOD, pruning.method.name)
        item.set(RATE, pruning.rate)
        item.set(REGION_POSITIONS, torch.cat(positions, dim=1).clone())
    delete_tokens(output, keep)
    for item in items:
        key_by_pruning(item, pruning.method.name, pruning.rate)
    output.padded_input_ids = type(output).build_padded_input_ids(output.input_ids, output.mm_items)
    return stats
