"""CPU servers forked from a warm interpreter that has imported SGLang already.

A tiny CPU server spends about 6 s of its 10 s start importing SGLang (`python -m sglang.launch_server`),
and a test session starts over a hundred. A `WarmStarter` is one long-lived interpreter, per environment
that matters at import time, which imports the launcher's modules once and then forks one child per server:
the child takes its own session, environment, cores and log, and runs the launcher module as
`python -m` would (`runpy`, `__main__`). Nothing of SGLang's is called before the fork: the child loads
the plugins (or not: `SGLANG_PLUGINS=none`) and starts the server as a fresh process does. What every
server start would import anyway is imported before the fork (`PRELOAD`, `_import_what_a_server_start_imports`),
and the garbage collector's view of it frozen, so that no child walks it (a server start's `gc.collect()`
took 0.7 s of its own otherwise).

The same fork runs a test's helper script or module in place of a fresh interpreter (`run`): a probe of SGLang's
registry, a graph-runner worker, a snippet worker (`snippet_worker`), each saving the ~10 s of importing SGLang.

Protocol: one JSON line per request on the warm interpreter's stdin, one JSON line back on its stdout.
  {"start": {"module" | "path", "argv", "env", "log", "stdout", "cores"}} -> {"pid": N}
    (`stdout`: a file of its own for the child's standard output; None: the log takes both streams)
  {"poll": N} -> {"returncode": int | None}   (only the warm interpreter can wait for its children)
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence

# Read while a server runs, not when SGLang is imported: servers that differ only in these share one
# warm interpreter. Any other difference in the environment gets a warm interpreter of its own.
RUNTIME_ENV = frozenset({
    "PYTEST_CURRENT_TEST",  # pytest's, different in every test
    "SGLANG_PLUGINS", "SGLANG_EVS_TRACE", "SGLANG_EVS_TRACE_POSITIONS", "SGLANG_EVS_TRACE_TRANSFERS", "OMP_NUM_THREADS",
    "SGLANG_CPU_OMP_THREADS_BIND", "SGLANG_EVS_TEST_PERTURB_MASKS", "SGLANG_EVS_ENCODER_PATCH_BUDGET",
    "SGLANG_EVS_TEST_SKIP_GRAPH_BUFFERS",  # read when the model is built
    "MOONCAKE_PROTOCOL", "MC_MIN_RPC_PORT", "MC_MAX_RPC_PORT",  # read when a PD server's transfer engine starts
    "SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL",  # read when a --language-only server's tokenizer starts
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",  # read when a prefill server's KV manager starts
    "SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT",  # read when a server starts its HTTP tokenizer workers
    "SGLANG_VLM_CACHE_SIZE_MB",  # read when a server sizes its embedding cache
    "SGLANG_MAMBA_CONV_DTYPE",  # read when a hybrid model's state pool is sized
    "SGLANG_EVS_HELD_VIDEO_MB",  # read by the plugin per request
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH",  # read by the crash handler
    "OPENAI_API_KEY",  # set by SGLang's run_eval in a test process (MMMU); read by clients only
    "PATH",  # decord appends its own folder when a test process imports it; nothing imported reads it
})  # fmt: skip
# Set by SGLang itself when it is imported (its third-party cache directories, from SGLANG_CACHE_DIR; kernel
# options): a test process that imported SGLang passes them on to its servers, one that has not does not, and both
# kinds of server import the same. Not part of the import key, so that neither gets a warm interpreter of its own.
SET_BY_IMPORTING_SGLANG = frozenset({
    "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH", "TILELANG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
    "DG_JIT_CACHE_DIR", "DG_JIT_USE_NVRTC", "TLLM_LOG_LEVEL",
})  # fmt: skip
KEPT_IDLE = 4  # warm interpreters (about 0.7 GB each) kept once none of their servers runs
PRELOAD = (
    "sglang.launch_server", "sglang.srt.entrypoints.http_server", "sglang_evs.launch_server",
    "sglang.srt.models.registry",  # imports every model module of SGLang: 1.4 s of CPU per server start
)  # fmt: skip
# Comma-separated modules a warm interpreter imports instead of `PRELOAD` (the launcher's own checks start
# interpreters that need no SGLang); an import-time variable, so such interpreters are never a server's.
PRELOAD_ENV = "SGLANG_EVS_WARM_PRELOAD"


class WarmProcess:
    """What the tests use of `subprocess.Popen` for a server forked by a `WarmStarter`."""

    def __init__(self, starter: WarmStarter, pid: int) -> None:
        self.starter, self.pid, self.returncode = starter, pid, None
        starter.children.append(self)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.starter.poll(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"server pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]


class WarmStarter:
    def __init__(self, env: dict[str, str], log_path: str) -> None:
        """`log_path`: the warm interpreter's own output (SGLang's import-time warnings, its errors)."""
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True,
            )  # fmt: skip
        self.lock = threading.Lock()
        self.children: list[WarmProcess] = []
        # Not waited for: the interpreter imports while its caller goes on, and answers the first request once ready.

    def idle(self) -> bool:
        return all(child.poll() is not None for child in self.children)

    def _ask(self, request: dict) -> dict:
        with self.lock:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            with open(self.log_path, errors="replace") as log:
                raise RuntimeError(f"the warm interpreter exited ({self.process.poll()}):\n{log.read()[-4000:]}")
        return json.loads(line)

    def start(
        self, target: str, argv: Sequence[str], env: dict[str, str], log: str, cores, stdout: str | None = None
    ) -> WarmProcess:
        request = {_target_kind(target): target, "argv": list(argv), "env": env, "log": str(log), "cores": cores,
                   "stdout": stdout}  # fmt: skip
        return WarmProcess(self, self._ask({"start": request})["pid"])

    def poll(self, pid: int) -> int | None:
        return self._ask({"poll": pid})["returncode"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


_starters: dict[tuple, WarmStarter] = {}
started: list[dict[str, str]] = []  # each warm interpreter's import-time environment, in the order they started


def import_key(env: dict[str, str]) -> tuple:
    ignored = RUNTIME_ENV | SET_BY_IMPORTING_SGLANG
    return tuple(sorted((key, value) for key, value in env.items() if key not in ignored))


def start(module: str, argv: Sequence[str], env: dict[str, str], log: str, cores) -> WarmProcess:
    """`python -m module *argv` with `env`, output to `log`, on `cores` (None: any), forked from the warm
    interpreter for `env` (started on first use, one per import-time environment)."""
    return _starter(env, f"{log}.warm-start.log").start(module, argv, env, log, cores)


def run(target: str, argv: Sequence[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`python target *argv` (a script's path, or a module's name as `python -m` takes it) with `env`, forked from
    the warm interpreter for `env`, run to its exit: its status, standard output and standard error."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        process = _starter(env, f"{err}.warm-start.log").start(target, argv, env, err, None, stdout=out)
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            raise
        with open(out, errors="replace") as stdout, open(err, errors="replace") as stderr:
            return subprocess.CompletedProcess([target, *argv], returncode, stdout.read(), stderr.read())


def _target_kind(target: str) -> str:
    return "path" if target.endswith(".py") else "module"


def prestart(env: dict[str, str], log: str) -> None:
    """Start the warm interpreter for `env` now, without waiting for its imports: a test session that will
    start servers overlaps the ~10 s of importing SGLang with its own collection and unit tests."""
    _starter(env, log)


def _starter(env: dict[str, str], log: str) -> WarmStarter:
    key = import_key(env)
    if key not in _starters:
        idle = [other for other, starter in _starters.items() if starter.idle()]
        for other in idle[: max(0, len(idle) - KEPT_IDLE + 1)]:  # the oldest idle ones go
            _starters.pop(other).close()
        _starters[key] = WarmStarter(dict(key), log)  # its environment: the key itself
        started.append(dict(key))
    _starters[key] = _starters.pop(key)  # the most recently used last
    return _starters[key]


def why_started() -> list[str]:
    """For each warm interpreter after the first, how its import-time environment differs from the one
    started before it: what a test pays about 10 s for (printed after a test session)."""
    lines = []
    for before, after in zip(started, started[1:], strict=False):
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        lines.append(", ".join(f"{k}={after.get(k, '(unset)')}" for k in changed))
    return lines


@atexit.register
def _close_all() -> None:
    for starter in _starters.values():
        starter.close()


# --- the warm interpreter ------------------------------------------------------------------------------


def _run_child(request: dict) -> None:
    """In the forked child: become the server process `request` describes, and never return."""
    code = 1
    try:
        os.setsid()
        if request["cores"] is not None:
            os.sched_setaffinity(0, request["cores"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "OMP_NUM_THREADS" in request["env"]:
            import torch

            torch.set_num_threads(int(request["env"]["OMP_NUM_THREADS"]))
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if request["stdout"] else log
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(log, 2)
        import runpy

        if "path" in request:  # as `python path` runs a script: its folder first on the import path
            sys.argv = [request["path"], *request["argv"]]
            sys.path.insert(0, os.path.dirname(os.path.abspath(request["path"])))
            runpy.run_path(request["path"], run_name="__main__")
        else:
            sys.argv = [request["module"], *request["argv"]]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:  # as the interpreter does: an int is the status, anything else is printed
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the child's last words go to its log
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:  # exited already
        return None


def _import_what_a_server_start_imports() -> None:
    """The modules a server start imports by walking a package or a lazy mapping (0.9 s of CPU per start),
    imported and nothing called: SGLang's multimodal processors (its `import_processors` fills its mapping
    in the child, as in a fresh process) and transformers' video processors (its `AutoVideoProcessor` walks them)."""
    import importlib
    import pkgutil

    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING

    processors = importlib.import_module("sglang.srt.multimodal.processors")
    for module in pkgutil.iter_modules(processors.__path__, f"{processors.__name__}."):
        try:
            importlib.import_module(module.name)
        except Exception:  # noqa: BLE001 - as SGLang does: a processor whose dependency is missing is skipped
            continue
    VIDEO_PROCESSOR_MAPPING.values()


def _serve() -> None:
    import gc
    import importlib

    preload = os.environ.get(PRELOAD_ENV)
    for name in preload.split(",") if preload else PRELOAD:
        importlib.import_module(name)
    if not preload:
        _import_what_a_server_start_imports()
    gc.freeze()
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        if "start" in request:
            out.flush()
            pid = os.fork()
            if pid == 0:
                _run_child(request["start"])
            while _session_of(pid) not in (pid, None):  # the caller may signal its group from now on
                time.sleep(0.001)
            reply: dict = {"pid": pid}
        else:  # {"poll": pid}
            done, status = os.waitpid(request["poll"], os.WNOHANG)
            reply = {"returncode": os.waitstatus_to_exitcode(status) if done else None}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
