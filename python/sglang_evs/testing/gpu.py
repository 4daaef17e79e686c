"""How the GPU checks start a server: the GPU route's arguments and environment, for the GPU tests and the GPU
benchmark.

The GPU machine has no SGLang CUDA stack (sgl_kernel, flashinfer); the GPU route (`sglang_evs.runtime.gpu_route`,
active with `SGLANG_EVS_GPU_ROUTE=1`) serves on SGLang's Triton attention backend with pure-torch stand-ins, and
its `SERVER_ARGS` are the flags that select it.
"""

from sglang_evs.runtime.gpu_route import ROUTE_ENV as ROUTE_ENV_NAME
from sglang_evs.runtime.gpu_route import SERVER_ARGS

ROUTE_ENV = {ROUTE_ENV_NAME: "1"}


def route_args() -> tuple[str, ...]:
    """The GPU route's server arguments."""
    return SERVER_ARGS


def without_graphs(args: list[str] | tuple[str, ...]) -> list[str]:
    """`args` with every CUDA graph off (decode and prefill): the eager reference of the same server."""
    return [*args, "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]


def without_prefill_graphs(args: list[str] | tuple[str, ...]) -> list[str]:
    """`args` with prefill graphs off and decode graphs as they were."""
    return [*args, "--cuda-graph-backend-prefill", "disabled"]
