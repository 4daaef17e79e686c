"""Independent EVS oracle for the tests: the spec's rule (evs-spec.md section 1) in plain Python.

One cosine per cell (torch's, in the embedding dtype, so bf16 ties are the
ones the model sees; fp16 in fp32, as `sglang_evs.methods.evs` documents),
then Python's stable `sorted` on the scores, no tensor sort.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def kept_count(tokens_per_group: int, num_groups: int, q: float) -> int:
    """``max(tpf, int(T * tpf * (1 - q)))``, float arithmetic then truncation."""
    return max(tokens_per_group, int(num_groups * tokens_per_group * (1 - q)))


def scores(video_embeds: torch.Tensor, grid_thw: Sequence[int], spatial_merge_size: int) -> list[float]:
    """Flat per-row scores: 255 for group 0, else ``1 - cos(row, same cell one group earlier)``."""
    t, hh, ww = (int(v) for v in grid_thw)
    tpf = (hh // spatial_merge_size) * (ww // spatial_merge_size)
    x = video_embeds.float() if video_embeds.dtype == torch.float16 else video_embeds
    out = []
    for g in range(t):
        for cell in range(tpf):
            if g == 0:
                out.append(255.0)
                continue
            now, before = x[g * tpf + cell], x[(g - 1) * tpf + cell]
            out.append(float(1 - torch.nn.functional.cosine_similarity(now, before, dim=0)))
    return out


def keep_mask(video_embeds: torch.Tensor, grid_thw: Sequence[int], spatial_merge_size: int, q: float) -> torch.Tensor:
    """``[T * h * w]`` bool: the ``kept_count`` highest scores, ties to the lower row (NaN ranks first)."""
    t, hh, ww = (int(v) for v in grid_thw)
    tpf = (hh // spatial_merge_size) * (ww // spatial_merge_size)
    s = scores(video_embeds, (t, hh, ww), spatial_merge_size)
    order = sorted(range(len(s)), key=lambda i: (not math.isnan(s[i]), -s[i] if not math.isnan(s[i]) else 0.0))
    mask = [False] * len(s)
    for i in order[: kept_count(tpf, t, q)]:
        mask[i] = True
    return torch.tensor(mask, dtype=torch.bool)


def limited_kept_count(tokens_per_group: int, num_groups: int, q: float, budget: int = 0, floor: int = 0) -> int:
    """The count under a token budget and a per-group floor (0: off), restated: the rate's count, capped by
    the budget, then raised to ``min(floor, tpf)`` per group."""
    return capped_then_raised(kept_count(tokens_per_group, num_groups, q), tokens_per_group, num_groups, budget, floor)


def capped_then_raised(count: int, tokens_per_group: int, num_groups: int, budget: int = 0, floor: int = 0) -> int:
    """``count`` capped by the budget, then raised to ``min(floor, tpf)`` per group (0: off)."""
    count = min(count, budget) if budget else count
    return max(count, min(floor, tokens_per_group) * num_groups) if floor else count


def ranked(scores: Sequence[float]) -> list[int]:
    """Row indices best first: higher score first, ties to the lower row, NaN first."""
    return sorted(
        range(len(scores)), key=lambda i: (not math.isnan(scores[i]), -scores[i] if not math.isnan(scores[i]) else 0.0)
    )


def limited_keep_mask(video_embeds: torch.Tensor, grid_thw: Sequence[int], spatial_merge_size: int, q: float,
                      budget: int = 0, floor: int = 0) -> torch.Tensor:  # fmt: skip
    """``[T * h * w]`` bool under a budget and a floor: each group its ``min(floor, tpf)`` best-scored rows, then
    the best-scored of the rest up to ``limited_kept_count``."""
    t, hh, ww = (int(v) for v in grid_thw)
    tpf = (hh // spatial_merge_size) * (ww // spatial_merge_size)
    return _floors_then_best(scores(video_embeds, (t, hh, ww), spatial_merge_size), t,
                             floor, limited_kept_count(tpf, t, q, budget, floor))  # fmt: skip


def threshold_keep_mask(video_embeds: torch.Tensor, grid_thw: Sequence[int], spatial_merge_size: int,
                        threshold: float, budget: int = 0, floor: int = 0) -> torch.Tensor:  # fmt: skip
    """``[T * h * w]`` bool of a threshold t: group 0 and every row whose score is not at most t (NaN too); with
    a budget or a floor (0: off), their count capped then raised as the rate's is, and the rows chosen as
    `limited_keep_mask` chooses them."""
    t, hh, ww = (int(v) for v in grid_thw)
    tpf = (hh // spatial_merge_size) * (ww // spatial_merge_size)
    s = scores(video_embeds, (t, hh, ww), spatial_merge_size)
    over = [i for i, score in enumerate(s) if i < tpf or not score <= threshold]
    count = capped_then_raised(len(over), tpf, t, budget, floor)
    if count == len(over) and not floor:
        mask = torch.zeros(t * tpf, dtype=torch.bool)
        mask[over] = True
        return mask
    return _floors_then_best(s, t, floor, count)


def _floors_then_best(row_scores: list[float], groups: int, floor: int, count: int) -> torch.Tensor:
    tpf = len(row_scores) // groups
    order = ranked(row_scores)
    k = min(floor, tpf)
    first = [i for g in range(groups) for i in [j for j in order if j // tpf == g][:k]]
    taken = set(first)
    rest = [i for i in order if i not in taken][: count - len(first)]
    mask = torch.zeros(groups * tpf, dtype=torch.bool)
    mask[first + rest] = True
    return mask


def stream_keep_masks(
    rows: Sequence[torch.Tensor], grid_thw: Sequence[Sequence[int]], spatial_merge_size: int, q: float | None = None,
    threshold: float | None = None,
) -> list[torch.Tensor]:  # fmt: skip
    """One stream's segments (their rows, [T_i * h * w, D] each, and grids) pruned as the stream: the spec's scores on
    the segments' rows concatenated (the stream's group 0 alone scores 255), then per segment, at a rate its
    ``kept_count`` (the first) or ``int(T * tpf * (1 - q))`` (a continued one, which no group of keeps whole) best
    scores, ties to the lower row; or at a threshold every cell above it (the stream's group 0 kept)."""
    t = [int(grid[0]) for grid in grid_thw]
    _, hh, ww = (int(v) for v in grid_thw[0])
    tpf = (hh // spatial_merge_size) * (ww // spatial_merge_size)
    stream = scores(torch.cat(list(rows)), (sum(t), hh, ww), spatial_merge_size)
    masks, start = [], 0
    for index, groups in enumerate(t):
        s = stream[start : start + groups * tpf]
        start += groups * tpf
        if threshold is not None:
            masks.append(torch.tensor([score > threshold or math.isnan(score) for score in s]))
            continue
        count = kept_count(tpf, groups, q) if index == 0 else int(groups * tpf * (1 - q))
        chosen = set(sorted(range(len(s)), key=lambda i: -s[i])[:count])  # stable: ties to the lower row
        masks.append(torch.tensor([i in chosen for i in range(len(s))], dtype=torch.bool))
    return masks
