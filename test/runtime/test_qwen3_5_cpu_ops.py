"""The sgl_kernel CPU ops Qwen3.5's layers call (norms, gates, projection split), against plain references.

Each op is called through `torch.ops.sgl_kernel`, with the argument lists SGLang 0.5.23's
`models/qwen3_5.py` and `fla/layernorm_gated.py` pass, on random shapes (views included, as
SGLang hands over slices of one projection).
"""

from types import SimpleNamespace

import torch

from sglang_evs.runtime.torch_ops import define_sgl_kernel_ops

CASES = 50


def ops():
    define_sgl_kernel_ops()
    return torch.ops.sgl_kernel


def gemma_rmsnorm_row(row: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """One row, in float64: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    x = row.double()
    return x / torch.sqrt((x * x).sum() / x.numel() + eps) * (1 + weight.double())


def random_shapes(gen: torch.Generator) -> tuple[int, int, int, int]:
    tokens = int(torch.randint(1, 9, (), generator=gen))
    heads = int(torch.randint(1, 5, (), generator=gen))
    kv_heads = int(torch.randint(1, heads + 1, (), generator=gen))
    head_dim = int(torch.randint(1, 5, (), generator=gen)) * 8
    return tokens, heads, kv_heads, head_dim


def test_fused_qk_gemma_rmsnorm_matches_per_row_formula():
    gen = torch.Generator().manual_seed(0)
    for _ in range(CASES):
        tokens, heads, kv_heads, dim = random_shapes(gen)
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
        q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)  # views, as SGLang's
        qw, kw = torch.randn(dim, generator=gen), torch.randn(dim, generator=gen)
        eps = float(torch.rand((), generator=gen)) * 1e-3
        q_out, k_out = ops().fused_qk_gemma_rmsnorm_cpu(q, k, qw, kw, eps, dim)
        assert q_out.shape == (tokens * heads, dim) and k_out.shape == (tokens * kv_heads, dim)
        for t in range(tokens):
            for h in range(heads):
                want = gemma_rmsnorm_row(q[t, h * dim : (h + 1) * dim], qw, eps)
                torch.testing.assert_close(q_out[t * heads + h].double(), want, rtol=1e-5, atol=1e-5)
            for h in range(kv_heads):
                want = gemma_rmsnorm_row(k[t, h * dim : (h + 1) * dim], kw, eps)
                torch.testing.assert_close(k_out[t * kv_heads + h].double(), want, rtol=1e-5, atol=1e-5)


def test_fused_qk_gemma_rmsnorm_with_gate_splits_interleaved_heads():
    gen = torch.Generator().manual_seed(1)
    for _ in range(CASES):
        tokens, heads, kv_heads, dim = random_shapes(gen)
        qkv = torch.randn(tokens, (2 * heads + 2 * kv_heads) * dim, generator=gen)
        q_gate, k, _ = qkv.split([2 * heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        qw, kw = torch.randn(dim, generator=gen), torch.randn(dim, generator=gen)
        q_out, k_out, gate_out = ops().fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qw, kw, 1e-6, dim, heads)
        for t in range(tokens):
            for h in range(heads):
                start = 2 * h * dim  # [q_h | gate_h] per head
                want_q = gemma_rmsnorm_row(q_gate[t, start : start + dim], qw, 1e-6)
                torch.testing.assert_close(q_out[t * heads + h].double(), want_q, rtol=1e-5, atol=1e-5)
                assert torch.equal(gate_out[t * heads + h], q_gate[t, start + dim : start + 2 * dim])
            for h in range(kv_heads):
                want_k = gemma_rmsnorm_row(k[t, h * dim : (h + 1) * dim], kw, 1e-6)
                torch.testing.assert_close(k_out[t * kv_heads + h].double(), want_k, rtol=1e-5, atol=1e-5)
        assert gate_out.is_contiguous() and gate_out.data_ptr() != q_gate.data_ptr()


def test_fused_sigmoid_mul_gates_in_place():
    gen = torch.Generator().manual_seed(2)
    for case in range(CASES):
        tokens, heads, _, dim = random_shapes(gen)
        x = torch.randn(tokens, heads * dim, generator=gen)
        gate = torch.randn(tokens, heads, dim, generator=gen)
        if case % 2:
            gate = gate.reshape(tokens, -1)
        want = [[float(x[t, i]) / (1 + torch.exp(-gate.reshape(tokens, -1)[t, i]).item())
                 for i in range(heads * dim)] for t in range(tokens)]  # fmt: skip
        ops().fused_sigmoid_mul_cpu(x, gate)
        torch.testing.assert_close(x, torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_projection_split_matches_upstream_reference_ordering():
    """Against SGLang's own pure-torch `fix_query_key_value_ordering` (the path for other ratios)."""
    from sglang.srt.models.qwen3_5 import Qwen3_5GatedDeltaNet

    gen = torch.Generator().manual_seed(3)
    for _ in range(CASES):
        tokens = int(torch.randint(1, 9, (), generator=gen))
        k_heads = int(torch.randint(1, 4, (), generator=gen))
        v_heads = k_heads * int(torch.randint(1, 4, (), generator=gen))
        dk, dv = (int(torch.randint(1, 5, (), generator=gen)) * 4 for _ in range(2))
        layer = SimpleNamespace(key_dim=k_heads * dk, value_dim=v_heads * dv, num_v_heads=v_heads, attn_tp_size=1,
                                head_v_dim=dv)  # fmt: skip
        qkvz = torch.randn(tokens, 2 * k_heads * dk + 2 * v_heads * dv, generator=gen)
        ba = torch.randn(tokens, 2 * v_heads, generator=gen)
        q, k, v, z, b, a = Qwen3_5GatedDeltaNet.fix_query_key_value_ordering(layer, qkvz, ba)
        mixed, z_out, b_out, a_out = ops().fused_qkvzba_split_reshape_cat_contiguous_cpu(
            qkvz, ba, k_heads, v_heads, dk, dv
        )
        assert torch.equal(mixed, torch.cat([q, k, v.reshape(tokens, -1)], dim=-1))
        assert torch.equal(z_out, z) and torch.equal(b_out, b) and torch.equal(a_out, a)
        assert mixed.is_contiguous() and z_out.shape == (tokens, v_heads, dv)


def test_fused_rmsnorm_gated_matches_norm_then_silu_gate():
    gen = torch.Generator().manual_seed(4)
    for _ in range(CASES):
        rows, dim = int(torch.randint(1, 17, (), generator=gen)), int(torch.randint(1, 9, (), generator=gen)) * 4
        x, z, w = torch.randn(rows, dim, generator=gen), torch.randn(rows, dim, generator=gen), torch.randn(dim)
        out = ops().fused_rmsnorm_gated_cpu(x, w, z, 1e-6)
        for r in range(rows):
            xr = x[r].double()
            normed = xr / torch.sqrt((xr * xr).mean() + 1e-6) * w.double()
            zr = z[r].double()
            torch.testing.assert_close(out[r].double(), normed * zr / (1 + torch.exp(-zr)), rtol=1e-5, atol=1e-5)
        ungated = ops().fused_rmsnorm_gated_cpu(x, w, None, 1e-6)  # z=None: the norm alone, against the formula
        for r in range(rows):
            xr = x[r].double()
            normed = xr / torch.sqrt((xr * xr).mean() + 1e-6) * w.double()
            torch.testing.assert_close(ungated[r].double(), normed, rtol=1e-5, atol=1e-5)


def test_gated_norm_module_takes_the_cpu_op_without_amx(cpu_route):
    """On the CPU route, as SGLang's scheduler: Gated DeltaNet's output norm runs on CPU
    (upstream would call Triton, which needs CUDA, on a CPU without Intel AMX)."""
    code = """
        import torch
        from sglang.kernels.ops.attention.fla import layernorm_gated
        norm = layernorm_gated.RMSNorm(8, eps=1e-6)
        x, z = torch.randn(3, 8), torch.randn(3, 8)
        out = norm(x, z)
        want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.nn.functional.silu(z)
        torch.testing.assert_close(out, want)
        print("gated norm on cpu")
    """
    assert "gated norm on cpu" in cpu_route(code)


def test_shared_expert_gate_matches_per_token_formula():
    from sglang_evs.runtime.elementwise import fused_gate_sigmoid_mul, fused_gate_sigmoid_mul_add

    gen = torch.Generator().manual_seed(5)
    for _ in range(CASES):
        tokens, dim = int(torch.randint(1, 9, (), generator=gen)), int(torch.randint(1, 9, (), generator=gen)) * 8
        hidden, shared = torch.randn(tokens, dim, generator=gen), torch.randn(tokens, dim, generator=gen)
        weight, final = torch.randn(dim, generator=gen), torch.randn(tokens, dim, generator=gen)
        want = torch.stack([
            shared[t].double() / (1 + torch.exp(-(hidden[t].double() * weight.double()).sum())) for t in range(tokens)
        ])  # fmt: skip
        torch.testing.assert_close(fused_gate_sigmoid_mul(hidden, weight, shared).double(), want, rtol=1e-5, atol=1e-5)
        expected_sum = final.double() + want
        fused_gate_sigmoid_mul_add(hidden, weight, shared, final)
        torch.testing.assert_close(final.double(), expected_sum, rtol=1e-5, atol=1e-5)


def test_qwen2_moe_module_gets_the_torch_shared_expert_gate(cpu_route):
    code = """
        from sglang.srt.models import qwen2_moe
        from sglang_evs.runtime import elementwise
        assert qwen2_moe.fused_gate_sigmoid_mul_add is elementwise.fused_gate_sigmoid_mul_add
        assert qwen2_moe.fused_gate_sigmoid_mul is elementwise.fused_gate_sigmoid_mul
        print("torch gate")
    """
    assert "torch gate" in cpu_route(code)
