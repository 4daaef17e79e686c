"""Where a pruned video's kept tokens sit before the encoder has chosen them.

A pruned video occupies, in the prompt, its unpruned region (first pad to last pad, any
framing text between temporal groups included) with the pruned pads deleted. Its length is
fixed by the grid and the rate (the kept count does not depend on the mask), so the prompt
can be laid out before encoding. Only the split of the kept count over groups depends on
the mask; until the mask is known the layout uses the *canonical* split below, and the
model fills the region with the true one after encoding.
"""

import torch

from .selection import GridTHW, grid_tokens, retained_token_count


def canonical_kept_per_group(tokens_per_group: int, num_groups: int, pruning_rate: float) -> torch.Tensor:
    """Mask-independent split of the kept count, ``[T]`` int64.

    Group 0 keeps ``tpf``; the other ``N - tpf`` are spread evenly over groups
    ``1..T-1``, the remainder going to the earliest groups.
    """
    tpf, t = int(tokens_per_group), int(num_groups)
    rest = retained_token_count(tpf, t, pruning_rate) - tpf
    counts = torch.full((t,), tpf, dtype=torch.long)
    if t > 1:
        g = torch.arange(t - 1)
        counts[1:] = rest // (t - 1) + (g < rest % (t - 1)).long()
    return counts


def canonical_keep_mask(grid_thw: GridTHW, spatial_merge_size: int, pruning_rate: float) -> torch.Tensor:
    """``[T * h * w]`` mask with the canonical split, first cells of each group."""
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    counts = canonical_kept_per_group(h * w, t, pruning_rate)
    return (torch.arange(h * w)[None, :] < counts[:, None]).reshape(-1)
