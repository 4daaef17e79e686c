"""Shared by the stand-in tests: upstream's own Triton kernels as the oracle, run under Triton's interpreter,
and interpreters on the CPU route, where the runtime's import fixes act."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from sglang_evs.testing import warm_start


def run_under_triton_interpreter(source: str) -> dict:
    """Run `source` in a fresh interpreter with `TRITON_INTERPRET=1` (it must be set before Triton is
    imported) and return the JSON object it printed on its `RESULT ` line."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.fixture(scope="session")
def triton_interpreter():
    return run_under_triton_interpreter


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that runs upstream's Triton kernels under the interpreter (directly or through a fixture) is a
    long run, 5-15 s of interpreted kernels: slow tier. The stand-ins' own tests stay in the quick tier."""
    for item in items:
        if "triton_interpreter" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


class CpuRouteWorker:
    """A snippet worker (`sglang_evs.testing.snippet_worker`) on the CPU route, forked from the warm interpreter
    for its environment: SGLang is imported once per environment instead of once per test."""

    def __init__(self, extra_env: dict[str, str]) -> None:
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", **extra_env}
        env.pop("SGLANG_EVS_DISABLE_CPU_RUNTIME", None)
        self.folder = tempfile.TemporaryDirectory()
        requests, replies, log = (os.path.join(self.folder.name, name) for name in ("requests", "replies", "log"))
        os.mkfifo(requests)
        os.mkfifo(replies)
        self.log = log
        self.process = warm_start.start("sglang_evs.testing.snippet_worker", [requests, replies], env, log, None)
        self.requests = open(requests, "w")  # noqa: SIM115 - open while the worker lives
        self.replies = open(replies)  # noqa: SIM115

    def run(self, code: str) -> str:
        """Run `code` (dedented); its stdout. An exception in it fails the calling test with its traceback."""
        self.requests.write(json.dumps(textwrap.dedent(code)) + "\n")
        self.requests.flush()
        line = self.replies.readline()
        assert line, f"the CPU-route worker exited:\n{open(self.log, errors='replace').read()[-3000:]}"
        reply = json.loads(line)
        assert reply["ok"], reply["out"][-3000:]
        return reply["out"]

    def close(self) -> None:
        self.requests.close()
        self.process.wait(timeout=60)
        self.replies.close()
        self.folder.cleanup()


@pytest.fixture(scope="session")
def cpu_route_workers():
    workers: dict[tuple, CpuRouteWorker] = {}
    yield workers
    for worker in workers.values():
        worker.close()


@pytest.fixture(scope="session")
def cpu_route(cpu_route_workers):
    """`cpu_route(code, **env)`: run `code` on the CPU route (with `env` added to the environment); its stdout."""

    def run(code: str, **extra_env: str) -> str:
        key = tuple(sorted(extra_env.items()))
        if key not in cpu_route_workers:
            cpu_route_workers[key] = CpuRouteWorker(extra_env)
        return cpu_route_workers[key].run(code)

    return run
