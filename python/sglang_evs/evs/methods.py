"""Video-token pruning methods behind one interface: EVS and VidCom2.

A method is chosen by the setting a request (``mm_processor_kwargs``) or the
server config carries: ``video_pruning_rate`` (EVS, ``q`` itself) or
``video_retention_ratio`` (VidCom2, ``q = 1 - ratio``); at most one of them.
Every method then works with the pruning rate ``q`` in ``[0, 1)``:

    found = method_from_settings(request.mm_processor_kwargs)
    if found:
        method, q = found
        n = method.retained_token_count(tokens_per_frame, num_frames, q)        # before encoding
        mask = method.retention_mask(video_embeds, grid_thw, spatial_merge_size, q)  # after; n True
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from . import selection, vidcom2
from .selection import PRUNING_RATE_SETTING, GridTHW, validate_pruning_rate

__all__ = [
    "EVS",
    "METHODS",
    "RETENTION_RATIO_SETTING",
    "VIDCOM2",
    "PruningMethod",
    "method_from_settings",
    "rate_from_retention_ratio",
]

RETENTION_RATIO_SETTING = "video_retention_ratio"


@dataclass(frozen=True)
class PruningMethod:
    """One pruning method; all functions take the pruning rate ``q`` in ``[0, 1)``.

    Attributes:
        name: ``"evs"`` or ``"vidcom2"``.
        setting: the request / config key that selects the method.
        pruning_rate: the setting's value -> ``q``; raises ValueError naming ``setting``.
        setting_value: ``q`` -> the setting's value (the inverse of ``pruning_rate``).
        retained_token_count: ``(tokens_per_frame, num_frames, q) -> int``, known before encoding.
        retention_mask: ``(video_embeds [T * h * w, D], grid_thw (T, H, W), spatial_merge_size, q)
            -> [T * h * w] bool`` with exactly ``retained_token_count(h * w, T, q)`` True.
    """

    name: str
    setting: str
    pruning_rate: Callable[[object], float]
    setting_value: Callable[[float], float]
    retained_token_count: Callable[[int, int, float], int]
    retention_mask: Callable[[torch.Tensor, GridTHW, int, float], torch.Tensor]


def rate_from_retention_ratio(ratio: object) -> float:
    """``video_retention_ratio`` in ``(0, 1]`` -> ``q = 1 - ratio``; else ValueError naming the setting."""
    ok = isinstance(ratio, numbers.Real) and not isinstance(ratio, bool) and not math.isnan(float(ratio))
    if not ok or not 0.0 < float(ratio) <= 1.0:  # type: ignore[arg-type]
        raise ValueError(f"{RETENTION_RATIO_SETTING} must be a number in (0, 1], got {ratio!r}")
    return 1.0 - float(ratio)  # type: ignore[arg-type]


EVS = PruningMethod(
    "evs",
    PRUNING_RATE_SETTING,
    validate_pruning_rate,
    lambda q: q,
    selection.retained_token_count,
    selection.retention_mask,
)
VIDCOM2 = PruningMethod(
    "vidcom2",
    RETENTION_RATIO_SETTING,
    rate_from_retention_ratio,
    lambda q: 1.0 - q,
    vidcom2.retained_token_count,
    vidcom2.retention_mask,
)
METHODS: dict[str, PruningMethod] = {method.name: method for method in (EVS, VIDCOM2)}


def method_from_settings(settings: Mapping[str, object]) -> tuple[PruningMethod, float] | None:
    """The method a mapping of settings selects, and its validated ``q``; None when it selects none.

    ``settings`` is e.g. a request's ``mm_processor_kwargs`` or ``vars(config)``;
    other keys are ignored, a value of None counts as unset.  Raises ValueError
    when both settings are given or the value is out of range.
    """
    given = [m for m in METHODS.values() if settings.get(m.setting) is not None]
    if len(given) > 1:
        raise ValueError(f"set either {PRUNING_RATE_SETTING} or {RETENTION_RATIO_SETTING}, not both")
    if not given:
        return None
    method = given[0]
    return method, method.pruning_rate(settings[method.setting])
