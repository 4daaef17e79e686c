"""How the GPU checks start a server on the GPU route (`sglang_evs.runtime.gpu_route`: SGLang's Triton attention
backend with pure-torch stand-ins, its flags `SERVER_ARGS`), for the GPU tests and the GPU benchmark."""

from sglang_evs.runtime.gpu_route import ROUTE_ENV

ROUTE_ON = {ROUTE_ENV: "1"}  # a server's environment that turns the route on in each of its processes


def without_graphs(args: list[str] | tuple[str, ...]) -> list[str]:
    """`args` with every CUDA graph off (decode and prefill): the eager reference of the same server."""
    return [*args, "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]


def without_prefill_graphs(args: list[str] | tuple[str, ...]) -> list[str]:
    """`args` with prefill graphs off and decode graphs as they were."""
    return [*args, "--cuda-graph-backend-prefill", "disabled"]
