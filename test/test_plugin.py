"""The plugin is found through SGLang's entry-point group and announces itself once per process."""

import logging
from importlib.metadata import entry_points

import pytest

from sglang_evs import plugin


def test_registered_in_sglang_plugin_group():
    names = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert names.get("sglang_evs") == "sglang_evs.plugin:load_plugin"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_announces_once_per_process(monkeypatch):
    monkeypatch.setattr(plugin, "_loaded_in_pid", None)
    collect = _Collect()
    plugin._announce_logger().addHandler(collect)
    try:
        plugin.load_plugin()
        plugin.load_plugin()
    finally:
        plugin.logger.removeHandler(collect)
    announcements = [m for m in collect.messages if "plugin loaded" in m]
    assert len(announcements) == 1
    assert "sglang 0.5.23" in announcements[0]


def test_sglang_load_plugins_runs_it():
    from sglang.srt import plugins

    seen = plugins.load_plugins_by_group(plugins.GENERAL_PLUGINS_GROUP)
    func, dist = seen["sglang_evs"]
    assert func is plugin.load_plugin and dist == "sglang-evs"


def test_adaptive_dispatch_to_encoder_is_refused_naming_the_flag():
    from types import SimpleNamespace

    with pytest.raises(plugin.UnsupportedServerArgsError, match="--enable-adaptive-dispatch-to-encoder"):
        plugin.refuse_unsupported_server_args(None, SimpleNamespace(enable_adaptive_dispatch_to_encoder=True))
    allowed = SimpleNamespace(enable_adaptive_dispatch_to_encoder=False)
    assert plugin.refuse_unsupported_server_args("checked", allowed) == "checked"


def test_a_server_wide_pruning_setting_for_a_model_not_pruned_is_refused(tiny_gemma3_dir, tiny_model_dir):
    """Gemma 3's processor never reads the setting: silently serving it unpruned is refused at startup."""
    from types import SimpleNamespace

    def args(model_dir, overrides):
        return SimpleNamespace(model_path=str(model_dir), json_model_override_args=overrides)

    message = "Gemma3ForConditionalGeneration does not prune videos, so its video_pruning_rate would be ignored"
    with pytest.raises(plugin.UnsupportedServerArgsError, match=message):
        plugin.refuse_unsupported_server_args(None, args(tiny_gemma3_dir, '{"video_pruning_rate": 0.5}'))
    with pytest.raises(ValueError, match="video_pruning_method must be one of"):  # a bad value, by its name
        plugin.refuse_unsupported_server_args(None, args(tiny_gemma3_dir, '{"video_pruning_method": "fast"}'))
    for serves in (args(tiny_gemma3_dir, '{"video_pruning_rate": 0}'), args(tiny_gemma3_dir, None),
                   args(tiny_model_dir, '{"video_pruning_rate": 0.5}')):  # fmt: skip
        assert plugin.refuse_unsupported_server_args("checked", serves) == "checked"


@pytest.mark.slow
def test_server_with_adaptive_dispatch_stops_at_startup(tiny_model_dir, tmp_path):
    """Refused while SGLang validates its arguments, before any scheduler starts."""
    from sglang_evs.testing.server import start_server

    log = tmp_path / "server.log"
    process = start_server(tiny_model_dir, log, ["--enable-adaptive-dispatch-to-encoder"])
    assert process.wait(timeout=180) != 0
    text = log.read_text()
    assert "sglang-evs does not support --enable-adaptive-dispatch-to-encoder" in text
    assert "run_scheduler_process" not in text  # no scheduler was started
