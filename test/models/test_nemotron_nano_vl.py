"""Nemotron-Nano-VL, the model SGLang 0.5.23 prunes with its own EVS, starts with the plugin installed as it
starts without it: the documented setting (`--json-model-override-args '{"video_pruning_rate": 0.7}'`, with
`--trust-remote-code`) is accepted and SGLang's EVS is enabled at that rate, in both servers.

What cannot be shown here: a served request. SGLang's NemotronH Mamba2 layers call Triton kernels that have no
CPU path (`docs/cpu-runtime.md` names them), so both servers start without a warm-up and are asked only
what needs no forward. The rest of the proof is in-process, over SGLang's whole registry
(`test_registry.py`): with the plugin, Nemotron-Nano-VL keeps SGLang's class and processor (so its prompts,
EVS placeholders included, are laid out as upstream lays them out) and SGLang's routine, which hands its
language model the same tensors.
"""

import pytest
import requests

from sglang_evs.testing.server import HYBRID_CPU_SERVER_ARGS, start_server, stop, wait_ready

pytestmark = pytest.mark.slow  # two servers: the full suite only (see pyproject.toml)

DOCUMENTED = ["--json-model-override-args", '{"video_pruning_rate": 0.7}', "--trust-remote-code"]
CPU_ONLY = ["--load-format", "dummy", "--dtype", "bfloat16", "--skip-server-warmup", *HYBRID_CPU_SERVER_ARGS]
EVS_ENABLED = "[EVS] enabled for NemotronH_Nano_VL_V2 [EVSConfig(video_pruning_rate=0.7"


@pytest.fixture(scope="module")
def started(tiny_nemotron_vl_dir, tmp_path_factory) -> dict[str, dict]:
    """{"on" | "off": {"log": server log, "model_info": /get_model_info}} once both servers answer."""
    work = tmp_path_factory.mktemp("nemotron")
    processes, out = {}, {}
    try:
        for plugin in ("on", "off"):
            env = {} if plugin == "on" else {"SGLANG_PLUGINS": "none"}
            log = work / f"{plugin}.log"
            processes[plugin] = start_server(tiny_nemotron_vl_dir, log, [*DOCUMENTED, *CPU_ONLY], env)
            out[plugin] = {"log_path": log}
        for plugin, process in processes.items():
            url = f"http://127.0.0.1:{process.port}/get_model_info"
            wait_ready(lambda url=url: requests.get(url, timeout=10).ok, process, out[plugin]["log_path"], plugin, 240)
            out[plugin]["model_info"] = requests.get(url, timeout=10).json()
            out[plugin]["alive"] = process.poll() is None
    finally:
        for process in processes.values():
            stop(process)
    for entry in out.values():
        entry["log"] = entry.pop("log_path").read_text(errors="replace")
    return out


@pytest.mark.parametrize("plugin", ["on", "off"])
def test_the_server_starts_with_sglangs_own_evs_at_the_documented_rate(started, plugin):
    server = started[plugin]
    assert server["alive"]
    assert EVS_ENABLED in server["log"]
    assert "UnsupportedServerArgsError" not in server["log"]


def test_the_plugin_was_loaded_in_one_server_only_and_both_describe_the_same_model(started):
    assert "plugin loaded" in started["on"]["log"] and "plugin loaded" not in started["off"]["log"]
    assert started["on"]["model_info"] == started["off"]["model_info"]
    assert started["on"]["model_info"]["is_generation"]
