"""What a pruned video item carries from the tokenizer process to the model, and region helpers.

Neutral ground: the tokenizer side (`regions.py`) writes these fields, the model side
(`videos.py`) reads them; neither imports the other.
"""

import hashlib
from dataclasses import dataclass

import torch

METHOD = "evs_pruning_method"  # the pruning method's name (methods.METHODS)
RATE = "evs_pruning_rate"  # q in (0, 1)
REGION_IDS = "evs_region_ids"  # [len(R)] int64, unpruned region token ids
REGION_POSITIONS = "evs_region_positions"  # [3, len(R)] int64, unpruned positions of the region
VIDEO_TOKENS = "evs_video_tokens"  # (before, after) pruning


@dataclass(frozen=True)
class VideoTokenCounts:
    before: int
    after: int


def is_pruned(item) -> bool:
    return RATE in item.model_specific_data


def region_keep(region_ids: torch.Tensor, video_token_id: int, pad_mask: torch.Tensor) -> torch.Tensor:
    """[len(R)] bool: which region tokens remain, given the [T*h*w] keep-mask over its pads."""
    keep = torch.ones_like(region_ids, dtype=torch.bool)
    keep[region_ids == video_token_id] = pad_mask.to(keep.device)
    return keep


def pruning_aware_hash(item_hash: int, method: str, pruning_rate: float) -> int:
    """The same video pruned by two methods or at two rates must not share radix-cache entries or
    cached embeddings."""
    digest = hashlib.sha256(f"{item_hash}:{method}:{pruning_rate!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big")
