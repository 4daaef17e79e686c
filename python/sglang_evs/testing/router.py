"""Start `python -m sglang_router.launch_router` (PyPI `sglang-router`) in front of running workers."""

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import requests

from sglang_evs.testing import warm_start
from sglang_evs.testing.server import (
    COLD_START_ENV,
    RunningServer,
    free_port,
    server_environment,
    spawn,
    stop,
    wait_ready,
)


def worker_args(pruning_rate: float) -> list[str]:
    """Arguments of a router's worker: float32, Prometheus metrics, and a server-wide EVS rate (what a
    `/generate` request through the router gets: the router drops its `mm_processor_kwargs`)."""
    rate = json.dumps({"video_pruning_rate": pruning_rate})
    return ["--dtype", "float32", "--enable-metrics", "--json-model-override-args", rate]


# Cache-aware routing matches the prompt text only, not the media: with the default thresholds (64 requests
# and 1.5x apart) a burst of media requests asking the same question all go to one worker. The README's
# recipe and the router test use these.
MEDIA_BALANCE_ARGS = ("--balance-abs-threshold", "4", "--balance-rel-threshold", "1.2")


ROUTER_MODULE = "sglang_router.launch_router"


def _router_base(port: int) -> list[str]:
    # its Prometheus exporter takes port 29000 by default: a second router on the machine would not start
    return ["--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port())]


def router_command(
    worker_urls: Sequence[str], port: int, policy: str = "cache_aware", extra: Sequence[str] = ()
) -> list[str]:
    """The router's arguments (after `python -m sglang_router.launch_router`)."""
    return [*_router_base(port), "--worker-urls", *worker_urls, "--policy", policy, *extra]


def pd_router_command(
    prefill_url: str, bootstrap_port: int, decode_urls: str | Sequence[str], port: int, extra: Sequence[str] = ()
) -> list[str]:
    """The router in PD mode: it sends each request to the prefill server and one of the decode servers (a
    `--decode` each), with the prefill server's bootstrap address, and answers with the decode server's reply."""
    decodes = [decode_urls] if isinstance(decode_urls, str) else list(decode_urls)
    return [
        *_router_base(port), "--pd-disaggregation",
        "--prefill", prefill_url, str(bootstrap_port), *(arg for url in decodes for arg in ("--decode", url)),
        *extra,
    ]  # fmt: skip


def healthy_workers(base_url: str) -> list[str]:
    """The URLs of the workers the router lists as healthy (`GET /workers`, sglang-router 0.3)."""
    body = requests.get(f"{base_url}/workers", timeout=5).json()
    return [worker["url"] for worker in body["workers"] if worker.get("is_healthy")]


def _start(args: Sequence[str], log_path: str | Path):
    """`python -m sglang_router.launch_router *args`, in a process group of its own. On the CPU route it is
    forked from the servers' warm interpreter (`warm_start`, which has SGLang imported): the router's Python
    side imports SGLang (its mini load balancer), about 5 s of CPU per router, which several routers
    started on 2 cores beside servers turn into tens of seconds. `COLD_START_ENV=1`: a fresh interpreter."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" and os.environ.get(COLD_START_ENV) != "1":
        return warm_start.start(ROUTER_MODULE, args, server_environment(cpu=True), str(log_path), None)
    return spawn([sys.executable, "-m", ROUTER_MODULE, *args], log_path)


class _Router(NamedTuple):
    args: list[str]
    port: int
    worker_urls: Sequence[str]
    log_path: str | Path


@contextmanager
def _running(*routers: _Router) -> Iterator[list[RunningServer]]:
    """Launch the routers together, wait until each lists every worker of its own healthy, yield them, and
    always stop them all."""
    processes = []
    try:
        for router in routers:
            processes.append(_start(router.args, router.log_path))
        running = []
        for router, process in zip(routers, processes, strict=True):
            base_url = f"http://127.0.0.1:{router.port}"

            def every_worker_listed(base_url=base_url, count=len(router.worker_urls)) -> bool:
                return len(healthy_workers(base_url)) == count  # the router registers them in the background

            wait_ready(every_worker_listed, process, router.log_path, "router", timeout=120, interval=0.5)
            running.append(RunningServer(base_url, process, Path(router.log_path)))
        yield running
    finally:
        stop(*processes)


@contextmanager
def running_router(
    worker_urls: Sequence[str], log_path: str | Path, policy: str = "cache_aware", extra: Sequence[str] = ()
) -> Iterator[RunningServer]:
    """Launch the router, wait until it lists every worker healthy, yield it, always stop it."""
    port = free_port()
    with _running(_Router(router_command(worker_urls, port, policy, extra), port, worker_urls, log_path)) as (router,):
        yield router


class PdPair(NamedTuple):
    """A prefill server and one decode server or several for a router in PD mode, the prefill server's
    bootstrap port, the router's log and further router flags."""

    prefill: RunningServer
    bootstrap_port: int
    decode: RunningServer | Sequence[RunningServer]
    log_path: str | Path
    extra: Sequence[str] = ()


@contextmanager
def running_pd_routers(*pairs: PdPair) -> Iterator[list[RunningServer]]:
    """A router in PD mode in front of each running prefill server and its decode servers (`server.pd_launches`,
    `server.pd_decode_launch`; one server may be in several pairs), all started together, each once it lists
    its servers healthy; always stopped."""
    routers = []
    for pair in pairs:
        decodes = [pair.decode] if isinstance(pair.decode, RunningServer) else list(pair.decode)
        port = free_port()
        args = pd_router_command(pair.prefill.base_url, pair.bootstrap_port, [d.base_url for d in decodes], port,
                                 pair.extra)  # fmt: skip
        routers.append(_Router(args, port, [pair.prefill.base_url, *(d.base_url for d in decodes)], pair.log_path))
    with _running(*routers) as running:
        yield running


@contextmanager
def running_pd_router(
    prefill: RunningServer,
    decode: RunningServer | Sequence[RunningServer],
    bootstrap_port: int,
    log_path: str | Path,
    extra: Sequence[str] = (),
) -> Iterator[RunningServer]:
    """The router in PD mode in front of a running prefill server and one decode server or several, with more
    router flags in `extra`, once it lists them all healthy; always stopped."""
    with running_pd_routers(PdPair(prefill, bootstrap_port, decode, log_path, extra)) as (router,):
        yield router
