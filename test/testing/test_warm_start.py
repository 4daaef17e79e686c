"""The test launcher's warm interpreter (`sglang_evs.testing.warm_start`); every CPU server test goes through it."""

import os

from sglang_evs.testing import warm_start


def test_a_warm_start_runs_the_module_as_python_m_would_in_its_own_session(tmp_path):
    """`python -m json.tool FILE` forked from a warm interpreter: its argv, its output in its log, its exit
    status; an import-time variable gives another warm interpreter (every server stop signals the child's
    own process group, which exists only if the child became a session leader)."""
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"a": 1}')
    bad.write_text("{")
    env = {**os.environ, "SGLANG_EVS_TRACE": str(tmp_path / "unused.jsonl")}
    ok = warm_start.start("json.tool", [str(good)], env, str(tmp_path / "ok.log"), None)
    assert ok.wait(timeout=120) == 0 and '"a": 1' in (tmp_path / "ok.log").read_text()
    failed = warm_start.start("json.tool", [str(bad)], env, str(tmp_path / "failed.log"), None)
    assert failed.wait(timeout=60) == 1 and "Expecting" in (tmp_path / "failed.log").read_text()
    assert len({warm_start.import_key(env), warm_start.import_key({**env, "OTHER": "1"})}) == 2
