"""A plain reference of DivPrune's greedy max-min selection (Alvar et al., CVPR 2025), in Python loops over
floats: the oracle `methods/divprune.py` is tested against."""

import math


def cosine_distance(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return 1.0 - dot / max(norm, 1e-12)


def divprune_kept(rows: list[list[float]], keep: int) -> list[int]:
    """The indices kept, in the order chosen: first the token whose nearest other token is farthest, then each time
    the token whose nearest kept token is farthest (the lowest index on a tie)."""
    n = len(rows)
    distance = [[cosine_distance(rows[i], rows[j]) for j in range(n)] for i in range(n)]
    nearest_other = [min((distance[i][j] for j in range(n) if j != i), default=0.0) for i in range(n)]
    chosen = [max(range(n), key=lambda i: (nearest_other[i], -i))]
    while len(chosen) < keep:
        candidates = [i for i in range(n) if i not in chosen]
        chosen.append(max(candidates, key=lambda i: (min(distance[i][k] for k in chosen), -i)))
    return chosen
