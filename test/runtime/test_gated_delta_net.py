"""The five Gated DeltaNet stand-ins against plain per-sequence, per-token loops.

References here walk every sequence, token and head one at a time, in float64
Python-level steps; the stand-ins are vectorised (and chunked for prefill).
"""

import math
import os

import pytest
import torch

from sglang_evs.runtime.sgl_kernel_mamba import (
    causal_conv1d_fn_cpu,
    causal_conv1d_update_cpu,
    chunk_gated_delta_rule_cpu,
)
from sglang_evs.runtime.torch_ops import define_sgl_kernel_ops

CASES = 50
TOL = {"rtol": 1e-4, "atol": 1e-4}
POOL = 9  # slots in every state pool


@pytest.fixture(scope="module", autouse=True)
def sgl_kernel_ops():
    define_sgl_kernel_ops()


# ---- naive references -------------------------------------------------------


def ref_conv_sequence(xs, weight, bias, history, activation):
    """xs [dim, L], history [dim, S] -> (out [dim, L], new history [dim, S]), one token at a time."""
    dim, width = weight.shape
    state_len = history.shape[1]
    window = [history[:, j].double() for j in range(state_len)]
    out = torch.zeros(dim, xs.shape[1], dtype=torch.float64)
    for t in range(xs.shape[1]):
        window.append(xs[:, t].double())
        for c in range(dim):
            acc = 0.0 if bias is None else float(bias[c])
            for w in range(width):
                acc += float(weight[c, w]) * float(window[len(window) - width + w][c])
            out[c, t] = acc * (1 / (1 + math.exp(-acc))) if activation == "silu" else acc
    return out, torch.stack(window[-state_len:], dim=1)


def ref_delta_rule_sequence(q, k, v, g, beta, state, l2norm):
    """q, k [L, H, K]; v [L, HV, V]; g, beta [L, HV]; state [HV, V, K] -> (out [L, HV, V], final state)."""
    state = state.double().clone()
    heads_v, group = v.shape[1], v.shape[1] // q.shape[1]
    out = torch.zeros(v.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        for hv in range(heads_v):
            qt, kt = q[t, hv // group].double(), k[t, hv // group].double()
            if l2norm:
                qt = qt / math.sqrt(float((qt * qt).sum()) + 1e-6)
                kt = kt / math.sqrt(float((kt * kt).sum()) + 1e-6)
            qt = qt / math.sqrt(q.shape[-1])
            s = state[hv] * math.exp(float(g[t, hv]))  # [V, K]
            delta = float(beta[t, hv]) * (v[t, hv].double() - s @ kt)
            state[hv] = s + torch.outer(delta, kt)
            out[t, hv] = state[hv] @ qt
    return out, state


def ref_softplus(x, threshold=20.0):
    return x if x > threshold else math.log1p(math.exp(x))


# ---- random inputs ----------------------------------------------------------


def random_lengths(gen, max_seqs, max_len):
    n = int(torch.randint(1, max_seqs + 1, (1,), generator=gen))
    lengths = torch.randint(1, max_len + 1, (n,), generator=gen)
    return lengths, torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).int()])


def random_slots(gen, n, allow_padding=True):
    slots = torch.randperm(POOL, generator=gen)[:n].int()
    if allow_padding and n > 1 and torch.rand(1, generator=gen) < 0.3:
        slots[int(torch.randint(0, n, (1,), generator=gen))] = -1
    return slots


def random_qkv(gen, tokens, l2norm):
    heads = int(torch.randint(1, 3, (1,), generator=gen))
    heads_v = heads * int(torch.randint(1, 3, (1,), generator=gen))
    key_dim, value_dim = (int(d) for d in torch.randint(2, 9, (2,), generator=gen))
    q = torch.randn(1, tokens, heads, key_dim, generator=gen)
    k = torch.randn(1, tokens, heads, key_dim, generator=gen)
    if not l2norm:  # keep the delta rule contractive: |k| about 1
        k = k / math.sqrt(key_dim)
    v = torch.randn(1, tokens, heads_v, value_dim, generator=gen)
    pool = torch.randn(POOL, heads_v, value_dim, key_dim, generator=gen)
    return q, k, v, pool


def check_pool(pool_after, pool_before, expected_rows):
    """Rows in expected_rows hold those states; every other row is untouched."""
    for slot in range(POOL):
        want = expected_rows.get(slot, pool_before[slot])
        torch.testing.assert_close(pool_after[slot].double(), want.double(), **TOL)


# ---- the five stand-ins -----------------------------------------------------


def test_causal_conv1d_fn_matches_token_loop():
    gen = torch.Generator().manual_seed(1)
    for case in range(CASES):
        lengths, starts = random_lengths(gen, 4, 9)
        dim, width = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(2, 5, (1,), generator=gen))
        slots = random_slots(gen, len(lengths))
        has_initial = torch.rand(len(lengths), generator=gen) < 0.5
        activation = "silu" if case % 2 else None
        bias = torch.randn(dim, generator=gen) if case % 3 else None
        weight = torch.randn(dim, width, generator=gen)
        x = torch.randn(int(starts[-1]), dim, generator=gen).T  # [dim, T] view, as SGLang passes it
        conv_states = torch.randn(POOL, dim, width - 1, generator=gen)
        before = conv_states.clone()

        out = causal_conv1d_fn_cpu(
            x,
            weight,
            bias,
            activation=activation,
            conv_states=conv_states,
            has_initial_state=has_initial,
            cache_indices=slots,
            query_start_loc=starts,
            seq_lens_cpu=lengths.tolist(),
        )

        expected_rows = {}
        for i, slot in enumerate(slots.tolist()):
            begin, end = int(starts[i]), int(starts[i + 1])
            warm = slot >= 0 and bool(has_initial[i])
            history = before[slot] if warm else torch.zeros(dim, width - 1)
            want, new_history = ref_conv_sequence(x[:, begin:end], weight, bias, history, activation)
            torch.testing.assert_close(out[:, begin:end].double(), want, **TOL)
            if slot >= 0:
                expected_rows[slot] = new_history
        check_pool(conv_states, before, expected_rows)


def test_causal_conv1d_update_matches_token_loop():
    gen = torch.Generator().manual_seed(2)
    for case in range(CASES):
        batch = int(torch.randint(1, 5, (1,), generator=gen))
        steps = 1 if case % 2 else int(torch.randint(1, 4, (1,), generator=gen))
        dim, width = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(2, 5, (1,), generator=gen))
        slots = random_slots(gen, batch)
        activation = "silu" if case % 3 else None
        bias = torch.randn(dim, generator=gen) if case % 4 else None
        weight = torch.randn(dim, width, generator=gen)
        x = torch.randn(batch, dim, generator=gen) if case % 2 else torch.randn(batch, dim, steps, generator=gen)
        conv_states = torch.randn(POOL, dim, width - 1, generator=gen)
        before = conv_states.clone()

        out = causal_conv1d_update_cpu(x, conv_states, weight, bias, activation, conv_state_indices=slots)

        assert out.shape == x.shape
        tokens = x if x.dim() == 3 else x.unsqueeze(-1)
        got = out if out.dim() == 3 else out.unsqueeze(-1)
        expected_rows = {}
        for i, slot in enumerate(slots.tolist()):
            history = before[slot] if slot >= 0 else torch.zeros(dim, width - 1)
            want, new_history = ref_conv_sequence(tokens[i], weight, bias, history, activation)
            torch.testing.assert_close(got[i].double(), want, **TOL)
            if slot >= 0:
                expected_rows[slot] = new_history
        check_pool(conv_states, before, expected_rows)


def test_fused_gdn_gating_matches_scalar_formula():
    gen = torch.Generator().manual_seed(3)
    for _ in range(CASES):
        tokens, heads_v = (int(d) for d in torch.randint(1, 7, (2,), generator=gen))
        A_log = torch.randn(heads_v, generator=gen)
        dt_bias = torch.randn(heads_v, generator=gen)
        a = torch.randn(tokens, heads_v, generator=gen) * 12  # some past the softplus threshold of 20
        b = torch.randn(tokens, heads_v, generator=gen) * 3

        g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(A_log, a, b, dt_bias)

        assert g.shape == beta.shape == (1, tokens, heads_v) and g.dtype == torch.float32
        for t in range(tokens):
            for h in range(heads_v):
                want_g = -math.exp(float(A_log[h])) * ref_softplus(float(a[t, h]) + float(dt_bias[h]))
                assert math.isclose(float(g[0, t, h]), want_g, rel_tol=1e-4, abs_tol=1e-4)
                assert math.isclose(float(beta[0, t, h]), 1 / (1 + math.exp(-float(b[t, h]))), abs_tol=1e-4)


def test_chunk_gated_delta_rule_matches_token_loop():
    gen = torch.Generator().manual_seed(4)
    for case in range(CASES):
        # a few long cases cross the 64-token chunk boundary (and fill h with several chunks)
        lengths, starts = random_lengths(gen, 3, 140 if case % 10 == 0 else 20)
        l2norm = case % 2 == 0
        q, k, v, pool = random_qkv(gen, int(starts[-1]), l2norm)
        if case % 5 == 0:
            pool.zero_()  # fresh requests: the pool slot holds zeros
        heads_v = v.shape[2]
        g = -torch.rand(1, q.shape[1], heads_v, generator=gen) * (3 if case % 3 else 0.1)
        beta = torch.rand(1, q.shape[1], heads_v, generator=gen)
        slots = random_slots(gen, len(lengths))
        before = pool.clone()

        out, final, h = chunk_gated_delta_rule_cpu(
            q=q,
            k=k,
            v=v,
            g=g,
            beta=beta,
            initial_state=pool,
            cu_seqlens=starts,
            head_first=False,
            use_qk_l2norm_in_kernel=l2norm,
            initial_state_indices=slots,
        )

        assert final is pool and out.shape == v.shape
        expected_rows, chunk_states = {}, []
        for i, slot in enumerate(slots.tolist()):
            begin, end = int(starts[i]), int(starts[i + 1])
            state = before[slot] if slot >= 0 else torch.zeros(pool.shape[1:])
            for chunk_begin in range(begin, end, 64):  # h: the state before each 64-token chunk
                chunk_states.append(
                    ref_delta_rule_sequence(*(x[0, begin:chunk_begin] for x in (q, k, v, g, beta)), state, l2norm)[1]
                )
            want, final_state = ref_delta_rule_sequence(*(x[0, begin:end] for x in (q, k, v, g, beta)), state, l2norm)
            torch.testing.assert_close(out[0, begin:end].double(), want, **TOL)
            if slot >= 0:
                expected_rows[slot] = final_state
        check_pool(pool, before, expected_rows)
        torch.testing.assert_close(h[0].double(), torch.stack(chunk_states), **TOL)


def test_fused_sigmoid_gating_delta_rule_update_matches_token_loop():
    gen = torch.Generator().manual_seed(5)
    for case in range(CASES):
        # the decode batch has one token per request; a few cases carry more
        lengths, starts = random_lengths(gen, 5, 1 if case % 4 else 4)
        l2norm = case % 3 != 0
        q, k, v, pool = random_qkv(gen, int(starts[-1]), l2norm)
        heads_v = v.shape[2]
        A_log = torch.randn(heads_v, generator=gen)
        dt_bias = torch.randn(heads_v, generator=gen)
        a = torch.randn(q.shape[1], heads_v, generator=gen) * 3
        b = torch.randn(q.shape[1], heads_v, generator=gen)
        slots = random_slots(gen, len(lengths))
        before = pool.clone()

        out = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log,
            dt_bias=dt_bias,
            q=q,
            k=k,
            v=v,
            a=a,
            b=b,
            initial_state_source=pool,
            initial_state_indices=slots,
            cu_seqlens=starts,
            use_qk_l2norm_in_kernel=l2norm,
            softplus_beta=1.0,
            softplus_threshold=20.0,
        )

        assert out.shape == v.shape
        g = torch.tensor(
            [
                [-math.exp(float(A_log[h])) * ref_softplus(float(a[t, h] + dt_bias[h])) for h in range(heads_v)]
                for t in range(q.shape[1])
            ]
        )
        beta = torch.sigmoid(b.double())
        expected_rows = {}
        for i, slot in enumerate(slots.tolist()):
            begin, end = int(starts[i]), int(starts[i + 1])
            state = before[slot] if slot >= 0 else torch.zeros(pool.shape[1:])
            want, final_state = ref_delta_rule_sequence(
                q[0, begin:end], k[0, begin:end], v[0, begin:end], g[begin:end], beta[begin:end], state, l2norm
            )
            torch.testing.assert_close(out[0, begin:end].double(), want, **TOL)
            if slot >= 0:
                expected_rows[slot] = final_state
        check_pool(pool, before, expected_rows)


def test_speculative_verify_over_a_draft_tree_is_refused_not_miscomputed():
    """Chains verify (against upstream's kernels in test_speculative_kernels.py); trees are refused."""
    pool = torch.zeros(2, 1, 2, 2)
    with pytest.raises(NotImplementedError, match="eagle-topk 1"):
        torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=torch.zeros(1),
            dt_bias=torch.zeros(1),
            q=torch.ones(1, 2, 1, 2),
            k=torch.ones(1, 2, 1, 2),
            v=torch.ones(1, 2, 1, 2),
            a=torch.zeros(2, 1),
            b=torch.zeros(2, 1),
            initial_state_source=pool,
            initial_state_indices=torch.tensor([0], dtype=torch.int32),
            cu_seqlens=torch.tensor([0, 2], dtype=torch.int32),
            use_qk_l2norm_in_kernel=True,
            is_kda=False,
            disable_state_update=True,
            intermediate_states_buffer=torch.zeros(2, 2, 1, 2, 2),
            intermediate_state_indices=torch.tensor([0], dtype=torch.int32),
            cache_steps=2,
            retrieve_parent_token=torch.tensor([[-1, 0]]),
        )
    assert not pool.any()


# ---- wiring into SGLang -----------------------------------------------------


def check_backend_forward() -> None:
    """SGLang's GDNAttnBackend, without a server: extend two prompts, decode one token each,
    against the whole layer (conv, gates, delta rule) run token by token. Needs the CPU engine."""
    from types import SimpleNamespace as NS

    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend, GDNKernelDispatcher
    from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    gen = torch.Generator().manual_seed(0)
    H, HV, K, V, W = 1, 2, 4, 3, 4
    dims = [H * K, H * K, HV * V]
    dim = sum(dims)
    heads = dict(num_q_heads=H, num_k_heads=H, num_v_heads=HV, head_q_dim=K, head_k_dim=K, head_v_dim=V)
    layer = NS(layer_id=0, q_dim=dims[0], k_dim=dims[1], v_dim=dims[2], activation="silu", **heads)
    layer.conv_weights, layer.bias = torch.randn(dim, W, generator=gen), torch.randn(dim, generator=gen)
    layer.A_log, layer.dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    conv, ssm = torch.zeros(4, dim, W - 1), torch.zeros(4, HV, V, K)
    cache = NS(conv=[conv], temporal=ssm, replayssm_d=None, replayssm_k=None, replayssm_g=None)
    backend = GDNAttnBackend.__new__(GDNAttnBackend)  # its __init__ wants a ModelRunner
    backend.kernel_dispatcher = GDNKernelDispatcher(LinearAttnKernelBackend.TRITON, LinearAttnKernelBackend.TRITON)
    backend.mis_metadata = None
    backend.req_to_token_pool = NS(mamba2_layer_cache=lambda layer_id: cache)
    unused = ["retrieve_next_token", "retrieve_next_sibling", "retrieve_parent_token", "conv_block_table"]
    unused += ["state_checkpoint_cu_starts", "num_state_checkpoints", "state_checkpoint_every_n_tokens"]
    unused += ["track_chunk_idx", "replayssm_write_pos", "replayssm_force_flush"]
    slots, prompt = torch.tensor([3, 1], dtype=torch.int32), [5, 3]
    seq_x = [torch.randn(n + 1, dim, generator=gen) for n in prompt]  # prompt tokens, then one decode token
    seq_a = [torch.randn(n + 1, HV, generator=gen) for n in prompt]
    seq_b = [torch.randn(n + 1, HV, generator=gen) for n in prompt]

    def packed(seqs, decode):
        return torch.cat([s[-1:] if decode else s[:-1] for s in seqs])

    backend.forward_metadata = NS(
        query_start_loc=torch.tensor([0, 5, 8], dtype=torch.int32),
        mamba_cache_indices=slots,
        has_mamba_track_mask=False,
        **dict.fromkeys(unused),
    )
    batch = NS(forward_mode=ForwardMode.EXTEND, extend_prefix_lens=torch.zeros(2, dtype=torch.int64))
    batch.extend_seq_lens_cpu, batch.mamba_track_mask, batch.batch_size = prompt, None, 2
    extend_out = backend.forward_extend(layer, batch, *(packed(s, False) for s in (seq_x, seq_a, seq_b)))

    backend.forward_metadata.query_start_loc = torch.tensor([0, 1, 2], dtype=torch.int32)
    batch = NS(forward_mode=ForwardMode.DECODE, mamba_track_mask=None, batch_size=2)
    decode_out = backend.forward_decode(layer, batch, *(packed(s, True) for s in (seq_x, seq_a, seq_b)))

    begin = 0
    for i, n in enumerate(prompt):
        mixed, _ = ref_conv_sequence(seq_x[i].T, layer.conv_weights, layer.bias, torch.zeros(dim, W - 1), "silu")
        q, k, v = mixed.T.float().split(dims, dim=-1)
        g = -layer.A_log.exp() * torch.nn.functional.softplus(seq_a[i] + layer.dt_bias)
        qkv = q.view(-1, H, K), k.view(-1, H, K), v.view(-1, HV, V)
        want, state = ref_delta_rule_sequence(*qkv, g, seq_b[i].sigmoid(), torch.zeros(HV, V, K), True)
        torch.testing.assert_close(extend_out[0, begin : begin + n].double(), want[:n], **TOL)
        torch.testing.assert_close(decode_out[0, i].double(), want[n], **TOL)
        torch.testing.assert_close(ssm[int(slots[i])].double(), state, **TOL)
        begin += n
    print("backend forward ok")


def test_sglang_gdn_backend_resolves_the_stand_ins_on_cpu(cpu_route):
    """A fresh interpreter, as SGLang's scheduler: the GDN modules import, bind our functions,
    and GDNAttnBackend runs an extend and a decode through them."""
    code = f"""
        import torch
        import sglang.srt.layers.attention.linear.gdn_backend as backend
        import sglang.srt.layers.attention.linear.kernels.gdn_triton as kernels
        import sglang.srt.layers.attention.linear.kda_backend as kda
        from sglang_evs.runtime import sgl_kernel_mamba, torch_ops
        assert backend.causal_conv1d_fn is sgl_kernel_mamba.causal_conv1d_fn_cpu
        assert backend.causal_conv1d_update is sgl_kernel_mamba.causal_conv1d_update_cpu
        assert kda.causal_conv1d_update is sgl_kernel_mamba.causal_conv1d_update_cpu
        assert kernels.chunk_gated_delta_rule is sgl_kernel_mamba.chunk_gated_delta_rule_cpu
        g, beta = backend.fused_gdn_gating(torch.zeros(2), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(2))
        assert torch.allclose(g, torch.full((1, 3, 2), -torch.nn.functional.softplus(torch.tensor(0.0)).item()))
        assert torch.equal(beta, torch.full((1, 3, 2), 0.5))
        op = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu
        assert kernels.fused_sigmoid_gating_delta_rule_update is op
        assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
        try:
            from sgl_kernel.mamba import selective_scan_fwd_cpu
        except ImportError:
            print("unknown mamba name -> ImportError")
        print("wired")
        import importlib.util
        spec = importlib.util.spec_from_file_location("test_gated_delta_net", {os.path.abspath(__file__)!r})
        this_module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(this_module)
        this_module.check_backend_forward()
    """
    stdout = cpu_route(code)
    assert "unknown mamba name -> ImportError" in stdout
    assert "wired" in stdout
    assert "backend forward ok" in stdout


# ---- padded graph replays -----------------------------------------------------


@pytest.mark.parametrize("verify", [False, True], ids=["decode", "target_verify"])
def test_conv_update_replays_from_a_graph_whatever_rows_are_padding(verify):
    """SGLang pads a graph's batch with rows whose slot is -1 and replays one capture for any padding: a
    replay with other live rows must roll exactly their states (and windows), the capture having sized
    nothing by which rows were live (the strict `CpuGraph` refuses a boolean-mask write)."""
    from sglang_evs.runtime.cpu_graph import CpuGraph

    gen = torch.Generator().manual_seed(5)
    batch, dim, width, steps = 4, 3, 4, 3 if verify else 1
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    conv_states = torch.randn(POOL, dim, width - 1, generator=gen)
    windows = torch.zeros(POOL, steps, dim, width - 1) if verify else None
    x = torch.randn(batch, dim, steps, generator=gen) if verify else torch.randn(batch, dim, generator=gen)
    slots, rows = torch.tensor([1, 4, 6, -1], dtype=torch.int32), torch.tensor([2, 0, 5, -1], dtype=torch.int32)

    def call(x, conv_states, slots, windows, rows):
        extra = {"intermediate_conv_window": windows, "intermediate_state_indices": rows} if verify else {}
        return causal_conv1d_update_cpu(x, conv_states, weight, bias, "silu", conv_state_indices=slots, **extra)

    graph = CpuGraph()
    with graph:
        out = call(x, conv_states, slots, windows, rows)
    for live_slots, live_rows in (([5, 3, -1, -1], [1, 7, 3, -1]), ([2, 8, 0, 7], [4, -1, 6, 8]), ([-1] * 4, [1] * 4)):
        new_x = torch.randn(x.shape, generator=gen)
        want_states, want_windows = conv_states.clone(), None if windows is None else windows.clone()
        live_slots, live_rows = torch.tensor(live_slots, dtype=torch.int32), torch.tensor(live_rows, dtype=torch.int32)
        want = call(new_x, want_states, live_slots, want_windows, live_rows)
        x.copy_(new_x), slots.copy_(live_slots), rows.copy_(live_rows)
        graph.replay()
        live = live_slots >= 0
        assert torch.equal(out[live], want[live]) and torch.equal(conv_states, want_states)
        assert windows is None or torch.equal(windows, want_windows)
