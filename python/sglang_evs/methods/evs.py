"""Which video tokens EVS keeps.

Efficient Video Sampling (arXiv 2510.14624) drops the merged vision tokens of
a video that barely change from one temporal group to the next (the grid and
rows as in :mod:`.inputs`).

* Score of cell ``(t, r, c)``: ``1 - cos(x[t, r, c], x[t - 1, r, c])`` for
  ``t >= 1`` (torch's default eps, computed in the embedding dtype); group 0
  scores 255 so it always ranks first.
* Kept count: ``N = max(h * w, int(T * h * w * (1 - q)))``.
* The ``N`` best scores are kept, ties broken towards the lower flat index
  (stable descending sort).  The mask is over the original rows, so kept rows
  stay in frame/raster order.  On CUDA a cell identical to the one before
  scores 0 only to within rounding, so such cells do not tie exactly there
  (test/methods/test_methods_gpu.py).

For Qwen3-VL the rows to score are the main merger output concatenated with
the deepstack outputs (``[main | ds0 | ds1 | ds2]``); the one mask then prunes
every level.

The maths is SGLang's own ``evs_core`` (the same functions as vLLM 0.33's
``video_prune/evs.py``), reached through :mod:`sglang_evs.sglang_compat` and
loaded from its file on first use, so it costs nothing to import here.  This
module adds the argument checks and error messages.

fp16: torch's cosine eps underflows in fp16, so a zero vector scores NaN, and
evs_core's descending sort puts NaN above group 0's 255 (group 0 would lose
tokens to zero vectors).  fp16 rows are therefore scored in fp32, where a zero
vector scores 1; fp32 and bf16 rows are scored in their own dtype, bit for bit
like vLLM and SGLang.  Non-finite rows still score NaN and rank first; the
mask then still keeps exactly ``N`` rows.

Another count than the rate's (a token budget or a per-group floor, :mod:`.limits`): the same scores
and the same stable descending order (:func:`dissimilarity`, :func:`mask_for_count`), cut at that count;
at the rate's own count it is the rate's mask bit for bit.
"""

from __future__ import annotations

import torch

from sglang_evs import sglang_compat

from .inputs import GridTHW, check_pruning_rate, check_video_rows

__all__ = ["dissimilarity", "mask_for_count", "ranking", "retained_token_count", "retention_mask"]

FIRST_GROUP_SCORE = 255.0  # above any 1 - cos (at most 2): group 0 ranks first, as in evs_core


def retained_token_count(tokens_per_group: int, num_groups: int, pruning_rate: float) -> int:
    """Number of video tokens EVS keeps: ``max(tpf, int(T * tpf * (1 - q)))``.

    Float arithmetic then truncation, e.g. ``(10, 20, 0.9) -> 19``.  Depends
    only on the grid and the rate, so it is known before the encoder runs.
    """
    q = check_pruning_rate(pruning_rate)
    tpf, t = int(tokens_per_group), int(num_groups)
    if tpf < 1 or t < 1:
        raise ValueError(f"tokens_per_group and num_groups must be >= 1, got {tpf}, {t}")
    return int(sglang_compat.resolve_file("evs_core").compute_retained_tokens_count(tpf, t, q))


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
        :func:`retained_token_count` entries are True, group 0 all True
        (for finite rows).
    """
    t, h, w = check_video_rows(video_embeds, grid_thw, spatial_merge_size)
    q = check_pruning_rate(pruning_rate)
    m = int(spatial_merge_size)
    x = video_embeds.float() if video_embeds.dtype == torch.float16 else video_embeds
    return sglang_compat.resolve_file("evs_core").compute_retention_mask(x, (t, h * m, w * m), m, q)


def dissimilarity(video_embeds: torch.Tensor, grid_thw: GridTHW, spatial_merge_size: int) -> torch.Tensor:
    """EVS's score of every cell, ``[T, h * w]``: ``1 - cos`` with the same cell one group earlier
    (groups ``1..T-1``), ``FIRST_GROUP_SCORE`` for group 0; the very values ``evs_core`` ranks (the same
    ops in the same dtype; fp16 rows in fp32, as :func:`retention_mask`).

    Args:
        video_embeds: ``[T * h * w, D]`` merged vision tokens.
        grid_thw: ``(T, H, W)`` before merging.
        spatial_merge_size: ``m``.
    """
    t, h, w = check_video_rows(video_embeds, grid_thw, spatial_merge_size)
    x = video_embeds.float() if video_embeds.dtype == torch.float16 else video_embeds
    x = x.reshape(t, h, w, x.size(-1))
    changed = 1 - torch.nn.functional.cosine_similarity(x[1:, ...], x[:-1, ...], dim=-1)
    first = FIRST_GROUP_SCORE * torch.ones_like(x[:1, :, :, 0])
    return torch.cat([first, changed], dim=0).reshape(t, h * w)


def ranking(video_embeds: torch.Tensor, grid_thw: GridTHW, spatial_merge_size: int) -> torch.Tensor:
    """``[T * h * w]`` scores, higher kept first (ties to the lower row): :func:`dissimilarity`, flat."""
    return dissimilarity(video_embeds, grid_thw, spatial_merge_size).reshape(-1)


def mask_for_count(video_embeds: torch.Tensor, grid_thw: GridTHW, spatial_merge_size: int, kept: int) -> torch.Tensor:
    """``[T * h * w]`` bool with the ``kept`` best-ranked cells True (stable descending sort of
    :func:`ranking`, as evs_core sorts; NaN ranks first). Any ``kept`` in ``[0, T * h * w]``: below ``h * w``
    group 0 itself is cut, its lower cells first."""
    scores = ranking(video_embeds, grid_thw, spatial_merge_size)
    if not 0 <= int(kept) <= scores.numel():
        raise ValueError(f"kept must be in [0, {scores.numel()}], got {kept}")
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    mask = torch.zeros_like(scores, dtype=torch.bool)
    mask[order[: int(kept)]] = True
    return mask
