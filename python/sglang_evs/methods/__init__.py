"""Pure-torch video-token pruning methods (EVS, VidCom2); nothing of SGLang but ``evs_core``'s maths.

* :mod:`.inputs`    -- the settings' names and what every method takes: the rate, the grid, the rows.
* :mod:`.evs`       -- which video tokens EVS keeps (kept count, keep-mask).
* :mod:`.vidcom2`   -- which video tokens VidCom2 keeps (same signatures).
* :mod:`.table`     -- both behind one interface, by the name ``video_pruning_method`` gives them.
* :mod:`.canonical` -- the split a pruned video is laid out with before the encoder has chosen.

SGLang's ``evs_core`` is reached through :mod:`sglang_evs.sglang_compat`, loaded from its file.
"""

from .canonical import canonical_keep_mask, canonical_kept_per_group
from .inputs import PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING, check_pruning_rate, grid_tokens
from .table import DEFAULT_METHOD, EVS, METHODS, VIDCOM2, PruningMethod, method_named

__all__ = [
    "DEFAULT_METHOD",
    "EVS",
    "METHODS",
    "PRUNING_METHOD_SETTING",
    "PRUNING_RATE_SETTING",
    "VIDCOM2",
    "PruningMethod",
    "canonical_keep_mask",
    "canonical_kept_per_group",
    "check_pruning_rate",
    "grid_tokens",
    "method_named",
]
