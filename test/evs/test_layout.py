"""Tests of sglang_evs.evs.layout: Qwen3-VL video expansion under pruning."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_evs.evs import (
    canonical_keep_mask,
    canonical_kept_per_group,
    group_timestamps,
    kept_cells,
    kept_per_group,
    pruned_placeholder_length,
    pruned_video_slots,
    retained_token_count,
    retention_mask,
    timestamp_text,
    video_token_ids,
)

VS, VE, PAD = 151652, 151653, 151656


def _hf_timestamps(indices: list[int], fps: float) -> list[float]:
    """transformers' Qwen3VLProcessor._calculate_timestamps (it ignores self)."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    return Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, 2)  # type: ignore[arg-type]


def test_group_timestamps_examples() -> None:
    assert group_timestamps([0, 2, 4, 6], 2.0) == [0.5, 2.5]
    assert group_timestamps([0, 10, 20], 10.0) == [0.5, 2.0]  # odd: repeat last
    assert group_timestamps(torch.tensor([3]), 1.0) == [3.0]
    assert timestamp_text(0.5) == "<0.5 seconds>"
    assert timestamp_text(12.25) == "<12.2 seconds>"  # Python's round-half-even repr
    with pytest.raises(ValueError):
        group_timestamps([], 2.0)


def test_group_timestamps_match_transformers() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 40)
        fps = rng.choice([1.0, 2.0, 23.976, 24.0, 29.97, 30.0, 59.94, 7.5])
        idx = sorted(rng.sample(range(2000), n))
        got = group_timestamps(idx, fps)
        want = _hf_timestamps(idx, fps)
        assert got == want
        assert [timestamp_text(x) for x in got] == [f"<{x:.1f} seconds>" for x in want]


def _unpruned_ids(ts: list[list[int]], tpf: int) -> list[int]:
    out: list[int] = []
    for ids in ts:
        out += [*ids, VS] + [PAD] * tpf + [VE]
    return out


@st.composite
def videos(draw: st.DrawFn) -> tuple[list[list[int]], torch.Tensor, tuple[int, int, int], int, float]:
    m = draw(st.sampled_from([1, 2]))
    t, h, w = draw(st.integers(1, 8)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    q = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.9]))
    ts = [draw(st.lists(st.integers(0, 1000), min_size=1, max_size=5)) for _ in range(t)]
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    x = torch.randn(t, h * w, 6, generator=gen)
    static = torch.rand(t, generator=gen) < 0.4
    for g in range(1, t):
        if static[g]:
            x[g] = x[g - 1]  # groups that likely keep nothing
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    mask = retention_mask(x.reshape(-1, 6).to(dtype), (t, h * m, w * m), m, q)
    return ts, mask, (t, h * m, w * m), m, q


@given(videos())
@settings(max_examples=150, deadline=None)
def test_pruned_expansion_is_unpruned_minus_pruned_pads(
    video: tuple[list[list[int]], torch.Tensor, tuple[int, int, int], int, float],
) -> None:
    ts, mask, grid, m, q = video
    t, tpf = grid[0], grid[1] * grid[2] // m**2
    n = retained_token_count(tpf, t, q)
    length = pruned_placeholder_length([len(x) for x in ts], tpf, q)

    # reference: the unpruned expansion with the pruned pad tokens deleted
    full = _unpruned_ids(ts, tpf)
    row_of_slot = []
    row = 0
    for tok in full:
        row_of_slot.append(row if tok == PAD else -1)
        row += tok == PAD
    keep = [r < 0 or bool(mask[r]) for r in row_of_slot]
    want_ids = [tok for tok, k in zip(full, keep, strict=True) if k]
    want_rows = [r for r, k in zip(row_of_slot, keep, strict=True) if k]

    ids, rows = pruned_video_slots(ts, mask, VS, VE, PAD)
    assert ids.tolist() == want_ids
    assert rows.tolist() == want_rows
    assert ids.numel() == length == len(full) - (t * tpf - n)

    counts = kept_per_group(mask, t)
    assert counts.tolist() == [int(mask[g * tpf : (g + 1) * tpf].sum()) for g in range(t)]
    assert torch.equal(video_token_ids(ts, counts, VS, VE, PAD), ids)

    # before encoding: canonical split, same length, same multiset of tokens,
    # identical through group 0's vision_end
    canon = canonical_kept_per_group(tpf, t, q)
    assert int(canon.sum()) == n and int(canon[0]) == tpf
    if t > 1:
        assert int(canon[1:].max() - canon[1:].min()) <= 1
    canon_ids = video_token_ids(ts, canon, VS, VE, PAD)
    assert canon_ids.numel() == length
    assert sorted(canon_ids.tolist()) == sorted(ids.tolist())
    head = len(ts[0]) + 2 + tpf
    assert torch.equal(canon_ids[:head], ids[:head])
    cmask = canonical_keep_mask(grid, m, q)
    assert torch.equal(kept_per_group(cmask, t), canon)
    assert torch.equal(pruned_video_slots(ts, cmask, VS, VE, PAD)[0], canon_ids)

    # pad slot i holds kept row i, at original (group, row, col)
    cells = kept_cells(mask, grid, m)
    w = grid[2] // m
    assert cells.shape == (n, 3)
    assert torch.equal(cells[:, 0] * tpf + cells[:, 1] * w + cells[:, 2], rows[rows >= 0])
    assert torch.equal(cells[:, 0], torch.repeat_interleave(torch.arange(t), counts))


def test_unpruned_expansion_matches_hf_layout() -> None:
    ts = [[60, 15, 20], [60, 16, 20], [60, 17, 13, 20]]
    ids = video_token_ids(ts, [4, 4, 4], VS, VE, PAD)
    assert ids.tolist() == _unpruned_ids(ts, 4)
    assert pruned_placeholder_length([3, 3, 4], 4, 0.0) == ids.numel()


def test_placeholder_length_examples() -> None:
    # T = 32 groups of 16 x 28 merged tokens, q = .75, 6-token timestamps
    assert pruned_placeholder_length([6] * 32, 448, 0.75) == 6 * 32 + 64 + 3584
    assert pruned_placeholder_length([5], 448, 0.75) == 5 + 2 + 448
    with pytest.raises(ValueError, match="video_pruning_rate"):
        pruned_placeholder_length([5, 5], 4, 1.0)


def test_canonical_split_examples() -> None:
    assert canonical_kept_per_group(16, 6, 0.75).tolist() == [16, 2, 2, 2, 1, 1]
    assert canonical_kept_per_group(16, 4, 0.75).tolist() == [16, 0, 0, 0]
    assert canonical_kept_per_group(5, 1, 0.5).tolist() == [5]
    assert canonical_kept_per_group(3, 3, 0.0).tolist() == [3, 3, 3]
    assert canonical_keep_mask((3, 2, 4), 2, 0.5).int().tolist() == [1, 1, 1, 0, 0, 0]
