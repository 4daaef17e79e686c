"""Start `python -m sglang_router.launch_router` (PyPI `sglang-router`) in front of running workers."""

import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

from sglang_evs.testing.server import RunningServer, free_port, stop


def worker_args(pruning_rate: float) -> list[str]:
    """Arguments of a router's worker: float32, Prometheus metrics, and a server-wide EVS rate (what a
    `/generate` request through the router gets: the router drops its `mm_processor_kwargs`)."""
    rate = json.dumps({"video_pruning_rate": pruning_rate})
    return ["--dtype", "float32", "--enable-metrics", "--json-model-override-args", rate]


def router_command(
    worker_urls: Sequence[str], port: int, policy: str = "cache_aware", extra: Sequence[str] = ()
) -> list[str]:
    # its Prometheus exporter takes port 29000 by default: a second router on the machine would not start
    return [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
        "--worker-urls", *worker_urls,
        "--policy", policy, *extra,
    ]  # fmt: skip


def healthy_workers(base_url: str) -> list[str]:
    """The URLs of the workers the router lists as healthy (`GET /workers`, sglang-router 0.3)."""
    body = requests.get(f"{base_url}/workers", timeout=5).json()
    return [worker["url"] for worker in body["workers"] if worker.get("is_healthy")]


def wait_router(base_url: str, process: subprocess.Popen, log_path: Path, workers: int, timeout: float = 120) -> None:
    """Until the router lists `workers` healthy workers (it registers them in the background)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"router exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if len(healthy_workers(base_url)) == workers:
                return
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"router not ready after {timeout}s:\n{log_path.read_text()[-4000:]}")


@contextmanager
def running_router(
    worker_urls: Sequence[str], log_path: str | Path, policy: str = "cache_aware", extra: Sequence[str] = ()
) -> Iterator[RunningServer]:
    """Launch the router, wait until it lists every worker healthy, yield it, always stop it."""
    port = free_port()
    log = open(log_path, "w")  # noqa: SIM115 - owned by the child for its lifetime
    process = subprocess.Popen(
        router_command(worker_urls, port, policy, extra), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_router(base_url, process, Path(log_path), len(worker_urls))
        yield RunningServer(base_url, process, Path(log_path))
    finally:
        stop(process)
