"""Independent VidCom2 oracle for the tests: the paper's selection restated in float64 and plain
Python (stable sorts, one frame at a time). For continuous inputs, which do not tie, it equals
`sglang_evs.methods.vidcom2.retention_mask`.
"""

from __future__ import annotations

import math

import torch


def kept_count(tokens_per_frame: int, num_frames: int, q: float) -> int:
    """``max(T, int(T * tpf * (1 - q)))``, float arithmetic then truncation, at most every row."""
    return max(num_frames, min(int(num_frames * tokens_per_frame * (1 - q)), num_frames * tokens_per_frame))


def oracle_mask(x: torch.Tensor, t: int, tpf: int, q: float) -> tuple[torch.Tensor, list[int]]:
    """The paper's selection in float64, one frame at a time; ``(mask, per-frame budgets)``."""
    mask, budgets, _ = selection(x, t, tpf, 1 - q, kept_count(tpf, t, q))
    return mask, budgets


def selection(x: torch.Tensor, t: int, tpf: int, retention: float, target: int):
    """``(mask, per-frame budgets, [T * tpf] similarity)``: frame budgets from the ``retention`` share (``1 - q``
    at a rate), then exactly ``target`` rows."""
    x = x.double()
    var = x.var(dim=0, unbiased=False)
    channels = sorted(range(x.shape[1]), key=lambda c: float(var[c]))[: max(1, x.shape[1] // 2)]
    rows = x[:, channels]
    rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
    video_centre = rows.mean(dim=0)

    def kernel(r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        d2 = ((r - c) ** 2).sum(dim=-1)
        return sum(torch.exp(-d2 / (2 * a)) for a in (1 / 8, 1 / 4, 1 / 2, 1, 2))  # type: ignore[return-value]

    sims, distinct = [], []
    for f in range(t):
        frame = rows[f * tpf : (f + 1) * tpf]
        to_video = kernel(frame, video_centre)
        sims.append(to_video + kernel(frame, frame.mean(dim=0)))
        distinct.append(-float(to_video.mean()))
    top = max(distinct)
    e = [math.exp((d - top) / 0.01) for d in distinct]
    p = [v / sum(e) for v in e]
    budgets = [min(tpf, max(1, round(tpf * min(1.0, retention * (1 + pf - sum(p) / t))))) for pf in p]
    sim = torch.cat(sims)
    keep = set()
    for f, k in enumerate(budgets):
        order = sorted(range(f * tpf, (f + 1) * tpf), key=lambda i: float(sim[i]))
        keep.update(order[:k])
    by_sim = sorted(range(t * tpf), key=lambda i: float(sim[i]))
    while len(keep) > target:  # drop the most similar kept
        keep.remove(max(keep, key=lambda i: float(sim[i])))
    for i in by_sim:  # add the least similar others
        if len(keep) >= target:
            break
        keep.add(i)
    mask = torch.zeros(t * tpf, dtype=torch.bool)
    mask[sorted(keep)] = True
    return mask, budgets, sim


def keep_mask(video_embeds: torch.Tensor, grid_thw, spatial_merge_size: int, q: float) -> torch.Tensor:
    """The oracle on one video's rows ``[T * h * w, D]`` with its grid ``(T, H, W)``."""
    t, hh, ww = (int(v) for v in grid_thw)
    return oracle_mask(video_embeds, t, (hh // spatial_merge_size) * (ww // spatial_merge_size), q)[0]


def limited_keep_mask(video_embeds: torch.Tensor, grid_thw, spatial_merge_size: int, q: float, budget: int = 0,
                      floor: int = 0) -> torch.Tensor:  # fmt: skip
    """Under a token budget and a per-group floor (0: off), restated: the count is the rate's, capped by the
    budget, raised to ``min(floor, tpf)`` per frame; the selection is the paper's for that count (frame budgets
    from the share ``count / (T * tpf)`` where the count is not the rate's); with a floor, each frame its
    ``min(floor, tpf)`` least similar rows, then the least similar of the selection's other rows."""
    t, hh, ww = (int(v) for v in grid_thw)
    tpf = (hh // spatial_merge_size) * (ww // spatial_merge_size)
    at_rate = kept_count(tpf, t, q)
    count = min(at_rate, budget) if budget else at_rate
    count = max(count, min(floor, tpf) * t) if floor else count
    retention = 1 - q if count == at_rate else count / (t * tpf)
    mask, _, sim = selection(video_embeds, t, tpf, retention, count)
    if not floor:
        return mask
    by_sim = sorted(range(t * tpf), key=lambda i: float(sim[i]))
    first = [i for f in range(t) for i in [j for j in by_sim if j // tpf == f][: min(floor, tpf)]]
    taken = set(first)
    rest = [i for i in by_sim if mask[i] and i not in taken][: count - len(first)]
    out = torch.zeros(t * tpf, dtype=torch.bool)
    out[first + rest] = True
    return out
