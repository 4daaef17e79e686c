"""Tests of sglang_evs.methods.table: one interface over EVS and VidCom2, by vLLM's method names."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from sglang_evs.methods import (
    DEFAULT_METHOD,
    EVS,
    METHODS,
    VIDCOM2,
    PruningMethod,
    check_pruning_rate,
    evs,
    method_named,
    vidcom2,
)


def test_the_table_names_the_methods_as_vllm_does() -> None:
    assert list(METHODS) == ["evs", "vidcom2"] and DEFAULT_METHOD is EVS
    assert all(isinstance(m, PruningMethod) and METHODS[m.name] is m for m in METHODS.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        EVS.name = "other"  # type: ignore[misc]


def test_method_named() -> None:
    assert method_named("evs") is EVS and method_named("vidcom2") is VIDCOM2


@pytest.mark.parametrize("bad", ["EVS", "fastv", "", None, 1, True])
def test_an_unknown_method_names_the_setting_and_the_choices(bad: object) -> None:
    with pytest.raises(ValueError, match="video_pruning_method must be one of 'evs', 'vidcom2'") as err:
        method_named(bad)
    assert repr(bad) in str(err.value)


@pytest.mark.parametrize("bad", [1.0, -0.1, math.nan, math.inf, "0.5", True, None])
def test_one_rate_check_for_every_method(bad: object) -> None:
    with pytest.raises(ValueError, match=r"video_pruning_rate must be a number in \[0, 1\)"):
        check_pruning_rate(bad)
    for method in METHODS.values():
        with pytest.raises(ValueError, match="video_pruning_rate"):
            method.retained_token_count(4, 4, bad)
        with pytest.raises(ValueError, match="video_pruning_rate"):
            method.retention_mask(torch.randn(16, 4), (4, 2, 2), 1, bad)


def test_methods_are_the_modules_functions() -> None:
    assert (EVS.retained_token_count, EVS.retention_mask) == (evs.retained_token_count, evs.retention_mask)
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
        q = rng.choice([0.0, 0.1, 0.25, 0.5, 0.75, 0.9])
        x = torch.randn(t * h * w, 16).to(rng.choice([torch.float32, torch.bfloat16]))
        mask = method.retention_mask(x, (t, h * m, w * m), m, q)
        assert int(mask.sum()) == method.retained_token_count(h * w, t, q)
