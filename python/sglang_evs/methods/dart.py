"""Which image tokens DART keeps: the tokens least duplicated by a few pivot tokens, read off the tower's output.

DART (Wen et al., "Stop Looking for Important Tokens in Multimodal Language Models: Duplication Matters More",
arXiv 2502.11494, EMNLP 2025) prunes by duplication rather than importance; its abstract reports pruning 88.9% of
the vision tokens with comparable performance and a 1.99x (total) / 2.99x (prefill) speed-up.

The authors' rule (github.com/ZichenWen1/DART, ``get_retained_image_token`` in
``llava/model/language_model/modeling_llama_self.py``, read in its copy xqy1111111/DART; defaults in
``llava/eval/model_vqa_loader.py`` and ``scripts/v1_5/eval/*.sh``: layer K=2, 4 image + 4 text pivots, 128 of
LLaVA-1.5's 576 tokens): inside the LLM, the pivots are the image tokens (and the text tokens) of largest L1 norm
of the layer's key states; then, pivot after pivot, the ``budget // pivots`` remaining image tokens of lowest
cosine similarity to the pivot (on the layer's normed hidden states) are kept and leave the pool.

At the embedding level (as NVIDIA TensorRT-Edge-LLM ships it for Qwen3-VL: ``cpp/runtime/preprocess/dartPruner.cpp``
and ``docs/source/user_guide/features/visual-token-pruning.md``, read in its copy nvluxiaoz/TensorRT-Edge-LLM) there
is no key state nor LLM layer, so both scores are taken on the tower's output rows of one image, here over every
column (for Qwen3-VL ``[main | ds0 | ds1 | ds2]``), in float32:

* Pivots: the ``min(PIVOTS, keep)`` rows of largest L1 norm (``PIVOTS = 4``, the authors' and TensorRT-Edge-LLM's
  image-pivot default), largest first, ties to the lower index. No text pivots: the prompt is not part of an
  image's rows, and leaving it out keeps one mask per image and setting (prefix and embedding caches stay valid).
* Growth: pivot after pivot, the ``ceil(left / pivots left)`` pool rows of lowest cosine similarity to the pivot
  (``x.y / (max(|x|, eps) max(|y|, eps))``) are kept, ties to the lower index, and leave the pool; ``left`` counts
  the rows still to keep, so exactly ``keep`` rows are kept (TensorRT-Edge-LLM's exact-count share; the authors'
  fixed ``budget // 8`` per pivot does not add up exactly).

Memory is linear in N (one [N] similarity vector per pivot, no [N, N] matrix as in DivPrune), so very large images
cost little. Pivots are chosen by norm alone: identical rows of the largest norm can all be pivots (at most
``PIVOTS`` of them); every other kept row is chosen for its low similarity. Tested against a plain reference of
this rule (`testing/dart_oracle.py`).
"""

import torch

PIVOTS = 4
EPS = 1e-12


def pivots(rows: torch.Tensor, count: int) -> torch.Tensor:
    """rows: [N, width] float32. Returns long [count]: the rows of largest L1 norm, largest first, ties to the
    lower index."""
    l1 = rows.abs().sum(dim=1)  # [N]
    return torch.sort(-l1, stable=True).indices[:count]


def dart_mask(rows: torch.Tensor, keep: int) -> torch.Tensor:
    """rows: [N, width], an image's merged tokens in raster order; keep: how many to keep (1..N).
    Returns a bool [N] keep-mask with exactly `keep` True, on the rows' device."""
    num_tokens = rows.shape[0]
    if not 1 <= keep <= num_tokens:
        raise ValueError(f"DART keeps 1 to {num_tokens} tokens of this image, not {keep}")
    rows = rows.float()
    unit = rows / rows.norm(dim=1, keepdim=True).clamp_min(EPS)  # [N, width]
    chosen = pivots(rows, min(PIVOTS, keep))
    kept = torch.zeros(num_tokens, dtype=torch.bool, device=rows.device)
    kept[chosen] = True
    left = keep - len(chosen)
    for done, pivot in enumerate(chosen.tolist()):
        share = -(-left // (len(chosen) - done))
        if share == 0:
            break
        similarity = (unit @ unit[pivot]).masked_fill(kept, torch.inf)  # [N]; kept rows are out of the pool
        kept[torch.sort(similarity, stable=True).indices[:share]] = True
        left -= share
    return kept
