"""The startup check refuses an SGLang it was not written against, naming both versions."""

import os
import subprocess
import sys

import pytest

from sglang_evs import plugin, sglang_compat
from sglang_evs.testing.server import CPU_ENV


def test_supported_version_passes():
    assert sglang_compat.check_sglang_compatibility() == "0.5.23"


def test_wrong_version_is_refused_with_both_versions_named():
    with pytest.raises(sglang_compat.UnsupportedSGLangError) as info:
        sglang_compat.check_sglang_compatibility(version="0.5.24")
    assert "0.5.24" in str(info.value) and "0.5.23" in str(info.value)


def test_missing_internal_is_refused(monkeypatch):
    internals = {**sglang_compat.INTERNALS, "gone": "sglang.srt.managers.mm_utils:no_such_function"}
    monkeypatch.setattr(sglang_compat, "INTERNALS", internals)
    monkeypatch.setattr(sglang_compat, "STARTUP_INTERNALS", (*sglang_compat.STARTUP_INTERNALS, "gone"))
    with pytest.raises(sglang_compat.UnsupportedSGLangError, match="no_such_function"):
        sglang_compat.check_sglang_compatibility()


def test_every_internal_resolves_on_the_supported_version():
    assert sglang_compat.missing_internals(tuple(sglang_compat.INTERNALS)) == []


def test_plugin_stops_the_process_on_a_wrong_version(monkeypatch):
    monkeypatch.setattr(sglang_compat, "installed_sglang_version", lambda: "0.6.0")
    monkeypatch.setattr(plugin, "_loaded_in_pid", None)
    with pytest.raises(SystemExit, match="found SGLang 0.6.0"):
        plugin.load_plugin()


@pytest.mark.slow  # a fresh interpreter (~5 s); the quick tier checks the refusal itself, above
def test_launch_server_fails_loudly_on_a_faked_sglang_version(tmp_path, tiny_model_dir):
    """A dist-info claiming sglang 0.9.9 ahead on sys.path is what importlib.metadata reports."""
    fake = tmp_path / "fake_site"
    dist_info = fake / "sglang-0.9.9.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.9.9\n")
    env = {**os.environ, **CPU_ENV, "PYTHONPATH": str(fake)}
    done = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tiny_model_dir), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode != 0
    assert "sglang-evs supports SGLang 0.5.23 only, but found SGLang 0.9.9" in done.stderr


def test_every_hook_target_resolves_and_a_missing_one_is_refused(monkeypatch):
    assert sglang_compat.missing_internals() == []
    assert sglang_compat.hook_target("prefill_graph_execute").endswith("PrefillCudaGraphRunner.execute")
    targets = {**sglang_compat.HOOK_TARGETS, "gone": "sglang.srt.managers.mm_utils:Nothing.here"}
    monkeypatch.setattr(sglang_compat, "HOOK_TARGETS", targets)
    with pytest.raises(sglang_compat.UnsupportedSGLangError, match="Nothing.here"):
        sglang_compat.check_sglang_compatibility()


def test_prefill_limits_outside_a_server_are_zero():
    assert sglang_compat.prefill_limits() == sglang_compat.PrefillLimits()  # no server args published here
