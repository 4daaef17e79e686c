"""What a pruned video or image item carries from the tokenizer process to the model, and region helpers.

Neutral ground: the tokenizer side (`regions.py`) writes these fields, the model side
(`videos.py`, `images.py`) reads them; neither imports the other. A pruned image item carries METHOD, RATE and
REGION_POSITIONS (its images' pad positions, unpruned, one image after the other); the other fields are videos'.
"""

import hashlib
from dataclasses import dataclass

import torch

METHOD = "evs_pruning_method"  # the pruning method's name (methods.METHODS)
RATE = "evs_pruning_rate"  # q in [0, 1) (0 where a token budget alone prunes)
TOKEN_BUDGET = "evs_token_budget"  # N > 0, set only where a budget was asked for
MIN_TOKENS_PER_GROUP = "evs_min_tokens_per_group"  # k > 0, set only where a floor was asked for
REGION_IDS = "evs_region_ids"  # [len(R)] int64, unpruned region token ids
REGION_POSITIONS = "evs_region_positions"  # [3, len(R)] int64, unpruned positions of the region (images: [3, pads])
VIDEO_TOKENS = "evs_video_tokens"  # (before, after) pruning
# {"threshold", "token_budget", "min_tokens_per_group"} of a video laid out unpruned for its threshold: the
# scheduler decides its mask when it admits the request and lays the prompt out from it (`admission.py`).
# A dict, which SGLang's per-item split of model_specific_data copies whole.
THRESHOLD = "evs_threshold"
THRESHOLD_KEPT = "kept"  # the key of THRESHOLD the scheduler adds: the video's keep-mask, [T*h*w] bool
# {"method", "rate"} of a video an encoder server pruned, on a --language-only server's item (encoder_records):
# the rows arrive pruned, so the item carries no RATE (which would have the model compute a keep-mask again).
# A dict, which SGLang's per-item split of model_specific_data copies whole (a list may be split by item).
ENCODER_PRUNED = "evs_encoder_pruned"
# {"fold": `pruning_aware_hash`'s arguments but the content hash, "exporter_pid": the tokenizer's pid} on a pruned
# video SGLang has not hashed yet (`keys.py`): folded into the key where SGLang hashes the item.
DEFERRED_KEY = "evs_deferred_key"
# {"patches": [H * W, patch width] the stream's group before this segment (the previous segment's last temporal group,
# its pixels as the processor patched them), "digest": their SHA-256} on a pruned segment that continues a stream
# (`streams.py`): the tower encodes them before the segment's own, and the mask scores the segment against them.
# A dict, which SGLang's per-item split of model_specific_data copies whole.
STREAM_CONTEXT = "evs_stream_context"


@dataclass(frozen=True)
class TokenCounts:
    """One video's or image's tokens before and after pruning."""

    before: int
    after: int


def is_pruned(item) -> bool:
    return RATE in item.model_specific_data


def awaits_threshold(item) -> bool:
    """Whether a video item waits for its threshold's mask (laid out unpruned, `THRESHOLD`)."""
    data = item.model_specific_data
    return THRESHOLD in data and THRESHOLD_KEPT not in data[THRESHOLD]


def continues_stream(item) -> bool:
    """Whether a video item is a pruned segment that continues a stream (`STREAM_CONTEXT`)."""
    return STREAM_CONTEXT in item.model_specific_data


def threshold_decided(item) -> bool:
    """Whether a video item's threshold mask was decided at admission (`THRESHOLD_KEPT`)."""
    return THRESHOLD_KEPT in item.model_specific_data.get(THRESHOLD, {})


def pruned_with(item) -> tuple[str, float] | None:
    """(method, rate) a video item was pruned with, wherever it was: in this server's tokenizer (`is_pruned`:
    the model prunes it) or by an encoder server (`ENCODER_PRUNED`: its rows arrived pruned); None: not
    pruned. Both servers of a prefill/decode pair compare it (`prefill_decode.layout_of`)."""
    data = item.model_specific_data
    if RATE in data:
        return data[METHOD], float(data[RATE])
    if ENCODER_PRUNED in data:
        return data[ENCODER_PRUNED]["method"], float(data[ENCODER_PRUNED]["rate"])
    return None


def video_grids(item) -> torch.Tensor:
    """[N, 3] (T, H, W) of each video an item holds (a Qwen2-VL-family item may bundle several)."""
    return item.video_grid_thw.reshape(-1, 3)


def image_grids(item) -> torch.Tensor:
    """[N, 3] (T, H, W) of each image an item holds (a Qwen-family item bundles a request's images)."""
    return item.image_grid_thw.reshape(-1, 3)


def video_grid(item) -> list[int]:
    """(T, H, W) of a one-video item."""
    return [int(v) for v in video_grids(item)[0]]


def encoder_patches(item) -> int:
    """Patches the vision tower takes for every video of the item."""
    return int(video_grids(item).prod(dim=-1).sum())


def region_span(item) -> tuple[int, int]:
    """[start, end) of the item's tokens in the prompt: its first pad to its last (framing text between
    temporal groups included, for one video split into a span per group)."""
    return item.offsets[0][0], item.offsets[-1][1] + 1


def region_keep(region_ids: torch.Tensor, video_token_id: int, pad_mask: torch.Tensor) -> torch.Tensor:
    """[len(R)] bool: which region tokens remain, given the [T*h*w] keep-mask over its pads."""
    keep = torch.ones_like(region_ids, dtype=torch.bool)
    keep[region_ids == video_token_id] = pad_mask.to(keep.device)
    return keep


def pruned_limits(item) -> tuple[int, int]:
    """(token budget, min tokens per group) a video item was pruned with here (0: none)."""
    data = item.model_specific_data
    return int(data.get(TOKEN_BUDGET, 0)), int(data.get(MIN_TOKENS_PER_GROUP, 0))


def pruning_aware_hash(
    item_hash: int,
    method: str,
    pruning_rate: float,
    token_budget: int = 0,
    min_tokens_per_group: int = 0,
    threshold: float | None = None,
    stream_context: str | None = None,
) -> int:
    """The same video pruned by two methods, at two rates or thresholds, under two budgets or floors, or continuing
    two streams (`stream_context`: the digest of the group before it) must not share radix-cache entries or
    cached embeddings. (Without a budget, floor, threshold or stream the key is what it always was.)"""
    key = f"{item_hash}:{method}:{pruning_rate!r}"
    key += f":budget={int(token_budget)}" if token_budget else ""
    key += f":floor={int(min_tokens_per_group)}" if min_tokens_per_group else ""
    key += f":threshold={float(threshold)!r}" if threshold is not None else ""
    key += f":after={stream_context}" if stream_context is not None else ""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big")
