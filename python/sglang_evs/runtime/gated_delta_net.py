"""Gated DeltaNet (Qwen3.5 linear attention) in plain torch, for the CPU route.

Pure functions over SGLang's state pools; the `sgl_kernel` adapters live in
`sgl_kernel_mamba.py` and `torch_ops.py`. Conventions, as in SGLang 0.5.23:

- Variable-length batches are packed along the token axis; sequence i owns
  tokens `starts[i]:starts[i + 1]` (`query_start_loc` / `cu_seqlens`).
- States live in pools indexed by a per-sequence slot; a negative slot is
  padding: that sequence starts from zeros and its state is not written back.
- Conv state: `[slots, dim, state_len]`, the last `state_len` inputs, oldest
  first. Recurrent state: `[slots, HV, V, K]` (value rows, key columns).
- Math in float32; outputs in the input dtype, pools keep their dtype.

Recurrence per value head, with k and q of the key head it shares (GQA):
    S_t = exp(g_t) S_{t-1} + beta_t (v_t - exp(g_t) S_{t-1} k_t) k_t^T
    o_t = S_t q_t
"""

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6  # as SGLang's kernels: x / sqrt(sum(x^2) + eps)


def _activate(y: torch.Tensor, activation: str | bool | None) -> torch.Tensor:
    if activation in ("silu", "swish", True):
        return F.silu(y)
    if activation in (None, False):
        return y
    raise ValueError(f"unsupported conv activation {activation!r}")


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    starts: torch.Tensor,
    slots: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    activation: str | bool | None,
) -> torch.Tensor:
    """Depthwise causal conv over packed sequences; updates conv_states in place.

    x [dim, T], weight [dim, W], bias [dim] or None, conv_states [slots, dim, S]
    (S >= W - 1), starts [N + 1], slots [N], has_initial_state [N] bool or None
    (None: no sequence has one). Returns [dim, T] in x.dtype. Sequence i's
    history is conv_states[slots[i]] if it has an initial state, else zeros.
    """
    dim, width = weight.shape
    state_len = conv_states.shape[-1]
    out = torch.empty_like(x)
    bounds = starts.tolist()
    for i, slot in enumerate(slots.tolist()):
        begin, end = bounds[i], bounds[i + 1]
        if end <= begin:
            continue
        warm = slot >= 0 and has_initial_state is not None and bool(has_initial_state[i])
        history = conv_states[slot].float() if warm else x.new_zeros(dim, state_len, dtype=torch.float32)
        full = torch.cat([history, x[:, begin:end].float()], dim=1)
        window = full[:, state_len - (width - 1) :].unsqueeze(0)
        y = F.conv1d(window, weight.float().unsqueeze(1), None if bias is None else bias.float(), groups=dim)
        out[:, begin:end] = _activate(y[0], activation).to(x.dtype)
        if slot >= 0:
            conv_states[slot] = full[:, -state_len:].to(conv_states.dtype)
    return out


def causal_conv1d_step(
    x: torch.Tensor,
    conv_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | bool | None,
    slots: torch.Tensor | None,
) -> torch.Tensor:
    """Decode conv: L new tokens per sequence after its stored history.

    x [B, dim] or [B, dim, L], conv_states [slots, dim, S] (S >= W - 1),
    weight [dim, W], slots [B] or None (= 0..B-1). Returns x's shape and
    dtype; conv_states[slots[b]] becomes the last S inputs (padding slots < 0
    read zeros and are not written).
    """
    tokens = x if x.dim() == 3 else x.unsqueeze(-1)
    batch, _, steps = tokens.shape
    width = weight.shape[1]
    state_len = conv_states.shape[-1]
    if slots is None:
        slots = torch.arange(batch)
    slots = slots.long()
    valid = slots >= 0
    history = conv_states[slots.clamp(min=0)].float() * valid.view(-1, 1, 1)
    full = torch.cat([history, tokens.float()], dim=2)  # [B, dim, S + L]
    windows = full[:, :, state_len - (width - 1) :].unfold(2, width, 1)  # [B, dim, L, W]
    y = (windows * weight.float().unsqueeze(1)).sum(-1)
    if bias is not None:
        y = y + bias.float().unsqueeze(-1)
    write_rows(conv_states, slots, full[:, :, -state_len:].to(conv_states.dtype))
    y = _activate(y, activation).to(x.dtype)
    return y if x.dim() == 3 else y.squeeze(-1)


def write_rows(pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """pool[slots[b]] = rows[b] for each b with slots[b] >= 0, in shapes that never depend on the data (a
    graph captured with some padding slots replays with others, and a GPU capture cannot size by a mask).
    A padding row writes what the first live row writes, to its slot (none live: slot 0's own value back
    to slot 0), so repeated indices carry equal values and any write order gives the same pool."""
    slots = slots.long()
    valid = slots >= 0
    anchor = valid.int().argmax().view(1)  # the first live row (0 if none is); a [1] index, never a Python int
    anchor_slot = slots.index_select(0, anchor).clamp(min=0)
    ones = [1] * (rows.dim() - 1)
    anchor_row = torch.where(
        valid.index_select(0, anchor).view(1, *ones), rows.index_select(0, anchor), pool.index_select(0, anchor_slot)
    )
    pool[torch.where(valid, slots, anchor_slot)] = torch.where(valid.view(-1, *ones), rows, anchor_row)


def gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log decay g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b).

    A_log, dt_bias [HV]; a, b [T, HV]. Returns g [1, T, HV] float32 and
    beta [1, T, HV] in b.dtype.
    """
    dt = F.softplus(a.float() + dt_bias.float(), beta=softplus_beta, threshold=softplus_threshold)
    g = -A_log.float().exp() * dt
    return g.unsqueeze(0), b.float().sigmoid().to(b.dtype).unsqueeze(0)


def _l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _delta_rule_chunk(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply C tokens at once (the recurrence solved in closed form).

    state [HV, V, K]; q, k [HV, C, K]; v [HV, C, V]; g, beta [HV, C]; all
    float32. Returns (outputs [HV, C, V], state after the C tokens).
    With G = cumsum(g) and D[t, s] = exp(G_t - G_s), the per-token corrections
    u_t = beta_t (v_t - exp(g_t) S_{t-1} k_t) solve the unit lower-triangular
    system (I + A) U = beta (V - exp(G) K S0^T), A[t, s<t] = beta_t D[t, s] k_t.k_s;
    then S_t = exp(G_t) S0 + sum_{s<=t} D[t, s] u_s k_s^T.
    """
    steps = g.shape[1]
    cum = g.cumsum(-1)
    lower = torch.ones(steps, steps, dtype=torch.bool).tril()
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~lower, float("-inf")).exp()  # [HV, C, C]
    beta_col = beta.unsqueeze(-1)
    coupling = (beta_col * decay * (k @ k.transpose(-1, -2))).tril(-1)
    eye = torch.eye(steps).expand_as(coupling)
    rhs = beta_col * (v - cum.exp().unsqueeze(-1) * (k @ state.transpose(-1, -2)))
    u = torch.linalg.solve_triangular(eye + coupling, rhs, upper=False, unitriangular=True)  # [HV, C, V]
    out = cum.exp().unsqueeze(-1) * (q @ state.transpose(-1, -2)) + (decay * (q @ k.transpose(-1, -2))) @ u
    to_end = (cum[:, -1:] - cum).exp().unsqueeze(-1)  # [HV, C, 1]
    new_state = cum[:, -1].exp().view(-1, 1, 1) * state + (u * to_end).transpose(-1, -2) @ k
    return out, new_state


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    use_qk_l2norm: bool,
    scale: float | None = None,
    chunk_size: int = 64,
    write_back: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule over packed sequences, reading and updating a state pool.

    q, k [1, T, H, K]; v [1, T, HV, V] (HV a multiple of H); g, beta [1, T, HV]
    (g: log decay); state_pool [slots, HV, V, K]; slots [N]; starts [N + 1].
    scale defaults to K ** -0.5 (applied to q after the optional L2 norm).
    Returns (out [1, T, HV, V] in v.dtype, h [1, sum_i ceil(len_i / chunk_size),
    HV, V, K]: each sequence's state before each of its chunk_size-token chunks,
    in state_pool.dtype). With write_back, state_pool[slots[i]] ends as the
    state after sequence i (padding slots < 0: zero start, never written).
    """
    heads, key_dim = q.shape[2], q.shape[3]
    group = v.shape[2] // heads
    scale = key_dim**-0.5 if scale is None else scale
    q, k = q[0].float(), k[0].float()
    if use_qk_l2norm:
        q, k = _l2_normalize(q), _l2_normalize(k)
    q = (q * scale).repeat_interleave(group, dim=1).transpose(0, 1)  # [HV, T, K]
    k = k.repeat_interleave(group, dim=1).transpose(0, 1)
    v_h, g_h, beta_h = v[0].float().transpose(0, 1), g[0].float().T, beta[0].float().T
    out = torch.empty(v.shape[1:], dtype=torch.float32).transpose(0, 1)  # [HV, T, V] view
    snapshots = []
    bounds = starts.tolist()
    for i, slot in enumerate(slots.tolist()):
        state = state_pool[slot].to(torch.float32, copy=True) if slot >= 0 else torch.zeros(state_pool.shape[1:])
        for begin in range(bounds[i], bounds[i + 1], chunk_size):
            snapshots.append(state)
            span = slice(begin, min(begin + chunk_size, bounds[i + 1]))
            out[:, span], state = _delta_rule_chunk(
                state, q[:, span], k[:, span], v_h[:, span], g_h[:, span], beta_h[:, span]
            )
        if write_back and slot >= 0:
            state_pool[slot] = state.to(state_pool.dtype)
    h = torch.stack(snapshots) if snapshots else state_pool.new_zeros((0, *state_pool.shape[1:]))
    return out.transpose(0, 1).unsqueeze(0).to(v.dtype), h.unsqueeze(0).to(state_pool.dtype)


def sigmoid_gated_delta_rule_update(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    use_qk_l2norm: bool,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> torch.Tensor:
    """Decode: gates from raw a, b, then the gated delta rule; updates state_pool in place.

    q, k [1, T, H, K]; v [1, T, HV, V]; a, b [T, HV]; A_log, dt_bias [HV];
    state_pool [slots, HV, V, K]; slots [N]; starts [N + 1]. Returns [1, T, HV, V].
    """
    heads_v = v.shape[2]
    g, beta = gdn_gating(
        A_log, a.reshape(-1, heads_v), b.reshape(-1, heads_v), dt_bias, softplus_beta, softplus_threshold
    )
    if starts.numel() - 1 == q.shape[1] and bool((starts.diff() == 1).all()):
        return _one_token_each(q, k, v, g, beta, state_pool, slots, use_qk_l2norm)
    out, _ = gated_delta_rule(q, k, v, g, beta, state_pool, slots, starts, use_qk_l2norm)
    return out


def _one_token_each(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    use_qk_l2norm: bool,
) -> torch.Tensor:
    """The usual decode batch, one token per sequence, all sequences at once (shapes as above, N == T)."""
    q, k = _per_value_head(q, k, v.shape[2], use_qk_l2norm)  # [N, HV, K]
    slots = slots.long()
    valid = slots >= 0
    state = state_pool[slots.clamp(min=0)].float() * valid.view(-1, 1, 1, 1)  # [N, HV, V, K]
    out, state = _delta_rule_step(state, q, k, v[0], g[0], beta[0])
    state_pool[slots[valid]] = state[valid].to(state_pool.dtype)
    return out.unsqueeze(0).to(v.dtype)


def _per_value_head(q: torch.Tensor, k: torch.Tensor, heads_v: int, use_qk_l2norm: bool):
    """q, k [1, T, H, K] -> float32 [T, HV, K] each, repeated per value head (GQA); q scaled by
    K ** -0.5 after the optional L2 norm."""
    group = heads_v // q.shape[2]
    q, k = q[0].float(), k[0].float()
    if use_qk_l2norm:
        q, k = _l2_normalize(q), _l2_normalize(k)
    return (q * q.shape[-1] ** -0.5).repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)


def _delta_rule_step(state, q, k, v, g, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: state [..., HV, V, K]; q, k [..., HV, K]; v [..., HV, V]; g, beta [..., HV].
    Returns (output [..., HV, V], the state after the token), float32."""
    state = state * g.exp()[..., None, None]
    correction = beta.float()[..., None] * (v.float() - (state @ k.unsqueeze(-1)).squeeze(-1))
    state = state + correction.unsqueeze(-1) * k.unsqueeze(-2)
    return (state @ q.unsqueeze(-1)).squeeze(-1), state


def causal_conv1d_verify(
    x: torch.Tensor,
    conv_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | bool | None,
    slots: torch.Tensor | None,
    windows: torch.Tensor,
    window_rows: torch.Tensor,
) -> torch.Tensor:
    """Speculative target-verify conv over a chain of L draft tokens per sequence.

    As `causal_conv1d_step` (x [B, dim, L], conv_states rolled in place), and
    windows[window_rows[b], t] [dim, W-1] becomes the last W-1 inputs through
    draft token t: the conv state to commit if t is the last accepted token.
    windows [rows, steps, dim, W-1]; window_rows [B] (< 0: not recorded).
    Returns a tensor with x's shape, dtype and strides.
    """
    batch, _, steps = x.shape
    width = weight.shape[1]
    state_len = conv_states.shape[-1]
    slot_ids = torch.arange(batch) if slots is None else slots.long()
    valid = slot_ids >= 0
    history = conv_states[slot_ids.clamp(min=0)].float() * valid.view(-1, 1, 1)
    full = torch.cat([history, x.float()], dim=2)  # [B, dim, S + L]
    through_token = full[:, :, state_len + 1 - (width - 1) :].unfold(2, width - 1, 1)  # [B, dim, L, W-1]
    # all windows in one write: SGLang's CPU windows are dense (it overlaps them in memory on CUDA only)
    recorded = torch.where(valid & (window_rows >= 0), window_rows.long(), -1)
    write_rows(windows[:, :steps], recorded, through_token.transpose(1, 2).to(windows.dtype))  # [B, L, dim, W-1]
    y = causal_conv1d_step(x, conv_states, weight, bias, activation, slots)
    # SGLang's caller reshapes the result through x's memory layout (a transposed view)
    return torch.empty_like(x).copy_(y)


def sigmoid_gated_delta_rule_verify(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    use_qk_l2norm: bool,
    softplus_beta: float,
    softplus_threshold: float,
    write_back: bool,
    step_states: torch.Tensor | None,
    step_rows: torch.Tensor | None,
) -> torch.Tensor:
    """Speculative target-verify: a chain of draft tokens per sequence, token by token.

    Shapes as `sigmoid_gated_delta_rule_update`. step_states [rows, steps, HV, V, K]
    gets, at row step_rows[i], the state after each of sequence i's tokens (the
    state to commit if that token is the last accepted one); with write_back
    false the pool is left unchanged. Returns [1, T, HV, V].
    """
    heads_v = v.shape[2]
    g, beta = gdn_gating(
        A_log, a.reshape(-1, heads_v), b.reshape(-1, heads_v), dt_bias, softplus_beta, softplus_threshold
    )
    qf, kf = _per_value_head(q, k, heads_v, use_qk_l2norm)  # [T, HV, K]
    out = torch.empty(v.shape, dtype=v.dtype)
    bounds = starts.tolist()
    for i, slot in enumerate(slots.tolist()):
        state = state_pool[slot].float() if slot >= 0 else torch.zeros(state_pool.shape[1:])
        row = -1 if step_states is None else int(step_rows[i])
        for step, t in enumerate(range(bounds[i], bounds[i + 1])):
            token_out, state = _delta_rule_step(state, qf[t], kf[t], v[0, t], g[0, t], beta[0, t])
            out[0, t] = token_out.to(v.dtype)
            if row >= 0:
                step_states[row, step] = state.to(step_states.dtype)
        if write_back and slot >= 0:
            state_pool[slot] = state.to(state_pool.dtype)
    return out
