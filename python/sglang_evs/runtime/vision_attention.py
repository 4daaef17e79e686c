"""Vision attention on CPU without a dense mask: one SDPA call per segment of ``cu_seqlens``.

SGLang's ``VisionSdpaAttention`` (the CPU route's vision backend) builds a boolean
``[1, s, s]`` mask over every patch of the batch and keeps up to 128 of them in an LRU cache.
The Qwen-VL towers attend within a frame (or a window), so the mask is block-diagonal, but at
``s`` patches it costs ``s**2`` bytes and SDPA then materialises ``heads * s**2`` scores: a 64 s
clip (25,600 patches) needs over 10 GB and the scheduler is killed. Attending segment by
segment computes the same attention (masked scores contribute exactly zero) in memory linear
in ``s`` and quadratic only in the segment length.
"""

import torch
import torch.nn.functional as F


def segmented_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                   scale: float) -> torch.Tensor:  # fmt: skip
    """``q, k, v``: ``[s, heads, head_dim]`` (k, v may have fewer heads: grouped); ``cu_seqlens``:
    ``[segments + 1]`` offsets from 0 to s. Returns ``[s, heads, head_dim]``, each row attending
    only to the rows of its own segment."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            segment = [x[start:end].transpose(0, 1) for x in (q, k, v)]  # [heads, len, head_dim]
            out[start:end] = F.scaled_dot_product_attention(*segment, scale=scale).transpose(0, 1)
    return out


def patch_vision_sdpa(module) -> None:
    """Route ``VisionSdpaAttention.forward`` of ``module`` (sglang.srt.layers.attention.vision)
    through `segmented_sdpa` where it would build a flattened-batch mask; otherwise unchanged."""
    cls = module.VisionSdpaAttention
    original = cls.forward

    def forward(self, q, k, v, bsz, cu_seqlens=None, attention_mask=None, **kwargs):
        if (not self.flatten_batch or cu_seqlens is None or attention_mask is not None or bsz != 1
                or self.softmax_in_single_precision or self.dropout):  # fmt: skip
            return original(self, q, k, v, bsz, cu_seqlens=cu_seqlens, attention_mask=attention_mask, **kwargs)
        q = q.reshape(-1, self.num_heads, self.head_size)
        k = k.reshape(-1, self.num_kv_heads, self.head_size)
        v = v.reshape(-1, self.num_kv_heads, self.head_size)
        return segmented_sdpa(q, k, v, cu_seqlens.cpu(), self.scale)

    forward.__wrapped__ = original
    cls.forward = forward
