"""Tests of sglang_evs.methods.threshold: the keep-mask of a dissimilarity threshold, and the settings' checks."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sglang_evs.methods import (
    EVS,
    check_pruning_threshold,
    check_token_count,
    evs,
    limit_count,
    threshold_keep_mask,
    threshold_limited_mask,
    with_group_floor,
)
from sglang_evs.testing.evs_oracle import scores as oracle_scores
from sglang_evs.testing.evs_oracle import threshold_keep_mask as oracle_threshold_mask

from .test_evs import random_video


def test_group_0_is_kept_and_later_cells_where_they_changed_by_more_than_t() -> None:
    d = torch.tensor([[0.0, 0.0, 0.0], [0.1, 0.5, 0.3], [0.3, 0.29, math.nan]])  # [T = 3, h * w = 3]
    assert threshold_keep_mask(d, 0.3).int().tolist() == [1, 1, 1, 0, 1, 0, 0, 0, 1]  # strictly above; NaN kept
    assert threshold_keep_mask(d, 0.0).int().tolist() == [1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert threshold_keep_mask(d, 2.0).int().tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 1]  # group 0 (and NaN) only
    assert threshold_keep_mask(d[:1], 1.0).tolist() == [True] * 3


def test_on_evs_scores_the_threshold_keeps_a_top_of_evs_ranking() -> None:
    """What the next step composes on: the cells a threshold keeps are the best-ranked ones, so a budget and a
    floor over them are EVS's `mask_for_count` and `with_group_floor` at `limit_count` of their count."""
    rng = random.Random(7)
    for _ in range(100):
        x, grid, m, _ = random_video(rng, [torch.float32, torch.bfloat16])
        t, tpf = grid[0], grid[1] * grid[2] // m**2
        d = evs.dissimilarity(x, grid, m)
        assert d.shape == (t, tpf)
        threshold = rng.choice([0.0, 0.01, 0.3, 1.0, 2.0, rng.random() * 2])
        kept = threshold_keep_mask(d, threshold)
        assert torch.equal(kept, evs.mask_for_count(x, grid, m, int(kept.sum())))
        assert kept[:tpf].all()
        # the scores are the oracle's (each cell's own cosine, so to rounding)
        want = torch.tensor(oracle_scores(x, grid, m), dtype=torch.float64)
        assert torch.allclose(d.reshape(-1).double(), want, atol=1e-2 if x.dtype == torch.bfloat16 else 1e-5,
                              equal_nan=True)  # fmt: skip
        floor = rng.randint(0, tpf)
        count = limit_count(int(kept.sum()), tpf, t, rng.randint(0, t * tpf), floor)
        limited = with_group_floor(evs.mask_for_count(x, grid, m, max(count, 0)), EVS.ranking(x, grid, m), t, floor)
        assert int(limited.sum()) == count and min(limited.view(t, -1).sum(dim=1).tolist()) >= floor


def test_under_a_budget_and_a_floor_the_threshold_mask_is_the_oracles() -> None:
    """`threshold_limited_mask` against the oracle's plain-Python rule (float32, where no two scores tie near a
    cut), over thresholds, budgets and floors that bind and that do not."""
    rng = random.Random(11)
    bound = 0
    for _ in range(150):
        x, grid, m, _ = random_video(rng, [torch.float32])
        t, tpf = grid[0], grid[1] * grid[2] // m**2
        threshold = rng.choice([0.0, 0.5, 1.0, 1.5, 2.0, rng.random() * 2])
        budget = rng.choice([0, 0, rng.randint(1, t * tpf)])
        floor = rng.choice([0, 0, rng.randint(1, tpf + 1)])
        got = threshold_limited_mask(x, grid, m, threshold, budget, floor)
        assert torch.equal(got, oracle_threshold_mask(x, grid, m, threshold, budget, floor)), (threshold, budget, floor)
        alone = threshold_limited_mask(x, grid, m, threshold)
        bound += not torch.equal(got, alone)
        if floor:
            assert min(got.view(t, -1).sum(dim=1).tolist()) >= min(floor, tpf)
    assert bound > 30  # the limits bound in many of the cases, not only the threshold decided


@pytest.mark.parametrize("bad", [-0.1, 2.01, math.nan, math.inf, "0.3", None, True])
def test_a_bad_threshold_names_the_setting_and_its_range(bad: object) -> None:
    with pytest.raises(ValueError, match=r"video_pruning_threshold must be a number in \[0, 2\]") as err:
        check_pruning_threshold(bad)
    assert repr(bad) in str(err.value)
    with pytest.raises(ValueError, match="video_pruning_threshold"):
        threshold_keep_mask(torch.zeros(2, 2), bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("good", [0, 0.0, 0.5, 2, 2.0])
def test_a_threshold_in_range_is_accepted(good: float) -> None:
    assert check_pruning_threshold(good) == float(good)


@pytest.mark.parametrize("bad", [-1, 1.5, 2.0, "100", None, True, math.nan])
def test_a_token_count_setting_must_be_a_whole_number(bad: object) -> None:
    with pytest.raises(ValueError, match=r"video_token_budget must be a whole number >= 0 \(0: off\)") as err:
        check_token_count(bad, "video_token_budget")
    assert repr(bad) in str(err.value)
