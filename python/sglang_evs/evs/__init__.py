"""Pure-torch video-token pruning core (EVS, VidCom2).

It imports nothing of SGLang except through :mod:`sglang_evs.sglang_compat`,
for SGLang's own EVS maths (``evs_core``, loaded from its file, pure torch).

* :mod:`.selection` -- which video tokens EVS keeps (keep-mask, kept count).
* :mod:`.vidcom2`   -- which video tokens VidCom2 keeps (same signatures).
* :mod:`.methods`   -- both behind one interface, chosen by a request's or config's setting.
* :mod:`.layout`    -- the canonical split a pruned video is laid out with before encoding.
"""

from .layout import canonical_keep_mask, canonical_kept_per_group
from .methods import (
    METHODS,
    RETENTION_RATIO_SETTING,
    PruningMethod,
    method_from_settings,
)
from .selection import (
    PRUNING_RATE_SETTING,
    grid_tokens,
    retained_token_count,
    retention_mask,
    validate_pruning_rate,
)

__all__ = [
    "METHODS",
    "PRUNING_RATE_SETTING",
    "RETENTION_RATIO_SETTING",
    "PruningMethod",
    "canonical_keep_mask",
    "canonical_kept_per_group",
    "grid_tokens",
    "method_from_settings",
    "retained_token_count",
    "retention_mask",
    "validate_pruning_rate",
]
