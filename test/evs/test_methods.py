"""Tests of sglang_evs.evs.methods: one interface over EVS and VidCom2."""

from __future__ import annotations

import dataclasses
import math
import random
from types import SimpleNamespace

import pytest
import torch

from sglang_evs.evs import METHODS, PruningMethod, method_from_settings, selection, vidcom2
from sglang_evs.evs.methods import EVS, VIDCOM2


def test_registry() -> None:
    assert {name: m.setting for name, m in METHODS.items()} == {
        "evs": "video_pruning_rate",
        "vidcom2": "video_retention_ratio",
    }
    assert all(isinstance(m, PruningMethod) and METHODS[m.name] is m for m in METHODS.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        EVS.name = "other"  # type: ignore[misc]


def test_settings_select_the_method_and_rate() -> None:
    assert method_from_settings({}) is None
    assert method_from_settings({"fps": 2.0, "video_pruning_rate": None}) is None
    assert method_from_settings({"video_pruning_rate": 0.75, "fps": 2.0}) == (EVS, 0.75)
    assert method_from_settings({"video_pruning_rate": 0}) == (EVS, 0.0)
    assert method_from_settings({"video_retention_ratio": 0.3}) == (VIDCOM2, 1 - 0.3)
    assert method_from_settings({"video_retention_ratio": 1}) == (VIDCOM2, 0.0)
    assert method_from_settings({"video_retention_ratio": 0.25, "video_pruning_rate": None}) == (VIDCOM2, 0.75)
    config = SimpleNamespace(video_retention_ratio=0.5, hidden_size=8)
    assert method_from_settings(vars(config)) == (VIDCOM2, 0.5)


def test_both_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="set either video_pruning_rate or video_retention_ratio, not both"):
        method_from_settings({"video_pruning_rate": 0.5, "video_retention_ratio": 0.5})


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.0001, 2, math.nan, math.inf, "0.5", True])
def test_invalid_retention_ratio_names_its_setting(bad: object) -> None:
    with pytest.raises(ValueError, match="video_retention_ratio") as err:
        method_from_settings({"video_retention_ratio": bad})
    assert repr(bad) in str(err.value)
    with pytest.raises(ValueError, match="video_retention_ratio"):
        VIDCOM2.pruning_rate(bad)


@pytest.mark.parametrize("bad", [1.0, -0.1, math.nan, "0.5", True])
def test_invalid_pruning_rate_names_its_setting(bad: object) -> None:
    with pytest.raises(ValueError, match="video_pruning_rate"):
        method_from_settings({"video_pruning_rate": bad})


def test_methods_are_the_modules_functions() -> None:
    assert (EVS.retained_token_count, EVS.retention_mask) == (selection.retained_token_count, selection.retention_mask)
    assert (VIDCOM2.retained_token_count, VIDCOM2.retention_mask) == (
        vidcom2.retained_token_count,
        vidcom2.retention_mask,
    )


@pytest.mark.parametrize("name", sorted(METHODS))
def test_mask_keeps_the_announced_count(name: str) -> None:
    """What the serving code relies on: the count known before encoding is the mask's count after."""
    method = METHODS[name]
    rng = random.Random(5)
    for _ in range(60):
        m = rng.choice([1, 2])
        t, h, w = rng.randint(1, 6), rng.randint(1, 4), rng.randint(1, 4)
        value = rng.choice([0.1, 0.25, 0.5, 0.75, 0.9])
        q = method.pruning_rate(value)
        x = torch.randn(t * h * w, 16).to(rng.choice([torch.float32, torch.bfloat16]))
        mask = method.retention_mask(x, (t, h * m, w * m), m, q)
        assert int(mask.sum()) == method.retained_token_count(h * w, t, q)


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 0.9])
def test_setting_value_inverts_pruning_rate(q: float) -> None:
    for method in METHODS.values():
        assert method.pruning_rate(method.setting_value(q)) == pytest.approx(q, abs=1e-12)
    assert VIDCOM2.setting_value(0.75) == 0.25 and EVS.setting_value(0.75) == 0.75
