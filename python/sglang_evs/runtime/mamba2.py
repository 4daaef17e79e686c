"""Mamba2 (NemotronH's SSM layers) in plain torch, for the CPU route.

SGLang's `MambaMixer2` (`sglang.srt.layers.attention.mamba.mamba`) imports its
causal convolution only on CUDA, NPU and XPU, and its chunk scan and decode
step are Triton kernels. `install` binds these stand-ins into that module under
the names it calls, with the call sites' signatures. Conventions, as upstream:

- Prefill batches are packed along the token axis; sequence i owns tokens
  `cu_seqlens[i]:cu_seqlens[i + 1]` (`query_start_loc`).
- States live in pools indexed by a per-sequence slot; a slot equal to
  `pad_slot_id` (-1) is padding: it reads zeros and is never written.
- Conv state `[slots, dim, >= W - 1]`: its first W - 1 columns hold the last
  W - 1 inputs, oldest first (the Triton kernels use only those).
  SSM state `[slots, heads, head_dim, d_state]`.
- Math in float32; outputs in the input dtype, pools keep their dtype.

SSM recurrence per head, with B and C of the head's group:
    dt_t = clamp(softplus(dt_t + dt_bias), *dt_limit)
    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T;   y_t = h_t C_t + D x_t
"""

import math

import torch
import torch.nn.functional as F

from sglang_evs.runtime.gated_delta_net import causal_conv1d_prefill, causal_conv1d_step

PAD_SLOT_ID = -1
SPECULATIVE = "speculative decoding (target verify) of Mamba2 layers is not supported on the CPU route"


def _slots(indices: torch.Tensor | None, count: int, pad_slot_id: int | None) -> torch.Tensor:
    """Per-sequence pool slots, padding mapped to -1 (what the gated_delta_net helpers skip)."""
    slots = torch.arange(count) if indices is None else indices.long().cpu()
    return slots if pad_slot_id is None else slots.masked_fill(slots == pad_slot_id, -1)


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: list[int] | None = None,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: str | bool | None = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    **kwargs,
) -> torch.Tensor:
    """Varlen prefill conv (both upstream entry points; arguments past bias by keyword).

    x [dim, T] (any strides), weight [dim, W], bias [dim] or None,
    conv_states [slots, dim, >= W - 1] or None, query_start_loc [N + 1],
    cache_indices [N] (None: 0..N-1), has_initial_state [N] bool or None.
    Returns [dim, T] in x.dtype, laid out like x. Sequence i starts from
    conv_states[cache_indices[i]] if it has an initial state, else zeros, and
    that state becomes its last W - 1 inputs (zero-padded on the left).
    """
    if kwargs.get("block_table") is not None:
        raise NotImplementedError("causal_conv1d_fn with block_table (CUDA graphs) on the CPU route")
    width = weight.shape[1]
    count = query_start_loc.numel() - 1
    if conv_states is None:
        conv_states, has_initial_state = x.new_zeros(count, x.shape[0], width - 1), None
    starts = query_start_loc.long().cpu()
    slots = _slots(cache_indices, count, pad_slot_id)
    history = conv_states[..., : width - 1]  # a view: the prefill writes through it
    return causal_conv1d_prefill(x, weight, bias, history, starts, slots, has_initial_state, activation)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | bool | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
    num_accept_tokens: torch.Tensor | None = None,
    intermediate_conv_window: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    retrieve_next_token: torch.Tensor | None = None,
    retrieve_next_sibling: torch.Tensor | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    metadata=None,
    validate_data: bool = False,
) -> torch.Tensor:
    """Decode conv: x [B, dim] or [B, dim, L] after each sequence's stored history.

    conv_state [slots, dim, >= W - 1] (rolled in place), weight [dim, W],
    conv_state_indices [B] (None: 0..B-1). Returns x's shape and dtype.
    The speculative arguments (verify windows, trees) raise NotImplementedError.
    """
    speculative = (num_accept_tokens, intermediate_conv_window, retrieve_next_token, retrieve_parent_token)
    if any(arg is not None for arg in speculative):
        raise NotImplementedError(SPECULATIVE)
    if cache_seqlens is not None:
        raise NotImplementedError("causal_conv1d_update with a circular conv state (cache_seqlens)")
    slots = _slots(conv_state_indices, x.shape[0], pad_slot_id)
    return causal_conv1d_step(x, conv_state[..., : weight.shape[1] - 1], weight, bias, activation, slots)


def _time_step(dt: torch.Tensor, dt_bias: torch.Tensor | None, softplus: bool, limit=(0.0, math.inf)) -> torch.Tensor:
    """dt (+ dt_bias), softplus (identity above 20, as upstream), clamped to limit; float32."""
    dt = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
    if softplus:
        dt = F.softplus(dt, threshold=20.0)
    return dt.clamp(limit[0], limit[1])


def _scan_piece(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """L tokens of one sequence at once (the recurrence in closed form), float32.

    state [H, P, N]; x [L, H, P]; dt [L, H]; A [H]; B, C [L, H, N] (per head).
    Returns (y [L, H, P] without the D term, state after the L tokens).
    With G = cumsum(dt A): y_t = exp(G_t) C_t.h0 + sum_{s<=t} exp(G_t - G_s) dt_s (C_t.B_s) x_s.
    """
    steps = x.shape[0]
    cum = (dt * A).T.cumsum(-1)  # [H, L]
    lower = torch.ones(steps, steps, dtype=torch.bool).tril()
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~lower, float("-inf")).exp()  # [H, t, s]
    scores = torch.einsum("thn,shn->hts", C, B) * decay * dt.T.unsqueeze(1)
    y = torch.einsum("hts,shp->thp", scores, x) + torch.einsum("thn,hpn->thp", C, state) * cum.T.exp().unsqueeze(-1)
    to_end = (cum[:, -1:] - cum).exp() * dt.T  # [H, L]
    state = cum[:, -1].exp().view(-1, 1, 1) * state + torch.einsum("hs,shp,shn->hpn", to_end, x, B)
    return y, state


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    chunk_offsets: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    out: torch.Tensor | None = None,
    return_final_states: bool = False,
    return_varlen_states: bool = False,
    return_intermediate_states: bool = False,
    state_dtype: torch.dtype | None = None,
    return_track_states: bool = False,
    track_seq_idx: torch.Tensor | None = None,
    track_end_locs: torch.Tensor | None = None,
):
    """Mamba2 prefill scan, token-exact to the recurrence; writes `out` in place.

    x [batch, T, H, P]; dt [batch, T, H]; A [H]; B, C [batch, T, G, N]; D [H, P]
    or [H]; z like x (output gate y * silu(z)); dt_bias [H]; out like x.
    With return_varlen_states, batch is 1 and cu_seqlens [S + 1] splits it into
    S sequences (initial_states [S, H, P, N]); else each batch row is one
    sequence (initial_states [batch, H, P, N]). seq_idx, chunk_indices and
    chunk_offsets describe the same split for the Triton kernels and are not needed.
    States, in state_dtype (default C.dtype):
    - intermediate [batch, ceil(T / chunk_size), H, P, N]: entry c is the state
      at packed position c * chunk_size of the sequence owning the token before
      it (entry 0: the first sequence's initial state);
    - final [batch, H, P, N]: after the last token; varlen [S, H, P, N]: each
      sequence's state after its last token;
    - track [1, K, H, P, N]: sequence track_seq_idx[k]'s state at packed
      position track_end_locs[k] (None when nothing is tracked).
    Returns what upstream returns for the same flags.
    """
    batch, seqlen, heads, head_dim = x.shape
    groups, dstate = B.shape[2:]
    per_group = heads // groups
    state_dtype = state_dtype or C.dtype
    if not return_varlen_states:
        cu_seqlens = None
    if cu_seqlens is None and seq_idx is not None and int(seq_idx.max()) > 0:
        raise NotImplementedError("mamba_chunk_scan_combined over several sequences needs cu_seqlens")
    if cu_seqlens is not None:
        assert batch == 1, "cu_seqlens needs batch 1"
        bounds = [(0, b, e) for b, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)]
    else:
        bounds = [(row, 0, seqlen) for row in range(batch)]
    tracked: dict[int, list[tuple[int, int]]] = {}  # sequence -> [(end position, track row)]
    if return_track_states and track_seq_idx is not None and track_end_locs is not None and track_end_locs.numel():
        for k, (seq, end) in enumerate(zip(track_seq_idx.tolist(), track_end_locs.tolist(), strict=True)):
            tracked.setdefault(seq, []).append((end, k))

    dt = _time_step(dt, dt_bias, dt_softplus, dt_limit)  # [batch, T, H]
    xf = x.float()
    Bh, Ch = (t.float().repeat_interleave(per_group, dim=2) for t in (B, C))  # [batch, T, H, N]
    Dh = None if D is None else (D.float() if D.dim() == 2 else D.float().unsqueeze(-1).expand(heads, head_dim))
    out = torch.empty_like(x) if out is None else out
    nchunks = -(-seqlen // chunk_size)
    zero = torch.zeros(heads, head_dim, dstate)
    intermediate = torch.zeros(batch, nchunks, heads, head_dim, dstate)
    final = torch.zeros(batch, heads, head_dim, dstate)
    varlen = torch.zeros(len(bounds), heads, head_dim, dstate)
    track = torch.zeros(len(track_end_locs) if tracked else 0, heads, head_dim, dstate)

    for seq, (row, begin, end) in enumerate(bounds):
        state = zero if initial_states is None else initial_states[seq if cu_seqlens is not None else row].float()
        if begin == 0 and nchunks:
            intermediate[row, 0] = state
        cuts = {p for p in range(begin + 1, end + 1) if p % chunk_size == 0} | {end}
        cuts |= {p for p, _ in tracked.get(seq, []) if begin < p <= end}
        at = {begin: state}
        for lo, hi in zip([begin, *sorted(cuts)], sorted(cuts), strict=False):
            if hi > lo:
                span = slice(lo, hi)
                y, state = _scan_piece(state, xf[row, span], dt[row, span], A.float(), Bh[row, span], Ch[row, span])
                if Dh is not None:
                    y = y + xf[row, span] * Dh
                if z is not None:
                    y = y * F.silu(z[row, span].float())
                out[row, span] = y.to(out.dtype)
            at[hi] = state
            if hi % chunk_size == 0 and 0 < hi // chunk_size < nchunks and hi > begin:
                intermediate[row, hi // chunk_size] = state
        varlen[seq] = state
        if end == seqlen and end > begin:
            final[row] = state
        for p, k in tracked.get(seq, []):
            track[k] = at.get(p, zero)

    states, final = intermediate.to(state_dtype), final.to(state_dtype)
    varlen_states = varlen.to(state_dtype) if cu_seqlens is not None else None
    track_states = track.to(state_dtype).unsqueeze(0) if tracked else None
    if return_track_states:
        assert return_varlen_states, "return_track_states requires return_varlen_states (cu_seqlens mode)"
        return states, varlen_states, track_states
    if return_intermediate_states:
        if return_varlen_states:
            return (states, final, varlen_states) if return_final_states else (states, varlen_states)
        return (states, final) if return_final_states else states
    if not return_varlen_states:
        return final if return_final_states else None
    return (final, varlen_states) if return_final_states else varlen_states


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    cache_steps: int | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
) -> None:
    """Decode step(s) of the SSM; writes `out` and (unless disabled) the state pool in place.

    state [slots, H, P, N] (or [slots, P, N]); x, dt, z, out [B, H, P] or
    [B, T, H, P] (or [B, P]); A [H, P, N]; B, C [B, G, N] or [B, T, G, N];
    D, dt_bias [H, P]; state_batch_indices [B] (None: 0..B-1). Padding rows
    start from zeros and leave the pool alone. The speculative buffers raise
    NotImplementedError.
    """
    if intermediate_states_buffer is not None or retrieve_parent_token is not None:
        raise NotImplementedError(SPECULATIVE)

    pool = state if state.dim() == 4 else state.unsqueeze(1)
    x4, dt4, B4, C4, z4, out4 = (_as4(t) for t in (x, dt, B, C, z, out))
    A3 = A if A.dim() == 3 else A.unsqueeze(0)
    D2 = None if D is None else D if D.dim() == 2 else D.unsqueeze(0)
    bias2 = None if dt_bias is None else dt_bias if dt_bias.dim() == 2 else dt_bias.unsqueeze(0)
    batch, steps, heads = x4.shape[:3]
    per_group = heads // B4.shape[2]
    slots = _slots(state_batch_indices, batch, pad_slot_id)
    valid = slots >= 0
    h = pool[slots.clamp(min=0)].float() * valid.view(-1, 1, 1, 1)  # [B, H, P, N]
    for t in range(steps):
        step = _time_step(dt4[:, t], bias2, dt_softplus)  # [B, H, P]
        b_t, c_t = (m[:, t].float().repeat_interleave(per_group, dim=1) for m in (B4, C4))  # [B, H, N]
        xt = x4[:, t].float()
        h = h * (A3.float() * step.unsqueeze(-1)).exp() + (step * xt).unsqueeze(-1) * b_t.unsqueeze(2)
        y = (h * c_t.unsqueeze(2)).sum(-1)
        if D2 is not None:
            y = y + xt * D2.float()
        if z4 is not None:
            y = y * F.silu(z4[:, t].float())
        out4[:, t] = y.to(out4.dtype)
    if not disable_state_update:
        pool[slots[valid]] = h[valid].to(pool.dtype)


def _as4(t: torch.Tensor | None) -> torch.Tensor | None:
    """Upstream's reshaping to [B, T, H, P] (views): [B, dim] -> [B, 1, 1, dim]; [B, H, P] -> [B, 1, H, P]."""
    while t is not None and t.dim() < 4:
        t = t.unsqueeze(1)
    return t


def install(module) -> None:
    """Bind the stand-ins into `sglang.srt.layers.attention.mamba.mamba` under the names it calls."""
    module.causal_conv1d_fn = module.causal_conv1d_fn_triton = causal_conv1d_fn
    module.causal_conv1d_update = module.causal_conv1d_update_triton = causal_conv1d_update
    module.mamba_chunk_scan_combined = mamba_chunk_scan_combined
    module.selective_state_update = selective_state_update
