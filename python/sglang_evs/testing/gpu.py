"""How the GPU checks start a server: the GPU route's arguments and environment, in one place for the GPU
tests and the GPU benchmark.

The GPU machine has no SGLang CUDA stack (sgl_kernel, flashinfer); the GPU route (`sglang_evs.runtime.gpu_route`,
active with `SGLANG_EVS_GPU_ROUTE=1`) serves on SGLang's Triton attention backend with pure-torch stand-ins,
and its `SERVER_ARGS` are the flags that select it. Where that module is not installed, the flags it is
planned to give (`PLANNED_ROUTE_ARGS`) stand in; a module that is installed but fails to import is an error.
"""

import importlib.util

ROUTE_MODULE = "sglang_evs.runtime.gpu_route"
ROUTE_ENV = {"SGLANG_EVS_GPU_ROUTE": "1"}
PLANNED_ROUTE_ARGS = (
    "--device", "cuda",
    "--attention-backend", "triton",
    "--mm-attention-backend", "sdpa",
    "--sampling-backend", "pytorch",
)  # fmt: skip


def route_args() -> tuple[str, ...]:
    """The GPU route's server arguments (`gpu_route.SERVER_ARGS`, or the planned ones where it is absent)."""
    if importlib.util.find_spec(ROUTE_MODULE) is None:
        return PLANNED_ROUTE_ARGS
    return tuple(importlib.import_module(ROUTE_MODULE).SERVER_ARGS)


def without_graphs(args: list[str] | tuple[str, ...]) -> list[str]:
    """`args` with every CUDA graph off (decode and prefill): the eager reference of the same server."""
    return [*args, "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]


def without_prefill_graphs(args: list[str] | tuple[str, ...]) -> list[str]:
    """`args` with prefill graphs off and decode graphs as they were."""
    return [*args, "--cuda-graph-backend-prefill", "disabled"]
