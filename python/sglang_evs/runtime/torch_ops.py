"""Torch op registrations that SGLang and torchvision expect to exist on CPU."""

import torch

from sglang_evs.runtime import gated_delta_net as gdn
from sglang_evs.runtime.sgl_kernel_mamba import require_chain

_libraries: list[torch.library.Library] = []  # keep alive: dropping one unregisters its ops

# Looked up at import by sglang/srt/models/qwen3_5.py on CPU and called by its layers
# (schemas from those call sites). `convert_weight_packed` is deliberately absent: its
# presence switches SGLang to Intel AMX kernels.
QWEN3_5_CPU_OPS = (
    "fused_sigmoid_mul_cpu(Tensor(a!) x, Tensor gate) -> ()",
    (
        "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, "
        "int head_dim) -> (Tensor, Tensor)"
    ),
    (
        "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, "
        "float eps, int head_dim, int num_heads) -> (Tensor, Tensor, Tensor)"
    ),
    (
        "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk, "
        "int num_heads_v, int head_qk, int head_v) -> (Tensor, Tensor, Tensor, Tensor)"
    ),
    # Gated DeltaNet's output norm (kernels/ops/attention/fla/layernorm_gated.py, see import_fixes)
    "fused_rmsnorm_gated_cpu(Tensor x, Tensor weight, Tensor? z, float eps) -> Tensor",
)


def fused_sigmoid_mul_cpu(x: torch.Tensor, gate: torch.Tensor) -> None:
    """x [T, H*D] *= sigmoid(gate) in place; gate [T, H*D] or [T, H, D] (a strided view)."""
    x.copy_(x.float() * torch.sigmoid(gate.reshape(x.shape).float()))


def rms_normalised(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Rows of x [..., D] divided by their root mean square (plus eps), in float32 [..., D]."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Rows of x [..., D] normalised in float32 and scaled by (1 + weight [D]), as Qwen3.5's q/k norms and
    Gemma's RMS norm (also the GPU route's `sgl_kernel.gemma_rmsnorm`); x's dtype."""
    return (rms_normalised(x, eps) * (1.0 + weight.float())).to(x.dtype)


def fused_qk_gemma_rmsnorm_cpu(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H*D], k [T, KH*D] (views allowed) -> per-head normalised [T*H, D], [T*KH, D], contiguous."""
    return (
        gemma_rms_norm(q.reshape(-1, head_dim), q_weight, eps).contiguous(),
        gemma_rms_norm(k.reshape(-1, head_dim), k_weight, eps).contiguous(),
    )


def fused_qk_gemma_rmsnorm_with_gate_cpu(
    q_gate: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    head_dim: int,
    num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q_gate [T, H*2D] interleaved per head [q_h | gate_h], k [T, KH*D] -> normalised q [T*H, D],
    normalised k [T*KH, D] and the gate [T*H, D], all contiguous."""
    per_head = q_gate.reshape(q_gate.shape[0], num_heads, 2 * head_dim)
    q, gate = per_head[..., :head_dim], per_head[..., head_dim:]
    q_out, k_out = fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim)
    return q_out, k_out, gate.reshape(-1, head_dim).clone()


def fused_qkvzba_split_reshape_cat_contiguous_cpu(
    mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, num_heads_qk: int, num_heads_v: int, head_qk: int, head_v: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gated DeltaNet input projections [q | k | v | z] and [b | a] (all heads of each, contiguous)
    -> mixed_qkv [T, 2*HQK*Dk + HV*Dv], z [T, HV, Dv], b [T, HV], a [T, HV], fresh tensors."""
    key, value = num_heads_qk * head_qk, num_heads_v * head_v
    qkv, z = mixed_qkvz.split([2 * key + value, value], dim=-1)
    b, a = mixed_ba.split([num_heads_v, num_heads_v], dim=-1)
    return qkv.contiguous().clone(), z.reshape(-1, num_heads_v, head_v).clone(), b.clone(), a.clone()


def fused_rmsnorm_gated_cpu(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMS norm of each row of x [T, D] times weight, then times silu(z) [T, D] (norm before gate)."""
    normed = rms_normalised(x, eps).to(x.dtype) * weight
    if z is None:
        return normed
    return (normed.float() * torch.nn.functional.silu(z.float())).to(x.dtype)


QWEN3_5_CPU_IMPLS = {
    "fused_rmsnorm_gated_cpu": fused_rmsnorm_gated_cpu,
    "fused_sigmoid_mul_cpu": fused_sigmoid_mul_cpu,
    "fused_qk_gemma_rmsnorm_cpu": fused_qk_gemma_rmsnorm_cpu,
    "fused_qk_gemma_rmsnorm_with_gate_cpu": fused_qk_gemma_rmsnorm_with_gate_cpu,
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": fused_qkvzba_split_reshape_cat_contiguous_cpu,
}


# Gated DeltaNet ops that sglang/srt/layers/attention/linear/{gdn_backend.py,
# kernels/gdn_triton.py} look up at import on CPU and call on the Qwen3.5 path.
GDN_CPU_OPS = (
    "fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)",
    (
        "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, "
        "Tensor a, Tensor b, Tensor(s!) initial_state_source, Tensor initial_state_indices, Tensor cu_seqlens, "
        "bool use_qk_l2norm_in_kernel, float softplus_beta=1.0, float softplus_threshold=20.0, bool is_kda=False, "
        "bool disable_state_update=False, Tensor? intermediate_states_buffer=None, "
        "Tensor? intermediate_state_indices=None, int? cache_steps=None, Tensor? retrieve_parent_token=None) -> Tensor"
    ),
)


def fused_gdn_gating_cpu(
    A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Body of torch.ops.sgl_kernel.fused_gdn_gating_cpu: a, b [T, HV] -> g [1, T, HV] fp32, beta [1, T, HV]."""
    return gdn.gdn_gating(A_log, a, b, dt_bias)


def fused_sigmoid_gating_delta_rule_update_cpu(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    use_qk_l2norm_in_kernel: bool,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    is_kda: bool = False,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    cache_steps: int | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
) -> torch.Tensor:
    """Body of torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu (decode, and
    speculative target-verify of chain drafts). q, k [1, T, H, K]; v [1, T, HV, V]; a, b [T, HV];
    the pool initial_state_source [slots, HV, V, K] updated in place at initial_state_indices [N]
    unless disable_state_update; intermediate_states_buffer [rows, steps, HV, V, K] gets the state
    after each token at intermediate_state_indices [N]. Returns [1, T, HV, V]."""
    if is_kda:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu: Kimi delta attention (is_kda)")
    pool, slots, starts, l2norm = initial_state_source, initial_state_indices, cu_seqlens, use_qk_l2norm_in_kernel
    inputs = (A_log, dt_bias, q, k, v, a, b, pool, slots, starts, l2norm, softplus_beta, softplus_threshold)
    if disable_state_update or intermediate_states_buffer is not None:
        require_chain(None, retrieve_parent_token)
        return gdn.sigmoid_gated_delta_rule_verify(
            *inputs,
            write_back=not disable_state_update,
            step_states=intermediate_states_buffer,
            step_rows=intermediate_state_indices,
        )
    return gdn.sigmoid_gated_delta_rule_update(*inputs)


GDN_CPU_IMPLS = {
    "fused_gdn_gating_cpu": fused_gdn_gating_cpu,
    "fused_sigmoid_gating_delta_rule_update_cpu": fused_sigmoid_gating_delta_rule_update_cpu,
}


def _op_exists(namespace: str, name: str) -> bool:
    return torch._C._dispatch_has_kernel(f"{namespace}::{name}") or hasattr(getattr(torch.ops, namespace), name)


def define_sgl_kernel_ops() -> None:
    """Idempotent: defines whichever of the ops above do not exist yet."""
    missing = [s for s in QWEN3_5_CPU_OPS + GDN_CPU_OPS if not _op_exists("sgl_kernel", s.split("(")[0])]
    if not missing:
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for schema in missing:
        name = schema.split("(")[0]
        lib.define(schema)
        lib.impl(name, {**QWEN3_5_CPU_IMPLS, **GDN_CPU_IMPLS}[name], "CompositeExplicitAutograd")
    _libraries.append(lib)


def nms_cpu(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression. boxes [N, 4] (x1, y1, x2, y2), scores [N] -> kept indices."""
    order = scores.argsort(descending=True)
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        suppressed |= inter / (areas[i] + areas - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


def define_missing_torchvision_ops() -> None:
    """Called after torchvision tried to load its compiled ops; no-op if that worked."""
    if _op_exists("torchvision", "nms"):
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.impl("nms", nms_cpu, "CPU")
    _libraries.append(lib)
