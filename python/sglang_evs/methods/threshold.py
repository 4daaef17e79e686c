"""Which video tokens a dissimilarity threshold keeps (``video_pruning_threshold`` t, in ``[0, 2]``).

EVS's dissimilarity of a cell (:func:`.evs.dissimilarity`) is ``1 - cos`` with the same cell one
temporal group back. A threshold keeps group 0 whole and every later cell whose dissimilarity exceeds
t, so its count is decided by the content: known only once the vision encoder has run, unlike a rate's,
a budget's or a floor's (:mod:`.limits`). Combined with them, the threshold decides first, then the
budget caps and the floor raises: ``limits.limit_count(int(mask.sum()), ...)``, and the tokens for that
count are EVS's best-ranked (the threshold's kept cells are a top of that ranking), each group's floor
taken first (``limits.with_group_floor``).

A server decides it when it admits the request, before laying the prompt out (``pruning/admission.py``).
"""

from __future__ import annotations

import torch

from .evs import dissimilarity, mask_for_count
from .inputs import GridTHW, check_pruning_threshold, grid_tokens
from .limits import limit_count, with_group_floor

__all__ = ["threshold_keep_mask", "threshold_limited_mask"]


def threshold_keep_mask(dissimilarity: torch.Tensor, threshold: float) -> torch.Tensor:
    """Keep-mask of one video by a dissimilarity threshold.

    Args:
        dissimilarity: ``[T, h * w]`` per cell, group by group (row 0, group 0, is kept whatever it holds:
            :func:`.evs.dissimilarity` scores it 255).
        threshold: ``t`` in ``[0, 2]``.

    Returns:
        ``[T * h * w]`` bool on ``dissimilarity.device``: group 0 all True; a later cell True where its
        dissimilarity exceeds ``t`` (strictly: ``t = 2`` keeps group 0 alone), or is NaN (a non-finite
        row, which EVS's ranking puts first too).
    """
    t = check_pruning_threshold(threshold)
    if dissimilarity.dim() != 2 or dissimilarity.shape[0] < 1:
        raise ValueError(f"dissimilarity must be [T, h * w] with T >= 1, got {list(dissimilarity.shape)}")
    keep = ~(dissimilarity <= t)  # NaN compares False: kept
    keep[0] = True
    return keep.reshape(-1)


def threshold_limited_mask(
    video_embeds: torch.Tensor,
    grid_thw: GridTHW,
    spatial_merge_size: int,
    threshold: float,
    token_budget: int = 0,
    min_tokens_per_group: int = 0,
) -> torch.Tensor:
    """Keep-mask of one video under a threshold, then the budget and the floor (0: off).

    Args:
        video_embeds: ``[T * h * w, D]`` merged vision rows (Qwen3-VL: ``[main | deepstack...]``).
        grid_thw: ``(T, H, W)`` before merging; ``spatial_merge_size`` m.
        threshold: ``t`` in ``[0, 2]``.

    Returns:
        ``[T * h * w]`` bool: :func:`threshold_keep_mask`'s cells where no limit binds; else the
        ``limits.limit_count`` best of EVS's ranking (the threshold's cells are its top), each group's floor
        first (``limits.with_group_floor``).
    """
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    scores = dissimilarity(video_embeds, grid_thw, spatial_merge_size)
    mask = threshold_keep_mask(scores, threshold)
    kept = limit_count(int(mask.sum()), h * w, t, token_budget, min_tokens_per_group)
    if kept != int(mask.sum()):
        mask = mask_for_count(video_embeds, grid_thw, spatial_merge_size, kept)
    if min_tokens_per_group:
        mask = with_group_floor(mask, scores.reshape(-1), t, min_tokens_per_group)
    return mask
