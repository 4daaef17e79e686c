"""The CPU vision attention attends segment by segment and equals SGLang's masked attention."""

import pytest
import torch
import torch.nn.functional as F

from sglang_evs.runtime.vision_attention import segmented_sdpa


def masked_reference(q, k, v, cu_seqlens, scale):
    """One SDPA over all rows with the block-diagonal mask (what SGLang's CPU backend computes)."""
    s = q.shape[0]
    mask = torch.zeros(s, s, dtype=torch.bool)
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True):
        mask[start:end, start:end] = True
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(*(x.transpose(0, 1) for x in (q, k, v)), attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


@pytest.mark.parametrize("seed", range(20))
def test_segments_equal_the_masked_attention(seed):
    rng = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (int(torch.randint(1, 6, (1,), generator=rng)),), generator=rng)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    heads, kv_heads, dim = [(4, 4, 16), (8, 2, 8)][seed % 2]
    q = torch.randn(int(cu_seqlens[-1]), heads, dim, generator=rng)
    k, v = (torch.randn(int(cu_seqlens[-1]), kv_heads, dim, generator=rng) for _ in range(2))
    got = segmented_sdpa(q, k, v, cu_seqlens, dim**-0.5)
    torch.testing.assert_close(got, masked_reference(q, k, v, cu_seqlens, dim**-0.5), rtol=1e-5, atol=1e-6)


def test_sglang_backend_is_patched_and_builds_no_dense_mask(monkeypatch):
    vision = pytest.importorskip("sglang.srt.layers.attention.vision")
    cls = vision.VisionSdpaAttention
    assert hasattr(cls.forward, "__wrapped__"), "the CPU runtime did not patch VisionSdpaAttention"
    attention = cls(head_dim=16, num_heads=4, num_kv_heads=4, flatten_batch=True)
    rng = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(50, 4, 16, generator=rng) for _ in range(3))
    cu_seqlens = torch.tensor([0, 20, 35, 50], dtype=torch.int32)
    unpatched = cls.forward.__wrapped__(attention, q, k, v, 1, cu_seqlens=cu_seqlens)

    def no_dense_mask(*args, **kwargs):
        raise AssertionError("a dense [s, s] mask was built")

    monkeypatch.setattr(cls, "generate_patch_attention_mask", no_dense_mask)
    patched = attention.forward(q, k, v, 1, cu_seqlens=cu_seqlens)
    assert patched.shape == unpatched.shape == (50, 4, 16)
    torch.testing.assert_close(patched, unpatched, rtol=1e-5, atol=1e-6)
