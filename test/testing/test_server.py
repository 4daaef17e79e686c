"""The CPU server harness: one core group per scheduler rank when several ranks are asked for."""

import pytest

from sglang_evs.testing import server


@pytest.mark.parametrize(
    ("args", "ranks"),
    [
        ((), 1),
        (("--tp-size", "2"), 2),
        (("--dp-size", "2", "--tp-size", "2"), 4),
        (("--tensor-parallel-size=2", "--pp-size", "3"), 6),
        (("--dp", "2", "--dtype", "float32"), 2),
        (("--json-model-override-args", '{"tp-size": 4}'), 1),
    ],
)
def test_ranks_asked_multiplies_tp_dp_pp(args, ranks):
    assert server.ranks_asked(args) == ranks


@pytest.mark.parametrize(
    ("ranks", "cores", "binding"),
    [
        (2, [0, 1], "0|1"),
        (2, [3, 0, 1, 2], "0,1|2,3"),
        (3, range(8), "0,1,2|3,4,5|6,7"),
        (4, [0, 1], "0|1|0|1"),
        (1, [0, 1], "0,1"),
    ],
)
def test_thread_binding_gives_each_rank_its_own_cores(ranks, cores, binding):
    assert server.thread_binding(ranks, cores) == binding


def test_binding_only_for_several_ranks_and_never_over_the_callers(monkeypatch):
    monkeypatch.setattr(server.os, "sched_getaffinity", lambda pid: {0, 1})
    assert server.cpu_rank_environment(["--tp-size", "1"], {}) == {}
    assert server.cpu_rank_environment(["--tp-size", "2"], {}) == {server.THREADS_BIND_ENV: "0|1"}
    assert server.cpu_rank_environment(["--dp-size", "2"], {server.THREADS_BIND_ENV: "1|0"}) == {}


def test_start_server_hands_the_binding_to_the_server(monkeypatch, tmp_path):
    seen = {}

    class Popen:
        def __init__(self, cmd, env, **kwargs):
            seen.update(cmd=cmd, env=env)

    monkeypatch.setattr(server.subprocess, "Popen", Popen)
    monkeypatch.setattr(server.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv(server.THREADS_BIND_ENV, raising=False)
    server.start_server(tmp_path, tmp_path / "log", ["--dp-size", "2"], port=1)
    assert seen["env"][server.THREADS_BIND_ENV] == "0|1"
    server.start_server(tmp_path, tmp_path / "log", ["--tp-size", "2"], port=1, cpu=False)
    assert server.THREADS_BIND_ENV not in seen["env"]
