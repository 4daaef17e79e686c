"""The plugin is found through SGLang's entry-point group and announces itself once per process."""

import importlib.util
import json
import logging
import os
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


def _server_args(model_dir, overrides=None, **flags):
    from types import SimpleNamespace

    return SimpleNamespace(model_path=str(model_dir), json_model_override_args=overrides, **flags)


def test_adaptive_dispatch_to_encoder_is_refused_naming_the_flag_for_our_models_only(tiny_model_dir, tiny_gemma3_dir):
    """Only this project's models embed through its routine, which has no adaptive-dispatch path; another
    model embeds through SGLang's own and is left to serve with the flag."""
    with pytest.raises(plugin.UnsupportedServerArgsError, match="--enable-adaptive-dispatch-to-encoder"):
        refused = _server_args(tiny_model_dir, enable_adaptive_dispatch_to_encoder=True)
        plugin.refuse_unsupported_server_args(None, refused)
    for allowed in (_server_args(tiny_model_dir, enable_adaptive_dispatch_to_encoder=False),
                    _server_args(tiny_gemma3_dir, enable_adaptive_dispatch_to_encoder=True)):  # fmt: skip
        assert plugin.refuse_unsupported_server_args("checked", allowed) == "checked"


def test_an_encoder_with_data_parallel_workers_is_refused_for_our_models_only(tiny_model_dir, tiny_gemma3_dir):
    """SGLang starts an encoder's DP workers without plugins (`launch_dp_worker`): they could not prune."""
    with pytest.raises(plugin.UnsupportedServerArgsError, match="--encoder-only with --dp-size 2"):
        plugin.refuse_encoder_data_parallel(_server_args(tiny_model_dir, encoder_only=True, dp_size=2))
    assert plugin.refuse_encoder_data_parallel(_server_args(tiny_gemma3_dir, encoder_only=True, dp_size=2)) is None


@pytest.mark.slow
def test_an_encoder_with_data_parallel_workers_stops_at_startup(tiny_model_dir):
    from sglang_evs.testing.server import run_to_exit

    done = run_to_exit(tiny_model_dir, ["--encoder-only", "--dp-size", "2"])
    assert done.returncode != 0
    assert "sglang-evs does not support --encoder-only with --dp-size 2" in done.stdout + done.stderr


def test_a_server_wide_pruning_setting_for_a_model_not_pruned_is_refused(tiny_gemma3_dir, tiny_model_dir):
    """Gemma 3's processor never reads the setting: silently serving it unpruned is refused at startup."""
    message = "Gemma3ForConditionalGeneration does not prune videos, so its video_pruning_rate would be ignored"
    with pytest.raises(plugin.UnsupportedServerArgsError, match=message):
        plugin.refuse_unsupported_server_args(None, _server_args(tiny_gemma3_dir, '{"video_pruning_rate": 0.5}'))
    with pytest.raises(ValueError, match="video_pruning_method must be one of"):  # a bad value, by its name
        plugin.refuse_unsupported_server_args(None, _server_args(tiny_gemma3_dir, '{"video_pruning_method": "fast"}'))
    for serves in (_server_args(tiny_gemma3_dir, '{"video_pruning_rate": 0}'), _server_args(tiny_gemma3_dir),
                   _server_args(tiny_model_dir, '{"video_pruning_rate": 0.5}')):  # fmt: skip
        assert plugin.refuse_unsupported_server_args("checked", serves) == "checked"


def test_a_server_wide_image_setting_for_a_model_not_pruned_is_refused(tiny_gemma3_dir, tiny_model_dir, tmp_path):
    """Neither Gemma 3 nor a model SGLang's own EVS prunes reads an image setting: refused at startup, by name."""
    nemotron = _checkpoint_naming(tmp_path, "NemotronH_Nano_VL_V2")
    for model in (tiny_gemma3_dir, nemotron):
        with pytest.raises(plugin.UnsupportedServerArgsError, match="does not prune images, so its image_pruning_rate"):
            plugin.refuse_unsupported_server_args(None, _server_args(model, '{"image_pruning_rate": 0.5}'))
    with pytest.raises(ValueError, match="image_pruning_method must be one of"):
        plugin.refuse_unsupported_server_args(None, _server_args(tiny_gemma3_dir, '{"image_pruning_method": "x"}'))
    served = '{"image_pruning_rate": 0.5, "image_pruning_method": "dart"}'
    for serves in (_server_args(tiny_gemma3_dir, '{"image_pruning_rate": 0}'), _server_args(tiny_model_dir, served)):
        assert plugin.refuse_unsupported_server_args("checked", serves) == "checked"


def _checkpoint_naming(directory, architecture: str):
    (directory / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": architecture}))
    return directory


@pytest.mark.parametrize("architecture", ["NemotronH_Nano_VL_V2", "NemotronH_Nano_Omni_Reasoning_V3"])
def test_sglangs_own_evs_setting_is_accepted(tmp_path, architecture):
    """Nemotron-Nano-VL is pruned by SGLang's own EVS, at the rate its documented override sets
    (`--json-model-override-args '{"video_pruning_rate": 0.7}'`, with `--trust-remote-code`): accepted.
    That EVS prunes with EVS only, so another method would be ignored: refused by name."""
    checkpoint = _checkpoint_naming(tmp_path, architecture)
    documented = _server_args(checkpoint, '{"video_pruning_rate": 0.7}', trust_remote_code=True)
    assert plugin.refuse_unsupported_server_args("checked", documented) == "checked"
    explicit = _server_args(checkpoint, '{"video_pruning_method": "evs", "video_pruning_rate": 0.7}')
    assert plugin.refuse_unsupported_server_args("checked", explicit) == "checked"
    vidcom2 = _server_args(checkpoint, '{"video_pruning_method": "vidcom2", "video_pruning_rate": 0.7}')
    with pytest.raises(plugin.UnsupportedServerArgsError, match="SGLang's own EVS, which does not read"):
        plugin.refuse_unsupported_server_args(None, vidcom2)
    budget = _server_args(checkpoint, '{"video_pruning_rate": 0.7, "video_token_budget": 500}')
    with pytest.raises(plugin.UnsupportedServerArgsError, match="reads video_pruning_rate alone, not video_pruning"):
        plugin.refuse_unsupported_server_args(None, budget)
    threshold = _server_args(checkpoint, '{"video_pruning_threshold": 0.3}')
    with pytest.raises(plugin.UnsupportedServerArgsError, match="reads video_pruning_rate alone, not video_pruning_th"):
        plugin.refuse_unsupported_server_args(None, threshold)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ('{"video_pruning_threshold": 0.2, "video_pruning_rate": 0.5}', "and video_pruning_threshold=0.2: name one"),
        ('{"video_pruning_rate": 0.5, "video_token_budet": 9}', "unknown video pruning setting 'video_token_budet'"),
    ],
)
def test_a_server_wide_threshold_or_misspelt_setting_is_refused_before_serving(tiny_model_dir, overrides, message):
    with pytest.raises(ValueError, match=message):
        plugin.refuse_unsupported_server_args(None, _server_args(tiny_model_dir, overrides))
    served = _server_args(tiny_model_dir, '{"video_token_budget": 300, "video_pruning_min_tokens_per_group": 4}')
    assert plugin.refuse_unsupported_server_args("checked", served) == "checked"
    threshold = _server_args(tiny_model_dir, '{"video_pruning_threshold": 0.2}')
    assert plugin.refuse_unsupported_server_args("checked", threshold) == "checked"


def test_a_record_that_keeps_its_prefill_eager_gets_no_prefill_graphs(monkeypatch):
    """`served.ServedModel.eager_prefill` (no record sets it since Qwen3-Omni's graph-mode suite ran) keeps a served
    architecture's prefill eager even where its server's default prunes; a q = 0 default keeps upstream's choice."""
    from dataclasses import replace
    from types import SimpleNamespace

    from sglang_evs import served

    architecture = "Qwen3OmniMoeForConditionalGeneration"
    pruning = SimpleNamespace(architectures=[architecture], video_pruning_rate=0.5)
    assert plugin.prefill_graphs_serve_pruning(pruning)
    assert plugin.prefill_graphs_serve_pruning(SimpleNamespace(architectures=[architecture], image_pruning_rate=0.5))
    assert not plugin.prefill_graphs_serve_pruning(SimpleNamespace(architectures=[architecture]))
    monkeypatch.setitem(served.SERVED, architecture, replace(served.SERVED[architecture], eager_prefill="a reason"))
    assert not plugin.prefill_graphs_serve_pruning(pruning)


def test_the_architecture_is_read_without_running_remote_code(tmp_path):
    checkpoint = _checkpoint_naming(tmp_path, "SomeRemoteCodeModel")
    assert plugin.checkpoint_architecture(_server_args(checkpoint)) == "SomeRemoteCodeModel"
    assert plugin.checkpoint_architecture(_server_args(tmp_path / "missing")) is None


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


def test_several_tokenizer_workers_import_the_app_that_loads_the_plugin(tiny_model_dir, tiny_gemma3_dir, monkeypatch):
    """SGLang never loads plugins in its tokenizer workers, which import the HTTP app by the path in
    `SGLANG_HTTP_SERVER_APP_PATH`: the plugin points it at its own app (SGLang's, after loading plugins). A path
    set to another app is refused for this project's models, naming both; one worker leaves it alone."""
    from sglang_evs.sglang_compat import HTTP_APP_PATH_ENV, UPSTREAM_HTTP_APP_PATH

    monkeypatch.delenv(HTTP_APP_PATH_ENV, raising=False)
    plugin.refuse_unsupported_server_args(None, _server_args(tiny_model_dir, tokenizer_worker_num=1))
    assert HTTP_APP_PATH_ENV not in os.environ
    for model in (tiny_model_dir, tiny_gemma3_dir):
        monkeypatch.setenv(HTTP_APP_PATH_ENV, UPSTREAM_HTTP_APP_PATH)
        plugin.refuse_unsupported_server_args(None, _server_args(model, tokenizer_worker_num=2))
        assert os.environ[HTTP_APP_PATH_ENV] == plugin.TOKENIZER_WORKER_APP_PATH
    module, _, attribute = plugin.TOKENIZER_WORKER_APP_PATH.partition(":")
    source = importlib.util.find_spec(module).origin
    assert f"\n{attribute} = " in open(source).read()  # the app it names (importing it would load SGLang's plugins)

    monkeypatch.setenv(HTTP_APP_PATH_ENV, "my_server:app")
    message = "--tokenizer-worker-num 2 with SGLANG_HTTP_SERVER_APP_PATH=my_server:app for Qwen3VLForConditional"
    with pytest.raises(plugin.UnsupportedServerArgsError, match=message):
        plugin.refuse_unsupported_server_args(None, _server_args(tiny_model_dir, tokenizer_worker_num=2))
    plugin.refuse_unsupported_server_args(None, _server_args(tiny_gemma3_dir, tokenizer_worker_num=2))  # not ours


def test_the_held_videos_bound_is_reserved_where_a_scheduler_holds_them(tiny_model_dir, tiny_gemma3_dir, monkeypatch,
                                                                         caplog):  # fmt: skip
    """SGLang's multimodal reservation grows by the holds' bound for this project's models, in the processes that
    encode videos for a language model; every other model and role keeps SGLang's."""
    from sglang_evs import sglang_compat
    from sglang_evs.pruning import holds

    monkeypatch.setenv(holds.BOUND_ENV, "512")
    roles = {"encoder_only": False, "language_only": False, "disaggregation_mode": "null"}

    def upstream(*, is_multimodal: bool, mm_feature_transport) -> float:
        return 0.25 if is_multimodal else 0.0

    cases = [(_server_args(tiny_model_dir, **roles), True, 0.75), (_server_args(tiny_gemma3_dir, **roles), True, 0.25),
             (_server_args(tiny_model_dir, **roles), False, 0.0),
             (_server_args(tiny_model_dir, **{**roles, "encoder_only": True}), True, 0.25),
             (_server_args(tiny_model_dir, **{**roles, "disaggregation_mode": "decode"}), True, 0.25)]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="sglang_evs"):
        for server_args, multimodal, expected in cases:
            monkeypatch.setattr(sglang_compat, "get_server_args", lambda args=server_args: args)
            got = plugin.reserve_held_videos(upstream, is_multimodal=multimodal, mm_feature_transport=None)
            assert got == expected, (server_args, multimodal)
    assert caplog.text.count("reserving 0.50 GB of the KV budget") == 1, caplog.text


def test_the_default_hold_bound_is_a_share_of_the_device_capped_at_4_gib():
    from sglang_evs.pruning import holds

    assert holds.default_bound_mb(24 * 10**9) < 700  # a 24-GB card keeps most of its KV budget for the KV
    assert holds.default_bound_mb(143 * 2**30) == 4096  # an H200
