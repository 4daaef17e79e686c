"""Pure-torch video-token pruning core (EVS, VidCom2).

It imports nothing of SGLang except through :mod:`sglang_evs.sglang_compat`,
for SGLang's own EVS maths (``evs_core``, loaded from its file, pure torch).

* :mod:`.selection` -- which video tokens EVS keeps (keep-mask, kept count).
* :mod:`.vidcom2`   -- which video tokens VidCom2 keeps (same signatures).
* :mod:`.methods`   -- both behind one interface, chosen by a request's or config's setting.
* :mod:`.layout`    -- Qwen3-VL video prompt layout under pruning.
* :mod:`.positions` -- M-RoPE positions and decode offset under pruning.
"""

from .layout import (
    canonical_keep_mask,
    canonical_kept_per_group,
    group_timestamps,
    kept_cells,
    kept_per_group,
    pruned_placeholder_length,
    pruned_video_slots,
    timestamp_text,
    video_token_ids,
)
from .methods import (
    METHODS,
    RETENTION_RATIO_SETTING,
    PruningMethod,
    method_from_settings,
)
from .positions import (
    PositionPlan,
    RequestLayout,
    build_position_plan,
    parse_request_layout,
    pruned_mrope_positions,
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
    "PositionPlan",
    "PruningMethod",
    "RequestLayout",
    "build_position_plan",
    "canonical_keep_mask",
    "canonical_kept_per_group",
    "grid_tokens",
    "group_timestamps",
    "kept_cells",
    "kept_per_group",
    "method_from_settings",
    "parse_request_layout",
    "pruned_mrope_positions",
    "pruned_placeholder_length",
    "pruned_video_slots",
    "retained_token_count",
    "retention_mask",
    "timestamp_text",
    "validate_pruning_rate",
    "video_token_ids",
]
