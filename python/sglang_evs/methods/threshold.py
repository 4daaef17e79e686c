"""Which video tokens a dissimilarity threshold keeps (``video_pruning_threshold`` t, in ``[0, 2]``).

EVS's dissimilarity of a cell (:func:`.evs.dissimilarity`) is ``1 - cos`` with the same cell one
temporal group back. A threshold keeps group 0 whole and every later cell whose dissimilarity exceeds
t, so its count is decided by the content: known only once the vision encoder has run, unlike a rate's,
a budget's or a floor's (:mod:`.limits`). Combined with them, the threshold decides first, then the
budget caps and the floor raises: ``limits.limit_count(int(mask.sum()), ...)``, and the tokens for that
count are EVS's best-ranked (the threshold's kept cells are a top of that ranking), each group's floor
taken first (``limits.with_group_floor``).

Not served yet: the server refuses the setting by name (``pruning/settings.py``); this is the mask
a server will compute.
"""

from __future__ import annotations

import torch

from .inputs import check_pruning_threshold

__all__ = ["threshold_keep_mask"]


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
