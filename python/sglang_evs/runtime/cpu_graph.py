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
as in a CUDA graph.

As strict as a CUDA capture: what would make the GPU wait for a captured kernel fails the
capture with `CaptureError`, naming the op, where CUDA fails with "operation not permitted
when stream is capturing". That is, on a value *computed inside the capture*:
- reading it back to Python: `.item()`, `bool()`, `int()`, `float()` (`aten._local_scalar_dense`),
  `torch.equal`, `.tolist()`, `.numpy()`;
- an op whose output shape depends on its data: `nonzero` (`torch.where(mask)`, `argwhere`),
  `masked_select`, `unique`, `bincount`, `repeat_interleave` without `output_size`, indexing or
  index-assigning with a boolean mask (except assigning one host value, which CUDA turns into
  `masked_fill_`);
and, at all, `torch.cpu.synchronize()` (`torch.cuda.synchronize()` on the CPU route's device module).

A value is computed inside the capture when its storage is the output of an op recorded in this
capture, or was written in place by one (views of it included). Every other tensor existed before
the capture began (or is a constant made during it): it stands for host memory (SGLang's `*_cpu`
metadata, Python lists turned into tensors) and stays readable, its value frozen into the graph as
a GPU capture freezes what the host computed. The rule cannot tell a pre-existing device buffer
from host memory (on CPU both are host memory): reading a static input buffer during a capture
passes here and would fail on a GPU.
"""

import functools
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CAPTURE_FAILS = "a CUDA graph capture fails here (operation not permitted when stream is capturing)"


class CaptureError(RuntimeError):
    """What a CUDA capture raises (a `cudaErrorStreamCaptureUnsupported`), for the CPU stand-in."""


_aten = torch.ops.aten
# ops that hand a device value to the host, by what they read: a CUDA capture cannot wait for it
_READS_BACK = {
    _aten._local_scalar_dense.default: ".item() / bool() / int() / float() of a tensor",
    _aten.equal.default: "torch.equal",
}
# ops whose output shape is a device value: the host waits for it to allocate the output
_SHAPE_FROM_DATA = {
    _aten.nonzero.default: "nonzero (torch.where(mask), argwhere)",
    _aten.masked_select.default: "masked_select",
    _aten._unique.default: "unique",
    _aten._unique2.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.unique_consecutive.default: "unique_consecutive",
    _aten.unique_dim_consecutive.default: "unique_consecutive",
    _aten.bincount.default: "bincount",
}
_MASK_INDEX = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}
_REPEAT_INTERLEAVE = _aten.repeat_interleave.Tensor


def _refused(what: Any, why: str) -> CaptureError:
    return CaptureError(f"{what}: {why}; {CAPTURE_FAILS}")


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class CpuGraph(TorchDispatchMode):
    """Records every aten op run inside `with graph:` (refusing what a CUDA capture refuses); `replay` re-runs them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []
        self.computed: set[int] = set()  # storages written by recorded ops (the ops keep them alive)
        self._running = False  # inside a recorded op's own body (a custom op's Python): not the captured body

    def __enter__(self):
        _install_host_read_checks()
        _capturing_graphs.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _capturing_graphs.remove(self)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [value for value in _flat([*args, *kwargs.values()]) if isinstance(value, torch.Tensor)]
        self.refuse_what_cuda_refuses(func, args, kwargs, inputs)
        self._running = True
        try:
            out = func(*args, **kwargs)
        finally:
            self._running = False
        self.ops.append((func, args, kwargs, out))
        self._mark_computed(func, args, kwargs, inputs, out)
        return out

    def is_computed(self, tensor: Any) -> bool:
        """Whether `tensor` holds a value computed inside this capture (see the module's docstring)."""
        return isinstance(tensor, torch.Tensor) and tensor.numel() > 0 and _storage(tensor) in self.computed

    def refuse_what_cuda_refuses(self, func, args: tuple, kwargs: dict, inputs: list[torch.Tensor]) -> None:
        """Raise `CaptureError` if CUDA's capture would fail at this op (the module's docstring says when);
        `inputs`: the tensors among its arguments."""
        computed = any(map(self.is_computed, inputs))
        if func in _READS_BACK and computed:
            raise _refused(func, f"{_READS_BACK[func]} reads a value computed in the capture")
        if func in _SHAPE_FROM_DATA and computed:
            raise _refused(func, f"{_SHAPE_FROM_DATA[func]} sizes its output by a value computed in the capture")
        if func is _REPEAT_INTERLEAVE and kwargs.get("output_size") is None and computed:
            raise _refused(func, "repeat_interleave without output_size sizes its output by computed repeats")
        if func in _MASK_INDEX:
            masks = [i for i in args[1] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
            if not any(map(self.is_computed, masks)):
                return
            if func is not _aten.index.Tensor and len(masks) == 1:
                value = args[2] if len(args) > 2 else kwargs["values"]
                if value.numel() == 1 and not self.is_computed(value):
                    return  # CUDA assigns one host value under a mask with `masked_fill_`
            raise _refused(func, "indexing with a boolean mask computed in the capture")

    def _mark_computed(self, func, args: tuple, kwargs: dict, inputs: list[torch.Tensor], out: Any) -> None:
        read = {_storage(tensor) for tensor in inputs}
        for value in _flat([out]):
            if isinstance(value, torch.Tensor) and _storage(value) not in read:
                self.computed.add(_storage(value))  # a fresh result (views and in-place results are inputs')
        schema = func._schema
        for position, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            written = kwargs.get(argument.name, args[position] if position < len(args) else None)
            for tensor in _flat([written]):
                if isinstance(tensor, torch.Tensor):
                    self.computed.add(_storage(tensor))

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
_capturing_graphs: list[CpuGraph] = []  # the graphs recording now (innermost last)


def _refuse_host_read(tensor: torch.Tensor, what: str) -> None:
    """`.tolist()` and `.numpy()` read a tensor's memory directly, below the dispatcher a `CpuGraph` sees."""
    for graph in _capturing_graphs:
        if not graph._running and graph.is_computed(tensor):
            raise _refused(f"Tensor.{what}()", "reads a value computed in the capture")


@functools.cache
def _install_host_read_checks() -> None:
    for name in ("tolist", "numpy"):
        upstream = getattr(torch.Tensor, name)

        def checked(self, *args, _upstream=upstream, _name=name, **kwargs):
            if _capturing_graphs:
                _refuse_host_read(self, _name)
            return _upstream(self, *args, **kwargs)

        setattr(torch.Tensor, name, functools.wraps(upstream)(checked))


def synchronize(device: Any = None) -> None:
    """`torch.cpu.synchronize` in graph mode: a capture cannot wait for its own kernels."""
    if _capture_active():
        raise _refused("torch.cuda.synchronize() (torch.cpu.synchronize on the CPU route)", "waits for the capture")
    _cpu_synchronize(device)


def _capture_active() -> bool:
    return _capturing[0] or any(not graph._running for graph in _capturing_graphs)


_cpu_synchronize = torch.cpu.synchronize


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
    context, the capturing query, the graph-pool handle (a CPU graph needs no memory pool) and a
    `synchronize` that fails during a capture, as CUDA's does."""
    torch.cuda.CUDAGraph = CpuGraphSegment
    torch.cpu.graph_pool_handle = lambda: (0, 0)
    torch.cpu.graph = graph
    torch.cpu.is_current_stream_capturing = lambda: _capturing[0]
    torch.cpu.synchronize = synchronize
