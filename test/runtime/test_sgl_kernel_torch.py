"""The GPU route's pure-torch `sgl_kernel` ops equal SGLang's own `forward_native` (or a plain reference), and
capture and replay in a real CUDA graph (GPU only)."""

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from sglang_evs.runtime import sgl_kernel_torch as ops

TOLERANCE = {torch.float32: {"rtol": 1e-6, "atol": 1e-6}, torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2}}


def norms(hidden: int, dtype: torch.dtype, gemma: bool, seed: int):
    from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm

    layer = (GemmaRMSNorm if gemma else RMSNorm)(hidden, eps=1e-6)
    layer.weight.data = torch.randn(hidden, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return layer


def inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (3 * torch.randn(shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_norms_equal_sglang_forward_native(dtype, gemma, seed):
    tokens, hidden = [(1, 64), (7, 128), (33, 48), (5, 256)][seed]
    layer = norms(hidden, dtype, gemma, seed)
    rmsnorm, fused = (ops.gemma_rmsnorm, ops.gemma_fused_add_rmsnorm) if gemma else (ops.rmsnorm, ops.fused_add_rmsnorm)
    x, residual = inputs((tokens, hidden), dtype, seed), inputs((tokens, hidden), dtype, seed + 100)

    expected = layer.forward_native(x.clone())
    torch.testing.assert_close(rmsnorm(x, layer.weight.data, 1e-6), expected, **TOLERANCE[dtype])
    out = torch.empty_like(x)
    assert rmsnorm(x, layer.weight.data, 1e-6, out=out) is out
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])

    expected_out, expected_residual = layer.forward_native(x.clone(), residual.clone())
    got_x, got_residual = x.clone(), residual.clone()
    assert fused(got_x, got_residual, layer.weight.data, 1e-6) is None  # in place, as the kernel
    torch.testing.assert_close(got_residual, expected_residual, **TOLERANCE[dtype])
    torch.testing.assert_close(got_x, expected_out, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "name, approximate",
    [("silu_and_mul", None), ("gelu_and_mul", "none"), ("gelu_tanh_and_mul", "tanh")],
)
def test_gated_activations_equal_sglang_forward_native(dtype, name, approximate):
    from sglang.srt.layers.activation import GeluAndMul, SiluAndMul

    layer = SiluAndMul() if approximate is None else GeluAndMul(approximate)
    for seed, shape in enumerate([(1, 16), (9, 256), (2, 3, 96)]):
        x = inputs(shape, dtype, seed)
        expected = layer.forward_native(x)
        torch.testing.assert_close(getattr(ops, name)(x), expected, **TOLERANCE[dtype])
        out = torch.empty_like(expected)
        assert getattr(ops, name)(x, out) is out
        torch.testing.assert_close(out, expected, **TOLERANCE[dtype])


def reference_top_k(probs: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Keep an entry when fewer than k entries of its row are larger (ties with the k-th kept); renormalise."""
    rows = []
    for row, k in zip(probs.double(), ks, strict=True):
        larger = (row[None, :] > row[:, None]).sum(1)
        kept = torch.where(larger < k, row, 0.0)
        rows.append(kept / kept.sum())
    return torch.stack(rows).float()


def reference_top_p(probs: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """Keep an entry when the mass of its row at or below it reaches 1 - p; renormalise."""
    rows = []
    for row, p in zip(probs.double(), ps, strict=True):
        mass_up_to = torch.stack([row[row <= v].sum() for v in row])
        kept = torch.where(mass_up_to >= 1 - p, row, 0.0)
        rows.append(kept / kept.sum())
    return torch.stack(rows).float()


@pytest.mark.parametrize("seed", range(6))
def test_renormalisation_keeps_the_top_k_and_the_nucleus(seed):
    rng = torch.Generator().manual_seed(seed)
    rows, vocab = 5, 50
    probs = torch.softmax(2 * torch.randn(rows, vocab, generator=rng), -1)
    ks = torch.randint(1, vocab + 5, (rows,), generator=rng)  # beyond the vocabulary: no filtering
    ps = torch.rand(rows, generator=rng).clamp(min=0.05)
    ps[0] = 1.0
    torch.testing.assert_close(ops.top_k_renorm_prob(probs, ks), reference_top_k(probs, ks.tolist()))
    torch.testing.assert_close(ops.top_p_renorm_prob(probs, ps), reference_top_p(probs, ps.tolist()))
    torch.testing.assert_close(ops.top_k_renorm_prob(probs, 3), reference_top_k(probs, [3] * rows))
    torch.testing.assert_close(ops.top_p_renorm_prob(probs, 0.5), reference_top_p(probs, [0.5] * rows))
    assert (ops.top_k_renorm_prob(probs, 3) > 0).sum(1).eq(3).all()  # softmax of random draws: no ties


def test_top_k_keeps_ties_at_the_pivot():
    probs = torch.tensor([[0.4, 0.2, 0.2, 0.1, 0.1]])
    torch.testing.assert_close(ops.top_k_renorm_prob(probs, 2), torch.tensor([[0.5, 0.25, 0.25, 0.0, 0.0]]))


def test_weak_ref_tensor_views_the_memory_without_keeping_it():
    base = torch.arange(24.0).reshape(4, 6)
    strong = base[1:, 2:5]
    weak = ops.weak_ref_tensor(strong)
    assert (weak.data_ptr(), weak.shape, weak.stride(), weak.dtype) == (
        strong.data_ptr(),
        strong.shape,
        strong.stride(),
        strong.dtype,
    )
    torch.testing.assert_close(weak, strong)
    weak.fill_(-1.0)  # the same memory
    assert (base[1:, 2:5] == -1).all()
    ref = StorageWeakRef(base.untyped_storage())
    del base, strong
    assert ref.expired()  # the weak view did not keep the storage alive (a plain view would)
    assert ops.weak_ref_tensor(3) == 3


def test_only_the_listed_names_exist_and_import_only_ones_say_what_they_are():
    assert ops.is_arch_support_pdl() is False
    top = ops.names_of("sgl_kernel")
    assert top["rmsnorm"] is ops.rmsnorm and "moe_sum" in top and "flash_attn_varlen_func" not in top
    with pytest.raises(NotImplementedError, match="sgl_kernel.quantization.ggml_dequantize .*GPU route"):
        ops.names_of("sgl_kernel.quantization")["ggml_dequantize"](torch.zeros(1))
    assert ops.names_of("sgl_kernel.flash_attn") == {}
    assert set(ops.MODULES) == {"sgl_kernel", "sgl_kernel.utils", "sgl_kernel.quantization", "sgl_kernel.kvcacheio"}


def tiny_forward(x, residual, norm_weight, up, top_k):
    """x, residual [T, 64], norm_weight [64], up [64, 128], top_k [T] -> (probs [T, 64], a weak view of the
    hidden state [T, 64]). A decoder-like step through every op with a torch body: norm, gated MLP, residual
    norm, renormalisation."""
    h = ops.rmsnorm(x, norm_weight, 1e-6)
    h = ops.silu_and_mul(h @ up)
    ops.fused_add_rmsnorm(h, residual, norm_weight[: h.shape[1]], 1e-6)
    h = ops.gelu_tanh_and_mul(torch.cat([h, h], -1)) + ops.gemma_rmsnorm(h, norm_weight[: h.shape[1]], 1e-6)
    probs = torch.softmax(h.float(), -1)
    return ops.top_p_renorm_prob(ops.top_k_renorm_prob(probs, top_k), 0.9), ops.weak_ref_tensor(h)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: captures a torch.cuda.CUDAGraph")
def test_the_ops_capture_and_replay_in_a_cuda_graph():
    device, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(8, 64, generator=gen).to(device, dtype) for _ in range(2))
    weight = torch.randn(64, generator=gen).to(device, dtype)
    up = (0.1 * torch.randn(64, 128, generator=gen)).to(device, dtype)
    top_k = torch.full((8,), 5, device=device, dtype=torch.int64)
    static = [x.clone(), residual.clone()]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as SGLang's runners do
        tiny_forward(static[0], static[1].clone(), weight, up, top_k)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        probs, _ = tiny_forward(static[0], static[1], weight, up, top_k)

    for seed in range(3):
        gen = torch.Generator().manual_seed(seed + 1)
        new_x, new_residual = (torch.randn(8, 64, generator=gen).to(device, dtype) for _ in range(2))
        static[0].copy_(new_x)
        static[1].copy_(new_residual)
        graph.replay()
        eager_residual = new_residual.clone()
        expected, _ = tiny_forward(new_x, eager_residual, weight, up, top_k)
        torch.testing.assert_close(probs, expected, rtol=0, atol=0)  # the same kernels on the same inputs
        torch.testing.assert_close(static[1], eager_residual, rtol=0, atol=0)  # the in-place residual update
        assert not torch.equal(static[1], new_residual)
        assert (probs > 0).sum(1).le(5).all()
