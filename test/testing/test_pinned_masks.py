"""The reference server's pinned keep-masks (`testing/pinned_masks.py`): test tooling its processes import at start,
nothing of it in the plugin."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import torch

from sglang_evs.pruning import videos as videos_module
from sglang_evs.testing import pinned_masks


def test_a_video_the_file_names_is_pruned_by_its_mask_and_any_other_as_decided(tmp_path, monkeypatch):
    decide = pinned_masks.pinned_first(lambda videos, item, rows: "decided")
    monkeypatch.setattr(videos_module.PrunedVideos, "_compute_keep_mask", decide)
    masks = tmp_path / "masks.json"
    masks.write_text(json.dumps({"7": [0, 2]}))
    monkeypatch.setenv(pinned_masks.PINNED_MASKS_ENV, str(masks))
    bare = videos_module.PrunedVideos.__new__(videos_module.PrunedVideos)
    named, other = (SimpleNamespace(hash=key, model_specific_data={}) for key in (7, 8))
    decide, rows = videos_module.PrunedVideos._compute_keep_mask, torch.zeros(4, 2)
    assert decide(bare, named, rows).tolist() == [True, False, True, False]
    assert decide(bare, other, rows) == "decided"


def test_a_process_started_with_the_server_env_installs_it_and_one_without_does_not(tmp_path):
    check = "from sglang_evs.pruning.videos import PrunedVideos; print(PrunedVideos._compute_keep_mask.__name__)"

    def decider(env: dict) -> str:
        run = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    plain = {key: value for key, value in os.environ.items() if key != pinned_masks.PINNED_MASKS_ENV}
    assert decider({**plain, **pinned_masks.server_env(tmp_path / "masks.json")}) == "keep_mask_pinned_first"
    assert decider(plain) == "_compute_keep_mask"
