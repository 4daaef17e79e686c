"""Tests of sglang_evs.methods.limits: a token budget and a per-group floor over EVS and VidCom2.

What serving relies on: the count the tokenizer lays the prompt out with (`limited_count`, from the grid and
the settings) is the count of the mask the model computes after the encoder (`limited_mask`); the floor holds
in every group; the budget caps; a limit that does not bind changes nothing. EVS's budget and floor are
checked against the rule restated in plain Python over the oracle's scores (`testing.evs_oracle`).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_evs.methods import (
    EVS,
    METHODS,
    VIDCOM2,
    evs,
    limit_count,
    limited_count,
    limited_mask,
    with_group_floor,
)
from sglang_evs.testing import evs_oracle, vidcom2_oracle

from .test_evs import random_video


def limits(rng: random.Random, tpf: int, groups: int) -> tuple[int, int]:
    """A budget and a floor, each off a third of the time, often binding."""
    total = tpf * groups
    budget = rng.choice([0, rng.randint(1, total), rng.randint(1, max(1, total // 3)), total + 5])
    floor = rng.choice([0, rng.randint(1, tpf), rng.randint(1, tpf + 2)])
    return budget, floor


def per_group(mask: torch.Tensor, groups: int) -> list[int]:
    return mask.view(groups, -1).sum(dim=1).tolist()


# ----------------------------------------------------------------- counts
@pytest.mark.parametrize(
    ("kept", "tpf", "groups", "budget", "floor", "expected"),
    [
        (200, 100, 4, 0, 0, 200),  # no limit: the rate's count
        (200, 100, 4, 150, 0, 150),  # the budget caps
        (200, 100, 4, 300, 0, 200),  # a budget above the count changes nothing
        (200, 100, 4, 0, 60, 240),  # the floor raises: 60 in each of 4 groups
        (200, 100, 4, 0, 40, 200),  # a floor under the count changes nothing
        (200, 100, 4, 150, 60, 240),  # budget, then floor: the floor wins
        (200, 100, 4, 0, 500, 400),  # a floor above a group's size keeps everything
        (100, 100, 4, 30, 0, 30),  # a budget below one group's size
        (400, 100, 4, 10, 0, 10),  # q = 0 with a budget prunes
    ],
)
def test_limit_count_table(kept: int, tpf: int, groups: int, budget: int, floor: int, expected: int) -> None:
    assert limit_count(kept, tpf, groups, budget, floor) == expected


@given(tpf=st.integers(1, 500), groups=st.integers(1, 64), q=st.floats(0, 1, exclude_max=True),
       budget=st.integers(0, 40000), floor=st.integers(0, 600))  # fmt: skip
@settings(max_examples=150, deadline=None)
def test_counts_stay_in_range_and_follow_the_order(tpf: int, groups: int, q: float, budget: int, floor: int) -> None:
    for method in METHODS.values():
        at_rate = method.retained_token_count(tpf, groups, q)
        n = limited_count(method, tpf, groups, q, budget, floor)
        assert 0 <= n <= tpf * groups
        assert n >= min(floor, tpf) * groups  # the floor is always met
        capped = min(budget, at_rate) if budget else at_rate
        if min(floor, tpf) * groups <= capped:
            assert n == capped  # the budget caps where the floor needs no more
        if not budget and not floor:
            assert n == at_rate


# ------------------------------------------------------------------ masks
@given(st.integers(0, 2**32 - 1))
@settings(max_examples=100, deadline=None)
def test_the_mask_keeps_the_count_known_at_layout_and_the_floor_holds(seed: int) -> None:
    """Random grids, rates, budgets and floors, rows full of ties, fp32 / bf16 / fp16, both methods."""
    rng = random.Random(seed)
    x, grid, m, q = random_video(rng)
    t, tpf = grid[0], grid[1] * grid[2] // m**2
    budget, floor = limits(rng, tpf, t)
    for method in METHODS.values():
        mask = limited_mask(method, x, grid, m, q, budget, floor)
        assert mask.shape == (t * tpf,) and mask.dtype == torch.bool
        assert int(mask.sum()) == limited_count(method, tpf, t, q, budget, floor)
        assert min(per_group(mask, t)) >= min(floor, tpf)
        if budget and min(floor, tpf) * t <= budget:
            assert int(mask.sum()) <= budget


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_no_limit_is_the_methods_own_mask(seed: int) -> None:
    """No budget and no floor, or a budget the rate's count stays under: the rate's mask (bit for bit what
    vLLM computes, tests of evs.py and vidcom2.py)."""
    rng = random.Random(seed)
    x, grid, m, q = random_video(rng)
    t, tpf = grid[0], grid[1] * grid[2] // m**2
    for method in METHODS.values():
        own = method.retention_mask(x, grid, m, q)
        assert torch.equal(limited_mask(method, x, grid, m, q), own)
        assert torch.equal(limited_mask(method, x, grid, m, q, token_budget=t * tpf), own)


def test_evs_for_the_rates_count_is_the_rates_mask() -> None:
    """`evs.mask_for_count` ranks by the very scores evs_core ranks (ties, NaN, fp16 included): at the rate's
    count it is the rate's mask, so a budget cuts the same order the rate does."""
    rng = random.Random(3)
    for _ in range(300):
        x, grid, m, q = random_video(rng)
        t, tpf = grid[0], grid[1] * grid[2] // m**2
        kept = evs.retained_token_count(tpf, t, q)
        assert torch.equal(evs.mask_for_count(x, grid, m, kept), evs.retention_mask(x, grid, m, q))


def test_evs_budget_and_floor_follow_the_rule_written_out() -> None:
    """EVS under a budget N and a floor k: each group its k best tokens, then the rest of the count by the
    global ranking (the rule restated in plain Python over the oracle's scores, `evs_oracle`)."""
    rng = random.Random(11)
    bound = 0
    for _ in range(150):
        x, grid, m, q = random_video(rng)
        t, tpf = grid[0], grid[1] * grid[2] // m**2
        budget, floor = limits(rng, tpf, t)
        want = evs_oracle.limited_keep_mask(x, grid, m, q, budget, floor)
        assert int(want.sum()) == evs_oracle.limited_kept_count(tpf, t, q, budget, floor)
        assert torch.equal(limited_mask(EVS, x, grid, m, q, budget, floor), want), (grid, m, q, budget, floor)
        bound += bool(floor) and min(per_group(want, t)) == min(floor, tpf)  # the floor bound somewhere
    assert bound > 20


def test_vidcom2_budget_and_floor_follow_the_rule_written_out() -> None:
    """VidCom2 under a budget and a floor against its float64 restatement (`vidcom2_oracle`; continuous fp32
    rows, which do not tie)."""
    from .test_vidcom2 import continuous_video

    rng = random.Random(12)
    for _ in range(60):
        x, grid, m, q = continuous_video(rng, torch.float32, widths=(8, 32, 64))
        t, tpf = grid[0], grid[1] * grid[2] // m**2
        budget, floor = limits(rng, tpf, t)
        want = vidcom2_oracle.limited_keep_mask(x, grid, m, q, budget, floor)
        assert torch.equal(limited_mask(VIDCOM2, x, grid, m, q, budget, floor), want), (grid, m, q, budget, floor)


def test_vidcom2_for_another_count_keeps_it_exactly() -> None:
    rng = random.Random(4)
    for _ in range(100):
        x, grid, m, _ = random_video(rng, [torch.float32, torch.bfloat16])
        t, tpf = grid[0], grid[1] * grid[2] // m**2
        kept = rng.randint(0, t * tpf)
        assert int(VIDCOM2.mask_for_count(x, grid, m, kept).sum()) == kept


def test_a_floor_the_mask_already_meets_changes_nothing() -> None:
    """Continuous rows (no ties): VidCom2's mask holds each frame's least similar rows, so a floor under
    every frame's share leaves it as it is; EVS's likewise."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6 * 16, 32, generator=gen)
    for method in (EVS, VIDCOM2):
        own = method.retention_mask(x, (6, 4, 4), 1, 0.25)
        least = min(per_group(own, 6))
        assert least >= 2
        assert torch.equal(limited_mask(method, x, (6, 4, 4), 1, 0.25, min_tokens_per_group=least), own)


def test_a_binding_floor_moves_tokens_into_the_groups_short_of_it() -> None:
    """A static clip: EVS keeps group 0 whole at q = .75 and nothing else; with a floor of 3 each later group
    keeps 3 (its lowest cells, as every score ties), taken from group 0's last cells."""
    x = torch.eye(4, 8).repeat(4, 1)  # 4 groups of the same 4 cells: every later score exactly 0
    own = EVS.retention_mask(x, (4, 2, 2), 1, 0.75)
    assert per_group(own, 4) == [4, 0, 0, 0]
    floored = limited_mask(EVS, x, (4, 2, 2), 1, 0.75, min_tokens_per_group=3)
    assert per_group(floored, 4) == [3, 3, 3, 3]  # 12 = 3 * 4 > 4: the floor raised the count
    assert floored.view(4, 4)[:, :3].all()
    budgeted = limited_mask(EVS, x, (4, 2, 2), 1, 0.0, token_budget=6, min_tokens_per_group=1)
    assert per_group(budgeted, 4) == [3, 1, 1, 1]


def test_with_group_floor_refuses_a_mask_too_small_for_it() -> None:
    with pytest.raises(ValueError, match="cannot keep 2 in each of 3 groups"):
        with_group_floor(torch.tensor([True] * 5 + [False] * 7), torch.zeros(12), 3, 2)
    with pytest.raises(ValueError, match="not 5 groups"):
        with_group_floor(torch.ones(12, dtype=torch.bool), torch.zeros(12), 5, 1)
