"""One core group per scheduler rank when several ranks are asked for on the CPU route."""

import pytest

from sglang_evs.runtime import rank_binding


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
    assert rank_binding.ranks_asked(args) == ranks


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
    assert rank_binding.thread_binding(ranks, cores) == binding


def test_binding_only_for_several_ranks_and_never_over_the_callers(monkeypatch):
    monkeypatch.setattr(rank_binding.os, "sched_getaffinity", lambda pid: {0, 1})
    assert rank_binding.cpu_rank_environment(["--tp-size", "1"], {}) == {}
    assert rank_binding.cpu_rank_environment(["--tp-size", "2"], {}) == {rank_binding.THREADS_BIND_ENV: "0|1"}
    assert rank_binding.cpu_rank_environment(["--dp-size", "2"], {rank_binding.THREADS_BIND_ENV: "1|0"}) == {}


def test_core_groups_split_contiguously_and_share_round_robin():
    assert rank_binding.core_groups(2, [3, 0, 1, 2]) == [[0, 1], [2, 3]]
    assert rank_binding.core_groups(2, [0, 1, 2]) == [[0, 1], [2]]
    assert rank_binding.core_groups(4, [0, 1]) == [[0], [1], [0], [1]]
