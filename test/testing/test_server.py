"""The CPU server harness: a multi-rank server gets its core groups, a server may get cores of its own,
servers get ports nobody races for."""

import os
import sys
from types import SimpleNamespace

from sglang_evs.runtime import rank_binding
from sglang_evs.testing import server


def capture_warm_starts(monkeypatch) -> dict:
    seen: dict = {}

    def start(module, argv, env, log, cores):
        seen.update(module=module, argv=argv, env=env, cores=cores)
        return SimpleNamespace()

    monkeypatch.setattr(server.warm_start, "start", start)
    return seen


def test_start_server_hands_the_binding_to_the_server(monkeypatch, tmp_path):
    warm = capture_warm_starts(monkeypatch)
    cold = {}

    class Popen:
        def __init__(self, cmd, env, **kwargs):
            cold.update(cmd=cmd, env=env)

    monkeypatch.setattr(server.subprocess, "Popen", Popen)
    monkeypatch.setattr(rank_binding.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv(rank_binding.THREADS_BIND_ENV, raising=False)
    server.start_server(tmp_path, tmp_path / "log", ["--dp-size", "2"], port=1)
    assert warm["env"][rank_binding.THREADS_BIND_ENV] == "0|1"
    assert warm["module"] == "sglang.launch_server" and warm["argv"][:2] == ["--model-path", str(tmp_path)]
    server.start_server(tmp_path, tmp_path / "log", ["--tp-size", "2"], port=1, cpu=False)
    assert rank_binding.THREADS_BIND_ENV not in cold["env"]


def test_a_server_given_cores_runs_only_on_them_with_as_many_torch_threads(monkeypatch, tmp_path):
    first_core = min(os.sched_getaffinity(0))
    report_cores = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    child = server.spawn(report_cores, tmp_path / "child.log", cores=[first_core])
    assert child.wait(timeout=60) == 0
    assert (tmp_path / "child.log").read_text().strip() == f"[{first_core}]"

    warm = capture_warm_starts(monkeypatch)
    server.start_server(tmp_path, tmp_path / "log", port=1, cores=[0, 1])
    assert (warm["env"]["OMP_NUM_THREADS"], warm["cores"]) == ("2", [0, 1])


def test_free_ports_are_distinct_and_out_of_the_ranges_others_pick_at_random():
    ephemeral_low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = [server.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(port < 22000 and port < ephemeral_low for port in ports)  # SGLang's own: 22000-29999


def test_a_pd_pair_is_two_launches_over_mooncake_tcp_whose_ports_race_nobody(tmp_path):
    pd = server.pd_launches(tmp_path, tmp_path, ["--dtype", "float32"])
    prefill, decode = pd.prefill.extra_args, pd.decode.extra_args
    assert prefill[:2] == decode[:2] == ["--dtype", "float32"]
    assert prefill[prefill.index("--disaggregation-mode") + 1] == "prefill"
    assert decode[decode.index("--disaggregation-mode") + 1] == "decode"
    assert prefill[prefill.index("--disaggregation-bootstrap-port") + 1] == str(pd.bootstrap_port)
    for args in (prefill, decode):
        assert args[args.index("--disaggregation-transfer-backend") + 1] == "mooncake"
    assert pd.prefill.env == pd.decode.env and pd.prefill.env["MOONCAKE_PROTOCOL"] == "tcp"
    # Mooncake's own ports: above SGLang's random range and the launcher's, below the kernel's ephemeral one
    ephemeral_low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    low, high = int(pd.prefill.env["MC_MIN_RPC_PORT"]), int(pd.prefill.env["MC_MAX_RPC_PORT"])
    assert 29999 < low < high < ephemeral_low and server.PORT_WINDOW.stop <= low
    # read when the transfer engine starts: a pair shares the warm interpreter of plain servers
    assert set(server.PD_ENV) <= server.warm_start.RUNTIME_ENV


def test_a_decode_server_of_a_mixed_fleet_takes_its_own_arguments_and_environment(tmp_path):
    pd = server.pd_launches(tmp_path, tmp_path, ["--dtype", "float32"], {"SGLANG_EVS_TRACE": "p.jsonl"})
    plain = {"SGLANG_PLUGINS": "none"}
    other = server.pd_decode_launch(tmp_path, tmp_path / "other.log", ["--dtype", "bfloat16"], plain)
    assert other.extra_args == ["--dtype", "bfloat16", *pd.decode.extra_args[2:]]  # the same PD flags
    assert other.env == {**server.PD_ENV, "SGLANG_PLUGINS": "none"} and "SGLANG_EVS_TRACE" not in other.env
    assert pd.decode.env == pd.prefill.env  # a pair's decode server gets the pair's environment
