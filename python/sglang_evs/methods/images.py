"""The image-token pruning methods, by the name ``image_pruning_method`` gives them, behind one interface.

An image is one grid ``(1, H, W)`` before spatial merging: ``N = (H / m) * (W / m)`` merged tokens, the tower's
output rows in raster order (Qwen3-VL: ``[main | deepstack...]`` columns, so one mask prunes every level).
``image_pruning_rate`` q in ``[0, 1)`` is the share dropped, whatever the method (vLLM's proposed names)::

    method = image_method_named(name)          # "divprune" | "dart"
    kept = image_kept_count(N, q)              # before encoding: max(1, int(N * (1 - q)))
    mask = method.keep_mask(rows, kept)        # after: [N] bool, exactly `kept` True

Both methods read the image's rows alone (no question, no attention weights), so one image at one setting always
gets one mask, and the prefix and embedding caches stay valid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import dart, divprune
from .inputs import check_pruning_rate

IMAGE_PRUNING_METHOD_SETTING = "image_pruning_method"
IMAGE_PRUNING_RATE_SETTING = "image_pruning_rate"


@dataclass(frozen=True)
class ImagePruningMethod:
    """One image pruning method: its ``image_pruning_method`` value and ``keep_mask(rows [N, D], kept) -> [N]
    bool`` with exactly ``kept`` True."""

    name: str
    keep_mask: Callable[[torch.Tensor, int], torch.Tensor]


DIVPRUNE = ImagePruningMethod("divprune", divprune.divprune_mask)  # the most diverse subset: [N, N] distances
DART = ImagePruningMethod("dart", dart.dart_mask)  # the least duplicated by 4 pivots: linear in N
IMAGE_METHODS: dict[str, ImagePruningMethod] = {method.name: method for method in (DIVPRUNE, DART)}
DEFAULT_IMAGE_METHOD = DIVPRUNE


def image_method_named(name: object) -> ImagePruningMethod:
    """The method ``image_pruning_method`` names, else ValueError naming the setting and the choices."""
    method = IMAGE_METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        choices = ", ".join(map(repr, IMAGE_METHODS))
        raise ValueError(f"{IMAGE_PRUNING_METHOD_SETTING} must be one of {choices}, got {name!r}")
    return method


def check_image_pruning_rate(rate: object) -> float:
    """``rate`` as a float in ``[0, 1)``, else ValueError naming ``image_pruning_rate``."""
    return check_pruning_rate(rate, IMAGE_PRUNING_RATE_SETTING)


def image_kept_count(num_tokens: int, rate: float) -> int:
    """Tokens kept of an image of ``num_tokens`` at rate q: ``max(1, int(N * (1 - q)))`` (all of them at q = 0)."""
    return max(1, int(num_tokens * (1 - rate)))
