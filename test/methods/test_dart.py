"""DART's keep-mask (`methods/dart.py`) against a plain reference of its embedding-level selection
(`testing/dart_oracle.py`)."""

import pytest
import torch

from sglang_evs.methods.dart import dart_mask
from sglang_evs.testing.dart_oracle import dart_kept


@pytest.mark.parametrize(
    "seed, tokens, width, keep",
    [(0, 16, 8, 8), (1, 49, 24, 12), (2, 30, 4, 27), (3, 7, 3, 1), (4, 9, 5, 3), (5, 12, 6, 12), (6, 64, 16, 5)],
)
def test_the_mask_keeps_what_the_reference_selects(seed, tokens, width, keep):
    rows = torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    mask = dart_mask(rows, keep)
    assert mask.dtype == torch.bool and int(mask.sum()) == keep
    assert sorted(mask.nonzero().flatten().tolist()) == sorted(dart_kept(rows.tolist(), keep))


def test_duplicates_are_dropped_before_anything_distinct():
    """A document's blank background: many identical tokens and a few distinct marks. Beyond the pivots (the 4
    largest norms, here the first 4 background tokens on the tie), the marks are kept before any other background
    token; with marks of larger norm they are the pivots and one background token joins them."""
    background, marks = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.eye(4)[1:]
    rows = torch.stack([background] * 12 + list(marks))
    assert dart_mask(rows, 7).nonzero().flatten().tolist() == [0, 1, 2, 3, 12, 13, 14]
    assert dart_mask(rows, 5).nonzero().flatten().tolist() == [0, 1, 2, 3, 12]
    bright = torch.stack([background] * 5 + [2 * marks[0], background, 2 * marks[1], 2 * marks[2]])
    assert dart_mask(bright, 4).nonzero().flatten().tolist() == [0, 5, 7, 8]
    assert int(dart_mask(bright, 9).sum()) == 9


def test_one_image_gets_one_mask_whatever_its_rows_dtype_and_the_count_is_checked():
    rows = torch.randn(20, 6, generator=torch.Generator().manual_seed(7))
    for keep in (1, 3, 5, 20):
        assert torch.equal(dart_mask(rows, keep), dart_mask(rows.double(), keep))
        assert torch.equal(dart_mask(rows, keep), dart_mask(rows.clone(), keep))
    assert dart_mask(rows[:1], 1).tolist() == [True]
    assert dart_mask(torch.zeros(5, 3), 2).tolist() == [True, True, False, False, False]
    for bad in (0, 21):
        with pytest.raises(ValueError, match="DART keeps 1 to 20 tokens of this image, not"):
            dart_mask(rows, bad)
