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

from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
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
            result = func(*args, **kwargs)
            _wait_for_collectives(result)
            _write_back(captured, result)

    def reads(self, tensor: torch.Tensor) -> bool:
        """Whether any recorded op takes as an input a tensor whose memory overlaps `tensor`'s."""
        start, end = _extent(tensor)
        return any(
            isinstance(arg, torch.Tensor) and _overlap((start, end), _extent(arg))
            for _, args, kwargs, _ in self.ops
            for arg in _flat([*args, *kwargs.values()])
        )


def _extent(tensor: torch.Tensor) -> tuple[int, int]:
    """The byte range [start, end) a tensor's elements span."""
    start = tensor.data_ptr()
    if tensor.numel() == 0:
        return start, start
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return start, start + (last + 1) * tensor.element_size()


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _flat(values):
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _flat(value)
        else:
            yield value


def _wait_for_collectives(result: Any) -> None:
    """A collective (c10d's `allreduce_` and the like) returns its `Work` beside its tensors and the Python
    that called it waited on it; a replay runs no such Python, so it waits here, as a CUDA graph's replay
    orders a collective's kernel before the kernels that read its result."""
    for value in result if isinstance(result, (list, tuple)) else (result,):
        if isinstance(value, torch.ScriptObject) and hasattr(value, "wait"):
            value.wait()


def _write_back(captured: Any, result: Any) -> None:
    if isinstance(captured, torch.Tensor) and isinstance(result, torch.Tensor):
        # Views and in-place ops return (views of) storage the graph already holds.
        if captured.untyped_storage().data_ptr() != result.untyped_storage().data_ptr():
            captured.copy_(result)
    elif isinstance(captured, (list, tuple)) and isinstance(result, (list, tuple)):
        for c, r in zip(captured, result, strict=True):
            _write_back(c, r)


# segments replayed since the last `take_replayed()` (bounded: only a trace takes them)
replayed: deque["CpuGraphSegment"] = deque(maxlen=10_000)
_capturing = [False]  # inside a segment's capture: `torch.cpu.is_current_stream_capturing()`


class CpuGraphSegment:
    """`torch.cuda.CUDAGraph`'s capture API over a `CpuGraph`: `capture_begin`, `capture_end`, `replay`.

    SGLang's breakable prefill graph records each stretch between two eager breaks (the attention
    calls) as one such graph; `stand_in_for_cuda_graphs` makes it build these on CPU, so SGLang's
    own capture and replay code runs unchanged around them.
    """

    def __init__(self, *args, **kwargs) -> None:
        self.graph = CpuGraph()

    def capture_begin(self, *args, **kwargs) -> None:
        self.graph.__enter__()
        _capturing[0] = True

    def capture_end(self) -> None:
        _capturing[0] = False
        self.graph.__exit__(None, None, None)

    def instantiate(self) -> None:
        pass

    def replay(self) -> None:
        while _before_next_replay:
            _before_next_replay.pop()()
        self.graph.replay()
        replayed.append(self)

    def reset(self) -> None:
        self.graph = CpuGraph()


_before_next_replay: list[Callable[[], None]] = []


def before_next_replay(call: Callable[[], None]) -> None:
    """Run `call` once, right before the next segment replays (when the runner has loaded its batch)."""
    _before_next_replay.append(call)


def take_replayed() -> list["CpuGraphSegment"]:
    """The segments replayed since the last call (a trace asks what a runner's replay read)."""
    taken = list(replayed)
    replayed.clear()
    return taken


@contextmanager
def graph(cuda_graph: CpuGraphSegment, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"):
    """`torch.cuda.graph` for the CPU device module: capture the body into `cuda_graph`."""
    cuda_graph.capture_begin()
    try:
        yield cuda_graph
    finally:
        cuda_graph.capture_end()


def stand_in_for_cuda_graphs() -> None:
    """Test processes only: `torch.cuda.CUDAGraph` becomes `CpuGraphSegment`, and the CPU device
    module (`torch.get_device_module("cpu")`, which SGLang's graph runners call) gets the capture
    context, the capturing query and the graph-pool handle (a CPU graph needs no memory pool)."""
    torch.cuda.CUDAGraph = CpuGraphSegment
    torch.cpu.graph_pool_handle = lambda: (0, 0)
    torch.cpu.graph = graph
    torch.cpu.is_current_stream_capturing = lambda: _capturing[0]
