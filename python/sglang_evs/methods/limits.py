"""A token budget and a per-group floor over any method: the kept count (known before encoding) and the mask.

Two settings beside ``video_pruning_rate`` q (grid and rows as in :mod:`.inputs`; a video of ``T`` temporal
groups of ``tpf = h * w`` tokens, the method's count at q written ``K_q``):

* ``video_token_budget`` N (0: none): at most N tokens of each video;
* ``video_pruning_min_tokens_per_group`` k (0: none): no group keeps fewer than ``min(k, tpf)`` tokens.

The count, in this order (the budget caps what the rate keeps, then the floor raises it)::

    K  = min(N, K_q) if N else K_q
    K' = max(K, min(k, tpf) * T) if k else K          # never above T * tpf

so it depends only on the grid and the settings, like ``K_q``: the tokenizer lays the prompt out with it
before the vision encoder runs. Where the floor needs more than the budget, the floor wins.

The mask, exactly ``K'`` tokens:

1. the method's own choice of ``K'`` tokens: its mask at q where ``K' == K_q`` (so a budget or floor
   that does not bind changes nothing), else its mask for that count (``PruningMethod.mask_for_count``:
   EVS keeps the ``K'`` best scores, VidCom2 runs with the share ``K' / (T * tpf)``);
2. with a floor, :func:`with_group_floor`: each group first gets its ``min(k, tpf)`` best tokens by the
   method's ranking (``PruningMethod.ranking``), and the rest of ``K'`` are the best-ranked of the other
   tokens step 1 kept. For EVS, whose mask is the ``K'`` best-ranked tokens, that is: each group its k
   best, the rest by the global ranking.
"""

from __future__ import annotations

import torch

from .inputs import GridTHW, grid_tokens
from .table import PruningMethod

__all__ = ["limit_count", "limited_count", "limited_mask", "with_group_floor"]


def limit_count(kept: int, tokens_per_group: int, num_groups: int, token_budget: int = 0,
                min_tokens_per_group: int = 0) -> int:  # fmt: skip
    """``kept`` (what a rate, or later a threshold, keeps of ``num_groups * tokens_per_group``) capped by
    ``token_budget`` and raised by ``min_tokens_per_group`` per group, as the module says (0: off)."""
    tpf, t, kept = int(tokens_per_group), int(num_groups), int(kept)
    if token_budget:
        kept = min(int(token_budget), kept)
    if min_tokens_per_group:
        kept = max(kept, min(int(min_tokens_per_group), tpf) * t)
    return kept


def limited_count(method: PruningMethod, tokens_per_group: int, num_groups: int, pruning_rate: float,
                  token_budget: int = 0, min_tokens_per_group: int = 0) -> int:  # fmt: skip
    """Tokens ``method`` keeps of a video at ``pruning_rate`` under the budget and the floor: known from the
    grid and the settings alone, and the count of :func:`limited_mask`."""
    kept = method.retained_token_count(tokens_per_group, num_groups, pruning_rate)
    return limit_count(kept, tokens_per_group, num_groups, token_budget, min_tokens_per_group)


def limited_mask(
    method: PruningMethod,
    video_embeds: torch.Tensor,
    grid_thw: GridTHW,
    spatial_merge_size: int,
    pruning_rate: float,
    token_budget: int = 0,
    min_tokens_per_group: int = 0,
) -> torch.Tensor:
    """Keep-mask of one video under the rate, the budget and the floor.

    Args:
        video_embeds: ``[T * h * w, D]`` merged vision rows (Qwen3-VL: ``[main | deepstack...]``).
        grid_thw: ``(T, H, W)`` before merging; ``spatial_merge_size`` m, ``h = H / m``, ``w = W / m``.
        pruning_rate, token_budget, min_tokens_per_group: the settings (0: budget or floor off).

    Returns:
        ``[T * h * w]`` bool with exactly :func:`limited_count` ``(method, h * w, T, ...)`` True; with
        no budget and no floor, ``method.retention_mask`` itself.
    """
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    at_rate = method.retained_token_count(h * w, t, pruning_rate)
    kept = limit_count(at_rate, h * w, t, token_budget, min_tokens_per_group)
    if kept == at_rate:
        mask = method.retention_mask(video_embeds, grid_thw, spatial_merge_size, pruning_rate)
    else:
        mask = method.mask_for_count(video_embeds, grid_thw, spatial_merge_size, kept)
    if not min_tokens_per_group:
        return mask
    scores = method.ranking(video_embeds, grid_thw, spatial_merge_size)
    return with_group_floor(mask, scores, t, min_tokens_per_group)


def with_group_floor(
    mask: torch.Tensor, scores: torch.Tensor, num_groups: int, min_tokens_per_group: int
) -> torch.Tensor:
    """``mask`` with as many tokens kept, each group holding at least ``min(k, tpf)`` of them.

    Args:
        mask: ``[T * tpf]`` bool, at least ``T * min(k, tpf)`` True.
        scores: ``[T * tpf]`` the method's ranking, higher kept first; ties to the lower index (a stable
            descending sort; NaN first, as torch sorts it).
        num_groups: ``T``.
        min_tokens_per_group: ``k`` >= 0.

    Returns:
        ``[T * tpf]`` bool, as many True as ``mask``: each group's ``min(k, tpf)`` best-ranked tokens, then
        the best-ranked of ``mask``'s other kept tokens.
    """
    n, t = mask.numel(), int(num_groups)
    tpf = n // t
    if t < 1 or tpf * t != n or scores.shape != mask.shape:
        raise ValueError(f"mask {list(mask.shape)} and scores {list(scores.shape)} are not {t} groups of one size")
    k = min(int(min_tokens_per_group), tpf)
    total = int(mask.sum())
    if total < k * t:
        raise ValueError(f"a mask of {total} tokens cannot keep {k} in each of {t} groups")
    order = torch.argsort(scores, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n, device=order.device)
    place_in_group = rank.view(t, tpf).argsort(dim=1).argsort(dim=1)  # 0: the group's best-ranked token
    out = (place_in_group < k).reshape(-1).to(mask.device)
    others = (mask & ~out).nonzero().flatten()
    best_others = others[rank[others.to(rank.device)].argsort()[: total - k * t].to(others.device)]
    out[best_others] = True
    return out
