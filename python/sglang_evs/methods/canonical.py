"""Where a pruned video's kept tokens sit before the encoder has chosen them.

A pruned video occupies, in the prompt, its unpruned region (first pad to last pad, any
framing text between temporal groups included) with the pruned pads deleted. Its length is
fixed by the grid, the method and the rate (every method's kept count is known before its
mask), so the prompt can be laid out before encoding. Only the split of the kept count over groups depends on
the mask; until the mask is known the layout uses the *canonical* split below, and the
model fills the region with the true one after encoding.
"""

import torch

from .inputs import GridTHW, grid_tokens


def canonical_kept_per_group(tokens_per_group: int, num_groups: int, kept: int) -> torch.Tensor:
    """Mask-independent split of ``kept`` tokens over ``T`` groups of ``tpf``, ``[T]`` int64.

    Group 0 keeps ``min(tpf, kept)`` (all of it under EVS, which always keeps the
    first group); the rest is spread evenly over groups ``1..T-1``, the remainder
    going to the earliest groups.
    """
    tpf, t, kept = int(tokens_per_group), int(num_groups), int(kept)
    if not 0 <= kept <= t * tpf:
        raise ValueError(f"kept must be in [0, {t * tpf}] for {t} groups of {tpf}, got {kept}")
    counts = torch.full((t,), min(tpf, kept), dtype=torch.long)
    rest = kept - min(tpf, kept)
    if t > 1:
        g = torch.arange(t - 1)
        counts[1:] = rest // (t - 1) + (g < rest % (t - 1)).long()
    return counts


def canonical_keep_mask(grid_thw: GridTHW, spatial_merge_size: int, kept: int) -> torch.Tensor:
    """``[T * h * w]`` mask with the canonical split of ``kept``, first cells of each group."""
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    counts = canonical_kept_per_group(h * w, t, kept)
    return (torch.arange(h * w)[None, :] < counts[:, None]).reshape(-1)
