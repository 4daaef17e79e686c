"""The plugin is found through SGLang's entry-point group and announces itself once per process."""

import logging
from importlib.metadata import entry_points

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
