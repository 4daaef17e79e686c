"""The canonical split a pruned video is laid out with before encoding."""

import pytest

from sglang_evs.methods import canonical_keep_mask, canonical_kept_per_group


def test_canonical_split_examples() -> None:
    assert canonical_kept_per_group(16, 6, 24).tolist() == [16, 2, 2, 2, 1, 1]
    assert canonical_kept_per_group(16, 4, 16).tolist() == [16, 0, 0, 0]
    assert canonical_kept_per_group(5, 1, 5).tolist() == [5]
    assert canonical_kept_per_group(3, 3, 9).tolist() == [3, 3, 3]
    assert canonical_kept_per_group(100, 4, 40).tolist() == [40, 0, 0, 0]  # VidCom2 may keep < one group
    assert canonical_keep_mask((3, 2, 4), 2, 3).int().tolist() == [1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize(("tpf", "groups", "q"), [(100, 4, 0.9), (448, 32, 0.75), (10, 20, 0.9), (7, 3, 0.3)])
def test_evs_count_keeps_group_zero_whole(tpf, groups, q) -> None:
    kept = max(tpf, int(groups * tpf * (1 - q)))  # the EVS count, written out here
    counts = canonical_kept_per_group(tpf, groups, kept)
    assert int(counts.sum()) == kept
    assert counts[0] == tpf and all(0 <= c <= tpf for c in counts.tolist())
    assert max(counts[1:].tolist(), default=0) - min(counts[1:].tolist(), default=0) <= 1


@pytest.mark.parametrize("kept", [0, 1, 7, 99, 100, 101, 250, 399, 400])
def test_any_count_fits_the_groups(kept) -> None:
    counts = canonical_kept_per_group(100, 4, kept)
    assert int(counts.sum()) == kept and all(0 <= c <= 100 for c in counts.tolist())
    assert int(canonical_keep_mask((4, 20, 20), 2, kept).sum()) == kept


@pytest.mark.parametrize("kept", [-1, 401])
def test_impossible_counts_are_refused(kept) -> None:
    with pytest.raises(ValueError, match="kept must be in"):
        canonical_kept_per_group(100, 4, kept)
