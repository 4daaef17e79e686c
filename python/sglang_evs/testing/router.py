"""Start `python -m sglang_router.launch_router` (PyPI `sglang-router`) in front of running workers."""

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

from sglang_evs.testing.server import RunningServer, free_port, spawn, stop, wait_ready


def worker_args(pruning_rate: float) -> list[str]:
    """Arguments of a router's worker: float32, Prometheus metrics, and a server-wide EVS rate (what a
    `/generate` request through the router gets: the router drops its `mm_processor_kwargs`)."""
    rate = json.dumps({"video_pruning_rate": pruning_rate})
    return ["--dtype", "float32", "--enable-metrics", "--json-model-override-args", rate]


# Cache-aware routing matches the prompt text only, not the media: with the default thresholds (64 requests
# and 1.5x apart) a burst of media requests asking the same question all go to one worker. The README's
# recipe and the router test use these.
MEDIA_BALANCE_ARGS = ("--balance-abs-threshold", "4", "--balance-rel-threshold", "1.2")


def _router_base(port: int) -> list[str]:
    # its Prometheus exporter takes port 29000 by default: a second router on the machine would not start
    return [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
    ]  # fmt: skip


def router_command(
    worker_urls: Sequence[str], port: int, policy: str = "cache_aware", extra: Sequence[str] = ()
) -> list[str]:
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


@contextmanager
def _running(command: Sequence[str], port: int, worker_urls: Sequence[str], log_path: str | Path):
    """Launch a router command listening on `port`, wait until it lists every worker healthy, yield it,
    always stop it."""
    process = spawn(command, log_path)
    base_url = f"http://127.0.0.1:{port}"

    def every_worker_listed() -> bool:  # the router registers them in the background
        return len(healthy_workers(base_url)) == len(worker_urls)

    try:
        wait_ready(every_worker_listed, process, log_path, "router", timeout=120, interval=0.5)
        yield RunningServer(base_url, process, Path(log_path))
    finally:
        stop(process)


@contextmanager
def running_router(
    worker_urls: Sequence[str], log_path: str | Path, policy: str = "cache_aware", extra: Sequence[str] = ()
) -> Iterator[RunningServer]:
    """Launch the router, wait until it lists every worker healthy, yield it, always stop it."""
    port = free_port()
    with _running(router_command(worker_urls, port, policy, extra), port, worker_urls, log_path) as router:
        yield router


@contextmanager
def running_pd_router(
    prefill: RunningServer,
    decode: RunningServer | Sequence[RunningServer],
    bootstrap_port: int,
    log_path: str | Path,
    extra: Sequence[str] = (),
) -> Iterator[RunningServer]:
    """The router in PD mode in front of a running prefill server and one decode server or several
    (`server.pd_launches`, `server.pd_decode_launch`), with more router flags in `extra`, once it lists
    them all healthy; always stopped."""
    decodes = [decode] if isinstance(decode, RunningServer) else list(decode)
    port = free_port()
    command = pd_router_command(prefill.base_url, bootstrap_port, [d.base_url for d in decodes], port, extra)
    with _running(command, port, [prefill.base_url, *(d.base_url for d in decodes)], log_path) as router:
        yield router
