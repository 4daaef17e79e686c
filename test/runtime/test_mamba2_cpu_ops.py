"""The Mamba2 stand-ins (`runtime/mamba2.py`) against upstream SGLang's own Triton kernels.

The oracle for each stand-in is the Triton kernel SGLang 0.5.23 runs on a GPU for
the same call (`causal_conv1d_triton.causal_conv1d_fn` / `causal_conv1d_update`,
`triton_ops.ssd_combined.mamba_chunk_scan_combined`, `triton_ops.mamba_ssm.
selective_state_update`), executed by Triton's interpreter (`TRITON_INTERPRET=1`,
set before Triton imports, so in a fresh process). The chunk scan's autotuners
would ask for a GPU driver: there they run their first config. Inputs are float32,
shaped and strided as `MambaMixer2.forward` passes them, on varlen batches of 2-3
sequences with and without initial states and with padding slots.
"""

import textwrap

import pytest
import torch

from sglang_evs.runtime import mamba2

ORACLE = textwrap.dedent(
    """
    import contextlib, json
    import torch, triton

    def first_config(configs, key=None, **kwargs):  # the autotuner benchmarks on a GPU
        def wrap(kernel):
            class Launch:
                def __getitem__(self, grid):
                    return lambda *args, **kw: kernel[grid](*args, **kw, **configs[0].kwargs)
            return Launch()
        return wrap

    triton.autotune = first_config
    torch.cpu.device = lambda index=None: contextlib.nullcontext()  # their launchers enter a device context
    import sglang.kernels.ops.mamba.causal_conv1d_triton as conv_triton
    import sglang.kernels.ops.mamba.triton_ops.mamba_ssm as ssm_triton
    from sglang.kernels.ops.mamba.triton_ops.ssd_combined import mamba_chunk_scan_combined
    from sglang.srt.layers.attention.mamba.mamba2_metadata import Mamba2Metadata
    from sglang_evs.runtime import mamba2

    for module in (conv_triton, ssm_triton):
        module.is_arch_support_pdl = lambda: False  # a GPU-architecture query

    def gap(a, b):
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0

    worst = {}
    def record(name, *pairs):
        worst[name] = max([worst.get(name, 0.0)] + [gap(a, b) for a, b in pairs])

    SLOTS, WIDTH = 8, 4
    for case in range(6):
        g = torch.Generator().manual_seed(case)
        n = 2 + case % 2
        lengths = torch.randint(1, 20, (n,), generator=g)
        lengths[0] = (1, 2, 3, 17)[case % 4]  # shorter and longer than the conv history
        starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).int()
        total, dim = int(starts[-1]), 24
        x = torch.randn(total, dim, generator=g).T  # [dim, T], channel-last as MambaMixer2 passes it
        weight, bias = torch.randn(dim, WIDTH, generator=g), (torch.randn(dim, generator=g) if case % 2 else None)
        slots = torch.randperm(SLOTS, generator=g)[:n].int()
        if case % 3 == 2:
            slots[1] = -1  # padding
        warm = torch.rand(n, generator=g) < 0.5 if case % 4 else torch.zeros(n, dtype=torch.bool)
        states = torch.randn(SLOTS, dim, WIDTH - 1, generator=g)
        conv = [states.clone(), states.clone()]
        outs = [fn(x, weight, bias, conv_states=conv[i], has_initial_state=warm, cache_indices=slots,
                   query_start_loc=starts, seq_lens_cpu=lengths.tolist(), activation="silu")
                for i, fn in enumerate((conv_triton.causal_conv1d_fn, mamba2.causal_conv1d_fn))]
        real = torch.cat([torch.full((int(k),), bool(s >= 0)) for k, s in zip(lengths, slots)])
        record("conv_fn", (outs[0][:, real], outs[1][:, real]), (conv[0], conv[1]))

        batch = 2 + case % 3
        xd = torch.randn(batch, 2 * dim, generator=g)[:, ::2]  # a strided slice, as the decode split
        ids = torch.randperm(SLOTS, generator=g)[:batch].int()
        if case % 3 == 1:
            ids[-1] = -1
        conv = [states.clone(), states.clone()]
        outs = [fn(xd, conv[i], weight, bias, "silu", conv_state_indices=ids)
                for i, fn in enumerate((conv_triton.causal_conv1d_update, mamba2.causal_conv1d_update))]
        record("conv_update", (outs[0][ids >= 0], outs[1][ids >= 0]), (conv[0], conv[1]))

        # SSM: H heads of P dims in G groups, N states
        H, P, G, N, chunk = 4, 8, 2, 16, 8
        ssm_pool = torch.randn(SLOTS, H, P, N, generator=g) * 0.3
        A, D, dt_bias = -torch.rand(H, generator=g) - 0.2, torch.randn(H, generator=g), torch.randn(H, generator=g)
        xs, dts = torch.randn(1, total, H, P, generator=g), torch.randn(1, total, H, generator=g)
        Bs, Cs = torch.randn(1, total, G, N, generator=g), torch.randn(1, total, G, N, generator=g)
        seq_idx = torch.repeat_interleave(torch.arange(n, dtype=torch.int32), lengths).unsqueeze(0)
        warm = torch.rand(n, generator=g) < 0.6
        initial = None
        chunk_indices = chunk_offsets = None
        if case % 2:  # as MambaMixer2: zeros where a sequence has no prefix
            initial = torch.where(warm[:, None, None, None], ssm_pool[torch.arange(n)], 0)
            chunk_indices, chunk_offsets = Mamba2Metadata._query_start_loc_to_chunk_indices_offsets(
                starts, chunk, total)
        track_seq = torch.arange(n, dtype=torch.int32)[: 1 + case % n]
        track_end = torch.stack([starts[int(s)] + torch.randint(1, int(lengths[int(s)]) + 1, (1,), generator=g)[0]
                                 for s in track_seq]).int()
        res, outs = [], [torch.zeros_like(xs), torch.zeros_like(xs)]
        for i, fn in enumerate((mamba_chunk_scan_combined, mamba2.mamba_chunk_scan_combined)):
            res.append(fn(xs, dts, A, Bs, Cs, chunk_size=chunk, D=D, z=None, dt_bias=dt_bias, seq_idx=seq_idx,
                          chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, cu_seqlens=starts,
                          initial_states=initial, return_varlen_states=True, return_final_states=False,
                          return_track_states=True, track_seq_idx=track_seq, track_end_locs=track_end,
                          dt_softplus=True, dt_limit=(0.0, float("inf")), out=outs[i], state_dtype=torch.float32))
        record("scan_out", (outs[0], outs[1]))
        record("scan_varlen_states", (res[0][1], res[1][1]))
        record("scan_chunk_states", (res[0][0], res[1][0]))
        record("scan_track_states", (res[0][2], res[1][2]))
        # a second run of the same batch in two prefill pieces, the state carried, equals one
        cut = [int(k) // 2 for k in lengths]
        ssm_pieces, out_pieces = torch.zeros(n, H, P, N), []
        for half in range(2):
            ranges = [(int(starts[i]) + (cut[i] if half else 0), int(starts[i]) + (int(lengths[i]) if half else cut[i]))
                      for i in range(n)]
            index = torch.cat([torch.arange(b, e) for b, e in ranges])
            piece_starts = torch.tensor([0] + [e - b for b, e in ranges]).cumsum(0).int()
            init = ssm_pieces.clone() if half else initial
            piece_out = torch.zeros(1, len(index), H, P)
            _, ssm_pieces, _ = mamba2.mamba_chunk_scan_combined(
                xs[:, index], dts[:, index], A, Bs[:, index], Cs[:, index], chunk_size=chunk, D=D, dt_bias=dt_bias,
                cu_seqlens=piece_starts, initial_states=init, return_varlen_states=True, return_track_states=True,
                dt_softplus=True, out=piece_out, state_dtype=torch.float32)
            out_pieces.append((index, piece_out))
        joined = torch.zeros_like(xs)
        for index, piece_out in out_pieces:
            joined[:, index] = piece_out
        record("scan_two_pieces", (joined, outs[1]), (ssm_pieces, res[1][1]))

        # decode step, shaped as MambaMixer2 passes it (A, dt, dt_bias, D expanded over head_dim)
        B_d, C_d = torch.randn(batch, G * N, generator=g), torch.randn(batch, G * N, generator=g)
        x_d, dt_d = torch.randn(batch, H, P, generator=g), torch.randn(batch, H, generator=g)
        args = (x_d, dt_d[:, :, None].expand(-1, -1, P), A[:, None, None].expand(-1, P, N),
                B_d.view(batch, G, N), C_d.view(batch, G, N), D[:, None].expand(-1, P))
        pools, outs = [ssm_pool.clone(), ssm_pool.clone()], [torch.zeros(batch, H, P), torch.zeros(batch, H, P)]
        for i, fn in enumerate((ssm_triton.selective_state_update, mamba2.selective_state_update)):
            fn(pools[i], *args, z=None, dt_bias=dt_bias[:, None].expand(-1, P), dt_softplus=True,
               state_batch_indices=ids, out=outs[i])
        record("ssm_update", (outs[0][ids >= 0], outs[1][ids >= 0]), (pools[0], pools[1]))
        # untied head_dim, a z gate and two tokens per sequence without a state write
        full = [torch.randn(batch, 2, H, P, generator=g) for _ in range(3)]
        BC = [torch.randn(batch, 2, G, N, generator=g) for _ in range(2)]
        A_full = -torch.rand(H, P, N, generator=g)
        D_full, bias_full = torch.randn(H, P, generator=g), torch.randn(H, P, generator=g)
        pools, outs = [ssm_pool.clone(), ssm_pool.clone()], [torch.zeros(batch, 2, H, P), torch.zeros(batch, 2, H, P)]
        for i, fn in enumerate((ssm_triton.selective_state_update, mamba2.selective_state_update)):
            fn(pools[i], full[0], full[1], A_full, BC[0], BC[1], D_full, z=full[2], dt_bias=bias_full,
               dt_softplus=True, state_batch_indices=ids, out=outs[i], disable_state_update=True)
        record("ssm_update_multi_token", (outs[0][ids >= 0], outs[1][ids >= 0]), (pools[0], pools[1]))
    print("RESULT " + json.dumps(worst))
    """
)


@pytest.fixture(scope="module")
def gaps_to_upstream(triton_interpreter) -> dict:
    return triton_interpreter(ORACLE)


@pytest.mark.parametrize("name", ["conv_fn", "conv_update"])
def test_causal_conv_matches_upstream_triton(gaps_to_upstream, name):
    assert gaps_to_upstream[name] < 1e-5  # outputs and the conv states written


@pytest.mark.parametrize("name", ["scan_out", "scan_varlen_states", "scan_chunk_states", "scan_track_states"])
def test_chunk_scan_matches_upstream_triton(gaps_to_upstream, name):
    # float32; the Triton scan goes through per-chunk states and sums in another order
    assert gaps_to_upstream[name] < 1e-4


def test_chunked_prefill_continuation_equals_one_pass(gaps_to_upstream):
    assert gaps_to_upstream["scan_two_pieces"] < 1e-4


@pytest.mark.parametrize("name", ["ssm_update", "ssm_update_multi_token"])
def test_selective_state_update_matches_upstream_triton(gaps_to_upstream, name):
    assert gaps_to_upstream[name] < 1e-5


def test_conv_prefill_in_two_pieces_equals_one():
    """The conv state written by a first prefill piece continues the second exactly."""
    g = torch.Generator().manual_seed(0)
    dim, width, lengths = 6, 4, [5, 9, 2]
    weight, bias = torch.randn(dim, width, generator=g), torch.randn(dim, generator=g)
    seqs = [torch.randn(dim, k, generator=g) for k in lengths]
    slots = torch.tensor([3, 0, 5], dtype=torch.int32)

    def run(pieces, states, warm):
        x = torch.cat(pieces, dim=1)
        starts = torch.tensor([0] + [p.shape[1] for p in pieces]).cumsum(0).int()
        return mamba2.causal_conv1d_fn(x, weight, bias, conv_states=states, query_start_loc=starts,
                                       cache_indices=slots, has_initial_state=warm)  # fmt: skip

    whole_states, split_states = torch.zeros(6, dim, width - 1), torch.zeros(6, dim, width - 1)
    whole = run(seqs, whole_states, torch.zeros(3, dtype=torch.bool))
    cold, warm = torch.zeros(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool)
    first = run([s[:, : k // 2] for s, k in zip(seqs, lengths, strict=True)], split_states, cold)
    second = run([s[:, k // 2 :] for s, k in zip(seqs, lengths, strict=True)], split_states, warm)
    a = b = 0  # token offsets into the first and second piece batches
    for k in lengths:
        half = k // 2
        torch.testing.assert_close(first[:, a : a + half], whole[:, a + b : a + b + half])
        torch.testing.assert_close(second[:, b : b + k - half], whole[:, a + b + half : a + b + k])
        a, b = a + half, b + k - half
    torch.testing.assert_close(split_states, whole_states)


def test_speculative_verify_is_refused_by_name():
    state = torch.zeros(2, 3, 4)
    with pytest.raises(NotImplementedError, match="speculative"):
        mamba2.causal_conv1d_update(torch.zeros(1, 3, 2), state, torch.zeros(3, 4), intermediate_conv_window=state)
    with pytest.raises(NotImplementedError, match="speculative"):
        mamba2.selective_state_update(
            torch.zeros(1, 1, 2, 2), *[torch.zeros(1, 1, 2)] * 3, *[torch.zeros(1, 1, 2)] * 2,
            intermediate_states_buffer=torch.zeros(1),
        )  # fmt: skip


def test_mamba_mixer_module_gets_the_stand_ins_on_cpu(cpu_route):
    """A fresh interpreter, as SGLang's scheduler: importing MambaMixer2's module binds every kernel name."""
    code = """
        import sglang.srt.layers.attention.mamba.mamba as mixer
        from sglang_evs.runtime import mamba2
        assert mixer.causal_conv1d_fn is mixer.causal_conv1d_fn_triton is mamba2.causal_conv1d_fn
        assert mixer.causal_conv1d_update is mixer.causal_conv1d_update_triton is mamba2.causal_conv1d_update
        assert mixer.mamba_chunk_scan_combined is mamba2.mamba_chunk_scan_combined
        assert mixer.selective_state_update is mamba2.selective_state_update
        print("wired")
    """
    stdout = cpu_route(code)
    assert "wired" in stdout
