"""A CPU stand-in for `torch.cuda.CUDAGraph`: record the tensor ops of one call, replay them in place.

    graph = CpuGraph()
    with graph:
        out = body(static_inputs)     # runs normally, every aten op is recorded
    static_inputs.copy_(new_values)   # what a graph runner does before replay
    graph.replay()                    # `out` now holds body(new_values)

Like a CUDA graph, replay re-runs the recorded kernels on the tensors they touched at
capture (same storage, same shapes) and runs none of the Python around them: a tensor
the body picked by Python logic at capture (an attribute, a branch, a temporary) is the
one it reads at every replay. Out-of-place results are written back into the tensors
captured for them, so later ops see the new values. Shapes and control flow are frozen,
as in a CUDA graph; values read back to Python during capture (`.item()`) stay frozen too.
"""

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CpuGraph(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out

    def replay(self) -> None:
        for func, args, kwargs, captured in self.ops:
            _write_back(captured, func(*args, **kwargs))

    def reads(self, tensor: torch.Tensor) -> bool:
        """Whether any recorded op takes a tensor sharing `tensor`'s storage as an input."""
        storage = tensor.untyped_storage().data_ptr()
        return any(
            isinstance(arg, torch.Tensor) and arg.untyped_storage().data_ptr() == storage
            for _, args, kwargs, _ in self.ops
            for arg in _flat([*args, *kwargs.values()])
        )


def _flat(values):
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _flat(value)
        else:
            yield value


def _write_back(captured: Any, result: Any) -> None:
    if isinstance(captured, torch.Tensor) and isinstance(result, torch.Tensor):
        # Views and in-place ops return (views of) storage the graph already holds.
        if captured.untyped_storage().data_ptr() != result.untyped_storage().data_ptr():
            captured.copy_(result)
    elif isinstance(captured, (list, tuple)) and isinstance(result, (list, tuple)):
        for c, r in zip(captured, result, strict=True):
            _write_back(c, r)
