"""Imported at the start of every process of a reference server (`testing/pinned_masks.server_env`)."""

import os

from sglang_evs.testing import pinned_masks

if os.environ.get(pinned_masks.PINNED_MASKS_ENV):
    pinned_masks.install()
