"""EVS over a video stream sent segment by segment: a segment that continues another is pruned as the stream is.

A stream's segments are consecutive pieces of one video (grid and rows as in :mod:`.inputs`, every segment the
same ``h x w``). Pruned each as a video of its own, a segment would keep its group 0 whole (EVS scores it 255:
nothing came before it), so a static camera would keep one full group per segment. Pruned as the stream, a
continued segment's group 0 is scored against the stream's group before it, the last group of the segment
before: ``1 - cos`` with the same cell, as every later group.

The rows to score are the segment's with that one *context* group before them, ``[(1 + T) * h * w, D]`` (the
context group's rows encoded again: Qwen-VL towers attend within a temporal group, so its rows are the ones
the previous segment had), and the grid ``(1 + T, H, W)``. The context group ranks first (255) and is kept whole;
what is kept of the segment is the rest, so every score is the one the concatenated stream gives:

* a rate ``q`` applies to each segment: ``int(T * h * w * (1 - q))`` tokens of a continued segment (no group
  of it is kept whole, so EVS's ``max(h * w, ...)`` floor does not apply); a whole stream's count is not
  known when its first segment is served, so no rate over the stream could be;
* a token budget and a per-group floor apply to each segment (:mod:`.limits`, over its ``T`` groups);
* a threshold keeps every cell of the segment whose dissimilarity exceeds it, group 0 included
  (:mod:`.threshold`).
"""

from __future__ import annotations

import torch

from .evs import dissimilarity, mask_for_count, ranking
from .inputs import GridTHW, check_pruning_rate, check_video_rows, grid_tokens
from .limits import limit_count, with_group_floor
from .threshold import threshold_keep_mask

__all__ = ["continued_count", "continued_mask", "continued_threshold_mask", "with_context"]

CONTEXT_GROUPS = 1  # the stream's last group before a continued segment


def with_context(grid_thw: GridTHW) -> tuple[int, int, int]:
    """A continued segment's ``(T, H, W)`` -> the grid its rows are scored with, ``(1 + T, H, W)``."""
    t, hh, ww = (int(v) for v in grid_thw)
    return CONTEXT_GROUPS + t, hh, ww


def continued_count(tokens_per_group: int, num_groups: int, pruning_rate: float, token_budget: int = 0,
                    min_tokens_per_group: int = 0) -> int:  # fmt: skip
    """Tokens EVS keeps of a continued segment of ``num_groups`` groups: ``int(T * tpf * (1 - q))`` (float
    arithmetic, truncation, as EVS's own count), capped by the budget and raised by the floor (0: off).
    Known from the grid and the settings, before encoding."""
    tpf, t = int(tokens_per_group), int(num_groups)
    kept = int(t * tpf * (1.0 - check_pruning_rate(pruning_rate)))
    return limit_count(kept, tpf, t, token_budget, min_tokens_per_group)


def continued_mask(
    rows: torch.Tensor,
    grid_thw: GridTHW,
    spatial_merge_size: int,
    pruning_rate: float,
    token_budget: int = 0,
    min_tokens_per_group: int = 0,
) -> torch.Tensor:
    """Keep-mask of a continued segment at a rate (and budget and floor).

    Args:
        rows: ``[(1 + T) * h * w, D]``: the context group's rows, then the segment's.
        grid_thw: the segment's ``(T, H, W)``; ``spatial_merge_size`` m.
        pruning_rate, token_budget, min_tokens_per_group: the settings (0: budget or floor off).

    Returns:
        ``[T * h * w]`` bool over the segment's rows, :func:`continued_count` True: its best-scored cells, each
        group's floor first.
    """
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    scored = with_context(grid_thw)
    check_video_rows(rows, scored, spatial_merge_size)
    kept = continued_count(h * w, t, pruning_rate, token_budget, min_tokens_per_group)
    mask = mask_for_count(rows, scored, spatial_merge_size, CONTEXT_GROUPS * h * w + kept)
    if min_tokens_per_group:
        scores = ranking(rows, scored, spatial_merge_size)
        mask = with_group_floor(mask, scores, t + CONTEXT_GROUPS, min_tokens_per_group)
    return mask[CONTEXT_GROUPS * h * w :]


def continued_threshold_mask(
    rows: torch.Tensor,
    grid_thw: GridTHW,
    spatial_merge_size: int,
    threshold: float,
    token_budget: int = 0,
    min_tokens_per_group: int = 0,
) -> torch.Tensor:
    """Keep-mask of a continued segment by a threshold: the cells of the segment whose dissimilarity exceeds it, its
    group 0 scored against the context group; then the segment's budget caps and its floor raises that count
    (0: off), the tokens for it EVS's best-ranked, each group's floor first (as :mod:`.threshold` does for a video).

    Args:
        rows: ``[(1 + T) * h * w, D]``: the context group's rows, then the segment's.
        grid_thw: the segment's ``(T, H, W)``; ``spatial_merge_size`` m; ``threshold`` t in ``[0, 2]``.

    Returns:
        ``[T * h * w]`` bool over the segment's rows.
    """
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    scored, context = with_context(grid_thw), CONTEXT_GROUPS * h * w
    scores = dissimilarity(rows, scored, spatial_merge_size)
    mask = threshold_keep_mask(scores, threshold)  # the context group: kept whole
    chosen = int(mask[context:].sum())
    kept = limit_count(chosen, h * w, t, token_budget, min_tokens_per_group)
    if kept != chosen:
        mask = mask_for_count(rows, scored, spatial_merge_size, context + kept)
    if min_tokens_per_group:
        mask = with_group_floor(mask, scores.reshape(-1), t + CONTEXT_GROUPS, min_tokens_per_group)
    return mask[context:]
