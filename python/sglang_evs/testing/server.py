"""Start `python -m sglang.launch_server` as a subprocess on CPU and wait until it serves."""

import functools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import requests

from sglang_evs import sglang_compat as sglang
from sglang_evs.runtime.graph_mode import GRAPH_MODE_ENV
from sglang_evs.runtime.rank_binding import cpu_rank_environment
from sglang_evs.testing import warm_start

COLD_START_ENV = "SGLANG_EVS_TEST_COLD_START"

CPU_SERVER_ARGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--max-total-tokens", "16384",
    "--sleep-on-idle",  # an idle scheduler otherwise busy-polls a whole core
)  # fmt: skip

# Models with linear-attention layers (Qwen3.5's Gated DeltaNet) keep per-request recurrent state in
# SGLang's Mamba pool. On CPU: its radix cache only without the extra state buffer, no overlap
# scheduler, and a capped pool (by default it reserves about 5.8 GB here).
HYBRID_CPU_SERVER_ARGS = (
    "--mamba-radix-cache-strategy", "no_buffer",
    "--disable-overlap-schedule",
    "--max-mamba-cache-size", "64",
)  # fmt: skip

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
CPU_ROUTE_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1"}
CPU_ENV = {**CPU_ROUTE_ENV, **OFFLINE_ENV}
# A server a test stops is not a crash to diagnose: SGLang's crash handler, which a stop by signal runs in every
# server that has served a request, otherwise sleeps 5 s "to let GPU activity settle" before its py-spy dump.
STOP_WITHOUT_DIAGNOSTICS_ENV = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}
# A tiny model's forwards are too small for several threads to pay: with two, a server's processes (tokenizer,
# scheduler) and the servers beside it spin in OpenMP waits on the same two cores. One thread each halved a
# three-server module's time (57 s -> 28 s, its CPU time 71 s -> 32 s). A server given cores gets one per core.
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1"}


def server_environment(
    cpu: bool, extra: dict[str, str] | None = None, base: dict[str, str] | None = None, server_args: Sequence[str] = ()
) -> dict:
    """The server's environment. A test process runs with the CPU route set (scripts/cpu_env.sh), so
    a GPU server gets this process's environment without it: SGLang would otherwise pick its CPU
    platform and the plugin its CPU runtime. A CPU server with several ranks (`server_args`) gets one
    core group per rank unless the environment names them."""
    env = dict(os.environ if base is None else base)
    if not cpu:
        for key in CPU_ROUTE_ENV:
            env.pop(key, None)
    threads = ONE_THREAD_ENV if cpu and "OMP_NUM_THREADS" not in env else {}
    env = {**env, **(CPU_ENV if cpu else OFFLINE_ENV), **STOP_WITHOUT_DIAGNOSTICS_ENV, **threads, **(extra or {})}
    return {**env, **cpu_rank_environment(server_args, env)} if cpu else env


def graph_mode_env(graph_mode: bool) -> dict[str, str]:
    return {GRAPH_MODE_ENV: "1"} if graph_mode else {}


# A graph-mode server captures prefill graphs for token buckets up to this many unless its test names its own:
# SGLang's default buckets run to 4096, and the twelve from 1280 up cost most of a tiny server's 7 s of prefill
# capture on CPU, for forwards no test here sends (a larger forward runs eagerly, as on a GPU).
GRAPH_MODE_PREFILL_TOKENS = ("--cuda-graph-max-bs-prefill", "1024")
PREFILL_BUCKET_FLAGS = ("--cuda-graph-max-bs-prefill", "--cuda-graph-bs-prefill")
# The plugin turns its models' prefill graphs on only where the server's default prunes
# (`plugin.prefill_graphs_serve_pruning`); a graph-mode test server that must replay them for pruned videos gets
# a default that prunes (where each of its requests names its own rate) or names the backend (where its q = 0
# requests carry no pruning fields: the flag is SGLang's own, honoured for any model as upstream honours it).
PRUNING_DEFAULT_ARGS = ("--json-model-override-args", '{"video_pruning_rate": 0.5}')
PREFILL_GRAPHS_BY_FLAG = ("--cuda-graph-backend-prefill", "breakable")


def graph_mode_args(graph_mode: bool, args: Sequence[str]) -> tuple[str, ...]:
    """The prefill-bucket cap a graph-mode server gets where `args` name no buckets of their own."""
    named = any(flag in args for flag in PREFILL_BUCKET_FLAGS)
    return GRAPH_MODE_PREFILL_TOKENS if graph_mode and not named else ()


def is_hybrid(model_path: str | Path) -> bool:
    """Whether a local checkpoint has linear-attention layers (False where there is no config.json)."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return False
    config = json.loads(config_file.read_text())
    layer_types = config.get("text_config", config).get("layer_types") or []
    return "linear_attention" in layer_types


def cpu_server_args(model_path: str | Path) -> tuple[str, ...]:
    return CPU_SERVER_ARGS + (HYBRID_CPU_SERVER_ARGS if is_hybrid(model_path) else ())


# A server binds its HTTP port only after loading the model, seconds after the port was chosen. A port
# from the kernel's ephemeral range (32768+, what bind(0) returns) can be taken meanwhile by any outgoing
# connection, e.g. the gloo links between TP ranks; SGLang picks its own internal ports (NCCL/dist-init)
# at random in 22000-29999. Ports handed out here come from below both, and none twice per process.
PORT_WINDOW = range(12000, 22000)


def own_port_window() -> range:
    """This process's share of `PORT_WINDOW`: under pytest-xdist each worker (`PYTEST_XDIST_WORKER` gwN of
    `PYTEST_XDIST_WORKER_COUNT`) hands out ports from its own slice, so that two workers never pick one port."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", "gw0"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    size = len(PORT_WINDOW) // count
    start = PORT_WINDOW.start + size * int(worker.removeprefix("gw"))
    return range(start, start + size)


_ports_given: set[int] = set()


def local_url(port: int) -> str:
    """The address of this machine's server at `port`."""
    return f"http://127.0.0.1:{port}"


def free_port() -> int:
    """A port that is free now and outside the ranges other processes pick from at random."""
    window = own_port_window()
    for port in random.sample(window, 256):
        if port in _ports_given:
            continue
        try:
            with socket.socket() as s:
                s.bind(("0.0.0.0", port))
        except OSError:
            continue
        _ports_given.add(port)
        return port
    raise RuntimeError(f"no free port in {window.start}-{window.stop - 1}")


@dataclass
class RunningServer:
    base_url: str
    process: subprocess.Popen | warm_start.WarmProcess
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None


def stop(*processes: subprocess.Popen | warm_start.WarmProcess) -> None:
    """Stop each server's whole process group: all are signalled first, then waited for together (a PD or
    multi-rank server takes seconds to wind down, and a module stops up to twelve)."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        # SIGINT: SGLang's server stops in well under a second (SIGTERM: about 6 s, measured on 0.5.23).
        os.killpg(process.pid, signal.SIGINT)
    deadline = time.monotonic() + 20
    for process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start_server(
    model_path: str | Path,
    log_path: str | Path,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    port: int | None = None,
    cpu: bool = True,
    cores: Sequence[int] | None = None,
    launcher: str = "sglang.launch_server",
    graph_mode: bool = False,
) -> subprocess.Popen:
    """`cpu=False` adds none of the CPU arguments and environment (a GPU run names its own). `cores`:
    the only CPU cores the server's processes may run on, and as many torch threads (a worker with
    cores of its own, as a GPU worker has its own GPU); None: every core this process may use.
    `launcher`: the module run with `python -m` (`sglang_evs.launch_server` takes vLLM's pruning flags).
    `graph_mode`: a CPU server resolves and captures CUDA graphs as a CUDA server does, SGLang's own
    decode and prefill graph runners replaying on CPU stand-ins (`runtime/graph_mode.py`).
    A CPU server is forked from a warm interpreter with SGLang imported (`warm_start`; `COLD_START_ENV=1`:
    a fresh `python -m` process instead)."""
    port = port or free_port()
    # SGLang picks its torch.distributed port at random from one range in every server; servers started
    # together have drawn the same one (EADDRINUSE at startup): each gets its own from this process. Not
    # with data-parallel replicas: given one port, every replica's group would bind it.
    own_port = not {"--nccl-port", "--dp-size"} & set(extra_args)
    nccl_port = ("--nccl-port", str(free_port())) if own_port else ()
    args = [
        "--model-path", str(model_path),
        "--host", "127.0.0.1", "--port", str(port), *nccl_port,
        *(cpu_server_args(model_path) if cpu else ()), *extra_args, *graph_mode_args(graph_mode and cpu, extra_args),
    ]  # fmt: skip
    environment = server_environment(cpu, {**(env or {}), **graph_mode_env(graph_mode)}, server_args=extra_args)
    if cores is not None:
        environment["OMP_NUM_THREADS"] = str(len(cores))
    # A warm interpreter's child opens the log itself, later: an earlier server's log at the same path (a benchmark's
    # work folder) would say "ready" before this one had started.
    Path(log_path).unlink(missing_ok=True)
    if cpu and os.environ.get(COLD_START_ENV) != "1":
        pinned = None if cores is None else list(cores)
        process = warm_start.start(launcher, args, environment, str(log_path), pinned)
    else:
        process = spawn([sys.executable, "-m", launcher, *args], log_path, environment, cores)
    process.port = port  # type: ignore[attr-defined]
    return process


def run_to_exit(
    model_path: str | Path, extra_args: Sequence[str] = (), timeout: float = 240
) -> subprocess.CompletedProcess:
    """A CPU server run until it exits by itself (a refusal at startup), forked from the warm interpreter as
    `start_server` forks a server (`COLD_START_ENV=1`: a fresh process); its output is `stdout`."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        process = start_server(model_path, log, extra_args)
        try:
            returncode = process.wait(timeout=timeout)
        finally:
            stop(process)
        cmd = ["python", "-m", "sglang.launch_server", "--model-path", str(model_path), *extra_args]
        return subprocess.CompletedProcess(cmd, returncode, log.read_text(errors="replace"), "")


def spawn(
    cmd: Sequence[str], log_path: str | Path, env: dict[str, str] | None = None, cores: Sequence[int] | None = None
) -> subprocess.Popen:
    """A child in a process group of its own (`stop` ends the whole group), its output in `log_path`;
    it and its children run only on `cores` when given (the affinity is inherited)."""
    log = open(log_path, "w")  # noqa: SIM115 - owned by the child for its lifetime
    pin = None if cores is None else functools.partial(os.sched_setaffinity, 0, list(cores))
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=pin)


def wait_ready(
    is_ready: Callable[[], bool], process: subprocess.Popen, log_path: str | Path, what: str, timeout: float,
    interval: float = 0.25,
) -> None:  # fmt: skip
    """Poll `is_ready` (a request error counts as not yet) until it holds; a RuntimeError with the log's
    tail if `process` exits first, a TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{Path(log_path).read_text()[-4000:]}")
        try:
            if is_ready():
                return
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout}s:\n{Path(log_path).read_text()[-4000:]}")


READY_LINE = "The server is fired up and ready to roll!"  # SGLang logs it once its warm-up request was served


def wait_healthy(
    base_url: str, process, log_path: Path, timeout: float = 240, encoder_only: bool = False, warm_ups: int = 1
) -> None:
    """Until the server has served SGLang's own warm-up requests (its log says so, once per warm-up: one per
    tokenizer worker, `warm_ups`; a test request sent while one still decodes would share its batches); an
    `--encoder-only` server, which has no warm-up, until /health_generate answers (each call waits a second)."""

    def healthy() -> bool:
        if encoder_only:
            return requests.get(f"{base_url}/health_generate", timeout=10).status_code == 200
        log = Path(log_path)
        return log.exists() and log.read_text(errors="replace").count(READY_LINE) >= warm_ups

    wait_ready(healthy, process, log_path, "server", timeout)


@dataclass(frozen=True)
class Launch:
    """One server to start (arguments as `start_server`). `port`: its HTTP port where another server started
    with it must name its URL (a `--language-only` server its encoders', `--encoder-urls`); None: one is picked."""

    model_path: str | Path
    log_path: str | Path
    extra_args: Sequence[str] = ()
    env: dict[str, str] | None = None
    cpu: bool = True
    cores: Sequence[int] | None = None
    launcher: str = "sglang.launch_server"
    graph_mode: bool = False
    port: int | None = None


def tokenizer_workers(args: Sequence[str]) -> int:
    """HTTP tokenizer processes a server runs (`--tokenizer-worker-num`), each of which sends a warm-up request."""
    return sglang.server_flags(args).tokenizer_worker_num


def rank_count(args: Sequence[str]) -> int:
    """Processes a server runs its model in: the product of its tp, pp and dp sizes, by any of their names."""
    flags = sglang.server_flags(args)
    return flags.tp_size * flags.pp_size * flags.dp_size


@contextmanager
def running_servers(*launches: Launch, timeout: float = 240) -> Iterator[list[RunningServer]]:
    """Start the servers, wait for each one's warm-up, yield them in order, and always stop every process
    group. Servers start at once (a start is mostly one core importing and loading, so their starts
    overlap), but a graph-mode server of several ranks starts once the one before it is up: its ranks capture
    every graph in lockstep over gloo, and two such captures on the same cores slow each other down several
    times over (two TP=2 servers' decode graphs: 31 s together, 6 s one after the other).
    An idle server sleeps (`--sleep-on-idle`), so one that waits costs the one serving nothing."""
    processes: dict[int, subprocess.Popen] = {}

    def start(index: int) -> None:
        launch = launches[index]
        processes[index] = start_server(
            launch.model_path, launch.log_path, launch.extra_args, launch.env, port=launch.port, cpu=launch.cpu,
            cores=launch.cores, launcher=launch.launcher, graph_mode=launch.graph_mode,
        )  # fmt: skip

    def wait(index: int) -> RunningServer:
        launch, process = launches[index], processes[index]
        base_url = local_url(process.port)  # type: ignore[attr-defined]
        encoder_only = "--encoder-only" in launch.extra_args
        wait_healthy(
            base_url, process, Path(launch.log_path), timeout, encoder_only, tokenizer_workers(launch.extra_args)
        )
        return RunningServer(base_url, process, Path(launch.log_path))

    try:
        several = [i for i, launch in enumerate(launches) if launch.graph_mode and rank_count(launch.extra_args) > 1]
        for index in range(len(launches)):
            if index not in several:
                start(index)
        servers = {}
        for index in several:
            start(index)
            servers[index] = wait(index)
        servers.update({index: wait(index) for index in range(len(launches)) if index not in several})
        yield [servers[index] for index in range(len(launches))]
    finally:
        stop(*processes.values())


# Prefill/decode disaggregation over Mooncake's transfer engine, by TCP (its default is RDMA). The engine
# picks its RPC and TCP data ports at random in 15000-17000 by default, inside PORT_WINDOW, when a port
# handed out there may still wait for its server: it picks them between SGLang's random range and the
# kernel's ephemeral one instead.
PD_ENV = {"MOONCAKE_PROTOCOL": "tcp", "MC_MIN_RPC_PORT": "30000", "MC_MAX_RPC_PORT": "32000"}


def mooncake_missing() -> str | None:
    """Why Mooncake's transfer engine cannot load here (the setup installs it, and Debian's libibverbs1 where
    it can: `scripts/setup_env.sh` warns where it could not), or None: a PD pair can run."""
    try:
        import mooncake.engine  # noqa: F401
    except (ImportError, OSError) as error:
        return f"Mooncake's transfer engine does not load ({error}): install libibverbs1 and rerun the setup"
    return None


PD_TRANSFER_ARGS = ("--disaggregation-transfer-backend", "mooncake")


class PdLaunches(NamedTuple):
    """A prefill server and a decode server (`Launch`es for `running_servers`), and the port the prefill
    server's bootstrap listens on (the router names it beside the prefill URL)."""

    prefill: Launch
    decode: Launch
    bootstrap_port: int


def pd_launches(
    model_path: str | Path, folder: str | Path, extra_args: Sequence[str] = (), env: dict[str, str] | None = None
) -> PdLaunches:
    """A PD pair on the model with `extra_args` (each server's), logs `prefill.log` and `decode.log` in
    `folder`; started by `running_servers` like any other servers, put behind `router.running_pd_router`."""
    bootstrap_port = free_port()
    prefill = Launch(model_path, Path(folder) / "prefill.log", [
        *extra_args, *PD_TRANSFER_ARGS,
        "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap_port),
    ], {**PD_ENV, **(env or {})})  # fmt: skip
    decode = pd_decode_launch(model_path, Path(folder) / "decode.log", extra_args, env)
    return PdLaunches(prefill, decode, bootstrap_port)


def pd_decode_launch(
    model_path: str | Path, log_path: str | Path, extra_args: Sequence[str] = (), env: dict[str, str] | None = None
) -> Launch:
    """A decode server over Mooncake's TCP transport, for the prefill server of a `pd_launches` pair: one
    prefill server may serve several decode servers (each behind a router of its own, `running_pd_router`),
    which may differ from it in arguments and environment (a mixed fleet)."""
    decode_args = [*extra_args, *PD_TRANSFER_ARGS, "--disaggregation-mode", "decode"]
    return Launch(model_path, log_path, decode_args, {**PD_ENV, **(env or {})})


@contextmanager
def running_server(
    model_path: str | Path,
    log_path: str | Path,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 240,
    cpu: bool = True,
    cores: Sequence[int] | None = None,
    graph_mode: bool = False,
) -> Iterator[RunningServer]:
    """Launch one server (arguments as `start_server`), wait for /health_generate, yield, and always stop
    the whole process group."""
    launch = Launch(model_path, log_path, extra_args, env, cpu, cores, graph_mode=graph_mode)
    with running_servers(launch, timeout=timeout) as (server,):
        yield server
