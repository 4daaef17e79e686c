"""Pure-torch bodies of the `sgl_kernel` names SGLang 0.5.23 asks for on CUDA (the GPU route).

Served under the name `sgl_kernel` by `runtime/gpu_route.py` when `SGLANG_EVS_GPU_ROUTE=1` and the real
`sglang-kernel` wheel is absent. Every function here is device-agnostic and safe inside a captured CUDA
graph: no host synchronisation, no shape that depends on tensor values, outputs written in place where the
kernel writes in place. Which module asked for which name is in `PROVIDED` / `IMPORT_ONLY` below and in
docs/gpu-route.md.

Two kinds of names:
- `PROVIDED`: called, or callable, on the Qwen3-VL bfloat16 path (norms, gated activations, sampling
  renormalisation, `weak_ref_tensor` for the breakable prefill graphs, the PDL query of the Triton backend);
- `IMPORT_ONLY`: imported unconditionally at module import by SGLang on CUDA (GGUF, int8, MoE, host KV
  offload) but never reached by a dense bfloat16 model served with `SERVER_ARGS`; each raises
  NotImplementedError naming itself when called. Any name in neither table is absent (AttributeError, so
  `from sgl_kernel import x` is an ImportError and SGLang's own fallbacks apply).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from sglang_evs.runtime.torch_ops import gemma_rms_norm, rms_normalised


def _into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    """`result` written into `out` (and `out` returned) where the caller gave one, as the kernels do."""
    if out is None:
        return result
    out.copy_(result)
    return out


def _add_to_residual(input: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual [T, D] += input [T, D], in place; the float32 sum, which the fused norms normalise."""
    total = input.float() + residual.float()
    residual.copy_(total)
    return total


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """RMS norm of each row of input [T, D] times weight [D], computed in float32; written to out [T, D]
    when given (and returned)."""
    return _into(out, (rms_normalised(input, eps) * weight.float()).to(input.dtype))


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: residual [T, D] += input [T, D]; input = RMS norm of the float32 sum times weight [D]."""
    input.copy_(rms_normalised(_add_to_residual(input, residual), eps) * weight.float())


def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Gemma's RMS norm of input [T, D]: scaled by (1 + weight [D]), in float32; into out when given."""
    return _into(out, gemma_rms_norm(input, weight, eps))


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: residual [T, D] += input; input = Gemma RMS norm (scale 1 + weight [D]) of the float32 sum."""
    input.copy_(gemma_rms_norm(_add_to_residual(input, residual), weight, eps))


def _gated(act: Callable[[torch.Tensor], torch.Tensor], input: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """act(first half) * second half of input [..., 2H] -> [..., H], in float32, into out when given."""
    gate, up = input.float().chunk(2, dim=-1)
    return _into(out, (act(gate) * up).to(input.dtype))


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """silu(x[..., :H]) * x[..., H:] for input [..., 2H] -> [..., H]."""
    return _gated(F.silu, input, out)


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """gelu(x[..., :H]) (exact, erf) * x[..., H:] for input [..., 2H] -> [..., H]."""
    return _gated(F.gelu, input, out)


def gelu_tanh_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """gelu(x[..., :H], tanh approximation) * x[..., H:] for input [..., 2H] -> [..., H]."""
    return _gated(lambda g: F.gelu(g, approximate="tanh"), input, out)


def _per_row(value: torch.Tensor | float | int, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scalar or a [1] / [B] tensor as one value per row, [B] (no host read of a tensor)."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).reshape(-1).expand(rows)
    return torch.full((rows,), value, dtype=dtype, device=device)


def _renormalise_from(probs: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """Keep probs [B, V] (float32) at or above each row's pivot [B] (ties at the pivot kept), rows summing to 1."""
    kept = torch.where(probs >= pivots[:, None], probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_k_renorm_prob(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """Each row of probs [B, V] restricted to its top_k (scalar or [B]) largest entries and renormalised,
    float32 [B, V]. Ties with the k-th largest value are kept (flashinfer's pivot semantics)."""
    probs = probs.float()
    rows, vocab = probs.shape
    ks = _per_row(top_k, rows, torch.int64, probs.device)
    ordered = probs.sort(dim=-1, descending=True).values
    pivots = ordered.gather(1, (ks - 1).clamp(0, vocab - 1)[:, None]).squeeze(1)
    return _renormalise_from(probs, pivots)


def top_p_renorm_prob(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Each row of probs [B, V] restricted to its nucleus (top_p, scalar or [B], in (0, 1]) and renormalised,
    float32 [B, V]. The pivot is the first value, in ascending order, at which the running mass reaches
    1 - top_p; everything at or above it is kept (flashinfer's semantics)."""
    probs = probs.float()
    rows, vocab = probs.shape
    ps = _per_row(top_p, rows, torch.float32, probs.device)
    ascending = probs.sort(dim=-1).values
    mass = ascending.cumsum(-1)
    cut = torch.searchsorted(mass, (1.0 - ps)[:, None]).clamp(max=vocab - 1)
    return _renormalise_from(probs, ascending.gather(1, cut).squeeze(1))


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor over the same memory, shape, strides and dtype that does not keep that memory alive, as
    sgl_kernel's: the breakable prefill graph holds its segments' outputs this way so that the graph's
    memory pool can reuse them. Non-tensors are returned as they are."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    storage = tensor.untyped_storage()
    unowned = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), tensor.device, storage.nbytes())
    view = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return view.set_(unowned, tensor.storage_offset(), tensor.size(), tensor.stride())


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch (an sm90+ launch overlap) is off: the Triton attention backend then
    launches its kernels the ordinary way."""
    return False


def _import_only(qualified_name: str) -> Callable[..., None]:
    """A name SGLang imports on CUDA but never calls on this route: calling it says so."""

    def unavailable(*args, **kwargs) -> None:
        raise NotImplementedError(
            f"{qualified_name} is not available on sglang-evs' GPU route (no sglang-kernel): "
            "only dense bfloat16 Qwen3-VL with sglang_evs.runtime.gpu_route.SERVER_ARGS is covered"
        )

    unavailable.__name__ = unavailable.__qualname__ = qualified_name.rsplit(".", 1)[-1]
    return unavailable


# module name -> names with a torch body
PROVIDED: dict[str, dict[str, Callable]] = {
    "sgl_kernel": {
        f.__name__: f
        for f in (
            rmsnorm,
            fused_add_rmsnorm,
            gemma_rmsnorm,
            gemma_fused_add_rmsnorm,
            silu_and_mul,
            gelu_and_mul,
            gelu_tanh_and_mul,
            top_k_renorm_prob,
            top_p_renorm_prob,
            weak_ref_tensor,
        )
    },
    "sgl_kernel.utils": {"is_arch_support_pdl": is_arch_support_pdl},
}

# module name -> names SGLang imports unconditionally on CUDA (so they must exist) and never calls here
IMPORT_ONLY: dict[str, tuple[str, ...]] = {
    "sgl_kernel": ("int8_scaled_mm", "moe_sum", "moe_sum_reduce"),
    "sgl_kernel.quantization": ("ggml_dequantize", "ggml_moe_a8", "ggml_mul_mat_a8", "ggml_mul_mat_vec_a8"),
    "sgl_kernel.kvcacheio": (
        "transfer_kv_all_layer",
        "transfer_kv_all_layer_direct_lf_pf",
        "transfer_kv_all_layer_lf_pf",
        "transfer_kv_all_layer_lf_ph",
        "transfer_kv_all_layer_mla",
        "transfer_kv_all_layer_mla_lf_pf",
        "transfer_kv_direct",
        "transfer_kv_per_layer",
        "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_per_layer_mla",
        "transfer_kv_per_layer_mla_pf_lf",
        "transfer_kv_per_layer_pf_lf",
        "transfer_kv_per_layer_ph_lf",
    ),
}

MODULES: tuple[str, ...] = tuple(sorted({*PROVIDED, *IMPORT_ONLY}))


def names_of(module: str) -> dict[str, Callable]:
    """Every name the stand-in module `module` (e.g. "sgl_kernel.utils") holds."""
    names = {name: _import_only(f"{module}.{name}") for name in IMPORT_ONLY.get(module, ())}
    names.update(PROVIDED.get(module, {}))
    return names
