"""Comparisons of two greedy generations (`sglang_evs.testing.requests.Generation`), as the tests make them:
exactly, to a logprob tolerance, or up to bfloat16 near-ties."""

from sglang_evs.testing.requests import logprob_gap


def assert_same_generation(got, want, tolerance: float, context: str, near_ties: bool = False) -> None:
    """Two greedy generations (`testing.requests.Generation`): the same tokens and prompt tokens, logprobs
    within `tolerance`. `near_ties` (bfloat16, where two roundings of one request may break a near-tie
    either way): where the two part, each one's token is within `tolerance` of the other's choice among the
    other's top logprobs, and nothing after that step is compared."""
    assert got.prompt_tokens == want.prompt_tokens, context
    if not near_ties:
        assert got.output_ids == want.output_ids, context
    for step, (a, b) in enumerate(zip(got.output_ids, want.output_ids, strict=True)):
        if a != b:
            assert near_ties, context
            for one, token in ((got, b), (want, a)):
                ranked = {tok: logprob for logprob, tok in one.top_logprobs[step]}
                assert token in ranked and one.logprobs[step] - ranked[token] <= tolerance, f"{context}: step {step}"
            return
        gap = abs(got.logprobs[step] - want.logprobs[step])
        assert gap <= tolerance, f"{context}: logprobs {gap:.2e} apart at step {step}"


def assert_same_greedy(got, want, context) -> None:
    """Tokens exactly; logprobs to 1e-4. Chunked prefill and radix hits compute attention in other
    pieces than one prefill does, which rounds differently on CPU (upstream too: ~1e-7 here); a
    wrong position moves logprobs by orders of magnitude more."""
    assert got.output_ids == want.output_ids, context
    assert logprob_gap(got, want) < 1e-4, context
    got_top = [[t for _, t in step] for step in got.top_logprobs]
    assert got_top == [[t for _, t in step] for step in want.top_logprobs], context


def assert_close(ours, reference, context: str = "", tolerance: float = 1e-4) -> None:
    """The same tokens and prompt length; logprobs within `tolerance`."""
    assert (ours.output_ids, ours.prompt_tokens) == (reference.output_ids, reference.prompt_tokens), context
    gap = logprob_gap(ours, reference)
    assert gap <= tolerance, (context, gap)
