"""Which video tokens EVS keeps.

Efficient Video Sampling (arXiv 2510.14624) drops the merged vision tokens of
a video that barely change from one temporal group to the next.  A video is
``grid_thw = (T, H, W)`` before spatial merging; after merging with factor
``m`` a temporal group (2 frames) is ``h x w = (H / m) x (W / m)`` tokens, and
the encoder output has ``T * h * w`` rows, group by group, row-major inside a
group.

* Score of cell ``(t, r, c)``: ``1 - cos(x[t, r, c], x[t - 1, r, c])`` for
  ``t >= 1`` (torch's default eps, computed in the embedding dtype); group 0
  scores 255 so it always ranks first.
* Kept count: ``N = max(h * w, int(T * h * w * (1 - q)))``.
* The ``N`` best scores are kept, ties broken towards the lower flat index
  (stable descending sort).  The mask is over the original rows, so kept rows
  stay in frame/raster order.

For Qwen3-VL the rows to score are the main merger output concatenated with
the deepstack outputs (``[main | ds0 | ds1 | ds2]``); the one mask then prunes
every level (see :func:`apply_retention_mask`).

The mask equals vLLM 0.33's ``compute_retention_mask`` bit for bit, ties
included (tested against a vendored copy in ``test/evs/vllm_reference.py``),
whenever the scores are not NaN.  A NaN score only arises from fp16 zero
vectors (torch's eps underflows) or non-finite embeddings; vLLM then ranks it
above group 0, here it scores 1 (what fp32 gives a zero vector), so group 0
is always whole and the pruned layout's first group is always fixed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

__all__ = [
    "PRUNING_RATE_SETTING",
    "apply_retention_mask",
    "grid_tokens",
    "retained_token_count",
    "retention_mask",
    "validate_pruning_rate",
]

PRUNING_RATE_SETTING = "video_pruning_rate"

GridTHW = Sequence[int] | torch.Tensor


def validate_pruning_rate(pruning_rate: object) -> float:
    """Return ``pruning_rate`` as a float, or raise ``ValueError``.

    Valid rates are real numbers in ``[0, 1)``; booleans, NaN, strings and
    ``None`` are rejected.  The message names the value and the setting.
    """
    ok = (
        isinstance(pruning_rate, numbers.Real)
        and not isinstance(pruning_rate, bool)
        and not math.isnan(float(pruning_rate))
        and 0.0 <= float(pruning_rate) < 1.0
    )
    if not ok:
        raise ValueError(f"{PRUNING_RATE_SETTING} must be a number in [0, 1), got {pruning_rate!r}")
    return float(pruning_rate)


def retained_token_count(tokens_per_group: int, num_groups: int, pruning_rate: float) -> int:
    """Number of video tokens EVS keeps: ``max(tpf, int(T * tpf * (1 - q)))``.

    Float arithmetic then truncation, e.g. ``(10, 20, 0.9) -> 19``.  Depends
    only on the grid and the rate, so it is known before the encoder runs.
    """
    q = validate_pruning_rate(pruning_rate)
    tpf, t = int(tokens_per_group), int(num_groups)
    if tpf < 1 or t < 1:
        raise ValueError(f"tokens_per_group and num_groups must be >= 1, got {tpf}, {t}")
    return max(tpf, int(t * tpf * (1 - q)))


def grid_tokens(grid_thw: GridTHW, spatial_merge_size: int) -> tuple[int, int, int]:
    """``(T, H, W)`` before merging -> ``(T, h, w)`` merged token grid."""
    t, hh, ww = (int(v) for v in grid_thw)
    m = int(spatial_merge_size)
    if m < 1 or hh % m or ww % m or min(t, hh, ww) < 1:
        raise ValueError(f"grid_thw {(t, hh, ww)} is not a positive grid divisible by spatial_merge_size {m}")
    return t, hh // m, ww // m


def retention_mask(
    video_embeds: torch.Tensor,
    grid_thw: GridTHW,
    spatial_merge_size: int,
    pruning_rate: float,
) -> torch.Tensor:
    """EVS keep-mask of one video.

    Args:
        video_embeds: ``[T * h * w, D]`` merged vision tokens (any D; pass the
            ``[main | deepstack...]`` concatenation to score all columns).
        grid_thw: ``(T, H, W)`` before merging (tuple, list or tensor).
        spatial_merge_size: ``m``; ``h = H / m``, ``w = W / m``.
        pruning_rate: ``q`` in ``[0, 1)``.

    Returns:
        ``[T * h * w]`` bool tensor on ``video_embeds.device``; exactly
        :func:`retained_token_count` entries are True, group 0 all True.
    """
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    tpf = h * w
    if video_embeds.dim() != 2 or video_embeds.shape[0] != t * tpf:
        raise ValueError(
            f"video_embeds must be [{t * tpf}, D] for grid {tuple(grid_thw)} and "
            f"merge size {spatial_merge_size}, got {list(video_embeds.shape)}"
        )
    keep = retained_token_count(tpf, t, pruning_rate)
    x = video_embeds.reshape(t, h, w, video_embeds.shape[-1])
    change = 1 - torch.nn.functional.cosine_similarity(x[1:], x[:-1], dim=-1)
    # A NaN score (fp16 zero vector: eps**2 underflows; non-finite input)
    # would outrank group 0 in the sort; count it as 1, the score fp32 gives
    # a zero vector.  Finite scores are untouched.
    change = torch.nan_to_num(change, nan=1.0)
    first = torch.full((1, h, w), 255, dtype=change.dtype, device=change.device)
    scores = torch.cat([first, change]).reshape(-1)
    order = torch.argsort(scores, descending=True, stable=True)
    mask = torch.zeros(t * tpf, dtype=torch.bool, device=video_embeds.device)
    mask[order[:keep]] = True
    return mask


def apply_retention_mask(
    embeds: torch.Tensor, mask: torch.Tensor, split_sizes: Sequence[int] | None = None
) -> torch.Tensor | list[torch.Tensor]:
    """Keep the masked rows of ``embeds`` ``[rows, D]``.

    With ``split_sizes`` (column widths, e.g. ``[hidden] * 4`` for main plus
    three deepstack levels) the kept rows are returned split per level.
    """
    kept = embeds[mask]
    if split_sizes is None:
        return kept
    return list(torch.split(kept, list(split_sizes), dim=-1))
