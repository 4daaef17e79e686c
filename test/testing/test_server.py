"""The CPU server harness: a multi-rank server gets its core groups, servers get ports nobody races for."""

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


def test_free_ports_are_distinct_and_out_of_the_ranges_others_pick_at_random():
    ephemeral_low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = [server.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(port < 22000 and port < ephemeral_low for port in ports)  # SGLang's own: 22000-29999
