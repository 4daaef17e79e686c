"""Pure-torch EVS (Efficient Video Sampling) core; no SGLang imports.

* :mod:`.selection` -- which video tokens are kept (keep-mask, kept count).
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
    "PRUNING_RATE_SETTING",
    "PositionPlan",
    "RequestLayout",
    "build_position_plan",
    "canonical_keep_mask",
    "canonical_kept_per_group",
    "grid_tokens",
    "group_timestamps",
    "kept_cells",
    "kept_per_group",
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
