"""Rewrite an SGLang processor output so each video occupies its pruned length.

Before encoding, the keep-mask is unknown but the pruned length is not
(`retained_token_count`). Each pruned video becomes ONE placeholder region
spanning from its first pad to its last pad (framing tokens of groups 1..T-1
included), laid out with the canonical split (`evs.canonical_keep_mask`).
After encoding, the model fills the region with the true layout: the
unpruned region minus the pruned pads (framing slots get their token's text
embedding) and writes the region's true M-RoPE positions.

The unpruned region ids and positions travel on the item, so the model can
place any mask exactly: positions = unpruned positions with pruned rows
deleted (the reference rule, spec section 4). Outside the regions the
positions and the decode offset computed here are already the final ones.
"""

import hashlib
from dataclasses import dataclass

import torch

from sglang_evs.evs import canonical_keep_mask, retained_token_count

RATE = "evs_pruning_rate"
REGION_IDS = "evs_region_ids"  # [len(R)] int64, unpruned region token ids
REGION_POSITIONS = "evs_region_positions"  # [3, len(R)] int64, unpruned positions of the region
VIDEO_TOKENS = "evs_video_tokens"  # (before, after) pruning


@dataclass(frozen=True)
class PrunedVideo:
    before: int
    after: int


def is_pruned(item) -> bool:
    return RATE in item.model_specific_data


def region_keep(region_ids: torch.Tensor, video_token_id: int, pad_mask: torch.Tensor) -> torch.Tensor:
    """[len(R)] bool: which region tokens remain, given the [T*h*w] keep-mask over its pads."""
    keep = torch.ones_like(region_ids, dtype=torch.bool)
    keep[region_ids == video_token_id] = pad_mask.to(keep.device)
    return keep


def rate_aware_hash(item_hash: int, pruning_rate: float) -> int:
    """The same video at two rates must not share radix-cache entries or cached embeddings."""
    digest = hashlib.sha256(f"{item_hash}:{pruning_rate!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def prune_video_layout(output, pruning_rate: float, spatial_merge_size: int, video_token_id: int):
    """Shorten every video of an SGLang `MultimodalProcessorOutput` to its pruned length, in place.

    Returns the list of PrunedVideo (token counts before/after), one per video.
    """
    ids = torch.as_tensor(output.input_ids, dtype=torch.int64)
    positions = output.mrope_positions  # [3, L]
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    videos = [item for item in output.mm_items if item.is_video()]
    stats = []
    for item in videos:
        grid = [int(x) for x in item.video_grid_thw.reshape(-1, 3)[0]]
        start, end = item.offsets[0][0], item.offsets[-1][1] + 1
        region_ids = ids[start:end].clone()
        keep[start:end] = region_keep(
            region_ids, video_token_id, canonical_keep_mask(grid, spatial_merge_size, pruning_rate)
        )
        t, h, w = grid[0], grid[1] // spatial_merge_size, grid[2] // spatial_merge_size
        kept = retained_token_count(h * w, t, pruning_rate)
        item.set(RATE, pruning_rate)
        item.set(REGION_IDS, region_ids)
        item.set(REGION_POSITIONS, positions[:, start:end].clone())
        item.set(VIDEO_TOKENS, (t * h * w, kept))
        stats.append(PrunedVideo(t * h * w, kept))

    new_index = torch.cumsum(keep, 0) - 1  # old token index -> new token index (for kept tokens)
    for item in output.mm_items:
        if item.is_video():
            start, end = item.offsets[0][0], item.offsets[-1][1] + 1
            new_start = int(new_index[start])
            item.offsets = [(new_start, new_start + int(keep[start:end].sum()) - 1)]
        else:
            item.offsets = [(int(new_index[s]), int(new_index[e])) for s, e in item.offsets]
    for item in videos:
        item.set_pad_value()  # content hash of the pixels, then folded with the rate
        item.set_hash(rate_aware_hash(item.hash, pruning_rate))

    pruned = int((~keep).sum())
    output.input_ids = ids[keep].tolist()
    output.mrope_positions = positions[:, keep]
    output.mrope_position_delta = output.mrope_position_delta + pruned
    output.padded_input_ids = type(output).build_padded_input_ids(output.input_ids, output.mm_items)
    return stats
