"""The speculative-decoding stand-ins against upstream SGLang's own kernels.

The oracle for each `*_cpu` body and Gated DeltaNet verify variant is the Triton
kernel SGLang 0.5.23 runs on a GPU for the same call, executed here by Triton's
interpreter (`TRITON_INTERPRET=1`, set before Triton imports, so in a fresh
process). The Mamba-state commit is compared with upstream's own non-CUDA
fallback in `HybridLinearAttnBackend`.
"""

import textwrap

import pytest
import torch

from sglang_evs.runtime import speculative_kernels as ours
from sglang_evs.runtime.sgl_kernel_mamba import TREES_UNSUPPORTED, causal_conv1d_update_cpu

ORACLE = textwrap.dedent(
    """
    import json
    import torch
    import sglang.kernels.ops.mamba.causal_conv1d_triton as conv_triton
    import sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent as recurrent_triton
    import sglang.kernels.ops.speculative.cache_locs as cache_locs
    import sglang.kernels.ops.speculative.eagle as eagle
    import sglang.kernels.ops.speculative.spec_tree as spec_tree
    from sglang.srt.utils import next_power_of_2
    from sglang_evs.runtime import speculative_kernels as ours
    from sglang_evs.runtime.sgl_kernel_mamba import causal_conv1d_update_cpu
    from sglang_evs.runtime.torch_ops import fused_sigmoid_gating_delta_rule_update_cpu

    for module in (conv_triton, recurrent_triton):
        module.is_arch_support_pdl = lambda: False  # a GPU-architecture query
    cache_locs._is_cpu = eagle._is_cpu = False  # their wrappers launch the Triton kernels

    def gap(a, b):
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0

    worst = {}
    def record(name, *pairs):
        worst[name] = max([worst.get(name, 0.0)] + [gap(a, b) for a, b in pairs])

    for case in range(12):
        g = torch.Generator().manual_seed(case)
        batch, dim, steps, width, slots = 1 + case % 3, 32, 3, 4, 8
        x = torch.randn(batch, steps, dim, generator=g).transpose(1, 2)  # strided, as SGLang passes it
        weight, bias = torch.randn(dim, width, generator=g), (torch.randn(dim, generator=g) if case % 2 else None)
        states = torch.randn(slots, dim, width - 1, generator=g)
        slot_ids = torch.randperm(slots, generator=g)[:batch].int()
        rows = torch.randperm(slots, generator=g)[:batch].int()
        if case % 4 == 3:
            slot_ids[0] = -1  # padding
        windows = [torch.zeros(slots, steps, dim, width - 1) for _ in range(2)]
        conv = [states.clone(), states.clone()]
        outs = [
            fn(x, conv[i], weight, bias, "silu", conv_state_indices=slot_ids,
               intermediate_conv_window=windows[i], intermediate_state_indices=rows)
            for i, fn in enumerate((conv_triton.causal_conv1d_update, causal_conv1d_update_cpu))
        ]
        real = slot_ids >= 0  # a padding row's output is left unwritten upstream
        record("conv_verify", (outs[0][real], outs[1][real]), (windows[0], windows[1]), (conv[0], conv[1]))
        strides_differ = int(outs[0].stride() != outs[1].stride())
        worst["conv_verify_strides_differ"] = max(worst.get("conv_verify_strides_differ", 0), strides_differ)

        heads, heads_v, key_dim, value_dim, tokens = 2, 4, 16, 16, batch * steps
        q, k = (torch.randn(1, tokens, heads, key_dim, generator=g) for _ in range(2))
        v = torch.randn(1, tokens, heads_v, value_dim, generator=g)
        a, b = (torch.randn(tokens, heads_v, generator=g) for _ in range(2))
        pool = torch.randn(slots, heads_v, value_dim, key_dim, generator=g)
        for keep_pool in (True, False):
            buffers = [torch.zeros(slots, steps, heads_v, value_dim, key_dim) for _ in range(2)]
            pools = [pool.clone(), pool.clone()]
            kw = dict(A_log=torch.randn(heads_v, generator=g) * 0.5, dt_bias=torch.randn(heads_v, generator=g),
                      q=q, k=k, v=v, a=a, b=b, initial_state_indices=slot_ids.clamp(min=0),
                      cu_seqlens=torch.arange(0, tokens + 1, steps, dtype=torch.int32), use_qk_l2norm_in_kernel=True,
                      softplus_beta=1.0, softplus_threshold=20.0, is_kda=False, disable_state_update=keep_pool,
                      intermediate_state_indices=rows, cache_steps=steps, retrieve_parent_token=None)
            outs = [
                fn(initial_state_source=pools[i], intermediate_states_buffer=buffers[i], **kw)
                for i, fn in enumerate((recurrent_triton.fused_sigmoid_gating_delta_rule_update,
                                        fused_sigmoid_gating_delta_rule_update_cpu))
            ]
            record("recurrent_verify", (outs[0], outs[1]), (buffers[0], buffers[1]), (pools[0], pools[1]))

        # draft trees as the EAGLE worker selects them, then greedy verification over them
        topk, depth = [1, 2, 3][case % 3], 3
        n = depth + 1 if topk == 1 else [4, 5, 6][case % 3]
        seq_lens = torch.randint(3, 20, (batch,), generator=g)
        if topk == 1:
            parents = torch.tensor([[-1, 0, 1, 2][:depth]] * batch)
            selected = torch.arange(depth).repeat(batch, 1)
        else:
            parents = torch.cat([torch.full((batch, 1), -1), torch.randint(
                0, topk * depth, (batch, topk * (depth - 1)), generator=g).sort(-1).values], 1)
            selected = torch.stack([torch.randperm(topk + topk * topk * (depth - 1), generator=g)[: n - 1].sort().values
                                    for _ in range(batch)])
        for mode in (spec_tree.TreeMaskMode.QLEN_ONLY, spec_tree.TreeMaskMode.FULL_MASK):
            size = n * n * batch + (int(seq_lens.sum()) * n if mode == spec_tree.TreeMaskMode.FULL_MASK else 0)
            built = []
            for fn in (spec_tree.sgl_build_tree_kernel_triton, ours.build_tree_kernel_efficient_cpu):
                mask, positions = torch.full((size,), True), torch.empty(batch * n, dtype=torch.long)
                links = torch.full((3, batch, n), -1, dtype=torch.long)
                fn(parents, selected, seq_lens, mask, positions, links[0], links[1], links[2], topk, depth, n, mode)
                built.append((mask, positions, links))
            record("build_tree", *zip(built[0], built[1]))
            links = built[0][2]
            candidates, target = (torch.randint(0, 3, (batch, n), generator=g) for _ in range(2))
            verified = []
            for use_ours in (False, True):
                predicts = torch.full((batch * n,), -7, dtype=torch.long)
                accept_index = torch.full((batch, depth + 1), -1, dtype=torch.long)
                accepted = torch.zeros(batch, dtype=torch.long)
                args = (predicts, accept_index, accepted, candidates, links[0], links[1], links[2], target)
                if use_ours:
                    ours.verify_tree_greedy_cpu(
                        predicts=predicts, accept_index=accept_index, accept_token_num=accepted,
                        candidates=candidates, retrive_index=links[0], retrive_next_token=links[1],
                        retrive_next_sibling=links[2], target_predict=target)
                else:
                    spec_tree.verify_tree_greedy_triton(*args)
                verified.append((predicts, accept_index, accepted))
            record("verify_tree_greedy", *zip(verified[0], verified[1]))
            worst["drafts_accepted"] = worst.get("drafts_accepted", 0) + int(verified[1][2].sum())

        # KV-slot bookkeeping
        pool_len = 64
        req_to_token = torch.randperm(4 * pool_len, generator=g).reshape(4, pool_len).int()
        req_pool = torch.randperm(4, generator=g)[:batch]
        lens = torch.randint(1, 40, (batch,), generator=g)
        locs = [torch.full((batch * topk * depth,), -1, dtype=torch.int64) for _ in range(2)]
        cache_locs.assign_draft_cache_locs_contiguous_func(req_pool, req_to_token, lens, locs[0], topk, depth)
        ours.assign_draft_cache_locs_contiguous_cpu(req_pool, req_to_token, lens, locs[1], pool_len, topk, depth)
        record("assign_draft_cache_locs", (locs[0], locs[1]))
        ends = lens + n
        locs = [torch.full((batch * n,), -1, dtype=torch.int64) for _ in range(2)]
        cache_locs.assign_extend_cache_locs[(batch,)](req_pool, req_to_token, lens, ends, locs[0], pool_len,
                                                      next_power_of_2(batch))
        ours.assign_extend_cache_locs_cpu(req_pool, req_to_token, lens, ends, locs[1], pool_len)
        record("assign_extend_cache_locs", (locs[0], locs[1]))
        accept_tokens = torch.randint(0, 100, (batch, depth + 1), generator=g)
        accept_lens = torch.randint(1, depth + 2, (batch,), generator=g)
        bonus = [torch.zeros(batch, dtype=torch.long) for _ in range(2)]
        eagle.fill_bonus_tokens_func(accept_tokens, accept_lens, bonus[0], depth + 1, batch)
        ours.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus[1], depth + 1)
        record("fill_bonus_tokens", (bonus[0], bonus[1]))
        accept_index = torch.randint(-1, batch * n, (batch, depth + 1), generator=g)
        out_locs = torch.randperm(batch * n + 5, generator=g)
        filled = [torch.full((batch * (depth + 1),), -9, dtype=torch.long) for _ in range(2)]
        eagle.fill_accept_out_cache_loc_func(accept_index, out_locs, filled[0], accept_index.numel())
        ours.fill_accept_out_cache_loc_cpu(accept_index, out_locs, filled[1])
        record("fill_accept_out_cache_loc", (filled[0], filled[1]))
    print("RESULT " + json.dumps(worst))
    """
)

EXACT = ("build_tree", "verify_tree_greedy", "assign_draft_cache_locs", "assign_extend_cache_locs",
         "fill_bonus_tokens", "fill_accept_out_cache_loc")  # fmt: skip


@pytest.fixture(scope="module")
def gaps_to_upstream(triton_interpreter) -> dict:
    return triton_interpreter(ORACLE)


def test_gated_delta_net_verify_matches_upstream_triton(gaps_to_upstream):
    # float32 throughout; the kernels sum in different orders
    assert gaps_to_upstream["conv_verify"] < 1e-5
    assert gaps_to_upstream["recurrent_verify"] < 1e-5
    # SGLang reads the conv result through x's (transposed) memory layout
    assert not gaps_to_upstream["conv_verify_strides_differ"]


@pytest.mark.parametrize("kernel", EXACT)
def test_index_kernels_equal_upstream_triton(gaps_to_upstream, kernel):
    assert gaps_to_upstream[kernel] == 0.0


def test_the_verify_cases_accept_drafts(gaps_to_upstream):
    """Greedy verification is compared on trees where some drafts are accepted, not only the empty path."""
    assert gaps_to_upstream["drafts_accepted"] > 0


def test_state_commit_matches_upstreams_cpu_fallback():
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    upstream_fallback = HybridLinearAttnBackend._scatter_speculative_state_with_mask
    g = torch.Generator().manual_seed(0)
    for case in range(20):
        layers, slots, rows, steps = 2, 9, 5, 4
        src = torch.randn(layers, rows, steps, 3, 2, generator=g)
        dst = torch.randn(layers, slots, 3, 2, generator=g)
        requests = 1 + case % 4
        dst_indices = torch.randint(-1, slots + 1, (requests,), generator=g)  # padding and out of range
        step_indices = torch.randint(-1, steps + 1, (requests,), generator=g)
        src_indices = None if case % 2 else torch.randperm(rows, generator=g)[:requests]
        want, got = dst.clone(), dst.clone()
        upstream_fallback(want, src, dst_indices, step_indices, src_indices)
        ours.fused_mamba_state_scatter_with_mask(got, src, dst_indices, step_indices, src_indices)
        assert torch.equal(got, want), case


def test_draft_trees_are_refused_by_name():
    x, states = torch.randn(1, 8, 3), torch.zeros(2, 8, 3)
    tree = torch.tensor([[1, -1, -1]])  # node 0 has two children: 1, then its sibling 2
    with pytest.raises(NotImplementedError, match="eagle-topk 1"):
        causal_conv1d_update_cpu(x, states, torch.randn(8, 4), None, "silu", torch.tensor([0]),
                                 torch.zeros(2, 3, 8, 3), torch.tensor([0]), retrieve_next_token=tree)  # fmt: skip
    assert "topk" in TREES_UNSUPPORTED
