"""Shared by the stand-in tests: upstream's own Triton kernels as the oracle, run under Triton's interpreter,
and interpreters on the CPU route, where the runtime's import fixes act."""

import json
import os
import subprocess
import sys
import textwrap

import pytest


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


# A long-lived interpreter on the CPU route that runs snippets one after another, each in a namespace of
# its own: SGLang is imported once per environment instead of once per test. The runtime's fixes act at
# import, whatever imported the module first, so a snippet sees the same wiring as a fresh interpreter.
WORKER = """
import contextlib, io, json, sys, traceback
for line in sys.stdin:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(json.loads(line), "<snippet>", "exec"), {"__name__": "__snippet__"})
        ok = True
    except BaseException:
        ok = False
        out.write(traceback.format_exc())
    sys.__stdout__.write(json.dumps({"ok": ok, "out": out.getvalue()}) + "\\n")
    sys.__stdout__.flush()
"""


class CpuRouteWorker:
    def __init__(self, extra_env: dict[str, str]) -> None:
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", **extra_env}
        env.pop("SGLANG_EVS_DISABLE_CPU_RUNTIME", None)
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
        self.process = subprocess.Popen([sys.executable, "-c", WORKER], env=env, text=True, **pipes)

    def run(self, code: str) -> str:
        """Run `code` (dedented); its stdout. An exception in it fails the calling test with its traceback."""
        self.process.stdin.write(json.dumps(textwrap.dedent(code)) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        while line and not line.startswith('{"ok": '):  # anything an import wrote to the real stdout
            line = self.process.stdout.readline()
        assert line, "the CPU-route worker exited"
        reply = json.loads(line)
        assert reply["ok"], reply["out"][-3000:]
        return reply["out"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


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
