"""EVS over a stream sent segment by segment (`methods.stream`): a continued segment is pruned as the stream is, checked
against the rule written out here on the concatenated stream's rows."""

import pytest
import torch

from sglang_evs.methods import EVS, threshold_limited_mask
from sglang_evs.methods.stream import continued_count, continued_mask, continued_threshold_mask

TPF = 6  # a group of 2 x 3 cells (m = 1)


def stream_scores(stream: torch.Tensor, groups: int) -> torch.Tensor:
    """The rule on the whole stream: [groups, TPF], 1 - cos with the same cell one group earlier; group 0 inf."""
    x = stream.view(groups, TPF, -1)
    scores = torch.full((groups, TPF), float("inf"))
    scores[1:] = 1 - torch.nn.functional.cosine_similarity(x[1:], x[:-1], dim=-1)
    return scores


def best(scores: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` highest scores, ties to the lower index."""
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    mask[torch.argsort(scores.reshape(-1), descending=True, stable=True)[:count]] = True
    return mask


def segments(seed: int, first: int = 3, second: int = 4) -> tuple[torch.Tensor, int, int]:
    return torch.randn((first + second) * TPF, 8, generator=torch.Generator().manual_seed(seed)), first, second


@pytest.mark.parametrize("q", [0.0, 0.3, 0.5, 0.75, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_continued_segment_keeps_the_best_scores_the_whole_stream_gives_it(q, seed):
    stream, first, second = segments(seed)
    rows = stream[(first - 1) * TPF :]  # the stream's last group before the segment, then the segment
    mask = continued_mask(rows, (second, 2, 3), 1, q)
    kept = int(second * TPF * (1 - q))
    assert int(mask.sum()) == kept == continued_count(TPF, second, q)
    assert torch.equal(mask, best(stream_scores(stream, first + second)[first:], kept))


def test_a_static_stream_keeps_one_group_at_a_threshold_where_segments_apart_keep_one_each():
    frame = torch.randn(TPF, 8, generator=torch.Generator().manual_seed(3))
    static = frame.repeat(4, 1)  # two segments of two groups, nothing moves
    first = threshold_limited_mask(static[: 2 * TPF], (2, 2, 3), 1, 0.1)
    continued = continued_threshold_mask(static[TPF:], (2, 2, 3), 1, 0.1)  # its context: the first's last group
    alone = threshold_limited_mask(static[2 * TPF :], (2, 2, 3), 1, 0.1)
    assert int(first.sum()) == TPF and int(continued.sum()) == 0  # the stream: its group 0 alone
    assert int(alone.sum()) == TPF  # the second segment as a video of its own: its own group 0 again


@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0, 2.0])
def test_a_threshold_keeps_the_continued_segments_cells_that_changed_by_more_group_0_included(threshold):
    stream, first, second = segments(4)
    mask = continued_threshold_mask(stream[(first - 1) * TPF :], (second, 2, 3), 1, threshold)
    assert torch.equal(mask, (stream_scores(stream, first + second)[first:] > threshold).reshape(-1))


def test_a_budget_and_a_floor_apply_to_the_segment():
    stream, first, second = segments(5)
    rows, scores = stream[(first - 1) * TPF :], stream_scores(stream, first + second)[first:]
    capped = continued_mask(rows, (second, 2, 3), 1, 0.25, token_budget=5)
    assert int(capped.sum()) == 5 == continued_count(TPF, second, 0.25, token_budget=5)
    assert torch.equal(capped, best(scores, 5))
    floored = continued_mask(rows, (second, 2, 3), 1, 0.9, min_tokens_per_group=2)
    assert int(floored.sum()) == 2 * second == continued_count(TPF, second, 0.9, min_tokens_per_group=2)
    for group, group_scores in zip(floored.view(second, TPF), scores, strict=True):  # each group: its 2 best
        assert torch.equal(group, best(group_scores, 2))
    by_threshold = continued_threshold_mask(rows, (second, 2, 3), 1, 2.0, min_tokens_per_group=3)
    assert by_threshold.view(second, TPF).sum(dim=1).tolist() == [3] * second  # nothing exceeds 2: the floor


def test_the_first_segment_is_a_video_of_its_own_and_the_counts_are_known_before_encoding():
    """A stream's first segment is pruned as any video (EVS: its group 0 whole); a continued one by `continued_count`
    from its grid and settings alone."""
    stream, first, _ = segments(6)
    assert torch.equal(
        EVS.retention_mask(stream[: first * TPF], (first, 2, 3), 1, 0.75),
        best(stream_scores(stream[: first * TPF], first), EVS.retained_token_count(TPF, first, 0.75)),
    )
    assert [continued_count(TPF, 4, q) for q in (0.0, 0.5, 0.99)] == [24, 12, 0]
    with pytest.raises(ValueError, match="video_pruning_rate"):
        continued_count(TPF, 4, 1.0)
