"""The pruning methods, by the name ``video_pruning_method`` gives them, behind one interface.

Every method takes the pruning rate ``q`` (``video_pruning_rate``, in ``[0, 1)``):

    method = method_named(name)                                                 # "evs" | "vidcom2"
    n = method.retained_token_count(tokens_per_group, num_groups, q)            # before encoding
    mask = method.retention_mask(video_embeds, grid_thw, spatial_merge_size, q)  # after; n True

and, for another count than the rate's (``methods.limits``: a token budget, a per-group floor):

    mask = method.mask_for_count(video_embeds, grid_thw, spatial_merge_size, kept)  # kept True
    scores = method.ranking(video_embeds, grid_thw, spatial_merge_size)  # [T * h * w], higher kept first
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import evs, vidcom2
from .inputs import PRUNING_METHOD_SETTING, GridTHW


@dataclass(frozen=True)
class PruningMethod:
    """One pruning method.

    Attributes:
        name: its ``video_pruning_method`` value.
        retained_token_count: ``(tokens_per_group, num_groups, q) -> int``, known before encoding.
        retention_mask: ``(video_embeds [T * h * w, D], grid_thw (T, H, W), spatial_merge_size, q)
            -> [T * h * w] bool`` with exactly ``retained_token_count(h * w, T, q)`` True.
        mask_for_count: ``(video_embeds, grid_thw, spatial_merge_size, kept) -> [T * h * w] bool`` with
            exactly ``kept`` True: the method run for a count no rate gives.
        ranking: ``(video_embeds, grid_thw, spatial_merge_size) -> [T * h * w]`` float, higher kept first
            (ties to the lower row): the order a per-group floor takes tokens in.
    """

    name: str
    retained_token_count: Callable[[int, int, float], int]
    retention_mask: Callable[[torch.Tensor, GridTHW, int, float], torch.Tensor]
    mask_for_count: Callable[[torch.Tensor, GridTHW, int, int], torch.Tensor]
    ranking: Callable[[torch.Tensor, GridTHW, int], torch.Tensor]


EVS = PruningMethod("evs", evs.retained_token_count, evs.retention_mask, evs.mask_for_count, evs.ranking)
VIDCOM2 = PruningMethod(
    "vidcom2", vidcom2.retained_token_count, vidcom2.retention_mask, vidcom2.mask_for_count, vidcom2.ranking
)
METHODS: dict[str, PruningMethod] = {method.name: method for method in (EVS, VIDCOM2)}
DEFAULT_METHOD = EVS  # vLLM's default too


def method_named(name: object) -> PruningMethod:
    """The method ``video_pruning_method`` names, else ValueError naming the setting and the choices."""
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise ValueError(f"{PRUNING_METHOD_SETTING} must be one of {', '.join(map(repr, METHODS))}, got {name!r}")
    return method
