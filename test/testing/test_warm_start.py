"""The test launcher's warm interpreter (`sglang_evs.testing.warm_start`); every CPU server test goes through it."""

import os

import pytest

from sglang_evs.testing import warm_start

# These checks fork `python -m json.tool`: their warm interpreters need not import SGLang first.
LIGHT = {warm_start.PRELOAD_ENV: "json.tool"}


@pytest.fixture(autouse=True)
def own_warm_interpreters(monkeypatch):
    """These tests start and close warm interpreters of their own, leaving the session's servers' ones alone."""
    monkeypatch.setattr(warm_start, "_starters", {})
    monkeypatch.setattr(warm_start, "started", [])
    yield
    for starter in warm_start._starters.values():
        starter.close()


def test_a_warm_start_runs_the_module_as_python_m_would_in_its_own_session(tmp_path):
    """`python -m json.tool FILE` forked from a warm interpreter: its argv, its output in its log, its exit
    status; an import-time variable gives another warm interpreter (every server stop signals the child's
    own process group, which exists only if the child became a session leader)."""
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"a": 1}')
    bad.write_text("{")
    env = {**os.environ, **LIGHT, "SGLANG_EVS_TRACE": str(tmp_path / "unused.jsonl")}
    ok = warm_start.start("json.tool", [str(good)], env, str(tmp_path / "ok.log"), None)
    assert ok.wait(timeout=120) == 0 and '"a": 1' in (tmp_path / "ok.log").read_text()
    failed = warm_start.start("json.tool", [str(bad)], env, str(tmp_path / "failed.log"), None)
    assert failed.wait(timeout=60) == 1 and "Expecting" in (tmp_path / "failed.log").read_text()
    assert len({warm_start.import_key(env), warm_start.import_key({**env, "OTHER": "1"})}) == 2


def test_the_test_name_pytest_sets_does_not_count_and_idle_warm_interpreters_are_closed(tmp_path):
    """pytest names the running test in the environment: servers of different tests share a warm
    interpreter. Once more import-time environments than `KEPT_IDLE` were used, the oldest idle ones close."""
    base = {**os.environ, **LIGHT, "PYTEST_CURRENT_TEST": "a"}
    assert warm_start.import_key(base) == warm_start.import_key({**base, "PYTEST_CURRENT_TEST": "b"})
    imported_sglang = {**base, "TORCHINDUCTOR_CACHE_DIR": "/root/.cache/sglang/inductor", "DG_JIT_USE_NVRTC": "0"}
    assert warm_start.import_key(base) == warm_start.import_key(imported_sglang)  # SGLang's import sets them
    good = tmp_path / "good.json"
    good.write_text("{}")
    started = [
        warm_start.start("json.tool", [str(good)], {**base, "WARM_TEST_KEY": str(i)}, str(tmp_path / f"{i}.log"), None)
        for i in range(warm_start.KEPT_IDLE + 2)
    ]
    for process in started:
        assert process.wait(timeout=120) == 0
    warm_start.start("json.tool", [str(good)], {**base, "WARM_TEST_KEY": "last"}, str(tmp_path / "last.log"), None)
    keys = [dict(key).get("WARM_TEST_KEY") for key in warm_start._starters]
    assert len([key for key in keys if key is not None]) <= warm_start.KEPT_IDLE + 1
    assert started[0].starter.process.poll() is not None  # the oldest idle one was closed


def test_a_script_runs_to_its_exit_with_its_own_streams_and_each_new_interpreter_says_why(tmp_path):
    """`run` forks a script as `python path` runs it (its folder importable), its stdout apart from its stderr;
    `why_started` names the variable that made a second warm interpreter."""
    (tmp_path / "helper.py").write_text("WORD = 'from the folder'\n")
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, helper\nprint(helper.WORD, sys.argv[1:])\nprint('noise', file=sys.stderr)\nsys.exit(3)\n"
    )
    base = {**os.environ, **LIGHT}
    done = warm_start.run(str(script), ["x"], base, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (3, "from the folder ['x']\n", "noise\n")
    assert warm_start.run(str(script), ["y"], {**base, "WARM_TEST_KEY": "2"}, timeout=120).returncode == 3
    assert warm_start.why_started() == ["WARM_TEST_KEY=2"]
