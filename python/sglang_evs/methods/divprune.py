"""Which image tokens DivPrune keeps: a max-min diverse subset of an image's merged tokens.

DivPrune (Alvar et al., "Diversity-based Visual Token Pruning for Large Multimodal Models", CVPR 2025) keeps the
tokens that together cover the image best, read off the tower's output alone (no attention weights, no question), so
one image at one setting always gets one mask and the prefix and embedding caches stay valid.

* Distance of two tokens: ``1 - cos(x_i, x_j)``, over every column of a row (for Qwen3-VL ``[main | ds0 | ds1 |
  ds2]``: the deepstack levels count too, and the one mask prunes every level), computed in float32.
* Greedy max-min selection: the first token kept is the one farthest from its nearest other token; each next one
  is the token farthest from the tokens kept so far (its smallest distance to them largest). Ties go to the lower
  index.
* Kept count: the caller's (``methods.images.image_kept_count``: ``max(1, int(N * (1 - q)))``).

Tested against a plain reference of the paper's selection (`testing/divprune_oracle.py`). The distances are an
``[N, N]`` matrix: 4 MB for a 1024-token image, 1 GB for a 16,384-token one.
"""

import torch


def divprune_mask(rows: torch.Tensor, keep: int) -> torch.Tensor:
    """rows: [N, width], an image's merged tokens in raster order; keep: how many to keep (1..N).
    Returns a bool [N] keep-mask with exactly `keep` True, on the rows' device."""
    num_tokens = rows.shape[0]
    if not 1 <= keep <= num_tokens:
        raise ValueError(f"DivPrune keeps 1 to {num_tokens} tokens of this image, not {keep}")
    unit = torch.nn.functional.normalize(rows.float(), dim=1)
    distance = 1 - unit @ unit.T  # [N, N]
    kept = torch.zeros(num_tokens, dtype=torch.bool, device=rows.device)
    to_others = distance.clone().fill_diagonal_(torch.inf)
    first = int(torch.argmax(to_others.min(dim=1).values if num_tokens > 1 else torch.zeros(1)))
    kept[first] = True
    to_kept = distance[first].clone()  # [N] each token's smallest distance to the tokens kept
    for _ in range(keep - 1):
        pick = int(torch.argmax(to_kept.masked_fill(kept, -torch.inf)))
        kept[pick] = True
        to_kept = torch.minimum(to_kept, distance[pick])
    return kept
