"""Torch op registrations that SGLang and torchvision expect to exist on CPU."""

import torch

_libraries: list[torch.library.Library] = []  # keep alive: dropping one unregisters its ops

# Looked up at import by sglang/srt/models/qwen3_5.py on CPU; never called on
# the Qwen3-VL path. `convert_weight_packed` is deliberately absent: its
# presence switches SGLang to Intel AMX kernels.
QWEN3_5_CPU_OPS = (
    "fused_sigmoid_mul_cpu(Tensor(a!) x, Tensor gate) -> ()",
    "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor qw, Tensor kw, float eps) -> ()",
    "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q, Tensor k, Tensor qw, Tensor kw, float eps) -> ()",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor x) -> ()",
)


def _op_exists(namespace: str, name: str) -> bool:
    return torch._C._dispatch_has_kernel(f"{namespace}::{name}") or hasattr(getattr(torch.ops, namespace), name)


def _not_available(name: str):
    def fail(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel::{name} has no CPU implementation in sglang-evs")

    return fail


def define_sgl_kernel_ops() -> None:
    missing = [s for s in QWEN3_5_CPU_OPS if not _op_exists("sgl_kernel", s.split("(")[0])]
    if not missing:
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for schema in missing:
        name = schema.split("(")[0]
        lib.define(schema)
        lib.impl(name, _not_available(name), "CompositeExplicitAutograd")
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
