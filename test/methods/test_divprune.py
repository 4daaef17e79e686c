"""DivPrune's keep-mask (`methods/divprune.py`) against a plain reference of the paper's greedy max-min selection
(`testing/divprune_oracle.py`)."""

import pytest
import torch

from sglang_evs.methods.divprune import divprune_mask
from sglang_evs.methods.images import image_kept_count as kept_count
from sglang_evs.testing.divprune_oracle import divprune_kept


@pytest.mark.parametrize(
    "seed, tokens, width, rate", [(0, 16, 8, 0.5), (1, 49, 24, 0.75), (2, 30, 4, 0.1), (3, 7, 3, 0.9)]
)
def test_the_mask_keeps_what_the_reference_selects(seed, tokens, width, rate):
    rows = torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    keep = kept_count(tokens, rate)
    mask = divprune_mask(rows, keep)
    assert mask.dtype == torch.bool and int(mask.sum()) == keep
    assert sorted(mask.nonzero().flatten().tolist()) == sorted(divprune_kept(rows.tolist(), keep))


def test_duplicates_are_dropped_before_anything_distinct():
    """A document's blank background: many identical tokens and a few distinct ones. The distinct ones and one
    background token are kept first; the rest of the background only once nothing else is left."""
    background, marks = torch.tensor([1.0, 0.0, 0.0]), torch.eye(3)[1:]
    rows = torch.stack([background] * 6 + [marks[0], background, marks[1]])
    assert divprune_mask(rows, 3).nonzero().flatten().tolist() == [0, 6, 8]
    assert int(divprune_mask(rows, 9).sum()) == 9


def test_one_image_gets_one_mask_whatever_its_rows_dtype_and_the_count_is_checked():
    rows = torch.randn(20, 6, generator=torch.Generator().manual_seed(4))
    assert torch.equal(divprune_mask(rows, 5), divprune_mask(rows.double(), 5))
    assert torch.equal(divprune_mask(rows, 5), divprune_mask(rows.clone(), 5))
    assert divprune_mask(rows[:1], 1).tolist() == [True]
    for bad in (0, 21):
        with pytest.raises(ValueError, match="DivPrune keeps 1 to 20 tokens"):
            divprune_mask(rows, bad)


def test_the_kept_count_is_the_rates_and_at_least_one():
    assert [kept_count(100, q) for q in (0.0, 0.5, 0.75, 0.999)] == [100, 50, 25, 1]
