"""Shared by the stand-in tests: upstream's own Triton kernels as the oracle, run under Triton's interpreter,
and fresh interpreters on the CPU route, where the runtime's import fixes act."""

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


def run_on_cpu_route(code: str) -> str:
    """Run `code` (dedented) in a fresh interpreter with the CPU runtime active; its stdout."""
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    env.pop("SGLANG_EVS_DISABLE_CPU_RUNTIME", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="session")
def cpu_route():
    return run_on_cpu_route
