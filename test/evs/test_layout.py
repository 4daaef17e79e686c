"""The canonical split a pruned video is laid out with before encoding."""

import pytest

from sglang_evs.evs import canonical_keep_mask, canonical_kept_per_group


def test_canonical_split_examples() -> None:
    assert canonical_kept_per_group(16, 6, 0.75).tolist() == [16, 2, 2, 2, 1, 1]
    assert canonical_kept_per_group(16, 4, 0.75).tolist() == [16, 0, 0, 0]
    assert canonical_kept_per_group(5, 1, 0.5).tolist() == [5]
    assert canonical_kept_per_group(3, 3, 0.0).tolist() == [3, 3, 3]
    assert canonical_keep_mask((3, 2, 4), 2, 0.5).int().tolist() == [1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize(("tpf", "groups", "q"), [(100, 4, 0.9), (448, 32, 0.75), (10, 20, 0.9), (7, 3, 0.3)])
def test_canonical_split_keeps_the_count_computed_here_and_group_zero_whole(tpf, groups, q) -> None:
    counts = canonical_kept_per_group(tpf, groups, q)
    assert int(counts.sum()) == max(tpf, int(groups * tpf * (1 - q)))  # the EVS count, written out here
    assert counts[0] == tpf and all(0 <= c <= tpf for c in counts.tolist())
    assert max(counts[1:].tolist(), default=0) - min(counts[1:].tolist(), default=0) <= 1
