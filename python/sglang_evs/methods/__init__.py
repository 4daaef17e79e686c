"""Pure-torch video- and image-token pruning methods (EVS, VidCom2; DivPrune, DART); nothing of SGLang but
``evs_core``'s maths.

* :mod:`.inputs`    -- the settings' names and what every method takes: the rate, the grid, the rows.
* :mod:`.evs`       -- which video tokens EVS keeps (kept count, keep-mask).
* :mod:`.vidcom2`   -- which video tokens VidCom2 keeps (same signatures).
* :mod:`.table`     -- both behind one interface, by the name ``video_pruning_method`` gives them.
* :mod:`.limits`    -- a token budget and a per-group floor over any method (count before, mask after).
* :mod:`.threshold` -- the keep-mask of a dissimilarity threshold (its count known only after encoding),
  under the budget and the floor.
* :mod:`.stream`    -- EVS over a stream sent segment by segment: a continued segment pruned as the stream is.
* :mod:`.canonical` -- the split a pruned video is laid out with before the encoder has chosen.
* :mod:`.images`    -- the image methods behind one interface, by the name ``image_pruning_method`` gives them.
* :mod:`.divprune`  -- which image tokens DivPrune keeps (a max-min diverse subset).
* :mod:`.dart`      -- which image tokens DART keeps (the least duplicated by a few pivots).

SGLang's ``evs_core`` is reached through :mod:`sglang_evs.sglang_compat`, loaded from its file.
"""

from .canonical import canonical_keep_mask, canonical_kept_per_group
from .inputs import (
    MIN_TOKENS_PER_GROUP_SETTING,
    PRUNING_METHOD_SETTING,
    PRUNING_RATE_SETTING,
    PRUNING_THRESHOLD_SETTING,
    STREAM_SETTING,
    TOKEN_BUDGET_SETTING,
    check_pruning_rate,
    check_pruning_threshold,
    check_token_count,
    grid_tokens,
)
from .limits import limit_count, limited_count, limited_mask, with_group_floor
from .stream import continued_count, continued_mask, continued_threshold_mask, with_context
from .table import DEFAULT_METHOD, EVS, METHODS, VIDCOM2, PruningMethod, method_named
from .threshold import threshold_keep_mask, threshold_limited_mask

__all__ = [
    "DEFAULT_METHOD",
    "EVS",
    "METHODS",
    "MIN_TOKENS_PER_GROUP_SETTING",
    "PRUNING_METHOD_SETTING",
    "PRUNING_RATE_SETTING",
    "PRUNING_THRESHOLD_SETTING",
    "STREAM_SETTING",
    "TOKEN_BUDGET_SETTING",
    "VIDCOM2",
    "PruningMethod",
    "canonical_keep_mask",
    "canonical_kept_per_group",
    "check_pruning_rate",
    "check_pruning_threshold",
    "check_token_count",
    "continued_count",
    "continued_mask",
    "continued_threshold_mask",
    "grid_tokens",
    "limit_count",
    "limited_count",
    "limited_mask",
    "method_named",
    "threshold_keep_mask",
    "threshold_limited_mask",
    "with_context",
    "with_group_floor",
]
