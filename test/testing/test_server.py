"""The CPU server harness: a multi-rank server gets its core groups, a server may get cores of its own,
servers get ports nobody races for."""

import os
import sys

from sglang_evs.runtime import rank_binding
from sglang_evs.testing import server


def test_start_server_hands_the_binding_to_the_server(monkeypatch, tmp_path):
    seen = {}

    class Popen:
        def __init__(self, cmd, env, **kwargs):
            seen.update(cmd=cmd, env=env)

    monkeypatch.setattr(server.subprocess, "Popen", Popen)
    monkeypatch.setattr(rank_binding.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv(rank_binding.THREADS_BIND_ENV, raising=False)
    server.start_server(tmp_path, tmp_path / "log", ["--dp-size", "2"], port=1)
    assert seen["env"][rank_binding.THREADS_BIND_ENV] == "0|1"
    server.start_server(tmp_path, tmp_path / "log", ["--tp-size", "2"], port=1, cpu=False)
    assert rank_binding.THREADS_BIND_ENV not in seen["env"]


def test_a_server_given_cores_runs_only_on_them_with_as_many_torch_threads(monkeypatch, tmp_path):
    first_core = min(os.sched_getaffinity(0))
    report_cores = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    child = server.spawn(report_cores, tmp_path / "child.log", cores=[first_core])
    assert child.wait(timeout=60) == 0
    assert (tmp_path / "child.log").read_text().strip() == f"[{first_core}]"

    seen = {}

    def spawn(cmd, log_path, env=None, cores=None):
        seen.update(env=env, cores=cores)
        return child

    monkeypatch.setattr(server, "spawn", spawn)
    server.start_server(tmp_path, tmp_path / "log", port=1, cores=[0, 1])
    assert (seen["env"]["OMP_NUM_THREADS"], seen["cores"]) == ("2", [0, 1])


def test_free_ports_are_distinct_and_out_of_the_ranges_others_pick_at_random():
    ephemeral_low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = [server.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(port < 22000 and port < ephemeral_low for port in ports)  # SGLang's own: 22000-29999
