"""Imported at the start of every process of a reference server (`testing/pinned_masks.server_env`): its keep-masks
are the file's where it names the video."""

import os

from sglang_evs.testing import pinned_masks

if os.environ.get(pinned_masks.PINNED_MASKS_ENV):
    from sglang_evs.pruning.videos import PrunedVideos

    PrunedVideos._compute_keep_mask = pinned_masks.pinned_first(PrunedVideos._compute_keep_mask)
