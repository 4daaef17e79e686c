"""Prefill/decode disaggregation on the CPU route: the CUDA-only calls a CPU PD pair meets, stood in for.

SGLang 0.5.23 serves a PD pair on CPU over Mooncake's TCP transport (`MOONCAKE_PROTOCOL=tcp`) but for these:

- the host KV pool (`mem_cache/pool_host`): a decode server builds one at startup for its default retraction
  backup (`host_pool`), and `--enable-hierarchical-cache` builds the same pool. Its buffers are allocated by
  `ALLOC_MEMORY_FUNCS[device type]`, which for any device but NPU, MUSA and XPU is `alloc_with_host_register`:
  it pins them with `cudaHostRegister` ("Torch not compiled with CUDA enabled" on CPU). With the device pool
  in host memory there is nothing to pin for: a CPU device pool gets its host buffers from the pool's own
  allocator, unregistered (`host_pool_unpinned`). The pool is sized against the machine's free memory less
  a 10 GiB reserve (`HICACHE_HOST_MEMORY_RESERVE_BYTES`), kept for a GPU host's own processes; on the CPU
  route the device pool and every server share that memory, sized by their own flags, so the reserve is
  1 GiB (`host_memory_reserve_on_cpu`): with 10 a decode server does not start on a 24 GiB machine that
  runs a few other servers.
- the prefill server's KV sender (`disaggregation/prefill.py`): with Mooncake (whose sender takes host tensor
  indices) every chunk's page indices are copied into a pinned host tensor, `pin_memory=True`, behind a
  `torch.cuda.Event()` recorded on `torch.cuda.current_stream()` that the transfer thread waits on; an early
  send of a radix-cached prefix under the overlap scheduler records a `torch.cuda.Event()` on the forward
  stream. On CPU a forward and a copy are done when the call returns, so the device module's own no-op
  `torch.cpu.Event` and `torch.cpu.current_stream` stand in, and pinning is dropped
  (`prefill_sender_on_cpu`: for that module only, its `torch` is a view of torch with those three names
  changed).
"""

from types import ModuleType
from typing import Any

import torch


def allocate_unpinned(
    dims: tuple,
    dtype: torch.dtype,
    device: str,
    pin_memory: bool,
    allocator: Any,
    registration_granularity_bytes: int | None = None,
) -> torch.Tensor:
    """`alloc_with_host_register`'s signature and allocation, without registering (pinning) the buffer."""
    if allocator is None:
        return torch.empty(dims, dtype=dtype, device=device)
    return allocator.allocate(dims, dtype=dtype, device=device)


def host_pool_unpinned(module: ModuleType) -> None:
    """After `sglang.srt.mem_cache.pool_host.common` imports: host pools over a CPU device pool allocate
    unpinned. Every pool module imports this one dict by name, so one entry serves them all."""
    module.ALLOC_MEMORY_FUNCS["cpu"] = allocate_unpinned


CPU_HOST_MEMORY_RESERVE_BYTES = 1024**3


def host_memory_reserve_on_cpu(module: ModuleType) -> None:
    """After `sglang.srt.mem_cache.pool_host.base` imports: a host pool leaves 1 GiB of free memory, not 10."""
    module.HICACHE_HOST_MEMORY_RESERVE_BYTES = CPU_HOST_MEMORY_RESERVE_BYTES


class _HostCuda:
    """`torch.cuda` with the CPU device module's `Event` and `current_stream`; all else is `torch.cuda`'s."""

    Event = torch.cpu.Event
    current_stream = staticmethod(torch.cpu.current_stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _HostTorch:
    """`torch` as `disaggregation/prefill.py` sees it on CPU: `torch.cuda` is `_HostCuda`, `torch.empty`
    pins nothing; all else is torch."""

    cuda = _HostCuda()

    @staticmethod
    def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return torch.empty(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def prefill_sender_on_cpu(module: ModuleType) -> None:
    """After `sglang.srt.disaggregation.prefill` imports: its CUDA events and pinned index copies run on CPU."""
    module.torch = _HostTorch()
