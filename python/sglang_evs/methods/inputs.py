"""What every pruning method takes, checked here once: the pruning rate, a video's grid and its rows.

A video is ``grid_thw = (T, H, W)`` before spatial merging; merged with factor ``m``, a temporal
group (2 frames) is ``h x w = (H / m) x (W / m)`` tokens, and the encoder output has ``T * h * w``
rows, group by group, row-major inside a group.

The two settings are vLLM's: ``video_pruning_method`` names the method (``methods.table``),
``video_pruning_rate`` is the fraction ``q`` of video tokens pruned, whatever the method. Beside them,
``video_token_budget`` (at most N tokens per video) and ``video_pruning_min_tokens_per_group`` (at least
k per temporal group) limit the count (``methods.limits``); ``video_pruning_threshold`` t keeps what
changed by more than t (``methods.threshold``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

PRUNING_METHOD_SETTING = "video_pruning_method"
PRUNING_RATE_SETTING = "video_pruning_rate"
TOKEN_BUDGET_SETTING = "video_token_budget"
MIN_TOKENS_PER_GROUP_SETTING = "video_pruning_min_tokens_per_group"
PRUNING_THRESHOLD_SETTING = "video_pruning_threshold"
STREAM_SETTING = "video_stream"  # a request's videos are consecutive segments of one stream (`methods.stream`)

GridTHW = Sequence[int] | torch.Tensor


def check_pruning_rate(pruning_rate: object, setting: str = PRUNING_RATE_SETTING) -> float:
    """``pruning_rate`` as a float if it is a real number in ``[0, 1)``, else ValueError naming ``setting``
    (booleans, NaN, strings and None are refused)."""
    ok = (
        isinstance(pruning_rate, numbers.Real)
        and not isinstance(pruning_rate, bool)
        and not math.isnan(float(pruning_rate))
        and 0.0 <= float(pruning_rate) < 1.0
    )
    if not ok:
        raise ValueError(f"{setting} must be a number in [0, 1), got {pruning_rate!r}")
    return float(pruning_rate)  # type: ignore[arg-type]


def check_token_count(value: object, setting: str) -> int:
    """``value`` as an int if it is a whole number >= 0 (0: the setting is off), else ValueError naming
    ``setting`` (booleans, fractions, strings and None are refused)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or int(value) < 0:
        raise ValueError(f"{setting} must be a whole number >= 0 (0: off), got {value!r}")
    return int(value)


def check_pruning_threshold(threshold: object) -> float:
    """``threshold`` as a float if it is a real number in ``[0, 2]`` (the range of ``1 - cos``), else
    ValueError naming the setting."""
    ok = (
        isinstance(threshold, numbers.Real)
        and not isinstance(threshold, bool)
        and not math.isnan(float(threshold))
        and 0.0 <= float(threshold) <= 2.0
    )
    if not ok:
        raise ValueError(f"{PRUNING_THRESHOLD_SETTING} must be a number in [0, 2], got {threshold!r}")
    return float(threshold)  # type: ignore[arg-type]


def grid_tokens(grid_thw: GridTHW, spatial_merge_size: int) -> tuple[int, int, int]:
    """``(T, H, W)`` before merging -> ``(T, h, w)`` merged token grid."""
    t, hh, ww = (int(v) for v in grid_thw)
    m = int(spatial_merge_size)
    if m < 1 or hh % m or ww % m or min(t, hh, ww) < 1:
        raise ValueError(f"grid_thw {(t, hh, ww)} is not a positive grid divisible by spatial_merge_size {m}")
    return t, hh // m, ww // m


def check_video_rows(video_embeds: torch.Tensor, grid_thw: GridTHW, spatial_merge_size: int) -> tuple[int, int, int]:
    """Validate ``video_embeds`` ``[T * h * w, D]`` against the grid; return ``(T, h, w)``."""
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    if video_embeds.dim() != 2 or video_embeds.shape[0] != t * h * w:
        raise ValueError(
            f"video_embeds must be [{t * h * w}, D] for grid {tuple(int(v) for v in grid_thw)} and "
            f"merge size {spatial_merge_size}, got {list(video_embeds.shape)}"
        )
    return t, h, w
