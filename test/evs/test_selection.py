"""Tests of sglang_evs.evs.selection: kept count and keep-mask."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_evs.evs import (
    apply_retention_mask,
    retained_token_count,
    retention_mask,
    validate_pruning_rate,
)

from .vllm_reference import compute_retained_tokens_count, compute_retention_mask

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


# ----------------------------------------------------------------- counts
@pytest.mark.parametrize(
    ("tpf", "groups", "q", "expected"),
    [
        (10, 20, 0.9, 19),  # float rounding: 200 * 0.09999... -> 19
        (16, 6, 0.75, 24),
        (16, 4, 0.75, 16),
        (16, 5, 0.75, 20),
        (448, 32, 0.75, 3584),
        (256, 64, 0.7, 4915),
        (16, 2, 0.9, 16),  # floor: int(3.2) = 3 < tpf
        (5, 1, 0.5, 5),  # one group: always all of it
        (7, 3, 0.0, 21),  # q = 0 keeps everything
        (448, 32, 0, 448 * 32),
    ],
)
def test_retained_token_count_table(tpf: int, groups: int, q: float, expected: int) -> None:
    assert retained_token_count(tpf, groups, q) == expected
    assert compute_retained_tokens_count(tpf, groups, q) == expected


@given(
    tpf=st.integers(1, 2000),
    groups=st.integers(1, 400),
    q=st.floats(0, 1, exclude_max=True),
)
@settings(max_examples=300, deadline=None)
def test_retained_token_count_matches_vllm(tpf: int, groups: int, q: float) -> None:
    n = retained_token_count(tpf, groups, q)
    assert n == compute_retained_tokens_count(tpf, groups, q)
    assert tpf <= n <= tpf * groups


@pytest.mark.parametrize("bad", [-0.1, -1e-12, 1.0, 1.5, math.nan, math.inf, "0.5", None, True])
def test_invalid_pruning_rate_raises(bad: object) -> None:
    for call in (
        lambda: retained_token_count(4, 4, bad),  # type: ignore[arg-type]
        lambda: validate_pruning_rate(bad),
        lambda: retention_mask(torch.zeros(8, 3), (2, 2, 2), 1, bad),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match="video_pruning_rate") as err:
            call()
        assert repr(bad) in str(err.value)


def test_invalid_grid_raises() -> None:
    with pytest.raises(ValueError, match="divisible"):
        retention_mask(torch.zeros(6, 3), (3, 1, 3), 2, 0.5)
    with pytest.raises(ValueError, match=r"\[6, D\]"):
        retention_mask(torch.zeros(5, 3), (3, 1, 2), 1, 0.5)


# ----------------------------------------------------------- exact masks
def _groups(*rows: torch.Tensor) -> torch.Tensor:
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("a b | a c | c c", [1, 1, 0, 1, 0, 0]),
        ("a b | a c | -a c", [1, 1, 0, 0, 1, 0]),
        ("a b | a b | a b", [1, 1, 1, 0, 0, 0]),
    ],
)
def test_spec_small_masks(case: str, expected: list[int], dtype: torch.dtype) -> None:
    vec = {"a": torch.tensor([1.0, 0, 0]), "b": torch.tensor([0, 1.0, 0])}
    vec["c"] = torch.tensor([0, 0, 1.0])
    vec["-a"] = -vec["a"]
    rows = _groups(*(vec[name] for name in case.replace("|", "").split()))
    rows = rows.to(dtype)
    mask = retention_mask(rows, (3, 1, 2), 1, 0.5)
    assert mask.dtype == torch.bool
    assert mask.int().tolist() == expected
    assert torch.equal(mask, compute_retention_mask(rows, (3, 1, 2), 1, 0.5))


# ---------------------------------------------------- property / oracle
@st.composite
def videos(draw: st.DrawFn) -> tuple[torch.Tensor, tuple[int, int, int], int, float]:
    m = draw(st.sampled_from([1, 2]))
    t, h, w = draw(st.integers(1, 7)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    d = draw(st.integers(1, 12))
    dtype = draw(st.sampled_from(DTYPES))
    q = draw(st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.9]), st.floats(0, 0.999)))
    style = draw(st.sampled_from(["random", "repeat", "quantized", "static", "zeros"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    x = torch.randn(t, h * w, d, generator=gen)
    if style == "repeat":  # repeated groups -> exact zero scores, ties
        keep = torch.rand(t, generator=gen) < 0.5
        for g in range(1, t):
            if keep[g]:
                x[g] = x[g - 1]
    elif style == "quantized":  # few distinct values -> many equal scores
        x = torch.randint(-1, 2, (t, h * w, d), generator=gen).float()
    elif style == "static":
        x = x[:1].expand(t, -1, -1).clone()
    elif style == "zeros":
        x[torch.rand(t, h * w, generator=gen) < 0.3] = 0
    return x.reshape(-1, d).to(dtype), (t, h * m, w * m), m, q


def _scores(x: torch.Tensor, t: int, tpf: int) -> torch.Tensor:
    y = x.view(t, tpf, -1)
    return 1 - torch.nn.functional.cosine_similarity(y[1:], y[:-1], dim=-1)


def _has_nan_score(x: torch.Tensor, t: int, tpf: int) -> bool:
    return bool(torch.isnan(_scores(x, t, tpf)).any())


def _sorted_mask(x: torch.Tensor, t: int, tpf: int, n: int) -> torch.Tensor:
    """Stable descending selection over scores with NaN counted as 1."""
    scores = torch.nan_to_num(_scores(x, t, tpf), nan=1.0).reshape(-1)
    scores = torch.cat([torch.full((tpf,), 255, dtype=scores.dtype), scores])
    mask = torch.zeros(t * tpf, dtype=torch.bool)
    mask[torch.argsort(scores, descending=True, stable=True)[:n]] = True
    return mask


@given(videos())
@settings(max_examples=400, deadline=None)
def test_mask_properties_and_vllm_equality(
    video: tuple[torch.Tensor, tuple[int, int, int], int, float],
) -> None:
    x, grid, m, q = video
    t, h, w = grid[0], grid[1] // m, grid[2] // m
    tpf = h * w
    mask = retention_mask(x, grid, m, q)
    ref = compute_retention_mask(x, torch.tensor(grid), m, q)
    if _has_nan_score(x, t, tpf):
        # vLLM ranks NaN (fp16 zero vectors) above group 0; we score it 1
        assert x.dtype == torch.float16
        n = retained_token_count(tpf, t, q)
        assert torch.equal(mask, _sorted_mask(x, t, tpf, n))
    else:
        assert torch.equal(mask, ref)
    # grid as list / tensor gives the same answer, and the call is deterministic
    assert torch.equal(mask, retention_mask(x, list(grid), m, q))
    assert torch.equal(mask, retention_mask(x, torch.tensor(grid), m, q))
    n = retained_token_count(tpf, t, q)
    assert mask.shape == (t * tpf,)
    assert int(mask.sum()) == n
    assert mask[:tpf].all()  # group 0 whole
    # only group 0 survives exactly when int(T * tpf * (1 - q)) <= tpf; in
    # particular whenever T * (1 - q) <= 1
    only_first = int(t * tpf * (1 - q)) <= tpf
    assert bool(mask[tpf:].any()) == (not only_first)
    if t * (1 - q) <= 1:
        assert not mask[tpf:].any()
    if q == 0:
        assert mask.all()
    # kept rows are the highest scores; ties go to the lower flat index
    scores = torch.cat(
        [
            torch.full((tpf,), 255.0),
            (1 - torch.nn.functional.cosine_similarity(x.view(t, tpf, -1)[1:], x.view(t, tpf, -1)[:-1], dim=-1))
            .float()
            .reshape(-1),
        ]
    )
    if not mask.all() and not torch.isnan(scores).any():
        lowest_kept = scores[mask].min()
        assert (scores[~mask] <= lowest_kept).all()
        tied = (~mask) & (scores == lowest_kept)
        if tied.any():
            last_kept_tie = torch.nonzero(mask & (scores == lowest_kept)).max()
            assert torch.nonzero(tied).min() > last_kept_tie


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_equality_realistic_sizes(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    t, h, w, d = 8, 6, 10, 256
    base = torch.randn(1, h * w, d, generator=gen)
    drift = 0.05 * torch.randn(t, h * w, d, generator=gen).cumsum(0)
    x = (base + drift).reshape(-1, d).to(dtype)
    x[h * w * 3 : h * w * 4] = x[h * w * 2 : h * w * 3]  # a repeated group
    for q in (0.1, 0.5, 0.75, 0.9):
        mask = retention_mask(x, (t, 2 * h, 2 * w), 2, q)
        assert torch.equal(mask, compute_retention_mask(x, (t, 2 * h, 2 * w), 2, q))


# --------------------------------------------------------------- deepstack
def test_deepstack_one_mask_prunes_every_level() -> None:
    gen = torch.Generator().manual_seed(1)
    t, h, w, hidden = 5, 2, 3, 8
    levels = [torch.randn(t * h * w, hidden, generator=gen) for _ in range(4)]
    cat = torch.cat(levels, dim=1)
    mask = retention_mask(cat, (t, h, w), 1, 0.6)
    kept = apply_retention_mask(cat, mask, [hidden] * 4)
    assert isinstance(kept, list)
    for got, level in zip(kept, levels, strict=True):
        assert torch.equal(got, level[mask])
    assert torch.equal(apply_retention_mask(cat, mask), cat[mask])


def test_deepstack_columns_are_scored() -> None:
    # main columns are identical for every group (scores 0 -> ties, lowest
    # index wins), deepstack columns change only in the last group: scoring
    # all columns keeps the last group, scoring main only keeps group 1.
    t, h, w, hidden = 3, 1, 2, 4
    main = torch.ones(t * h * w, hidden)
    deep = torch.ones(t * h * w, hidden)
    deep[4:, 0] = -5.0
    cat = torch.cat([main, deep], dim=1)
    full = retention_mask(cat, (t, h, w), 1, 0.3)
    main_only = retention_mask(main, (t, h, w), 1, 0.3)
    assert full.int().tolist() == [1, 1, 0, 0, 1, 1]
    assert main_only.int().tolist() == [1, 1, 1, 1, 0, 0]
    assert torch.equal(full, compute_retention_mask(cat, (t, h, w), 1, 0.3))
