"""Pure-torch stand-ins for SGLang Triton elementwise kernels that the CPU route reaches.

SGLang 0.5.23's `models/qwen2_moe.py` (the sparse MoE block Qwen3.5-MoE uses) gates its shared
expert with Triton kernels on every machine without Intel AMX; Triton has no CPU driver.
`import_fixes` puts these in that module's namespace once it is imported.
"""

import torch


def fused_gate_sigmoid_mul(
    hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor
) -> torch.Tensor:
    """sigmoid(hidden_states @ gate_weight) [T, 1] * shared_output [T, D], gate in float32."""
    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float())
    return (gate[:, None] * shared_output.float()).to(shared_output.dtype)


def fused_gate_sigmoid_mul_add(
    hidden_states: torch.Tensor,
    gate_weight: torch.Tensor,
    shared_output: torch.Tensor,
    final_hidden_states: torch.Tensor,
) -> None:
    """final_hidden_states += the gated shared-expert output (in place, as the kernel)."""
    gated = torch.sigmoid(hidden_states.float() @ gate_weight.float())[:, None] * shared_output.float()
    final_hidden_states.copy_(final_hidden_states.float() + gated)
