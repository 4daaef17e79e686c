"""Stand-in for `sgl_kernel.mamba` on CPU (imported under that name).

SGLang 0.5.23 imports these three from layers/attention/linear/gdn_backend.py,
kernels/gdn_triton.py and kda_backend.py and passes the argument names used
here; the two GDN torch ops are in `torch_ops.py`. Speculative target-verify
runs for chain drafts (`--speculative-eagle-topk 1`); draft trees raise
NotImplementedError. Any other name raises ImportError (through AttributeError).
"""

import torch

from sglang_evs.runtime import gated_delta_net as gdn

TREES_UNSUPPORTED = (
    "speculative target-verify over draft trees (--speculative-eagle-topk > 1) is not supported by "
    "sglang-evs' CPU Gated DeltaNet kernels; use --speculative-eagle-topk 1"
)


def require_chain(next_token: torch.Tensor | None, parent_token: torch.Tensor | None) -> None:
    """Draft tokens of a chain: each one's next is the one after it (or no tree given at all)."""
    if parent_token is not None:
        raise NotImplementedError(TREES_UNSUPPORTED)
    if next_token is None:
        return
    steps = next_token.shape[-1]
    chain = torch.arange(1, steps + 1)
    chain[-1] = -1
    if not bool((next_token.reshape(-1, steps).long() == chain).all()):
        raise NotImplementedError(TREES_UNSUPPORTED)


def causal_conv1d_fn_cpu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | bool | None,
    conv_states: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    cache_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: list[int] | None = None,
) -> torch.Tensor:
    """Prefill conv. x [dim, T] (packed), weight [dim, W], conv_states [slots, dim, W-1]
    updated in place at cache_indices [N]; query_start_loc [N + 1]. Returns [dim, T]."""
    return gdn.causal_conv1d_prefill(
        x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state, activation
    )


def causal_conv1d_update_cpu(
    x: torch.Tensor,
    conv_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | bool | None = None,
    conv_state_indices: torch.Tensor | None = None,
    intermediate_conv_window: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    retrieve_next_token: torch.Tensor | None = None,
    retrieve_next_sibling: torch.Tensor | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode conv. x [B, dim] or [B, dim, L]; conv_states [slots, dim, W-1] rolled in
    place at conv_state_indices [B]. Returns x's shape. Target verify (x [B, dim, L]) also
    records each draft token's window in intermediate_conv_window [rows, steps, dim, W-1]
    at intermediate_state_indices [B]."""
    if intermediate_conv_window is None:
        return gdn.causal_conv1d_step(x, conv_states, weight, bias, activation, conv_state_indices)
    require_chain(retrieve_next_token, retrieve_parent_token)
    windows, rows = intermediate_conv_window, intermediate_state_indices
    return gdn.causal_conv1d_verify(x, conv_states, weight, bias, activation, conv_state_indices, windows, rows)


def chunk_gated_delta_rule_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    initial_state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill delta rule. q, k [1, T, H, K]; v [1, T, HV, V]; g, beta [1, T, HV];
    initial_state: the pool [slots, HV, V, K], read and updated in place at
    initial_state_indices [N] (None: slots 0..N-1); cu_seqlens [N + 1].
    Returns (out [1, T, HV, V], the pool, per-64-token-chunk states h [1, chunks, HV, V, K])."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu: head_first layout")
    if initial_state_indices is None:
        initial_state_indices = torch.arange(cu_seqlens.numel() - 1)
    out, h = gdn.gated_delta_rule(
        q, k, v, g, beta, initial_state, initial_state_indices, cu_seqlens, use_qk_l2norm_in_kernel
    )
    return out, initial_state, h
