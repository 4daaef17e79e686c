"""Tests of sglang_evs.methods.vidcom2.

Oracles: the algorithm restated in float64 with stable sorts (`sglang_evs.testing.vidcom2_oracle`; for
continuous fp32 inputs, which do not tie), and vLLM 0.33.0's released
vidcom2.py fetched at test time (the `vllm_vidcom2` fixture; skipped without PyPI).
"""

from __future__ import annotations

import math
import random
from types import ModuleType

import pytest
import torch

from sglang_evs.methods import vidcom2
from sglang_evs.testing.vidcom2_oracle import oracle_mask


def continuous_video(
    rng: random.Random, dtype: torch.dtype, widths: tuple[int, ...] = (2, 3, 8, 32, 64)
) -> tuple[torch.Tensor, tuple[int, int, int], int, float]:
    """Random rows; ``d`` < 4 scores one channel, whose normalised rows are +-1: ties."""
    m = rng.choice([1, 2])
    t, h, w, d = rng.randint(1, 8), rng.randint(1, 6), rng.randint(1, 6), rng.choice(widths)
    q = rng.choice([0.0, 0.25, 0.5, 0.75, 0.9, 0.95, rng.random() * 0.95])
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    x = torch.randn(t, h * w, d, generator=gen)
    if rng.random() < 0.5:  # a scene: frames drift from a common base, some channels quiet
        x = torch.randn(1, h * w, d, generator=gen) + 0.3 * x.cumsum(0) * torch.rand(d, generator=gen)
    return x.reshape(-1, d).to(dtype), (t, h * m, w * m), m, q


# ----------------------------------------------------------------- counts
@pytest.mark.parametrize(
    ("tpf", "frames", "q", "expected"),
    [
        (16, 6, 0.75, 24),
        (448, 32, 0.75, 3584),
        (10, 20, 0.9, 20),  # int(19.99...) = 19 < T: one per frame
        (16, 4, 0.95, 4),
        (1, 7, 0.5, 7),
        (5, 3, 0.0, 15),
    ],
)
def test_retained_token_count_examples(tpf: int, frames: int, q: float, expected: int) -> None:
    assert vidcom2.retained_token_count(tpf, frames, q) == expected


def test_retained_token_count_matches_vllm(vllm_vidcom2: ModuleType) -> None:
    rng = random.Random(0)
    for _ in range(2000):
        tpf, frames, q = rng.randint(1, 2000), rng.randint(1, 400), rng.choice([rng.random(), rng.randint(0, 19) / 20])
        n = vidcom2.retained_token_count(tpf, frames, q)
        assert n == vllm_vidcom2.compute_retained_tokens_count(tpf, frames, q)
        assert frames <= n <= tpf * frames


@pytest.mark.parametrize("bad", [-0.1, 1.0, math.nan, "0.5", None, True])
def test_invalid_rate_raises(bad: object) -> None:
    with pytest.raises(ValueError, match="pruning_rate"):
        vidcom2.retained_token_count(4, 4, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pruning_rate"):
        vidcom2.retention_mask(torch.zeros(8, 3), (2, 2, 2), 1, bad)  # type: ignore[arg-type]


def test_invalid_grid_raises() -> None:
    with pytest.raises(ValueError, match=r"\[6, D\]"):
        vidcom2.retention_mask(torch.zeros(5, 3), (3, 1, 2), 1, 0.5)
    with pytest.raises(ValueError, match="divisible"):
        vidcom2.retention_mask(torch.zeros(6, 3), (3, 1, 3), 2, 0.5)


# ------------------------------------------------------------------ masks
def test_mask_equals_float64_oracle() -> None:
    rng = random.Random(2)
    for _ in range(150):
        x, grid, m, q = continuous_video(rng, torch.float32, widths=(8, 32, 64))
        t, tpf = grid[0], grid[1] * grid[2] // m**2
        want, budgets = oracle_mask(x, t, tpf, q)
        assert all(1 <= k <= tpf for k in budgets)
        assert torch.equal(vidcom2.retention_mask(x, grid, m, q), want), (grid, m, q)


def test_distinct_frames_get_larger_budgets() -> None:
    # every row of frames 0-2 is near a, of frame 3 near b: frame 3 is the distinctive one
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    x = torch.stack([a, a, a, b])[:, None, :] + 0.1 * torch.randn(4, 16, 8, generator=gen)
    mask = vidcom2.retention_mask(x.reshape(-1, 8), (4, 4, 4), 1, 0.5).view(4, 16)
    kept = mask.sum(1).tolist()
    assert kept[3] == max(kept) and kept[3] > kept[0]
    assert sum(kept) == vidcom2.retained_token_count(16, 4, 0.5)


def test_q0_keeps_everything_and_mask_is_on_the_rows_device() -> None:
    x = torch.randn(3 * 4, 6)
    mask = vidcom2.retention_mask(x, (3, 4, 4), 2, 0.0)
    assert mask.all() and mask.device == x.device and mask.shape == (12,)


def test_mask_equals_vllm_on_continuous_inputs(vllm_vidcom2: ModuleType) -> None:
    rng = random.Random(3)
    cases = 0
    for _ in range(360):
        x, grid, m, q = continuous_video(rng, rng.choice([torch.float32, torch.bfloat16]))
        want = vllm_vidcom2.compute_retention_mask(x, torch.tensor(grid), m, q)
        assert torch.equal(vidcom2.retention_mask(x, grid, m, q), want), (grid, m, q, x.dtype)
        cases += 1
    assert cases >= 300


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_count_is_exact_with_ties(dtype: torch.dtype) -> None:
    """Constant videos, repeated frames, few distinct values, zero rows: ties everywhere."""
    rng = random.Random(4)
    for _ in range(200):
        m = rng.choice([1, 2])
        t, h, w, d = rng.randint(1, 8), rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 16)
        q = rng.choice([0.0, 0.3, 0.5, 0.75, 0.9, 0.95])
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        style = rng.choice(["constant", "repeat", "quantized", "zeros", "one-row"])
        x = torch.randn(t, h * w, d, generator=gen)
        if style == "constant":
            x[:] = torch.randn(d, generator=gen)
        elif style == "repeat":
            x[:] = x[0]
        elif style == "quantized":
            x = torch.randint(0, 2, (t, h * w, d), generator=gen).float()
        elif style == "zeros":
            x[torch.rand(t, h * w, generator=gen) < 0.5] = 0
        else:
            x[:] = 0
            x[-1, -1] = 1
        mask = vidcom2.retention_mask(x.reshape(-1, d).to(dtype), (t, h * m, w * m), m, q)
        assert mask.shape == (t * h * w,) and mask.dtype == torch.bool
        assert int(mask.sum()) == vidcom2.retained_token_count(h * w, t, q), (style, t, h, w, q)
