"""A plain reference of DART's selection at the embedding level (Wen et al., arXiv 2502.11494), in Python loops
over floats: the oracle `methods/dart.py` is tested against. Written from the rule, not from that module: a few
pivots of largest L1 norm, then, pivot after pivot, its share of the rows least similar (cosine) to it."""

import math

PIVOTS = 4


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm_a = max(math.sqrt(sum(x * x for x in a)), 1e-12)
    norm_b = max(math.sqrt(sum(y * y for y in b)), 1e-12)
    return dot / (norm_a * norm_b)


def dart_kept(rows: list[list[float]], keep: int) -> list[int]:
    """The indices kept, in the order chosen: the min(PIVOTS, keep) pivots by decreasing L1 norm (the lower index
    on a tie), then for each pivot in turn ceil(still to keep / pivots not yet used) of the rows not yet kept, by
    increasing cosine similarity to that pivot (the lower index on a tie)."""
    n = len(rows)
    l1 = [sum(abs(x) for x in row) for row in rows]
    pivot_list = sorted(range(n), key=lambda i: (-l1[i], i))[: min(PIVOTS, keep)]
    chosen = list(pivot_list)
    for used, pivot in enumerate(pivot_list):
        share = math.ceil((keep - len(chosen)) / (len(pivot_list) - used))
        pool = [i for i in range(n) if i not in chosen]
        pool.sort(key=lambda i: (cosine(rows[pivot], rows[i]), i))
        chosen.extend(pool[:share])
    return chosen
