"""Tests of sglang_evs.methods.evs: kept count and keep-mask.

Oracles: the plain-Python rule in `sglang_evs.testing.evs_oracle`, and vLLM 0.33.0's released
evs.py fetched at test time (the `vllm_evs` fixture; skipped without PyPI).
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from types import ModuleType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_evs import sglang_compat
from sglang_evs.methods import check_pruning_rate
from sglang_evs.methods.evs import retained_token_count, retention_mask
from sglang_evs.testing.evs_oracle import keep_mask, kept_count

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
    assert kept_count(tpf, groups, q) == expected


@given(tpf=st.integers(1, 2000), groups=st.integers(1, 400), q=st.floats(0, 1, exclude_max=True))
@settings(max_examples=300, deadline=None)
def test_retained_token_count_matches_the_rule(tpf: int, groups: int, q: float) -> None:
    n = retained_token_count(tpf, groups, q)
    assert n == kept_count(tpf, groups, q)
    assert isinstance(n, int) and tpf <= n <= tpf * groups


def test_retained_token_count_matches_vllm(vllm_evs: ModuleType) -> None:
    rng = random.Random(0)
    for _ in range(2000):
        tpf, groups, q = rng.randint(1, 2000), rng.randint(1, 400), rng.choice([rng.random(), rng.randint(0, 19) / 20])
        assert retained_token_count(tpf, groups, q) == vllm_evs.compute_retained_tokens_count(tpf, groups, q)


@pytest.mark.parametrize("bad", [-0.1, -1e-12, 1.0, 1.5, math.nan, math.inf, "0.5", None, True])
def test_invalid_pruning_rate_raises(bad: object) -> None:
    for call in (
        lambda: retained_token_count(4, 4, bad),  # type: ignore[arg-type]
        lambda: check_pruning_rate(bad),
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
    with pytest.raises(ValueError, match=r"\[6, D\]"):
        retention_mask(torch.zeros(6), (3, 1, 2), 1, 0.5)
    with pytest.raises(ValueError, match=">= 1"):
        retained_token_count(0, 3, 0.5)


def test_evs_core_loads_without_sglang_packages() -> None:
    """evs_core is read from its file: the scheduler-importing package __init__ need not run. Checked in a
    fresh interpreter (in this one, another test may have imported the package already)."""
    probe = (
        "import sys; from sglang_evs import sglang_compat; core = sglang_compat.resolve_file('evs_core'); "
        "assert callable(core.compute_retention_mask) and callable(core.compute_retained_tokens_count); "
        "assert 'sglang.srt.multimodal.evs' not in sys.modules, 'the package __init__ ran'; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_evs_core_already_imported_is_the_one_used(monkeypatch: pytest.MonkeyPatch) -> None:
    name = sglang_compat.INTERNALS["evs_core"].partition(":")[0]
    fake = ModuleType(name)
    fake.compute_retained_tokens_count = lambda tpf, t, q: 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, fake)
    assert sglang_compat.resolve_file("evs_core") is fake
    assert retained_token_count(16, 4, 0.5) == 7  # served by whatever SGLang has loaded


def test_missing_sglang_file_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sglang_compat.INTERNALS, "gone", "sglang.srt.multimodal.evs.no_such_file:")
    with pytest.raises(ImportError, match="no_such_file"):
        sglang_compat.resolve_file("gone")


# ----------------------------------------------------------- exact masks
VEC = {"a": [1.0, 0, 0], "b": [0, 1.0, 0], "c": [0, 0, 1.0], "-a": [-1.0, 0, 0]}


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
    rows = torch.tensor([VEC[name] for name in case.replace("|", "").split()], dtype=dtype)
    mask = retention_mask(rows, (3, 1, 2), 1, 0.5)
    assert mask.dtype == torch.bool
    assert mask.int().tolist() == expected
    assert torch.equal(mask, keep_mask(rows, (3, 1, 2), 1, 0.5))


# ---------------------------------------------------- property / oracle
def random_video(rng: random.Random, dtypes: list[torch.dtype] = DTYPES) -> tuple[torch.Tensor, tuple, int, float]:
    """Random rows of a random grid, often full of exact ties; ``(rows, grid_thw, m, q)``."""
    m = rng.choice([1, 2])
    t, h, w, d = rng.randint(1, 7), rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 12)
    q = rng.choice([0.0, 0.25, 0.5, 0.75, 0.9, rng.random() * 0.999])
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    x = torch.randn(t, h * w, d, generator=gen)
    style = rng.choice(["random", "repeat", "quantized", "static", "zeros", "scaled"])
    if style == "repeat":  # repeated groups -> exact zero scores, ties
        for g in range(1, t):
            if rng.random() < 0.5:
                x[g] = x[g - 1]
    elif style == "quantized":  # few distinct values -> many equal scores
        x = torch.randint(-1, 2, (t, h * w, d), generator=gen).float()
    elif style == "static":
        x = x[:1].expand(t, -1, -1).clone()
    elif style == "zeros":  # zero vectors: NaN cosine in fp16, 0 in fp32/bf16
        x[torch.rand(t, h * w, generator=gen) < 0.3] = 0
    elif style == "scaled":  # same directions, other lengths -> ties at score 0
        x = x[:1] * torch.rand(t, h * w, 1, generator=gen).add(0.5)
    return x.reshape(-1, d).to(rng.choice(dtypes)), (t, h * m, w * m), m, q


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=400, deadline=None)
def test_mask_equals_oracle_and_properties(seed: int) -> None:
    x, grid, m, q = random_video(random.Random(seed))
    t, tpf = grid[0], grid[1] * grid[2] // m**2
    mask = retention_mask(x, grid, m, q)
    assert torch.equal(mask, keep_mask(x, grid, m, q))
    # grid as list / tensor gives the same answer
    assert torch.equal(mask, retention_mask(x, list(grid), m, q))
    assert torch.equal(mask, retention_mask(x, torch.tensor(grid), m, q))
    assert mask.shape == (t * tpf,) and mask.dtype == torch.bool
    assert int(mask.sum()) == retained_token_count(tpf, t, q)
    assert mask[:tpf].all()  # group 0 whole, fp16 zero vectors included
    # only group 0 survives exactly when int(T * tpf * (1 - q)) <= tpf
    assert bool(mask[tpf:].any()) == (int(t * tpf * (1 - q)) > tpf)
    if q == 0:
        assert mask.all()


def test_fp16_zero_vectors_do_not_outrank_group_0() -> None:
    # rows 2 and 4 meet a zero vector: NaN in fp16 arithmetic (which would rank
    # them above group 0); scored in fp32 both are 1 - 0 = 1, the lower row wins
    x = torch.tensor([[1.0, 0], [0, 1], [0, 0], [0, 1], [-1, 0], [0, 1]], dtype=torch.float16)
    mask = retention_mask(x, (3, 1, 2), 1, 0.5)
    assert mask.tolist() == [True, True, True, False, False, False]
    assert torch.equal(mask, keep_mask(x, (3, 1, 2), 1, 0.5))


def test_mask_follows_the_rows_device_and_leaves_them_alone() -> None:
    x = torch.randn(6, 5).to(torch.bfloat16)
    before = x.clone()
    mask = retention_mask(x, (3, 4, 2), 2, 0.5)
    assert mask.device == x.device and torch.equal(x, before)


def test_mask_equals_vllm_on_random_and_tied_inputs(vllm_evs: ModuleType) -> None:
    rng = random.Random(1)
    cases = 0
    for _ in range(400):
        x, grid, m, q = random_video(rng, [torch.float32, torch.bfloat16])
        want = vllm_evs.compute_retention_mask(x, torch.tensor(grid), m, q)
        assert torch.equal(retention_mask(x, grid, m, q), want), (grid, m, q, x.dtype)
        cases += 1
    assert cases >= 300


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mask_equals_vllm_at_realistic_sizes(dtype: torch.dtype, vllm_evs: ModuleType) -> None:
    gen = torch.Generator().manual_seed(0)
    t, h, w, d = 8, 6, 10, 256
    base = torch.randn(1, h * w, d, generator=gen)
    drift = 0.05 * torch.randn(t, h * w, d, generator=gen).cumsum(0)
    x = (base + drift).reshape(-1, d).to(dtype)
    x[h * w * 3 : h * w * 4] = x[h * w * 2 : h * w * 3]  # a repeated group
    for q in (0.1, 0.5, 0.75, 0.9):
        mask = retention_mask(x, (t, 2 * h, 2 * w), 2, q)
        assert torch.equal(mask, vllm_evs.compute_retention_mask(x, (t, 2 * h, 2 * w), 2, q))
        assert torch.equal(mask, keep_mask(x, (t, 2 * h, 2 * w), 2, q))


# --------------------------------------------------------------- deepstack
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
    assert torch.equal(full, keep_mask(cat, (t, h, w), 1, 0.3))
